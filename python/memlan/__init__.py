# SPDX-License-Identifier: Apache-2.0 OR MIT
"""memlan: Python bindings for libmemlan, memlan's shared-memory channels.

Pure Python over ctypes in ABI mode: only libmemlan's public functions are called, no private
structure is mirrored, and no compiler is needed.  libmemlan.so is found through $MEMLAN_LIB,
then beside this package, then ctypes.util.find_library("memlan"), then the build tree this
package sits in (../build/lib).

    import memlan
    with memlan.Fabric() as fab, fab.listen("echo") as srv:
        ch = srv.accept(timeout=5.0)
        ch.send(ch.recv(4096))

Errors are raised as :class:`MemlanError` (an :class:`OSError` whose ``errno`` is set and whose
text is memlan_strerror()'s); a timeout is :class:`TimeoutError`'s subclass :class:`Timeout`.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno as _errno
import os
import pathlib
from typing import List, Optional, Tuple, Union

__all__ = ["Fabric", "Channel", "Listener", "EventQueue", "Event", "MemlanError", "Timeout",
           "STREAM", "MSG", "DONTWAIT", "WAITALL", "EV_READ", "EV_WRITE", "EV_HUP", "EV_ERR",
           "SHUT_RD", "SHUT_WR", "SHUT_RDWR", "NAME_MAX", "strerror", "library_path"]

STREAM, MSG = 1, 2
Buffer = Union[bytes, bytearray, memoryview]  # what send() takes; recv_into() needs a writable one
DONTWAIT, WAITALL = 0x1, 0x2
EV_READ, EV_WRITE, EV_HUP, EV_ERR = 0x1, 0x2, 0x4, 0x8
SHUT_RD, SHUT_WR, SHUT_RDWR = 1, 2, 3
NAME_MAX = 64


def _find_library() -> str:
    env = os.environ.get("MEMLAN_LIB")
    if env:
        return env
    here = pathlib.Path(__file__).resolve().parent
    for cand in sorted(here.glob("libmemlan.so*")):
        return str(cand)
    found = ctypes.util.find_library("memlan")
    if found:
        return found
    tree = here.parent.parent / "build" / "lib" / "libmemlan.so"
    if tree.exists():
        return str(tree)
    raise OSError("libmemlan.so not found: set MEMLAN_LIB, install libmemlan, or build the tree")


library_path = _find_library()
_lib = ctypes.CDLL(library_path)

_P = ctypes.c_void_p
_PP = ctypes.POINTER(ctypes.c_void_p)


class _Opts(ctypes.Structure):
    # struct memlan_channel_opts: a public struct of the API (include/memlan.h).
    _fields_ = [("kind", ctypes.c_int), ("ring_size", ctypes.c_size_t)]


class _Event(ctypes.Structure):
    # struct memlan_event: public, as above.
    _fields_ = [("udata", ctypes.c_void_p), ("events", ctypes.c_uint32)]


def _fn(name, restype, *argtypes):
    f = getattr(_lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


_c = ctypes.c_int
_sz = ctypes.c_size_t
_ssz = ctypes.c_ssize_t
_s = ctypes.c_char_p
_fabric_open = _fn("memlan_fabric_open", _c, _s, _PP)
_fabric_close = _fn("memlan_fabric_close", None, _P)
_fabric_path = _fn("memlan_fabric_path", _s, _P)
_fabric_clean = _fn("memlan_fabric_clean", _c, _P)
_channel_create = _fn("memlan_channel_create", _c, _P, ctypes.POINTER(_Opts), _PP)
_channel_attach = _fn("memlan_channel_attach", _c, _P, _s, _PP)
_channel_token = _fn("memlan_channel_token", _s, _P)
_channel_wait_peer = _fn("memlan_channel_wait_peer", _c, _P, _c)
_channel_kind = _fn("memlan_channel_kind", _c, _P)
_channel_max_msg = _fn("memlan_channel_max_msg", _sz, _P)
_channel_poll = _fn("memlan_channel_poll", _c, _P)
_channel_close = _fn("memlan_channel_close", None, _P)
_channel_set_timeout = _fn("memlan_channel_set_timeout", _c, _P, _c, _c)
_send = _fn("memlan_send", _ssz, _P, _P, _sz, _c)
_recv = _fn("memlan_recv", _ssz, _P, _P, _sz, _c)
_reserve = _fn("memlan_reserve", _ssz, _P, _PP, _sz, _c)
_commit = _fn("memlan_commit", _c, _P, _sz)
_peek = _fn("memlan_peek", _ssz, _P, _PP, _c)
_release = _fn("memlan_release", _c, _P, _sz)
_shutdown = _fn("memlan_shutdown", _c, _P, _c)
_listen = _fn("memlan_listen", _c, _P, _s, _c, _PP)
_accept = _fn("memlan_accept", _c, _P, _c, _PP)
_listener_fd = _fn("memlan_listener_fd", _c, _P)
_listener_close = _fn("memlan_listener_close", None, _P)
_connect = _fn("memlan_connect", _c, _P, _s, ctypes.POINTER(_Opts), _c, _PP)
_evq_create = _fn("memlan_evq_create", _c, _P, ctypes.c_uint, _PP)
_evq_add = _fn("memlan_evq_add", _c, _P, _P, ctypes.c_uint32, _P)
_evq_del = _fn("memlan_evq_del", _c, _P, _P)
_evq_wait = _fn("memlan_evq_wait", _c, _P, ctypes.POINTER(_Event), _c, _c)
_evq_fd = _fn("memlan_evq_fd", _c, _P)
_evq_arm = _fn("memlan_evq_arm", _c, _P)
_evq_close = _fn("memlan_evq_close", None, _P)
_strerror = _fn("memlan_strerror", _s, _c)


def strerror(err: int) -> str:
    """memlan_strerror(): memlan's text for an error (negative or positive errno)."""
    return _strerror(err).decode()


class MemlanError(OSError):
    """A memlan function failed; ``errno`` is the positive errno, the text memlan's own."""

    def __init__(self, err: int, what: str = "") -> None:
        e = abs(err)
        super().__init__(e, f"{what}: {strerror(e)}" if what else strerror(e))


class Timeout(MemlanError, TimeoutError):
    """A wait ran out of time (ETIMEDOUT)."""


def _check(r: int, what: str) -> int:
    if r < 0:
        raise (Timeout if r == -_errno.ETIMEDOUT else MemlanError)(r, what)
    return r


def _ms(timeout: Optional[float]) -> int:
    """Seconds (None = forever) to the C API's milliseconds (-1 = forever)."""
    return -1 if timeout is None else max(0, int(timeout * 1000))


def _opts(kind: int, ring_size: int) -> _Opts:
    return _Opts(kind, ring_size)


class Fabric:
    """A fabric directory (memlan_fabric_open); ``path`` None means $MEMLAN_FABRIC or the
    default /dev/shm/memlan-UID.  Use as a context manager or call close()."""

    def __init__(self, path: Optional[str] = None) -> None:
        h = ctypes.c_void_p()
        _check(_fabric_open(path.encode() if path else None, ctypes.byref(h)), "fabric open")
        self._h: Optional[int] = h.value

    @property
    def path(self) -> str:
        """The fabric's directory."""
        return _fabric_path(self._h).decode()

    def clean(self) -> int:
        """Remove the files of dead owners; returns how many."""
        return _check(_fabric_clean(self._h), "fabric clean")

    def channel(self, kind: int = STREAM, ring_size: int = 0) -> "Channel":
        """Create a channel; hand ``channel.token`` to the one peer that may attach."""
        h = ctypes.c_void_p()
        o = _opts(kind, ring_size)
        _check(_channel_create(self._h, ctypes.byref(o), ctypes.byref(h)), "channel create")
        return Channel(h.value, self)

    def attach(self, token: str) -> "Channel":
        """Attach to a channel another process created, by its token."""
        h = ctypes.c_void_p()
        _check(_channel_attach(self._h, token.encode(), ctypes.byref(h)), "channel attach")
        return Channel(h.value, self)

    def listen(self, name: str, kind: int = 0) -> "Listener":
        """Serve ``name`` (memlan_listen); kind 0 accepts both kinds."""
        h = ctypes.c_void_p()
        _check(_listen(self._h, name.encode(), kind, ctypes.byref(h)), f"listen {name!r}")
        return Listener(h.value, self, name)

    def connect(self, name: str, kind: int = STREAM, ring_size: int = 0,
                timeout: Optional[float] = 5.0) -> "Channel":
        """Connect to the server of ``name``; returns a channel it has accepted."""
        h = ctypes.c_void_p()
        o = _opts(kind, ring_size)
        _check(_connect(self._h, name.encode(), ctypes.byref(o), _ms(timeout), ctypes.byref(h)),
               f"connect {name!r}")
        return Channel(h.value, self)

    def event_queue(self, capacity: int = 0) -> "EventQueue":
        """An event queue for up to ``capacity`` channels (0 = 4096)."""
        h = ctypes.c_void_p()
        _check(_evq_create(self._h, capacity, ctypes.byref(h)), "evq create")
        return EventQueue(h.value, self)

    def close(self) -> None:
        """Release the fabric handle (not the channels made through it); idempotent."""
        if self._h:
            _fabric_close(self._h)
            self._h = None

    def __enter__(self) -> "Fabric":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Loan:
    """A zero-copy loan: ``view`` is a memoryview of the ring itself, valid until the loan
    ends.  Leaving the ``with`` block commits (a send loan) or releases (a receive loan)."""

    def __init__(self, ch: "Channel", addr: int, n: int, writable: bool) -> None:
        self._ch = ch
        self._done = False
        buf = (ctypes.c_char * n).from_address(addr)
        self.view: memoryview = memoryview(buf).cast("B")
        if not writable:
            self.view = self.view.toreadonly()
        self.address = addr

    def __len__(self) -> int:
        return len(self.view)

    def _end(self) -> None:
        self.view.release()
        self._done = True


class SendLoan(_Loan):
    """From Channel.reserve(): write into ``view``, then commit(n) (or leave the ``with`` block,
    which commits ``length`` bytes: all of them unless set; an exception abandons the loan)."""

    def __init__(self, ch: "Channel", addr: int, n: int) -> None:
        super().__init__(ch, addr, n, True)
        self.length = n

    def commit(self, n: Optional[int] = None) -> None:
        """Send the first ``n`` bytes written (default ``length``) and end the loan."""
        if self._done:
            return
        n = self.length if n is None else n
        self._end()
        _check(_commit(self._ch._h, n), "commit")

    def __enter__(self) -> "SendLoan":
        return self

    def abandon(self) -> None:
        """End the loan without sending anything (the next reserve gets the same space)."""
        if not self._done:
            self._end()

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type:
            self.abandon()
        else:
            self.commit()


class RecvLoan(_Loan):
    """From Channel.peek(): read ``view`` in place, then release() (or leave the ``with``
    block, which consumes ``consumed`` bytes: all of them unless set; a message is consumed
    whole)."""

    def __init__(self, ch: "Channel", addr: int, n: int) -> None:
        super().__init__(ch, addr, n, False)
        self.consumed = n

    def release(self, n: Optional[int] = None) -> None:
        """Consume ``n`` bytes (default ``consumed``; a message whole) and end the loan."""
        if self._done:
            return
        n = self.consumed if n is None else n
        self._end()
        _check(_release(self._ch._h, n), "release")

    def __enter__(self) -> "RecvLoan":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class Channel:
    """One side of a channel: a byte stream (STREAM) or a message ring (MSG).  One thread may
    send while another receives; anything more needs a lock.  Only one zero-copy loan may be
    outstanding per direction; a message payload is 8-byte aligned."""

    def __init__(self, h: int, fab: Fabric) -> None:
        self._h: Optional[int] = h
        self._fab = fab  # the fabric must outlive its channels

    @property
    def token(self) -> str:
        """The capability to hand to the one peer that may attach."""
        return _channel_token(self._h).decode()

    @property
    def kind(self) -> int:
        """STREAM or MSG."""
        return _channel_kind(self._h)

    @property
    def max_msg(self) -> int:
        """The largest message a MSG channel carries (the ring size for a stream)."""
        return _channel_max_msg(self._h)

    def wait_peer(self, timeout: Optional[float] = None) -> None:
        """Wait until the peer has attached; None waits for ever, raises Timeout."""
        _check(_channel_wait_peer(self._h, _ms(timeout)), "wait_peer")

    def set_timeout(self, recv: Optional[float] = None, send: Optional[float] = None) -> None:
        """Bound blocking recv/peek (``recv`` seconds) and send/reserve (``send`` seconds), as
        a socket's SO_RCVTIMEO/SO_SNDTIMEO; None: no bound.  A call that waits that long with
        nothing moved raises Timeout."""
        def ms(t: Optional[float]) -> int:
            if t is None:
                return -1
            if t <= 0:
                raise ValueError("a timeout must be positive (None: no bound)")
            return max(1, int(t * 1000 + 0.999))
        _check(_channel_set_timeout(self._h, ms(recv), ms(send)), "set_timeout")

    def send(self, data: Buffer, flags: int = 0) -> int:
        """Copy ``data`` (bytes-like) into the ring; returns the count sent."""
        mv = memoryview(data).cast("B")
        buf = (ctypes.c_char * len(mv)).from_buffer_copy(mv) if mv.readonly else \
            (ctypes.c_char * len(mv)).from_buffer(mv)
        return _check(_send(self._h, buf, len(mv), flags), "send")

    def sendall(self, data: Buffer) -> None:
        """Send all of ``data`` (a blocking send on a stream sends all of it already)."""
        self.send(data)

    def recv(self, n: int = 65536, flags: int = 0) -> bytes:
        """Up to ``n`` bytes, or one message; b"" at end of stream."""
        buf = ctypes.create_string_buffer(n)
        got = _check(_recv(self._h, buf, n, flags), "recv")
        return buf.raw[:got]

    def recv_into(self, buffer: Union[bytearray, memoryview], flags: int = 0) -> int:
        """Receive into a writable ``buffer``; returns the count, 0 at end of stream."""
        mv = memoryview(buffer).cast("B")
        buf = (ctypes.c_char * len(mv)).from_buffer(mv)
        return _check(_recv(self._h, buf, len(mv), flags), "recv")

    def reserve(self, n: int, flags: int = 0) -> SendLoan:
        """Zero-copy send: a writable loan of at least ``n`` bytes in the ring (exactly ``n`` on
        a message channel).  Use with ``with``; it commits on exit."""
        p = ctypes.c_void_p()
        got = _check(_reserve(self._h, ctypes.byref(p), n, flags), "reserve")
        return SendLoan(self, p.value or 0, got)

    def peek(self, flags: int = 0) -> Optional[RecvLoan]:
        """Zero-copy receive: a read-only loan of the readable bytes or the next message, or
        None at end of stream.  Use with ``with``; it releases on exit."""
        p = ctypes.c_void_p()
        got = _check(_peek(self._h, ctypes.byref(p), flags), "peek")
        if got == 0 and not p.value:
            return None
        return RecvLoan(self, p.value or 0, got)

    def shutdown(self, how: int = SHUT_WR) -> None:
        """Half-close: SHUT_WR (the peer reads end of stream), SHUT_RD or SHUT_RDWR."""
        _check(_shutdown(self._h, how), "shutdown")

    def poll(self) -> int:
        """Readiness now (EV_* bits), without blocking."""
        return _check(_channel_poll(self._h), "poll")

    def close(self) -> None:
        """Close our side (the peer sees end of stream); idempotent."""
        if self._h:
            _channel_close(self._h)
            self._h = None

    def __enter__(self) -> "Channel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Listener:
    """A named endpoint being served (memlan_listen).  fileno() suits selectors/asyncio: it is
    readable while accept(timeout=0) may give a channel."""

    def __init__(self, h: int, fab: Fabric, name: str) -> None:
        self._h: Optional[int] = h
        self._fab = fab
        self.name = name

    def accept(self, timeout: Optional[float] = None) -> Optional[Channel]:
        """The next client's channel; None when ``timeout`` is 0 and nobody waits; raises
        Timeout when a positive timeout runs out."""
        h = ctypes.c_void_p()
        r = _accept(self._h, _ms(timeout), ctypes.byref(h))
        if r == -_errno.EAGAIN:
            return None
        _check(r, "accept")
        return Channel(h.value, self._fab)

    def fileno(self) -> int:
        """An fd readable while accept(timeout=0) may give a channel (level-triggered)."""
        return _listener_fd(self._h)

    def close(self) -> None:
        """Stop serving the name; accepted channels stay open; idempotent."""
        if self._h:
            _listener_close(self._h)
            self._h = None

    def __enter__(self) -> "Listener":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


Event = Tuple[Channel, int]


class EventQueue:
    """An event queue (memlan_evq_*): edge-triggered readiness of many channels, one waiter."""

    def __init__(self, h: int, fab: Fabric) -> None:
        self._h: Optional[int] = h
        self._fab = fab
        self._chans: dict = {}
        self._next = 1

    def add(self, ch: Channel, events: int = EV_READ) -> None:
        """Report ``ch``'s readiness (EV_READ and/or EV_WRITE) through this queue."""
        key = self._next
        self._next += 1
        _check(_evq_add(self._h, ch._h, events, key), "evq add")
        self._chans[key] = ch

    def remove(self, ch: Channel) -> None:
        """Stop reporting ``ch``."""
        _check(_evq_del(self._h, ch._h), "evq del")
        self._chans = {k: c for k, c in self._chans.items() if c is not ch}

    def wait(self, max_events: int = 64, timeout: Optional[float] = None) -> List[Event]:
        """Up to ``max_events`` (channel, EV_* bits) pairs; [] on timeout."""
        evs = (_Event * max_events)()
        n = _check(_evq_wait(self._h, evs, max_events, _ms(timeout)), "evq wait")
        return [(self._chans[evs[i].udata], evs[i].events) for i in range(n)
                if evs[i].udata in self._chans]

    def fileno(self) -> int:
        """An fd for select/poll: call arm() before sleeping on it, wait(timeout=0) after."""
        return _evq_fd(self._h)

    def arm(self) -> bool:
        """Arm the fd; False when events are already waiting (do not sleep)."""
        return _check(_evq_arm(self._h), "evq arm") == 0

    def close(self) -> None:
        """Close the queue (its channels stay open); idempotent."""
        if self._h:
            _evq_close(self._h)
            self._h = None
            self._chans.clear()

    def __enter__(self) -> "EventQueue":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
