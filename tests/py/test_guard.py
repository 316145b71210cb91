# SPDX-License-Identifier: Apache-2.0 OR MIT
"""A fabric file shrunk under a memlan process (src/guard.c, src/preload/sigbus.c).

Anyone who can open a fabric file can ftruncate it; before the guard, the next access of every
process that had it mapped died of SIGBUS (issue 20, item 2).  Now such a connection ends with an
error and the processes live on; and the guard's handler, which is in the kernel from the first
accelerated connection on, leaves every other SIGBUS exactly as the program set it up.
"""
import os
import struct
import subprocess
import sys
import time

import pytest

from conftest import BUILD, MEMLAN
from test_preload import next_port, scripted, settle

PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
SIGBUSCONF = BUILD / "tests-preload" / "sigbusconf"


def test_sigbus_dispositions_match_kernel(fabric, tmp_path):
    """The program's SIGBUS handler (siginfo code and address, a sent SIGBUS, SA_RESETHAND,
    signal(), SIG_IGN) and the default action (a fault, a sent signal) with an accelerated
    connection open: line for line as over kernel TCP."""
    plain, under, text = scripted(SIGBUSCONF, tmp_path)
    assert plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    assert "FAIL" not in plain.stdout
    # the plain run says what the kernel does: the comparison means something
    assert "B handler runs 1, code BUS_ADRERR, address the access's" in plain.stdout
    assert "D one-shot handler runs 3, then: default" in plain.stdout, plain.stdout
    assert "G child's fault: 1007" in plain.stdout and "G child sent SIGBUS: 1007" in plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines()
    assert "accelerated (client)" in text, text  # the guard's handler was in the kernel
    settle(fabric)


SERVER = r"""
import socket, sys
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", int(sys.argv[1]))); l.listen(8)
print("ready", flush=True)
for _ in range(2):
    c, _ = l.accept()
    try:
        while True:
            b = c.recv(65536)
            if not b:
                break
            c.sendall(b)
    except OSError as e:
        print("server:", type(e).__name__, flush=True)
    c.close()
print("server done", flush=True)
"""

CLIENT = r"""
import socket, sys, time
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
c.settimeout(20)
blob = bytes(range(256)) * 256
def round_trip():
    c.sendall(blob)
    got = b""
    while len(got) < len(blob):
        b = c.recv(65536)
        if not b:
            raise EOFError
        got += b
    assert got == blob
round_trip()
print("streaming", flush=True)
sys.stdin.readline()          # the test shrinks every fabric file now
end = "no error"
try:
    for _ in range(200):
        round_trip()
except (OSError, EOFError, AssertionError) as e:
    end = type(e).__name__
print("client:", end, flush=True)
c.close()
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))   # the server still serves
c.settimeout(20)
round_trip()
print("second connection ok", flush=True)
"""


def test_shrunk_fabric_files_end_connections_not_processes(fabric, tmp_path):
    """Every file of the fabric cut to nothing while an accelerated connection streams: the
    connection ends with an error, no process dies of a signal, and the server serves the next
    client (before the guard both died of SIGBUS)."""
    port = next_port()
    log = tmp_path / "memlan.log"
    run = [str(MEMLAN), "run", "--log", str(log), "--", PY, "-c"]
    srv = subprocess.Popen(run + [SERVER, str(port)], stdout=subprocess.PIPE, text=True)
    cli = None
    try:
        assert srv.stdout.readline() == "ready\n"
        cli = subprocess.Popen(run + [CLIENT, str(port)], stdout=subprocess.PIPE,
                               stdin=subprocess.PIPE, text=True)
        assert cli.stdout.readline() == "streaming\n"
        assert "accelerated (client)" in log.read_text()
        cut = 0
        for name in os.listdir(fabric):
            try:
                os.truncate(fabric / name, 0)
                cut += 1
            except OSError:
                pass  # a FIFO or a file that went meanwhile
        assert cut > 0
        cli.stdin.write("go\n")
        cli.stdin.flush()
        out, _ = cli.communicate(timeout=60)
        assert cli.returncode == 0, (cli.returncode, out)  # -7 was SIGBUS
        assert "client: no error" not in out, out  # the stream cannot have gone on unharmed
        assert "second connection ok" in out, out
        sout, _ = srv.communicate(timeout=30)
        assert srv.returncode == 0, (srv.returncode, sout)
        assert "server done" in sout
    finally:
        for p in (cli, srv):
            if p and p.poll() is None:
                p.kill()
                p.wait()
    settle(fabric)


SYSCALL_SERVER = r"""
import errno, os, socket, sys
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", int(sys.argv[1]))); l.listen(8)
print("ready", flush=True)
c, _ = l.accept()
how = sys.argv[2]
if how == "splice":   # the bytes wait in the ring: splice() looks at them there
    while not c.recv(1, socket.MSG_PEEK):
        pass
print("accepted", flush=True)
sys.stdin.readline()          # the test cut the rings off the channel's file now
r, w = os.pipe()
f = os.open(sys.argv[3], os.O_RDONLY)
try:
    if how == "splice":
        n = os.splice(c.fileno(), w, 65536)
    elif how == "sendfile":
        n = os.sendfile(c.fileno(), f, 0, 65536)
    else:                     # splice from a pipe into the socket: read into the ring
        os.write(w, b"y" * 1000)
        n = os.splice(r, c.fileno(), 1000)
    print("result", n, flush=True)
except OSError as e:
    print("result", errno.errorcode.get(e.errno, e.errno), flush=True)
c.close()
"""

SYSCALL_CLIENT = r"""
import socket, sys, time
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
c.sendall(b"x" * 1000)
print("sent", flush=True)
sys.stdin.readline()
c.close()
"""


@pytest.mark.parametrize("how", ["splice", "sendfile", "splice-to"])
def test_shrunk_ring_in_a_system_call_is_not_efault(fabric, tmp_path, how):
    """The channel's file cut back to its first page (its rings gone) while the server holds
    the connection; then the server moves bytes with a call that memlan carries out as a system
    call on ring memory: splice(socket -> pipe) writes to the pipe from the ring, sendfile reads
    the file into the ring, splice(pipe -> socket) reads the pipe into the ring.  The kernel
    cannot fault those in and answers EFAULT, which the program must never see (none of its
    buffers was involved): the connection ends (ECONNRESET; sendfile's bytes are "sent" once
    after the end, as TCP takes a write after a reset), as a user-space access to the same
    memory does through the guard.  Before: EFAULT reached the program, in all three."""
    port = next_port()
    data = tmp_path / "data"
    data.write_bytes(b"z" * 65536)
    log = tmp_path / "memlan.log"
    run = [str(MEMLAN), "run", "--log", str(log), "--", PY, "-c"]
    srv = subprocess.Popen(run + [SYSCALL_SERVER, str(port), "to" if how == "splice-to" else how,
                                  str(data)],
                           stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True)
    cli = None
    try:
        assert srv.stdout.readline() == "ready\n"
        cli = subprocess.Popen(run + [SYSCALL_CLIENT, str(port)], stdout=subprocess.PIPE,
                               stdin=subprocess.PIPE, text=True)
        assert cli.stdout.readline() == "sent\n"
        assert srv.stdout.readline() == "accepted\n"
        assert "accelerated (accepted" in log.read_text()
        cut = 0
        for name in os.listdir(fabric):
            p = fabric / name
            with open(p, "rb") as fh:
                h = fh.read(128)
            if len(h) == 128 and h[:8] == b"MEMLANSG" and struct.unpack_from("<I", h, 24)[0] == 2:
                os.truncate(p, 4096)  # the header page stays: the rings go
                cut += 1
        assert cut == 1
        srv.stdin.write("go\n")
        srv.stdin.flush()
        out, _ = srv.communicate(timeout=60)
        assert srv.returncode == 0, (srv.returncode, out)
        assert "result EFAULT" not in out, out
        # sendfile after the end is "sent" once, as over TCP (the peer's kernel answers it with
        # a reset), so its answer may be the count
        ok = ["result ECONNRESET"] + (["result 65536"] if how == "sendfile" else [])
        assert out.strip() in ok, out
        cli.stdin.write("done\n")
        cli.stdin.flush()
        cli.communicate(timeout=30)
    finally:
        for p in (cli, srv):
            if p and p.poll() is None:
                p.kill()
                p.wait()
    settle(fabric)
