# SPDX-License-Identifier: Apache-2.0 OR MIT
"""Issue 20 item 5: a connection whose two ends decided differently (one reads the ring, the
other talks TCP) ends, on both sides, instead of leaving both waiting for ever.

1. garbage in the attached word after the acceptor claimed the offer: the client reads it, gives
   the channel up and settles on TCP, while the acceptor (accelerated) reads the ring.  The
   acceptor speaks first (into the ring), the client waits for it over TCP.  Before the fix both
   waited for ever; now the client publishes its side reset, the acceptor's recv fails with
   ECONNRESET, its close reaches the client over TCP.
2. bytes on the kernel socket under an accelerated connection (a peer that writes by a raw
   system call, as one that settled on TCP does): the reader blocked on the ring sees them at its
   liveness check and reports a reset instead of waiting for ever.
"""
import os
import struct
import subprocess
import sys
import time

from conftest import MEMLAN
from test_preload import next_port, settle

PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable

SERVER = r"""
import socket, sys
P, first = int(sys.argv[1]), sys.argv[2]
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", P)); ls.listen(4)
print("ready", flush=True)
c, _ = ls.accept()
print("accepted", flush=True)
if first == "speak":
    c.sendall(b"banner")
try:
    while True:
        d = c.recv(64)
        print("S got", d, flush=True)
        if not d:
            break
except OSError as e:
    print("S error", e.errno, flush=True)
c.close()
print("S done", flush=True)
"""

CLIENT = r"""
import ctypes, socket, sys
P, mode = int(sys.argv[1]), sys.argv[2]
c = socket.create_connection(("127.0.0.1", P))
if mode == "raw":
    c.sendall(b"a")                      # settles the connection: accelerated
print("connected", flush=True)
sys.stdin.readline()
if mode == "raw":
    libc = ctypes.CDLL(None, use_errno=True)
    n = libc.syscall(1, c.fileno(), b"zz", 2)   # SYS_write, around memlan: the kernel socket
    print("C raw", n, flush=True)
try:
    while True:
        d = c.recv(64)
        print("C got", d, flush=True)
        if not d:
            break
except OSError as e:
    print("C error", e.errno, flush=True)
print("C done", flush=True)
"""

ATTACHED_OFF = 128 + 40          # struct ml_chan_hdr at 128, attached after 40 bytes


def channels(fabric):
    out = []
    for name in os.listdir(fabric):
        if not name.startswith("seg-"):
            continue
        with open(os.path.join(fabric, name), "rb") as f:
            hdr = f.read(32)
        if len(hdr) == 32 and struct.unpack_from("<I", hdr, 24)[0] == 2:   # ML_KIND_CHANNEL
            out.append(os.path.join(fabric, name))
    return out


def run(fabric, tmp_path, first, mode, vandal):
    (tmp_path / "server.py").write_text(SERVER)
    (tmp_path / "client.py").write_text(CLIENT)
    p = next_port()
    log = tmp_path / "memlan.log"
    run = [str(MEMLAN), "run", "--log", str(log), "--", PY]
    srv = subprocess.Popen(run + [str(tmp_path / "server.py"), str(p), first],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cli = None
    try:
        assert srv.stdout.readline() == "ready\n"
        cli = subprocess.Popen(run + [str(tmp_path / "client.py"), str(p), mode],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        assert cli.stdout.readline() == "connected\n"
        assert srv.stdout.readline() == "accepted\n"
        time.sleep(0.2)
        if vandal:
            chans = channels(fabric)
            assert chans, os.listdir(fabric)
            for path in chans:
                with open(path, "r+b") as f:
                    f.seek(ATTACHED_OFF)
                    f.write(struct.pack("<I", 7))
        cli.stdin.write("go\n")
        cli.stdin.flush()
        # Both must end: before the fix neither did.
        try:
            srv.wait(timeout=15)
            cli.wait(timeout=15)
        except subprocess.TimeoutExpired:
            raise AssertionError("split-brain: a side still waits (server %s, client %s)\n%s"
                                 % (srv.poll(), cli.poll(), log.read_text()))
        # (readline buffered part of stdout: read the rest from the same file objects)
        sout, serr = srv.stdout.read(), srv.stderr.read()
        cout, cerr = cli.stdout.read(), cli.stderr.read()
        assert srv.returncode == 0 and cli.returncode == 0, serr + cerr
        return sout, cout, log.read_text()
    finally:
        for pr in (srv, cli):
            if pr and pr.poll() is None:
                pr.kill()
                pr.wait()
        settle(fabric)


def test_garbage_attach_word_after_the_claim_ends_both_sides(fabric, tmp_path):
    sout, cout, text = run(fabric, tmp_path, "speak", "tcp", vandal=True)
    assert "accelerated (accepted" in text, text
    assert "attach word is corrupt" in text, text
    # The acceptor's recv reports the reset; the client reads the end over TCP.
    assert "S error 104" in sout, sout
    assert "C done" in cout, cout


def test_bytes_on_the_kernel_socket_end_a_reader_of_the_ring(fabric, tmp_path):
    sout, cout, text = run(fabric, tmp_path, "listen", "raw", vandal=False)
    assert "accelerated (client)" in text, text
    assert "S got b'a'" in sout, sout
    assert "S error 104" in sout, sout
    assert "C raw 2" in cout and "C done" in cout, cout
