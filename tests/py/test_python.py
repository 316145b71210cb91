# SPDX-License-Identifier: Apache-2.0 OR MIT
"""The Python package in python/: its API over the real libmemlan, its examples run as
programs, and a pip install of it that finds the library through MEMLAN_LIB."""
import importlib
import os
import selectors
import subprocess
import sys
import threading

import pytest

from conftest import LIB, ROOT

PY = ROOT / "python"


@pytest.fixture
def ml(fabric, monkeypatch):
    monkeypatch.setenv("MEMLAN_LIB", str(LIB))
    monkeypatch.syspath_prepend(str(PY))
    import memlan
    return importlib.reload(memlan)


def env_for(fabric):
    return dict(os.environ, MEMLAN_FABRIC=str(fabric), MEMLAN_LIB=str(LIB),
                PYTHONPATH=str(PY))


def test_connect_by_name_send_recv_and_errors(ml):
    with ml.Fabric() as fab, fab.listen("svc") as srv:
        got = {}
        t = threading.Thread(target=lambda: got.setdefault("c", fab.connect("svc", kind=ml.MSG)))
        t.start()
        ch = srv.accept(timeout=5)
        t.join()
        cl = got["c"]
        assert ch.kind == ml.MSG and cl.kind == ml.MSG
        cl.send(b"ping")
        assert ch.recv() == b"ping"
        ch.send(bytearray(b"pong"))
        buf = bytearray(16)
        assert cl.recv_into(buf) == 4 and bytes(buf[:4]) == b"pong"
        with pytest.raises(ml.MemlanError) as e:
            fab.listen("svc")
        assert e.value.errno == 98  # EADDRINUSE
        with pytest.raises(ml.MemlanError) as e:
            fab.listen("a/b")
        assert e.value.errno == 22 and "a/b" in str(e.value)
        with pytest.raises(ml.MemlanError) as e:
            fab.connect("nobody", timeout=0.2)
        assert e.value.errno == 111
        assert srv.accept(timeout=0) is None
        with pytest.raises(ml.Timeout):
            srv.accept(timeout=0.05)
        cl.close()
        assert ch.recv() == b""
        ch.close()


def test_zero_copy_loans_are_memoryviews_that_commit_and_release(ml):
    with ml.Fabric() as fab:
        a = fab.channel(kind=ml.MSG, ring_size=4096)
        b = fab.attach(a.token)
        for i in range(1000):  # wraps the ring many times
            with a.reserve(24) as loan:
                assert isinstance(loan.view, memoryview) and len(loan.view) == 24
                loan.view[:] = i.to_bytes(24, "little")
            with b.peek() as got:
                assert got.address % 8 == 0
                assert got.view.readonly
                assert int.from_bytes(got.view, "little") == i
        # An exception inside the block commits nothing.
        with pytest.raises(RuntimeError):
            with a.reserve(8) as loan:
                loan.view[:] = b"x" * 8
                raise RuntimeError
        assert b.poll() & ml.EV_READ == 0
        a.close()
        assert b.peek() is None
        b.close()


def test_event_queue_and_listener_fd(ml):
    with ml.Fabric() as fab, fab.listen("many") as srv, fab.event_queue(8) as q:
        sel = selectors.DefaultSelector()
        sel.register(srv, selectors.EVENT_READ)
        clients = []
        t = threading.Thread(target=lambda: clients.extend(fab.connect("many") for _ in range(3)))
        t.start()
        served = []
        while len(served) < 3:
            assert sel.select(timeout=5), "the listener fd never woke"
            while (ch := srv.accept(timeout=0)) is not None:
                q.add(ch, ml.EV_READ)
                served.append(ch)
        t.join()
        sel.close()
        for i, c in enumerate(clients):
            c.send(bytes([i]))
        seen = set()
        while len(seen) < 3:
            for ch, ev in q.wait(timeout=5):
                assert ev & ml.EV_READ
                seen.add(ch.recv(1))
        assert seen == {b"\0", b"\1", b"\2"}
        for c in clients + served:
            c.close()


def test_channel_timeouts_raise_timeout(ml):
    """set_timeout bounds a blocking recv on a silent peer and a send into a ring the peer does
    not read: each raises Timeout after the bound (not before); None lifts it."""
    import time
    with ml.Fabric() as fab:
        c = fab.channel(kind=ml.MSG, ring_size=4096)
        p = fab.attach(c.token)
        c.set_timeout(recv=0.15, send=0.1)
        t0 = time.monotonic()
        with pytest.raises(ml.Timeout):
            c.recv()
        assert time.monotonic() - t0 >= 0.149
        p.send(b"hi")
        assert c.recv() == b"hi"
        with pytest.raises(ml.Timeout):
            for _ in range(1000):
                c.send(b"x" * 256)
        with pytest.raises(ValueError):
            c.set_timeout(recv=0)
        c.set_timeout()
        with pytest.raises(ml.MemlanError):
            c.send(b"x" * 256, ml.DONTWAIT)
        p.close()
        c.close()


def test_strerror_is_memlans():
    sys.path.insert(0, str(PY))
    os.environ.setdefault("MEMLAN_LIB", str(LIB))
    import memlan
    assert memlan.strerror(-71) == memlan.strerror(71)
    assert "protocol" in memlan.strerror(-71)


def test_examples_echo_by_name(fabric):
    env = env_for(fabric)
    srv = subprocess.Popen([sys.executable, PY / "examples" / "echo_server.py", "py-echo", "2"],
                           env=env, stdout=subprocess.PIPE, text=True)
    assert "serving" in srv.stdout.readline()
    for _ in range(2):
        out = subprocess.run([sys.executable, PY / "examples" / "echo_client.py", "py-echo",
                              "300"], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert "300 round trips by name" in out.stdout
    assert srv.wait(timeout=30) == 0


def test_example_zerocopy(fabric):
    out = subprocess.run([sys.executable, PY / "examples" / "zerocopy.py", "20000"],
                         env=env_for(fabric), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "20000 records read in place" in out.stdout


def test_pip_installs_the_package(tmp_path, fabric):
    pytest.importorskip("setuptools")
    pytest.importorskip("wheel")  # pip builds a wheel even for --target; offline, it must be here
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                        "--no-build-isolation", "--target", tmp_path / "site", PY],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "site" / "memlan" / "__init__.py").exists()
    code = ("import memlan; f = memlan.Fabric(); c = f.channel(); "
            "d = f.attach(c.token); c.send(b'ok'); print(d.recv().decode(), memlan.library_path); "
            "d.close(); c.close(); f.close()")
    env = dict(os.environ, MEMLAN_FABRIC=str(fabric), MEMLAN_LIB=str(LIB),
               PYTHONPATH=str(tmp_path / "site"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         cwd=tmp_path, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ok", str(LIB)]


def test_public_api_has_docstrings_and_type_hints(ml):
    """The issue asks for type hints and docstrings: help(memlan.Channel.recv_into) said nothing
    (16 public methods had no docstring) and send()/recv_into() took untyped buffers."""
    import inspect
    missing = []
    for cname, obj in vars(ml).items():
        if cname.startswith("_") or getattr(obj, "__module__", None) != ml.__name__ or not (
                inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        members = [(cname, obj)] if inspect.isfunction(obj) else [(cname, obj)] + [
            (f"{cname}.{n}", m) for n, m in vars(obj).items() if not n.startswith("_")]
        for qual, m in members:
            fn = m.fget if isinstance(m, property) else m
            if not callable(fn) and not inspect.isclass(fn):
                continue
            if not inspect.getdoc(fn):
                missing.append(qual + ": no docstring")
            if inspect.isfunction(fn):
                sig = inspect.signature(fn)
                for p in list(sig.parameters.values())[1 if "." in qual else 0:]:
                    if p.annotation is inspect.Parameter.empty and p.kind not in (
                            p.VAR_POSITIONAL, p.VAR_KEYWORD):
                        missing.append(f"{qual}({p.name}): no type hint")
                if sig.return_annotation is inspect.Signature.empty:
                    missing.append(qual + ": no return type")
    assert not missing, missing
