# SPDX-License-Identifier: Apache-2.0 OR MIT
"""libzmq's patterns, through Debian's python3-zmq, one role per process (test_apps_mt.py runs
two of them, each under `memlan run`).  Run with Debian's /usr/bin/python3, for which the package
is built.

    apps_zmq.py ROLE PORT N [K]

rep/req       N round trips of 32 B to 12.8 KB, every answer checked
pub/sub       N messages on PORT after a slow-joiner handshake on PORT+1, all in order
router/dealers  K DEALER threads of N round trips each against one ROUTER
echo          a ROUTER that answers until a client says quit (a peer of stream and pirate)
stream        a DEALER with 16 requests in flight, checking every answer, until it is killed
pirate        a DEALER that resends what gets no answer within 300 ms (the zguide's lazy
              pirate), so that it survives its server's death and a new server; then says quit

Every wait is bounded; a failure exits non-zero with the reason.
"""
import hashlib
import sys
import time

import zmq

from apps_common import answer, in_threads, val

T = 20000  # ms: the longest any receive waits


def rx(s, role):
    if not s.poll(T):
        sys.exit("%s: nothing within %d ms" % (role, T))
    return s.recv_multipart()


def rep(ctx, ep, n):
    s = ctx.socket(zmq.REP)
    s.bind(ep)
    for _ in range(n):
        m, = rx(s, "rep")
        s.send(answer(m))
    print("served", n)


def req(ctx, ep, n):
    s = ctx.socket(zmq.REQ)
    s.connect(ep)
    for i in range(n):
        s.send(val(i))
        r, = rx(s, "req")
        assert r == answer(val(i)), i
    print("ok", n)


def pub(ctx, ep, n, sync_ep):
    s = ctx.socket(zmq.PUB)
    s.setsockopt(zmq.SNDHWM, 0)  # no message dropped at the high-water mark
    s.bind(ep)
    sync = ctx.socket(zmq.REP)
    sync.bind(sync_ep)
    end = time.time() + 20
    while not sync.poll(50):  # the slow joiner: hello until the subscriber has seen one
        assert time.time() < end, "pub: no subscriber in 20 s"
        s.send_multipart([b"hello"])
    sync.recv()
    sync.send(b"go")
    for i in range(n):
        s.send_multipart([b"m", b"%d" % i, val(i)])
    s.send_multipart([b"end"])
    assert rx(sync, "pub") == [b"done"]  # the subscriber has everything: now we may close
    print("published", n)


def sub(ctx, ep, n, sync_ep):
    s = ctx.socket(zmq.SUB)
    s.setsockopt(zmq.RCVHWM, 0)
    s.setsockopt(zmq.SUBSCRIBE, b"")
    s.connect(ep)
    sync = ctx.socket(zmq.REQ)
    sync.connect(sync_ep)
    while rx(s, "sub")[0] != b"hello":
        pass
    sync.send(b"ready")
    rx(sync, "sub")
    i = 0
    while True:
        m = rx(s, "sub")
        if m[0] == b"hello":  # sent before the publisher saw our ready
            continue
        if m[0] == b"end":
            break
        assert m[1] == b"%d" % i and m[2] == val(i), (i, m[1])
        i += 1
    assert i == n, (i, n)
    sync.send(b"done")
    print("ok", n)


def router(ctx, ep, n, k):
    s = ctx.socket(zmq.ROUTER)
    s.bind(ep)
    seen = {}
    for _ in range(n * k):
        who, m = rx(s, "router")
        seen[who] = seen.get(who, 0) + 1
        s.send_multipart([who, who + b":" + hashlib.sha256(m).digest()])
    assert len(seen) == k and set(seen.values()) == {n}, seen
    print("served", n * k)


def dealers(ctx, ep, n, k):
    def dealer(t):
        s = ctx.socket(zmq.DEALER)
        name = b"d%d" % t
        s.setsockopt(zmq.IDENTITY, name)
        s.connect(ep)
        for i in range(n):
            v = val(i * k + t)
            s.send(v)
            r, = rx(s, "dealer")
            assert r == name + b":" + hashlib.sha256(v).digest(), (t, i)
        s.close()

    in_threads(dealer, k)  # SystemExit from rx fails it too
    print("ok", n * k)


def echo(ctx, ep):
    s = ctx.socket(zmq.ROUTER)
    s.bind(ep)
    served, end = 0, time.time() + 120
    while time.time() < end:
        if not s.poll(1000):
            continue
        who, seq, m = s.recv_multipart()
        if m == b"quit":
            print("quit after", served, flush=True)
            return
        s.send_multipart([who, seq, hashlib.sha256(m).digest()])
        served += 1
        if served % 100 == 0:
            print("served", served, flush=True)
    sys.exit("echo: never told to quit")


def stream(ctx, ep):
    s = ctx.socket(zmq.DEALER)
    s.connect(ep)
    sent = got = 0
    end = time.time() + 120
    while time.time() < end:
        while sent - got < 16:
            s.send_multipart([b"%d" % sent, val(sent)])
            sent += 1
        seq, h = rx(s, "stream")
        assert seq == b"%d" % got and h == hashlib.sha256(val(got)).digest(), (seq, got)
        got += 1
        if got % 100 == 0:
            print("got", got, flush=True)
    sys.exit("stream: never killed")


def pirate(ctx, ep, n):
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 5000)  # the quit goes out before the context ends
    s.connect(ep)
    end, resent = time.time() + 60, 0
    for i in range(n):
        s.send_multipart([b"%d" % i, val(i)])
        while True:
            assert time.time() < end, "pirate: %d of %d in 60 s" % (i, n)
            if not s.poll(300):
                s.send_multipart([b"%d" % i, val(i)])
                resent += 1
                continue
            seq, h = s.recv_multipart()
            if seq == b"%d" % i:
                assert h == hashlib.sha256(val(i)).digest(), i
                break
            # an older seq answers a request that was resent: dropped
        if i % 100 == 0:
            print("done", i, flush=True)
    s.send_multipart([b"0", b"quit"])
    print("ok", n, "resent", resent, flush=True)


def main():
    role, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    k = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    ep, sync_ep = "tcp://127.0.0.1:%d" % port, "tcp://127.0.0.1:%d" % (port + 1)
    ctx = zmq.Context()
    {"rep": lambda: rep(ctx, ep, n), "req": lambda: req(ctx, ep, n),
     "pub": lambda: pub(ctx, ep, n, sync_ep), "sub": lambda: sub(ctx, ep, n, sync_ep),
     "router": lambda: router(ctx, ep, n, k), "dealers": lambda: dealers(ctx, ep, n, k),
     "echo": lambda: echo(ctx, ep), "stream": lambda: stream(ctx, ep),
     "pirate": lambda: pirate(ctx, ep, n)}[role]()
    ctx.destroy(linger=5000)


if __name__ == "__main__":
    main()
