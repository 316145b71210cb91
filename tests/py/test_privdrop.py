"""Servers that change their credentials, configured as distributions ship them, under memlan.

nginx's master stays root and its workers run as `nobody`; rsync's daemon forks a child per
connection that runs as `nobody`; OpenSSH's sshd hands each connection to a privilege-separated
child that chroots, drops to its own user and confines itself with a seccomp sandbox.  None of
them may make a peer wait, crash, or lose a byte under memlan: a process that can no longer use
the (per-user) fabric says so once, its listeners' new connections are plain TCP decided at once
(the client does not offer), and its accelerated connections still see their peer's death.

Needs root (the servers drop from root to `nobody`): skipped otherwise.  Every server runs on a
loopback test port, every process is stopped by its PID, every loop is bounded.
"""
import hashlib
import json
import os
import pathlib
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

from conftest import MEMLAN
from test_apps import NGINX_CONF, Server, need, next_port, run, settle, tcp_reasons, wait_port, wrap

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the servers drop from root: needs root")

# The rule's reason, as the logs and memlan stat give it.
CRED = "changed its credentials"


@pytest.fixture
def pubdir():
    """A directory that an unprivileged account can read (pytest's tmp_path is 0700)."""
    d = pathlib.Path(tempfile.mkdtemp(prefix="memlan-priv-"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def stalls(times, bound=0.5):
    return [t for t in times if t > bound]


# ---- nginx: a root master, two workers as nobody -----------------------------------------------


# One connection per request, as a browser's first visit or a health check makes them.
CURL_LOOP = r"""
import subprocess, sys, time
url, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
end = time.time() + 60
for i in range(n):
    p = subprocess.run(["curl", "-sf", "-o", out, "-w", "%{time_total}\n", url],
                       capture_output=True, text=True, timeout=30)
    print(p.returncode, p.stdout.strip(), flush=True)
    if p.returncode != 0 or float(p.stdout or 9) > 0.5 or time.time() > end:
        break   # the first stall is enough: on the old code each one costs 2 s
"""


def test_nginx_workers_as_nobody(fabric, tmp_path, pubdir):
    need("nginx", "curl", "wrk")
    pwd.getpwnam("nobody")
    (pubdir / "www").mkdir()
    data = os.urandom(64 << 10)
    (pubdir / "www" / "f.bin").write_bytes(data)
    for p in (pubdir / "www", pubdir / "www" / "f.bin"):
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    port, p2 = next_port(), next_port()
    conf = pubdir / "nginx.conf"
    conf.write_text(NGINX_CONF.format(d=pubdir, p1=port, p2=p2, user="user nobody nogroup;"))
    slog, clog = tmp_path / "server.log", tmp_path / "client.log"
    srv = Server(["nginx", "-c", str(conf), "-p", str(pubdir)], port, slog)
    try:
        wait_port(p2, srv.p)
        time.sleep(0.3)  # the workers start and drop to nobody
        url = f"http://127.0.0.1:{port}/f.bin"
        script = tmp_path / "loop.py"
        script.write_text(CURL_LOOP)
        n = 40
        out = run(["python3", str(script), url, str(n), str(tmp_path / "got")], clog)
        rows = [l.split() for l in out.splitlines()]
        assert len(rows) == n and all(r[0] == "0" for r in rows), out
        times = [float(r[1]) for r in rows]
        assert stalls(times) == [], f"requests that waited for an acceptor: {times}"
        assert (tmp_path / "got").read_bytes() == data
        # The reason, on both ends: the worker's log once, each client connection without offer.
        s, c = slog.read_text(), clog.read_text()
        assert CRED in s, s[-3000:]
        assert "could not refuse the offer" not in s, s[-3000:]
        assert all(CRED in r for r in tcp_reasons(clog)) and len(tcp_reasons(clog)) >= n, c[-3000:]
        assert "offer posted" not in c, c[-3000:]
        # Concurrent keep-alive load: every request answered, no timeouts.
        out = run(["wrk", "-t", "1", "-c", "8", "-d", "1s", "--timeout", "1s", url], clog)
        assert "Non-2xx" not in out and "Socket errors" not in out, out
        assert int(re.search(r"(\d+) requests in", out).group(1)) > 0
        # memlan stat shows why a live connection of that server is on TCP.
        holder = subprocess.Popen(wrap(["python3", "-c", HOLD, str(port)], clog),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline().startswith("HTTP/1.1 200"), "no answer"
            st = json.loads(subprocess.run([str(MEMLAN), "stat", "--json"], capture_output=True,
                                           text=True, timeout=30, check=True).stdout)
            details = [c["detail"] for c in st.get("connections", [])]
            assert any(CRED in d for d in details), st
        finally:
            holder.stdin.close()
            holder.wait(10)
    finally:
        srv.stop()
    settle()


# A client that keeps one connection open until told to go.
HOLD = r"""
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"GET /f.bin HTTP/1.1\r\nHost: x\r\n\r\n")
print(s.recv(100).decode().splitlines()[0], flush=True)
sys.stdin.read()
"""
