# SPDX-License-Identifier: Apache-2.0 OR MIT
"""A fabric file shrunk under a memlan process (src/guard.c, src/preload/sigbus.c).

Anyone who can open a fabric file can ftruncate it; before the guard, the next access of every
process that had it mapped died of SIGBUS (issue 20, item 2).  Now such a connection ends with an
error and the processes live on; and the guard's handler, which is in the kernel from the first
accelerated connection on, leaves every other SIGBUS exactly as the program set it up.
"""
import os
import subprocess
import sys
import time

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
