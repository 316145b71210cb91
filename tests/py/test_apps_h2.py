# SPDX-License-Identifier: Apache-2.0 OR MIT
"""HTTP/2 and TLS servers and proxies from Debian under `memlan run`, configured as their users
configure them, with both ends under memlan: h2o (`h2o -c CONF -m master`, as Debian's unit runs
it: start_server holds the listeners and execs the worker, which drops to debian-h2o; reloaded
by SIGHUP) serving static files and proxying to a local HTTP/1.1 origin, over TLS (a self-signed
certificate made here) and cleartext (h2c); and nghttpx (master and worker processes, --conf as
its unit runs it) in front of the same origin.  The clients: h2load (many streams on each
connection), nghttp and curl --http2.  Every workload's counts, statuses and bytes are compared
with the same run over kernel TCP, and the memlan logs must say which connections were
accelerated and why the others were not.  Skipped only where a program is not installed
(scripts/install-apps.sh installs them).  Every process is stopped by its PID; every wait is
bounded.
"""
import hashlib
import os
import pwd
import re
import shutil
import signal
import subprocess
import time

import pytest

from conftest import MEMLAN, fabric, logfile, port_free, port_range, pubdir, stop_proc  # noqa: F401 (fixtures)
from test_apps import accelerated, children_of, settle, tcp_reasons, wait_port, wrap

next_port = port_range(27801, 27999, "test_apps_h2")  # no other test's range, below the ephemeral range

PY = "/usr/bin/python3"
BUSY = "no memlan acceptor took the offer within MEMLAN_ACCEPT_WAIT_MS"
DEFER = "the server's listener defers accept until data (TCP_DEFER_ACCEPT)"
LATE = "the server accepted before our offer arrived and refused it"


def have(*progs):
    for p in progs:
        if not shutil.which(p) and not os.path.exists(p):
            pytest.skip(f"{p} is not installed (scripts/install-apps.sh installs it)")


# The origin behind the proxies: python's threading HTTP/1.1 server with keep-alive.  /big?n is n
# bytes made from n, /status/N answers N, POST /up answers its body's length and hash.  Its
# listen backlog is raised from socketserver's 5: with 5, a proxy's burst of new upstream
# connections overflows the accept queue over kernel TCP as well, and h2o answers 502 after its
# 30 s upstream timeout (seen here with and without memlan).
ORIGIN = r"""
import hashlib, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
def blob(n, seed):
    b = hashlib.sha256(seed.encode()).digest() * 64
    return (b * (n // len(b) + 1))[:n]
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def send(self, code, data):
        self.send_response(code)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        p, _, q = self.path.partition("?")
        p = p[6:] if p.startswith("/proxy/") else p  # nghttpx passes the path on whole
        if p == "/big": self.send(200, blob(int(q), q))
        elif p.startswith("/status/"): self.send(int(p[8:]), b"status " + p[8:].encode())
        else: self.send(404, b"")
    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0")); h = hashlib.sha256(); got = 0
        while got < n:
            c = self.rfile.read(min(65536, n - got))
            if not c: break
            h.update(c); got += len(c)
        self.send(200, ("%d %s" % (got, h.hexdigest())).encode())
ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer.request_queue_size = 1024
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def blob(n, seed):
    """ORIGIN's /big?n."""
    b = hashlib.sha256(seed.encode()).digest() * 64
    return (b * (n // len(b) + 1))[:n]


def setup(d, fabric):
    """The files every test serves, a self-signed certificate for 127.0.0.1, and (as root) the
    fabric opened to the user a server drops to, as test_apps.service_dir does."""
    (d / "origin.py").write_text(ORIGIN)
    www = d / "www"
    www.mkdir()
    (www / "small").write_bytes(os.urandom(1000))
    (www / "big").write_bytes(os.urandom(5_000_000))
    (d / "up.bin").write_bytes(os.urandom(3_000_000))
    p = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                        str(d / "key.pem"), "-out", str(d / "cert.pem"), "-days", "2", "-subj",
                        "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    os.chmod(d / "key.pem", 0o644)  # read by the server before it drops to its user, or after
    if os.geteuid() == 0:
        os.chmod(fabric, 0o1777)


def origin(d, log, on):
    port = next_port()
    p = subprocess.Popen(wrap([PY, str(d / "origin.py"), str(port)], log, on),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_port(port, p, 30)
    return p, port


H2O_CONF = """\
{user}pid-file: {d}/h2o.pid
error-log: {d}/h2o.err
access-log: /dev/null
num-threads: 2
listen:
  host: 127.0.0.1
  port: {pc}
listen:
  host: 127.0.0.1
  port: {pt}
  ssl:
    certificate-file: {w}/cert.pem
    key-file: {w}/key.pem
hosts:
  default:
    paths:
      /:
        file.dir: {w}/www
      /proxy:
        proxy.reverse.url: http://127.0.0.1:{po}/
"""


def h2o_user():
    """Debian's h2o.conf says `user: debian-h2o`; as root h2o drops to it (or nobody)."""
    if os.geteuid() != 0:
        return ""
    for u in ("debian-h2o", "nobody"):
        try:
            pwd.getpwnam(u)
            return f"user: {u}\n"
        except KeyError:
            pass
    pytest.skip("no user for h2o to drop to")


class H2o:
    """`h2o -c CONF -m master` (Debian's unit): start_server binds the ports and execs a worker;
    SIGHUP starts a new worker and sends the old one SIGTERM (a graceful shutdown)."""

    def __init__(self, w, base, po, log, on):
        self.base, self.pc, self.pt = base, next_port(), next_port()
        (base / "h2o.conf").write_text(H2O_CONF.format(user=h2o_user(), d=base, w=w, pc=self.pc,
                                                       pt=self.pt, po=po))
        self.p = subprocess.Popen(wrap(["h2o", "-c", str(base / "h2o.conf"), "-m", "master"], log, on),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.pc, self.p, 30)
        wait_port(self.pt, self.p, 30)
        self.wait_ready(1)

    def err(self):
        f = self.base / "h2o.err"
        return f.read_text() if f.exists() else ""

    def workers(self):
        return [int(x) for x in re.findall(r"starting new worker (\d+)", self.err())]

    def wait_ready(self, n, timeout=30):
        end = time.monotonic() + timeout
        while self.err().count("is ready to serve requests") < n:
            assert time.monotonic() < end and self.p.poll() is None, self.err()[-2000:]
            time.sleep(0.05)

    def hup(self, n):
        """SIGHUP; returns once the n-th worker is ready and the old one was told to go."""
        self.p.send_signal(signal.SIGHUP)
        self.wait_ready(n)
        end = time.monotonic() + 30
        while self.err().count("sending TERM to old workers") < n - 1:
            assert time.monotonic() < end, self.err()[-2000:]
            time.sleep(0.05)

    def stop(self):
        stop_proc(self.p)
        for pid in self.workers():  # start_server waits for its workers; make sure
            end = time.monotonic() + 10
            while os.path.exists(f"/proc/{pid}") and time.monotonic() < end:
                time.sleep(0.05)
            if os.path.exists(f"/proc/{pid}") and "h2o" in open(f"/proc/{pid}/cmdline").read():
                os.kill(pid, signal.SIGKILL)


REQS = re.compile(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, "
                  r"(\d+) failed, (\d+) errored, (\d+) timeout")
CODES = re.compile(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx")


def h2load(args, log, on, timeout=120):
    """h2load's (total, started, done, succeeded, failed, errored, timeout), its status-code
    classes and its response-body bytes."""
    p = subprocess.run(wrap(["h2load", *args], log, on), capture_output=True, text=True,
                       timeout=timeout)
    out = p.stdout
    assert p.returncode == 0 and REQS.search(out) and CODES.search(out), (p.returncode, out[-2000:], p.stderr[-2000:])
    data = int(re.search(r"\((\d+)\) data", out).group(1))
    return [int(x) for x in REQS.search(out).groups()], [int(x) for x in CODES.search(out).groups()], data


def fetch(cmd, log, on, timeout=90):
    """A client's exit status and the hash and length of what it printed."""
    p = subprocess.run(wrap(cmd, log, on), capture_output=True, timeout=timeout)
    return p.returncode, len(p.stdout), hashlib.sha256(p.stdout).hexdigest()[:16]


def curl(args, log, on):
    return fetch(["curl", "-sS", "-k", "-m", "60", *args], log, on)


def up_answer(d):
    data = (d / "up.bin").read_bytes()
    return f"{len(data)} {hashlib.sha256(data).hexdigest()}".encode()


def h2_workload(w, log, on, tls, clear, proxy_only=False):
    """The same load through any server that serves www at / (or not: proxy_only) and the origin
    at /proxy/: h2load over TLS and h2c, small and 5 MB files, 3 MB uploads, statuses; curl and
    nghttp bodies by hash.  Returns the results and the number of connections opened."""
    res, conns = [], 0

    def load(*args):
        nonlocal conns
        conns += int(args[args.index("-c") + 1])
        res.append(h2load(list(args), log, on))

    if not proxy_only:
        load("-c", "4", "-m", "32", "-n", "2000", f"{tls}/small", f"{tls}/missing")
        load("-c", "2", "-m", "8", "-n", "24", f"{tls}/big")
        load("-c", "2", "-m", "8", "-n", "24", f"{clear}/big")
    load("-c", "8", "-m", "32", "-n", "2048", f"{tls}/proxy/big?20000", f"{tls}/proxy/status/404",
         f"{tls}/proxy/status/503", f"{tls}/proxy/big?1")
    load("-c", "4", "-m", "16", "-n", "400", f"{clear}/proxy/big?300000")
    load("-c", "2", "-m", "4", "-n", "12", "-d", str(w / "up.bin"), f"{tls}/proxy/up")
    load("-c", "2", "-m", "4", "-n", "12", "-d", str(w / "up.bin"), f"{clear}/proxy/up")
    if not proxy_only:
        res.append(curl(["--http2", f"{tls}/big"], log, on))
        res.append(fetch(["nghttp", f"{tls}/big"], log, on))
        res.append(fetch(["nghttp", f"{clear}/big"], log, on))
        conns += 3
    res.append(curl(["--http2-prior-knowledge", f"{clear}/proxy/big?3000000"], log, on))
    res.append(curl(["--http2", "--data-binary", f"@{w / 'up.bin'}", f"{tls}/proxy/up"], log, on))
    res.append(fetch(["nghttp", "-d", str(w / "up.bin"), f"{tls}/proxy/up"], log, on))
    res.append(fetch(["nghttp", "-d", str(w / "up.bin"), f"{clear}/proxy/up"], log, on))
    return res, conns + 4


def check_workload(res, w, proxy_only=False):
    """What kernel TCP gave must be right too: every request answered, bodies whole."""
    up = hashlib.sha256(up_answer(w)).hexdigest()[:16]
    big = hashlib.sha256((w / "www" / "big").read_bytes()).hexdigest()[:16]
    loads = [r for r in res if isinstance(r[0], list)]
    for reqs, codes, _ in loads:
        assert reqs[0] == reqs[3] + reqs[4] and reqs[6] == 0 and reqs[0] == sum(codes), res
        assert reqs[3] == codes[0] + codes[1], res  # h2load counts a 4xx or 5xx as failed
    i = 0 if proxy_only else 3
    if not proxy_only:
        assert loads[0][0][3] == 1000 and loads[0][1] == [1000, 0, 1000, 0], res  # /missing: 404
        assert loads[1][2] == loads[2][2] == 24 * 5_000_000, res
    assert loads[i][1] == [1024, 0, 512, 512], res  # h2load takes each client's URIs in turn
    assert loads[i][2] == 512 * 20000 + 512 * 1 + 512 * 10 + 512 * 10, res
    assert loads[i + 1][2] == 400 * 300000, res
    assert loads[i + 2][1] == loads[i + 3][1] == [12, 0, 0, 0], res
    tail = res[len(loads):]
    if not proxy_only:
        assert tail[0] == tail[1] == tail[2] == (0, 5_000_000, big), res
        tail = tail[3:]
    assert tail[0] == (0, 3_000_000, hashlib.sha256(blob(3000000, "3000000")).hexdigest()[:16]), res
    assert tail[1][0] == tail[2][0] == tail[3][0] == 0 and tail[1][2] == up, res
    assert tail[2] == tail[3] == tail[1], res


# ---- h2o ---------------------------------------------------------------------------------------

def test_h2o_static_and_proxy_over_tls_and_h2c(fabric, pubdir):
    """h2o as Debian runs it (master mode, 2 threads, dropping to debian-h2o as root) serving a
    1 KB and a 5 MB file and proxying to an HTTP/1.1 origin, over TLS and h2c: h2load with up to
    32 streams per connection (statuses 200/404/503, 3 MB uploads), curl --http2 and nghttp
    bodies by hash.  Everything as over kernel TCP; every client connection accelerated, and
    h2o's upstream connections too (or on TCP while the origin was slow to accept, with the
    reason); a client not under memlan stays on TCP with the reason in h2o's log."""
    have("h2o", "h2load", "nghttp", "curl", "openssl")
    setup(pubdir, fabric)
    res = {}
    for on in (False, True):
        base = pubdir / ("on" if on else "off")
        base.mkdir()
        base.chmod(0o777)
        slog, olog, clog = (logfile(base, n) for n in ("h2o.log", "origin.log", "client.log"))
        o, po = origin(pubdir, olog, on)
        h = None
        try:
            h = H2o(pubdir, base, po, slog, on)
            tls, clear = f"https://127.0.0.1:{h.pt}", f"http://127.0.0.1:{h.pc}"
            res[on], conns = h2_workload(pubdir, clog, on, tls, clear)
            if on:
                c, s, og = clog.read_text(), slog.read_text(), olog.read_text()
                assert tcp_reasons(clog) == [], c[-2000:]
                assert c.count("accelerated (client)") == conns, (conns, c[-2000:])
                assert s.count("accelerated (accepted") == conns, s[-2000:]
                # h2o's upstream connections: accelerated, or on TCP while python was busy
                assert [r for r in tcp_reasons(slog) if BUSY not in r] == [], s[-2000:]
                assert s.count("accelerated (client)") >= 1, s[-2000:]
                assert og.count("accelerated (accepted") == s.count("accelerated (client)"), og[-2000:]
                plain = subprocess.run(["curl", "-sS", "-k", "--http2", f"{tls}/small"],
                                       capture_output=True, timeout=30).stdout
                assert plain == (pubdir / "www" / "small").read_bytes()
                assert any("not memlan" in r for r in tcp_reasons(slog)), s[-2000:]
            assert h.p.poll() is None and o.poll() is None, "a server exited"
        finally:
            if h:
                h.stop()
            stop_proc(o)
        err = (base / "h2o.err").read_text()
        assert "received fatal signal" not in err and not re.search(r"died, status:[^0]", err), err[-2000:]
    check_workload(res[False], pubdir)
    assert res[True] == res[False], res
    settle()


def progress_then(p, pct, action, timeout=60):
    """action() once h2load (started with stdout piped) says pct% done; h2load's output after."""
    out, end = [], time.monotonic() + timeout
    os.set_blocking(p.stdout.fileno(), True)
    while time.monotonic() < end:
        line = p.stdout.readline()
        if not line:
            break
        out.append(line)
        if line.startswith(f"progress: {pct}% done"):
            action()
            break
    rest, err = p.communicate(timeout=timeout)
    return "".join(out) + rest, err


def test_h2o_graceful_restart_under_load(fabric, pubdir):
    """h2o in master mode reloaded by SIGHUP (Debian's ExecReload) while h2load has 8
    connections x 16 streams open through its proxy, twice (TLS, then h2c), and three slow
    downloads of 5 MB (h2c, HTTP/1.1 and TLS) are under way: the old worker sends GOAWAY,
    finishes the streams it took and exits; h2load sees no timeout, no 5xx and whole bodies,
    the slow downloads are whole, and a run after the reloads, served by the new worker, gives kernel TCP's counts.
    The old workers' accelerated connections all end and their fabric files go."""
    have("h2o", "h2load", "openssl")
    setup(pubdir, fabric)
    res = {}
    for on in (False, True):
        base = pubdir / ("on" if on else "off")
        base.mkdir()
        base.chmod(0o777)
        slog, olog, clog = (logfile(base, n) for n in ("h2o.log", "origin.log", "client.log"))
        o, po = origin(pubdir, olog, on)
        h = None
        try:
            h = H2o(pubdir, base, po, slog, on)
            urls = (f"https://127.0.0.1:{h.pt}/proxy/big?20000", f"http://127.0.0.1:{h.pc}/proxy/big?20000")
            # slow downloads that the first worker must finish after it was told to go: h2c
            # and HTTP/1.1 (sendfile) from a file, TLS through the proxy
            # (each into a file: a reader that stops reading meanwhile is the next test's)
            outs = [open(base / f"slow{i}", "w+b") for i in range(3)]
            slow = [subprocess.Popen(wrap(["curl", "-sS", "-k", "-m", "60", "--limit-rate", "2M", *a],
                                          clog, on), stdout=f, stderr=subprocess.PIPE)
                    for f, a in zip(outs, (["--http2-prior-knowledge", f"http://127.0.0.1:{h.pc}/big"],
                                           ["--http1.1", f"http://127.0.0.1:{h.pc}/big"],
                                           ["--http2", f"https://127.0.0.1:{h.pt}/proxy/big?5000000"]))]
            time.sleep(0.3)
            for n, url in enumerate(urls, 2):
                p = subprocess.Popen(wrap(["h2load", "-c", "8", "-m", "16", "-n", "20000", url],
                                          clog, on), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
                try:
                    out, err = progress_then(p, 10, lambda: h.hup(n))
                finally:
                    stop_proc(p, 5)
                assert p.returncode == 0 and REQS.search(out), (out[-2000:], err[-2000:])
                reqs = [int(x) for x in REQS.search(out).groups()]
                codes = [int(x) for x in CODES.search(out).groups()]
                data = int(re.search(r"\((\d+)\) data", out).group(1))
                assert reqs[6] == 0 and reqs[3] >= 2000 and codes[1:] == [0, 0, 0], out[-2000:]
                assert reqs[0] == reqs[3] + reqs[4] and codes[0] == reqs[3], out[-2000:]
                assert data >= 20000 * reqs[3], out[-2000:]
                assert h.err().count("received SIGTERM, gracefully shutting down") >= n - 1
            got = []
            for p, f in zip(slow, outs):
                try:
                    p.communicate(timeout=60)
                finally:
                    stop_proc(p, 5)
                f.seek(0)
                out = f.read()
                f.close()
                got.append((p.returncode, len(out), hashlib.sha256(out).hexdigest()))
            big = hashlib.sha256((pubdir / "www" / "big").read_bytes()).hexdigest()
            assert got == [(0, 5_000_000, big)] * 2 + [
                (0, 5_000_000, hashlib.sha256(blob(5000000, "5000000")).hexdigest())], (on, big, got, h.err()[-2000:])
            end = time.monotonic() + 40  # the old workers finish their streams and exit
            while h.err().count("died, status:0") < 2:
                assert time.monotonic() < end, h.err()[-3000:]
                time.sleep(0.1)
            after = h2load(["-c", "8", "-m", "16", "-n", "4000", urls[0]], clog, on)
            res[on] = after
            if on:
                c, s = clog.read_text(), slog.read_text()
                assert tcp_reasons(clog) == [], c[-2000:]
                assert c.count("accelerated (client)") == 8 * 3 + 3, c[-2000:]
                assert s.count("accelerated (accepted") == 8 * 3 + 3, s[-2000:]
                assert [r for r in tcp_reasons(slog) if BUSY not in r] == [], s[-2000:]
                st = subprocess.run([str(MEMLAN), "stat"], capture_output=True, text=True, timeout=30).stdout
                old = h.workers()[:2]
                assert not [l for l in st.splitlines() if any(f" {pid} yes" in l for pid in old)], st
            assert h.p.poll() is None and o.poll() is None, "a server exited"
        finally:
            if h:
                h.stop()
            stop_proc(o)
        err = (base / "h2o.err").read_text()
        assert "received fatal signal" not in err and err.count("died, status:0") >= 2, err[-2000:]
    assert res[False] == ([4000, 4000, 4000, 4000, 0, 0, 0], [4000, 0, 0, 0], 4000 * 20000), res
    assert res[True] == res[False], res
    settle()


# h2o 2.2.5's HTTP/2 connection, once the second GOAWAY of a graceful shutdown is out and its
# last stream's last frames are queued, starts their write and closes the socket in the same
# call (do_emit_writereq), with what that nonblocking writev did not take still in its buffer:
# the client gets a true prefix and curl says this.  At most the rest of one write buffer.
H2O_SHORT = b"was not closed cleanly before end of the underlying stream"
H2O_WBUF = 131072  # its 80 KiB write buffer, the frame that crosses it, TLS records


def test_h2o_graceful_restart_with_stalled_h2_readers(fabric, pubdir):
    """Six HTTP/2 downloads of 40 MB from h2o (three h2c, three over TLS), each client's output
    a pipe nobody reads for 3 s (a stalled consumer), while h2o is reloaded by SIGHUP.  Some
    may end short, and that is h2o's own defect, not memlan's: h2o 2.2.5 closes an HTTP/2
    connection in graceful shutdown right after a writev that took only part of its last buffer
    (curl: "(18) HTTP/2 stream 1 was not closed cleanly before end of the underlying stream", a
    true prefix; fixed upstream after 2.2.5 by deferring the close while a write is in flight).
    A writev whose last buffer does not fit is common with a 256 KiB ring and rarer with kernel
    TCP's autotuned buffers (MBs), but not absent (a CI run saw one of six short without
    memlan); it is not rare over kernel TCP either once its buffers are the ring's size: run
    without memlan in a network namespace of its own with net.ipv4.tcp_wmem and tcp_rmem capped
    at 128 KiB, 7 of 18 h2c downloads in three runs ended short the same way, and traced (an
    LD_PRELOAD that logs h2o's writev returns and curl's recv), each download's bytes were
    exactly the sum of what h2o's writes returned on its connection, under memlan too.  So in
    both runs each download must be whole, or short by h2o's defect's signature: a true prefix,
    at most one write buffer short (80 KiB; under 128 KiB with the frame that crosses it and
    TLS), with curl's message; over kernel TCP at least three of the six whole.
    Memlan's own part, the bytes a send counted reaching the reader before the end, is
    test_close_right_after_a_partial_send's, exactly."""
    have("h2o", "curl", "openssl")
    setup(pubdir, fabric)
    data = os.urandom(40_000_000)
    (pubdir / "www" / "huge").write_bytes(data)
    res = {}
    for on in (False, True):
        base = pubdir / ("on" if on else "off")
        base.mkdir()
        base.chmod(0o777)
        slog, olog, clog = (logfile(base, n) for n in ("h2o.log", "origin.log", "client.log"))
        o, po = origin(pubdir, olog, on)
        h, ps = None, []
        try:
            h = H2o(pubdir, base, po, slog, on)
            for i in range(6):
                a = ["--http2-prior-knowledge", f"http://127.0.0.1:{h.pc}/huge"] if i % 2 else \
                    ["--http2", f"https://127.0.0.1:{h.pt}/huge"]
                ps.append(subprocess.Popen(wrap(["curl", "-sS", "-k", "-m", "60", *a], clog, on),
                                           stdout=subprocess.PIPE, stderr=subprocess.PIPE))
            time.sleep(0.5)
            h.hup(2)
            time.sleep(2.5)
            got = []
            for p in ps:
                out, err = p.communicate(timeout=60)
                if out == data and p.returncode == 0 and not err:
                    got.append("whole")
                elif (p.returncode == 18 and H2O_SHORT in err and data.startswith(out) and
                      0 < len(data) - len(out) <= H2O_WBUF):
                    got.append("h2o's short close")
                else:
                    got.append((p.returncode, len(out), data.startswith(out), err[-200:]))
            res[on] = got
        finally:
            for p in ps:
                stop_proc(p, 5)
            if h:
                h.stop()
            stop_proc(o)
    settle()  # before the verdict: the fixture finds the fabric clean either way
    # Over kernel TCP too, now and then (a CI run, 2026-11-30: one of six): h2o's defect needs
    # only a writev whose last buffer does not fit, which a loaded machine's smaller windows give.
    assert all(g in ("whole", "h2o's short close") for g in res[False]), res[False]
    assert res[False].count("whole") >= 3, res[False]
    assert all(g in ("whole", "h2o's short close") for g in res[True]), res[True]
    assert accelerated(clog) == 6, clog.read_text()[-2000:]


PARTIAL = r"""
import hashlib, os, select, socket, subprocess, sys, time
CH = 81920  # h2o's write buffer
def blob(n):
    b = hashlib.sha256(b"partial").digest() * 2048
    return (b * (n // len(b) + 1))[:n]
if sys.argv[1] == "server":
    l = socket.create_server(("127.0.0.1", int(sys.argv[2])))
    print("ready", flush=True)
    c, _ = l.accept()
    assert c.recv(100) == b"GET"
    c.setblocking(False)
    data = blob(64 << 20)
    sent, end = 0, time.monotonic() + 20
    while time.monotonic() < end and sent < len(data):
        try:
            n = c.send(data[sent:sent + CH])
        except BlockingIOError:
            select.select([], [c], [], 1)
            continue
        sent += n
        if n < CH:
            break  # a send that took part of the buffer: close at once, the rest dropped
    c.close()
    print(sent, flush=True)
    sys.exit(0)
port = int(sys.argv[1])
srv = subprocess.Popen([sys.executable, __file__, "server", str(port)], stdout=subprocess.PIPE, text=True)
assert srv.stdout.readline() == "ready\n"
c = socket.create_connection(("127.0.0.1", port))
c.sendall(b"GET")
time.sleep(0.5)  # the stalled reader: the writer fills what the connection holds meanwhile
got = bytearray()
end = time.monotonic() + 20
while time.monotonic() < end:
    b = c.recv(1 << 16)
    if not b:
        break
    got += b
sent = int(srv.stdout.readline())
srv.wait(10)
print(sent == len(got), bytes(got) == blob(len(got)), 0 < sent % CH)
"""


def test_close_right_after_a_partial_send(fabric, tmp_path):
    """What h2o 2.2.5 does at the end of a graceful shutdown (the stalled-reader test above),
    reduced: a nonblocking writer sends 80 KB pieces to a reader that does not read for 0.5 s,
    and closes at once after the first send that took only part of its piece.  The reader gets
    exactly the bytes that the sends returned, then EOF, as over kernel TCP: nothing that a send
    counted is lost at the close, and no EOF comes before the ring is empty."""
    (tmp_path / "partial.py").write_text(PARTIAL)
    log = tmp_path / "partial.log"
    out = {}
    for on in (False, True):
        out[on] = [subprocess.run(wrap([PY, str(tmp_path / "partial.py"), str(next_port())], log, on),
                                  capture_output=True, text=True, timeout=60).stdout for _ in range(3)]
    assert out[False] == ["True True True\n"] * 3, out
    assert out[True] == out[False], out
    assert accelerated(log) == 6, log.read_text()
    settle()


PEEK = r"""
import os, signal, socket, subprocess, sys, time
if sys.argv[1] == "server":
    l = socket.create_server(("127.0.0.1", int(sys.argv[2])))
    print("ready", flush=True)
    c, _ = l.accept()
    c.sendall(b"x" * 100)
    c.recv(1)  # the client's word: now die without a close, as a killed origin does
    os.kill(os.getpid(), getattr(signal, sys.argv[3]))
port, sig = int(sys.argv[1]), sys.argv[2]
srv = subprocess.Popen([sys.executable, __file__, "server", str(port), sig], stdout=subprocess.PIPE, text=True)
assert srv.stdout.readline() == "ready\n"
c = socket.create_connection(("127.0.0.1", port))
got = b""
while len(got) < 100:  # the whole answer, and no empty read after it
    got += c.recv(100 - len(got))
c.sendall(b"!")
srv.wait(10)
time.sleep(0.2)  # the kernel's FIN is there
c.setblocking(False)
try:
    print(sig, "peek:", repr(c.recv(1, socket.MSG_PEEK)))
except BlockingIOError:
    print(sig, "peek: EAGAIN")
except OSError as e:
    print(sig, "peek:", e)
"""


def test_nonblocking_peek_sees_a_dead_peer_at_once(fabric, tmp_path):
    """A connection pool's liveness check, reduced: the client reads a whole answer, its peer's
    process dies (SIGKILL, SIGTERM) without a close, and one nonblocking recv(MSG_PEEK) answers
    EOF, as over kernel TCP.  Before, the first empty answer since the data never looked at the
    kernel socket: EAGAIN, and h2o reused the dead connection (the next test)."""
    (tmp_path / "peek.py").write_text(PEEK)
    log = tmp_path / "peek.log"
    out = {}
    for on in (False, True):
        out[on] = [subprocess.run(wrap([PY, str(tmp_path / "peek.py"), str(next_port()), sig], log, on),
                                  capture_output=True, text=True, timeout=60).stdout
                   for sig in ("SIGKILL", "SIGTERM")]
    assert out[False] == ["SIGKILL peek: b''\n", "SIGTERM peek: b''\n"], out
    assert out[True] == out[False], out
    assert accelerated(log) == 4, log.read_text()
    settle()


def test_h2o_proxy_after_its_origin_restarts(fabric, pubdir):
    """h2o keeps its upstream connections to the origin alive in a pool and, before it reuses
    one, peeks at it (recv MSG_PEEK): when the origin was killed (SIGKILL, SIGTERM) and started
    again on its port, the next requests through the proxy are answered 200 over a new
    connection, as over kernel TCP.  Before, the peek answered EAGAIN on the dead peer's
    accelerated connection, h2o sent the request into it and answered 502 (curl: 502 502 502;
    h2load: 26 to 61 of 400 5xx)."""
    have("h2o", "h2load", "curl", "openssl")
    setup(pubdir, fabric)
    res = {}
    for on in (False, True):
        base = pubdir / ("on" if on else "off")
        base.mkdir()
        base.chmod(0o777)
        slog, olog, clog = (logfile(base, n) for n in ("h2o.log", "origin.log", "client.log"))
        o, po = origin(pubdir, olog, on)
        h = None
        try:
            h = H2o(pubdir, base, po, slog, on)
            url = f"http://127.0.0.1:{h.pc}/proxy/big?1000"
            res[on] = []
            for sig in (signal.SIGKILL, signal.SIGTERM):
                res[on].append(h2load(["-c", "8", "-m", "8", "-n", "400", url], clog, on))
                o.send_signal(sig)
                o.wait(10)
                end = time.monotonic() + 10
                while not port_free(po) and time.monotonic() < end:
                    time.sleep(0.05)
                o = subprocess.Popen(wrap([PY, str(pubdir / "origin.py"), str(po)], olog, on),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                wait_port(po, o, 30)
                res[on].append([subprocess.run(wrap(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}",
                                                     url], clog, on), capture_output=True, text=True,
                                               timeout=60).stdout for _ in range(3)])
                res[on].append(h2load(["-c", "8", "-m", "8", "-n", "400", url], clog, on))
            if on:
                s = slog.read_text()
                assert s.count("accelerated (client)") >= 16, s[-2000:]
            assert h.p.poll() is None, "h2o exited"
        finally:
            if h:
                h.stop()
            stop_proc(o)
    assert res[False][1] == ["200"] * 3 and res[False][2][1] == [400, 0, 0, 0], res
    assert res[True] == res[False], res
    settle()


# ---- nghttpx -----------------------------------------------------------------------------------

NGHTTPX_CONF = """\
frontend=127.0.0.1,{pc};no-tls
frontend=127.0.0.1,{pt}
backend=127.0.0.1,{po}
private-key-file={w}/key.pem
certificate-file={w}/cert.pem
errorlog-file={d}/nghttpx.err
accesslog-file=/dev/null
workers=2
"""


def test_nghttpx_in_front_of_an_http1_origin(fabric, pubdir):
    """nghttpx (master and worker process, 2 worker threads, --conf as Debian's unit runs it)
    with a TLS and a cleartext frontend in front of an HTTP/1.1 origin: h2load (statuses, 3 MB
    uploads with -d), curl --http2 --data-binary and nghttp -d, as over kernel TCP.  nghttpx sets
    TCP_DEFER_ACCEPT on its frontends, so its clients stay on TCP with that reason (design.md,
    "Not supported"); its backend connections to the origin are accelerated."""
    have("nghttpx", "h2load", "nghttp", "curl", "openssl")
    setup(pubdir, fabric)
    res = {}
    for on in (False, True):
        base = pubdir / ("on" if on else "off")
        base.mkdir()
        base.chmod(0o777)
        slog, olog, clog = (logfile(base, n) for n in ("nghttpx.log", "origin.log", "client.log"))
        o, po = origin(pubdir, olog, on)
        pc, pt = next_port(), next_port()
        (base / "nghttpx.conf").write_text(NGHTTPX_CONF.format(pc=pc, pt=pt, po=po, w=pubdir, d=base))
        n = subprocess.Popen(wrap(["nghttpx", f"--conf={base / 'nghttpx.conf'}"], slog, on),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_port(pc, n, 30)
            wait_port(pt, n, 30)
            # nghttpx serves no files: its backend is the origin for every path
            res[on], conns = h2_workload(pubdir, clog, on, f"https://127.0.0.1:{pt}",
                                         f"http://127.0.0.1:{pc}", proxy_only=True)
            if on:
                c, s, og = clog.read_text(), slog.read_text(), olog.read_text()
                assert accelerated(clog) == 0 and tcp_reasons(clog) == [DEFER] * conns, c[-2000:]
                assert "TCP_DEFER_ACCEPT set" in s, s[-2000:]
                assert s.count("accelerated (client)") >= 2, s[-2000:]
                assert [r for r in tcp_reasons(slog) if BUSY not in r and DEFER not in r] == [], s[-2000:]
                assert og.count("accelerated (accepted") == s.count("accelerated (client)"), og[-2000:]
            assert n.poll() is None and o.poll() is None, "a server exited"
        finally:
            stop_proc(n)
            stop_proc(o)
    check_workload(res[False], pubdir, proxy_only=True)
    assert res[True] == res[False], res
    settle()


# ---- apache2 with mod_http2 --------------------------------------------------------------------

APACHE_CONF = """\
ServerRoot {d}
PidFile {d}/httpd.pid
ErrorLog {d}/error.log
LogLevel warn
LoadModule mpm_event_module /usr/lib/apache2/modules/mod_mpm_event.so
LoadModule authz_core_module /usr/lib/apache2/modules/mod_authz_core.so
LoadModule mime_module /usr/lib/apache2/modules/mod_mime.so
LoadModule socache_shmcb_module /usr/lib/apache2/modules/mod_socache_shmcb.so
LoadModule ssl_module /usr/lib/apache2/modules/mod_ssl.so
LoadModule http2_module /usr/lib/apache2/modules/mod_http2.so
LoadModule proxy_module /usr/lib/apache2/modules/mod_proxy.so
LoadModule proxy_http_module /usr/lib/apache2/modules/mod_proxy_http.so
TypesConfig /etc/mime.types
{user}StartServers 2
ServerLimit 2
ThreadsPerChild 16
MaxRequestWorkers 32
ServerName localhost
Listen 127.0.0.1:{pc}
Listen 127.0.0.1:{pt} https
Protocols h2 h2c http/1.1
{accept}SSLSessionCache shmcb:{d}/ssl_scache(512000)
DocumentRoot {w}/www
<Directory {w}/www>
  Require all granted
</Directory>
ProxyPass /proxy/ http://127.0.0.1:{po}/
<VirtualHost 127.0.0.1:{pt}>
  SSLEngine on
  SSLCertificateFile {w}/cert.pem
  SSLCertificateKeyFile {w}/key.pem
</VirtualHost>
"""


@pytest.mark.parametrize("accept_filter", ["none", "default"])
def test_apache2_mod_http2(fabric, pubdir, accept_filter):
    """apache2 (event MPM, 2 children of 16 threads, dropping to www-data as root) with mod_http2
    (`Protocols h2 h2c http/1.1`, as `a2enmod http2` sets it), mod_ssl and mod_proxy_http in a
    private config: the h2o workload (files, the origin behind /proxy/, TLS and h2c, 3 MB
    uploads), as over kernel TCP, and a graceful restart (SIGUSR1, Debian's `apachectl
    graceful`) after it.  With `AcceptFilter http none` and `https none` every client connection
    is accelerated; with Apache's default (TCP_DEFER_ACCEPT on Linux) every one is on TCP with
    that reason, and its upstream connections are accelerated either way."""
    have("/usr/sbin/apache2", "/usr/lib/apache2/modules/mod_http2.so", "h2load", "nghttp", "curl", "openssl")
    setup(pubdir, fabric)
    user = "User www-data\nGroup www-data\n" if os.geteuid() == 0 else ""
    accept = "AcceptFilter http none\nAcceptFilter https none\n" if accept_filter == "none" else ""
    res = {}
    for on in (False, True):
        base = pubdir / ("on" if on else "off")
        base.mkdir()
        base.chmod(0o777)
        slog, olog, clog = (logfile(base, n) for n in ("apache.log", "origin.log", "client.log"))
        o, po = origin(pubdir, olog, on)
        pc, pt = next_port(), next_port()
        (base / "httpd.conf").write_text(APACHE_CONF.format(d=base, w=pubdir, pc=pc, pt=pt, po=po,
                                                            user=user, accept=accept))
        a = subprocess.Popen(wrap(["apache2", "-f", str(base / "httpd.conf"), "-DFOREGROUND"], slog, on),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            wait_port(pc, a, 30)
            wait_port(pt, a, 30)
            tls, clear = f"https://127.0.0.1:{pt}", f"http://127.0.0.1:{pc}"
            res[on], conns = h2_workload(pubdir, clog, on, tls, clear)
            before = tcp_reasons(clog) if on else []
            old = set(children_of(a.pid))
            a.send_signal(signal.SIGUSR1)
            end = time.monotonic() + 30
            while "resuming normal operations" not in (base / "error.log").read_text().split("SIGUSR1")[-1]:
                assert time.monotonic() < end and a.poll() is None, (base / "error.log").read_text()[-2000:]
                time.sleep(0.05)
            # The old children end gracefully: h2load's streams on one that was closing errored
            # (336 of 400, over kernel TCP, on a loaded machine: an explorer of flakes).  Wait
            # until they are gone and new ones serve.
            while old & set(children_of(a.pid)) or not children_of(a.pid):
                assert time.monotonic() < end and a.poll() is None, \
                    (base / "error.log").read_text()[-2000:]
                time.sleep(0.05)
            res[on] = (res[on], h2load(["-c", "4", "-m", "16", "-n", "400", f"{tls}/proxy/big?100000"],
                                       clog, on))
            conns += 4
            if on:
                c, s, og = clog.read_text(), slog.read_text(), olog.read_text()
                if accept_filter == "none":
                    # Apache accepts nothing for about 2 s after the graceful restart (its next
                    # maintenance tick forks the new children): h2load's four clients wait in its
                    # accept queue.  Their offers waited 2 s from the connect (0 to 4 of them on
                    # TCP, by how they fell against the tick) until the wait counted from the
                    # accept (MEMLAN_ACCEPT_WAIT_MS; MEMLAN_ACCEPT_QUEUE_MS bounds the queue).
                    # (one client held off a cpu past its offer's wait may go by TCP, as
                    # designed: seen once on a machine loaded by six other processes)
                    late = [r for r in tcp_reasons(clog) if r == LATE]
                    assert before == [] and set(tcp_reasons(clog)) <= {LATE} and len(late) <= 1, \
                        c[-2000:]
                    assert c.count("accelerated (client)") == conns - len(late), (conns, c[-2000:])
                    assert s.count("accelerated (accepted") == conns - len(late), s[-2000:]
                else:
                    assert accelerated(clog) == 0 and tcp_reasons(clog) == [DEFER] * conns, c[-2000:]
                other = [r for r in tcp_reasons(slog) if BUSY not in r and DEFER not in r]
                assert other == [], s[-2000:]
                assert s.count("accelerated (client)") >= 1, s[-2000:]
                assert og.count("accelerated (accepted") == s.count("accelerated (client)"), og[-2000:]
            assert a.poll() is None and o.poll() is None, "a server exited"
        finally:
            stop_proc(a)
            stop_proc(o)
        err = (base / "error.log").read_text()
        assert "exit signal" not in err and "[core:error]" not in err, err[-2000:]
    check_workload(res[False][0], pubdir)
    assert res[False][1] == ([400] * 4 + [0] * 3, [400, 0, 0, 0], 400 * 100000), res
    # (once in a CI run under load, 168 of the 400 requests after the graceful restart errored
    # under memlan; not reproduced since: the logs' ends say more next time)
    assert res[True] == res[False], (res, (base / "error.log").read_text()[-3000:],
                                     clog.read_text()[-4000:], slog.read_text()[-3000:])
    settle()
