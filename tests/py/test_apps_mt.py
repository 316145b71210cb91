# SPDX-License-Identifier: Apache-2.0 OR MIT
"""Multi-threaded real programs under `memlan run` (issue 18), from Debian's packages
(scripts/install-apps.sh installs them): libzmq through python3-zmq, gRPC through python3-grpcio
and through PyPI's grpcio, and MariaDB's thread-per-connection server with mariadb-slap.

These are the programs whose readiness patterns memlan once broke: libzmq's I/O thread received
memlan's internal epoll events and crashed; grpcio adds a socket to an epoll set while another
thread already sleeps in epoll_wait on it, and never connected; MariaDB's client and server
threads each poll before every read, and hung until their timeout.  Both ends run under memlan,
every answer is checked, every connection must be accelerated (a silent fall-back to TCP fails),
every process must exit 0, and every wait is bounded.
"""
import hashlib
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from conftest import logfile, port_free
from test_apps import accelerated, need, run, service_dir, settle, tcp_reasons, wait_port, wrap

HERE = pathlib.Path(__file__).resolve().parent
PY = "/usr/bin/python3"  # Debian's python3-zmq and python3-grpcio are built for it
PORT = [19400]  # 19401-19599: no other test's range, below the ephemeral range (32768-60999)


def next_port(n=1):
    """The first of n free ports in a row."""
    while True:
        PORT[0] += 1
        assert PORT[0] + n <= 19600, "test_apps_mt ran out of its ports"
        if all(port_free(PORT[0] + i, strict=True) for i in range(n)):
            PORT[0] += n - 1
            return PORT[0] - n + 1


def need_py(module):
    if not os.path.exists(PY):
        pytest.skip(f"{PY} is missing")
    if subprocess.run([PY, "-c", f"import {module}"], capture_output=True, timeout=60).returncode:
        pytest.fail(f"{PY} cannot import {module}: run scripts/install-apps.sh (make test does)")


class Proc:
    """A program under memlan run in the background, its output in a file, stopped by its PID."""

    def __init__(self, cmd, log, out):
        self.out = out
        with open(out, "w") as f:
            self.p = subprocess.Popen(wrap(cmd, log), stdout=f, stderr=subprocess.STDOUT)

    def text(self):
        return self.out.read_text()

    def wait_for(self, what, timeout=30.0):
        end = time.time() + timeout
        while time.time() < end:
            if what in self.text():
                return
            assert self.p.poll() is None, f"exited {self.p.returncode} before {what!r}:\n{self.text()}"
            time.sleep(0.05)
        raise AssertionError(f"no {what!r} in {timeout} s:\n{self.text()}")

    def wait(self, timeout=60):
        try:
            rc = self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"still running after {timeout} s:\n{self.text()}")
        assert rc == 0, f"exited {rc}:\n{self.text()}"
        return self.text()

    def kill_after(self, what):
        """SIGKILL once the output says what."""
        self.wait_for(what)
        self.kill()
        assert self.p.returncode == -signal.SIGKILL, self.p.returncode

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


# ---- libzmq ------------------------------------------------------------------------------------

def zmq_pair(tmp_path, server, client, n, k=None, ports=1):
    """server and client roles of apps_zmq.py, each under memlan: both exit 0, and the
    connections are all accelerated at both ends.  Returns the two logs."""
    port = next_port(ports)
    slog, clog = tmp_path / f"{server}.log", tmp_path / f"{client}.log"
    extra = [str(k)] if k else []
    srv = Proc([PY, str(HERE / "apps_zmq.py"), server, str(port), str(n)] + extra, slog,
               tmp_path / f"{server}.out")
    try:
        for p in range(port, port + ports):
            wait_port(p, srv.p)
        out = run([PY, str(HERE / "apps_zmq.py"), client, str(port), str(n)] + extra, clog,
                  timeout=90)
        assert out.split()[0] == "ok", out
        srv.wait(30)
    finally:
        srv.kill()
    conns = ports * (k or 1)
    assert accelerated(clog) == conns and accelerated(slog) == conns, \
        (clog.read_text(), slog.read_text())
    assert tcp_reasons(clog) == [] and tcp_reasons(slog) == []
    return slog, clog


def test_zmq_req_rep(fabric, tmp_path):
    need_py("zmq")
    zmq_pair(tmp_path, "rep", "req", 2000)
    settle()


def test_zmq_pub_sub(fabric, tmp_path):
    need_py("zmq")
    zmq_pair(tmp_path, "pub", "sub", 5000, ports=2)  # the data, and the slow joiner's handshake
    settle()


def test_zmq_router_dealers(fabric, tmp_path):
    need_py("zmq")
    zmq_pair(tmp_path, "router", "dealers", 300, k=6)
    settle()


def test_zmq_peer_killed(fabric, tmp_path):
    """A DEALER killed with SIGKILL mid-stream: its ROUTER goes on and serves the next client.
    Then that ROUTER is killed mid-stream: its client reconnects (libzmq does, on its own) to a
    new ROUTER on the same port, accelerated again, and finishes."""
    need_py("zmq")
    prog = [PY, str(HERE / "apps_zmq.py")]
    port = next_port()
    elog, klog = tmp_path / "echo.log", tmp_path / "stream.log"
    echo = Proc(prog + ["echo", str(port), "0"], elog, tmp_path / "echo.out")
    procs = [echo]
    try:
        wait_port(port, echo.p)
        victim = Proc(prog + ["stream", str(port), "0"], klog, tmp_path / "stream.out")
        procs.append(victim)
        victim.kill_after("got 500")
        plog = tmp_path / "pirate.log"
        out = run(prog + ["pirate", str(port), "300"], plog, timeout=90)
        assert "ok 300 " in out, out
        assert "quit after" in echo.wait(30)
        assert accelerated(klog) == 1 and accelerated(plog) == 1 and accelerated(elog) == 2

        # Now the server dies under a client.
        port = next_port()
        e1log, e2log, plog = tmp_path / "echo1.log", tmp_path / "echo2.log", tmp_path / "pirate2.log"
        first = Proc(prog + ["echo", str(port), "0"], e1log, tmp_path / "echo1.out")
        procs.append(first)
        wait_port(port, first.p)
        client = Proc(prog + ["pirate", str(port), "1500"], plog, tmp_path / "pirate2.out")
        procs.append(client)
        first.kill_after("served 300")
        second = Proc(prog + ["echo", str(port), "0"], e2log, tmp_path / "echo2.out")
        procs.append(second)
        out = client.wait(90)
        assert "ok 1500" in out, out
        assert "quit after" in second.wait(30)
        assert accelerated(e1log) == 1 and accelerated(e2log) == 1, (e1log.read_text(), e2log.read_text())
        # The client's first connection and its reconnection; the attempts in between, while
        # nothing listened, were refused.
        assert accelerated(plog) == 2, plog.read_text()
    finally:
        for p in procs:
            p.kill()
    settle()


# ---- gRPC --------------------------------------------------------------------------------------

@pytest.mark.parametrize("dist", ["debian", "pypi"])
def test_grpc(fabric, tmp_path, dist):
    """debian: python3-grpcio (1.51 in bookworm), whose poller is driven by the application's
    threads.  pypi: grpcio as pip installs it (install-apps.sh does, for the suite's python),
    whose EventEngine poller thread sleeps in epoll_wait while another thread adds the new
    connection: the pattern with which grpcio never connected (issue 18 item 3)."""
    if dist == "debian":
        py = PY
        need_py("grpc")
    else:
        py = sys.executable
        if os.path.realpath(py) == os.path.realpath(PY):
            pytest.skip("the suite runs under Debian's python: no grpcio of PyPI's beside it")
        if subprocess.run([py, "-c", "import grpc"], capture_output=True, timeout=60).returncode:
            # install-apps.sh (make test runs it) installs it with pip, which needs PyPI: a
            # machine that cannot reach it skips this case, and says so in pytest's summary.
            pytest.skip(f"{py} cannot import grpc: PyPI's grpcio is not installed (pip in "
                        "scripts/install-apps.sh failed or was not run)")
    port = next_port()
    slog, clog = tmp_path / "server.log", tmp_path / "client.log"
    srv = Proc([py, str(HERE / "apps_grpc.py"), "server", str(port)], slog, tmp_path / "server.out")
    try:
        srv.wait_for("listening")
        t0 = time.time()
        out = run([py, str(HERE / "apps_grpc.py"), "client", str(port), "300"], clog, timeout=90)
        assert "ok 300 1500" in out, out
        assert "stopped" in srv.wait(30)
        print(f"grpc {dist}: {out.splitlines()[0]}, all done in {time.time() - t0:.2f} s")
    finally:
        srv.kill()
    # The first channel's connection, and one for each of the client's 4 threads.
    assert accelerated(clog) == 5 and accelerated(slog) == 5, \
        (clog.read_text(), slog.read_text())
    assert tcp_reasons(clog) == [] and tcp_reasons(slog) == []
    settle()


# ---- MariaDB -----------------------------------------------------------------------------------

def test_mariadb_slap(fabric, tmp_path):
    """mariadbd as Debian runs it (started as root, --user=mysql) on a private datadir and
    port; mariadb-slap's concurrent clients and the mariadb client, all under memlan."""
    need("mariadbd", "mariadb-install-db", "mariadb", "mariadb-slap")
    with service_dir(fabric, tmp_path, "mysql") as (work, root):
        mariadb_run(work, ["--user=mysql"] if root else [])
    settle()


def mariadb_run(work, user):
    data, sock = work / "data", work / "sock"
    subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={data}", "--skip-test-db",
                    "--auth-root-authentication-method=socket"] + user,
                   check=True, capture_output=True, timeout=120)
    port = next_port()
    slog, clog = logfile(work, "server.log"), logfile(work, "client.log")  # mysql writes them too
    srv = Proc(["mariadbd", "--no-defaults", f"--datadir={data}", "--bind-address=127.0.0.1",
                f"--port={port}", f"--socket={sock}", f"--pid-file={work}/pid",
                f"--log-error={work}/error.log", "--innodb-buffer-pool-size=32M",
                "--max-connections=50"] + user, slog, work / "server.out")
    try:
        wait_port(port, srv.p, timeout=60)
        # The test's user, made over the Unix socket by a plain client (root logs in by socket).
        subprocess.run(["mariadb", "--no-defaults", "-S", str(sock), "-u", "root", "-e",
                        "CREATE USER 'slap'@'127.0.0.1' IDENTIFIED BY 'slap-pw'; "
                        "GRANT ALL ON *.* TO 'slap'@'127.0.0.1'; CREATE DATABASE t;"],
                       check=True, capture_output=True, timeout=60)
        cli = ["mariadb", "--no-defaults", "-h", "127.0.0.1", "-P", str(port), "-u", "slap",
               "-pslap-pw", "-N", "-B", "t"]
        rows = [(i, hashlib.sha256(b"%d" % i).hexdigest() * (1 + i % 50)) for i in range(400)]
        sql = "CREATE TABLE r (id INT PRIMARY KEY, v MEDIUMTEXT);\n" + "".join(
            f"INSERT INTO r VALUES ({i}, '{v}');\n" for i, v in rows)
        run(cli, clog, input=sql, timeout=60)
        got = run(cli + ["-e", "SELECT id, v FROM r ORDER BY id"], clog, timeout=60)
        assert got == "".join(f"{i}\t{v}\n" for i, v in rows)
        # 3 MB in one answer: a dozen ring turns.
        got = run(cli + ["-e", "SELECT REPEAT('ab', 1500000)"], clog, timeout=60)
        assert got == "ab" * 1500000 + "\n"
        before = accelerated(clog)
        assert before == 3 and accelerated(slog) == 3, (clog.read_text(), slog.read_text())

        t0 = time.time()
        out = run(["mariadb-slap", "--no-defaults", "-h", "127.0.0.1", "-P", str(port), "-u", "slap",
                   "-pslap-pw", "--concurrency=16", "--iterations=3", "--number-of-queries=4000",
                   "--auto-generate-sql", "--auto-generate-sql-load-type=mixed",
                   "--auto-generate-sql-add-autoincrement", "--create-schema=slap"],
                  clog, timeout=120)
        print(f"mariadb-slap: {time.time() - t0:.2f} s")
        assert "Number of clients running queries: 16" in out, out
        assert "Average number of queries per client: 250" in out, out
        # 16 connections an iteration, and more for the schema: every one accelerated.
        n = accelerated(clog) - before
        assert n >= 48 and accelerated(slog) == 3 + n, (clog.read_text(), slog.read_text())
        assert tcp_reasons(clog) == [] and tcp_reasons(slog) == []
        srv.p.terminate()
        srv.wait(60)
        err = (work / "error.log").read_text()
        assert "Shutdown complete" in err and "[ERROR]" not in err, err[-3000:]
    finally:
        srv.kill()
