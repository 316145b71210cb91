# SPDX-License-Identifier: Apache-2.0 OR MIT
"""Caching and forwarding proxies under `memlan run`, as Debian ships them: squid (root dropping
to its cache_effective_user proxy, its unlinkd and pinger helpers, a ufs disk cache; started as
systemd starts it, and as `squid -N`), and privoxy (root dropping to its user privoxy), in front
of a Python origin under memlan, driven by curl and a python client under memlan: GETs of 1 KB to
6 MB (a disk-cache hit among them), keep-alive reuse, CONNECT tunnels, POST uploads of several
MB, a body larger than the origin reads, 12 concurrent clients, a reconfigure in the middle of a
load, and a graceful shutdown in the middle of a slow transfer.  Every workload's bytes and
statuses are compared with the same run over kernel TCP, and the memlan logs with the path each
connection took.  Every process is stopped by its PID; every wait is bounded.
"""
import grp
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

from conftest import MEMLAN, as_user, port_range, stop_proc, pubdir  # noqa: F401 (fixture)
from test_apps import settle, tcp_reasons, wait_port, wrap

next_port = port_range(27601, 27799, "test_apps_proxy")  # no other test's range, below the ephemeral range

PY = "/usr/bin/python3"
CLIENT_UID = 1  # daemon: the clients and the origin run as another member of the fabric's group
stop = stop_proc
CLOSED_EARLY = "closed before a memlan acceptor took the offer"
NO_OFFER_FIN = ("the client shut down its sending before accept, with no offer (a memlan client "
                "that closed, or one without memlan)")


def reasons_but_tunnel(log):
    """The TCP reasons in log, less one for the half-closed tunnel: the proxy closes its
    connection to the origin at its client's EOF, which may be before the origin accepts it (its
    log says CLOSED_EARLY, the origin's NO_OFFER_FIN)."""
    why = tcp_reasons(log)
    for r in (CLOSED_EARLY, NO_OFFER_FIN):
        if r in why:
            why.remove(r)
    return why


def have(*progs):
    for p in progs:
        if not shutil.which(p) and not os.path.exists(p):
            pytest.skip(f"{p} is not installed (scripts/install-apps.sh installs it)")


def logfile(path):
    path.write_text("")
    os.chmod(path, 0o666)
    return path


def owned_dir(path, user):
    path.mkdir()
    pw = pwd.getpwnam(user)
    os.chown(path, pw.pw_uid, pw.pw_gid)
    return path


def children_of(pid):
    try:
        return sorted(int(c) for c in open(f"/proc/{pid}/task/{pid}/children").read().split())
    except OSError:
        return []


def kill_pids(pids):
    """SIGKILL to each PID still ours to kill (a helper its server left behind)."""
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass


@pytest.fixture
def group_fabric(monkeypatch):
    """A group fabric for the group the caller names (the documented command), in MEMLAN_FABRIC;
    afterwards no channel or segment file may be left."""
    made = []

    def make(group):
        d = pathlib.Path(tempfile.mkdtemp(prefix="memlan-proxy-", dir="/dev/shm"))
        d.rmdir()
        p = subprocess.run([str(MEMLAN), "fabric", "create", "--group", group, str(d)],
                           capture_output=True, text=True, timeout=30)
        assert p.returncode == 0, p.stdout + p.stderr
        monkeypatch.setenv("MEMLAN_FABRIC", str(d))
        made.append(d)
        return d

    yield make
    for d in made:
        subprocess.run([str(MEMLAN), "clean", "--fabric", str(d)], capture_output=True, timeout=30)
        left = sorted(os.listdir(d))
        shutil.rmtree(d, ignore_errors=True)
        assert [f for f in left if f.startswith(("seg-", "cx-"))] == [], f"left behind: {left}"


# ---- the origin, and the clients ---------------------------------------------------------------

# HTTP/1.1 with keep-alive, a thread per connection.  GET /big/N: N bytes (cacheable for a
# minute); POST /up: the body's length and hash; POST /short: reads 64 KB of the body, answers
# and closes (a body larger than the origin reads).
ORIGIN = r"""
import hashlib, http.server, socketserver, sys
def blob(n, seed):
    b = hashlib.sha256(seed.encode()).digest() * 64
    return (b * (n // len(b) + 1))[:n]
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def send(self, code, data, close=False, ctype="application/octet-stream"):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "max-age=60")
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        if self.path.startswith("/big/"):
            n = int(self.path[5:])
            self.send(200, blob(n, str(n)))
        else:
            self.send(404, b"no such thing", ctype="text/plain")
    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        if self.path == "/up":
            h, total = hashlib.sha256(), 0
            while total < n:
                c = self.rfile.read(min(65536, n - total))
                if not c:
                    break
                h.update(c); total += len(c)
            self.send(200, ("%d %s" % (total, h.hexdigest())).encode(), ctype="text/plain")
        elif self.path == "/short":
            got = len(self.rfile.read(min(n, 65536)))
            self.send(200, b"read %d" % got, close=True, ctype="text/plain")
        else:
            self.send(404, b"no", ctype="text/plain")
class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    request_queue_size = 64
S(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""

# The python client through the proxy: prints one JSON list of what each workload read.
# Workloads: keep-alive GETs of 1 KB to 6 MB and 4 MB uploads on one connection (the 3 MB
# object twice: the second from the cache); a CONNECT tunnel with keep-alive inside (a GET and an
# upload); a 4 MB body to an origin that reads 64 KB; 12 threads of 5 mixed requests each.
# "load N ROUNDS MARKS": N threads of ROUNDS requests (a request on a connection the proxy closed
# is sent again on a new one, as a browser would); MARKS/mark appears when every thread passed a
# third of its rounds.
CLIENT = r"""
import hashlib, http.client, json, os, socket, sys, threading, time
pport, oport, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
O = "http://127.0.0.1:%d" % oport
def body(n, seed):
    b = hashlib.sha256(b"%d" % seed).digest() * 2048
    return (b * (n // len(b) + 1))[:n]
def one(c, method, url, data=None):
    c.request(method, url, body=data)
    r = c.getresponse()
    d = r.read()
    return "%s %s %d %d %s" % (method, url.replace(O, ""), r.status, len(d), hashlib.sha256(d).hexdigest()[:16])
def conn():
    return http.client.HTTPConnection("127.0.0.1", pport, timeout=30)
# POST /short with an n-byte body, sent by a thread while the answer is read, as a browser reads
# an answer that comes before its upload ends: the answer's status line and body (or that the
# proxy closed without one); the sender meets a closed connection, or not, as the buffers' sizes
# and timing say.
def early(n):
    s = socket.create_connection(("127.0.0.1", pport), timeout=30)
    s.sendall(b"POST %s/short HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (O.encode(), n))
    def send():
        try:
            b = body(1 << 20, 5)
            for i in range(0, n, len(b)):
                s.sendall(b[:n - i])
        except OSError:
            pass
    t = threading.Thread(target=send); t.start()
    got = b""
    try:
        while True:
            c = s.recv(65536)
            if not c:
                break
            got += c
            if b"\r\n\r\n" in got and len(got.partition(b"\r\n\r\n")[2]) >= 10:
                break
    except OSError as e:
        got += b" [%s]" % type(e).__name__.encode()
    try:
        s.shutdown(socket.SHUT_RDWR)  # the sender's wait ends
    except OSError:
        pass
    s.close(); t.join(30)
    head, _, rest = got.partition(b"\r\n\r\n")
    return "early %s %r" % (head.split(b"\r\n")[0].decode(), rest)
out = []
if mode == "main":
    c = conn()
    for n in (1000, 200000, 3 << 20, 6 << 20, 5000, 3 << 20):
        out.append(one(c, "GET", "%s/big/%d" % (O, n)))
    out.append(one(c, "POST", O + "/up", body(4 << 20, 1)))
    out.append(one(c, "GET", O + "/nope"))
    out.append(one(c, "POST", O + "/up", body(3 << 20, 2)))
    c.close()
    t = conn()
    t.set_tunnel("127.0.0.1", oport)
    out.append("tunnel " + one(t, "GET", "/big/2000000"))
    out.append("tunnel " + one(t, "POST", "/up", body(3 << 20, 3)))
    out.append("tunnel " + one(t, "GET", "/big/1000"))
    t.close()
    out.append(early(8 << 20))
    res, bad = {}, []
    def worker(k):
        try:
            c, got = conn(), []
            for r in range(5):
                if (k + r) % 3 == 2:
                    got.append(one(c, "POST", O + "/up", body(100000 + 1000 * k + r, k)))
                else:
                    got.append(one(c, "GET", "%s/big/%d" % (O, 1000 + 97000 * ((k * 5 + r) % 11))))
            c.close()
            res[k] = got
        except Exception as e:
            bad.append("%d %r" % (k, e))
    th = [threading.Thread(target=worker, args=(k,)) for k in range(12)]
    [x.start() for x in th]; [x.join(60) for x in th]
    out += [l for k in sorted(res) for l in res[k]] + sorted(bad)
elif mode == "edge":
    # a CONNECT tunnel half-closed: an HTTP/1.0 request, the sending shut down, read to the end
    s = socket.create_connection(("127.0.0.1", pport), timeout=30)
    s.sendall(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % (oport, oport))
    got = b""
    while b"\r\n\r\n" not in got:
        c = s.recv(1)
        if not c:
            break
        got += c
    out.append("connect " + got.split(b"\r\n")[0].decode())
    s.sendall(b"GET /big/1500000 HTTP/1.0\r\nHost: x\r\n\r\n")
    s.shutdown(socket.SHUT_WR)
    got = b""
    while True:
        c = s.recv(65536)
        if not c:
            break
        got += c
    s.close()
    head, _, rest = got.partition(b"\r\n\r\n")
    b = hashlib.sha256(b"1500000").digest() * 64
    whole = (b * (1500000 // len(b) + 1))[:1500000]
    out.append("half-closed %s %d %s" % (head.split(b"\r\n")[0].decode(), len(rest), rest == whole[:len(rest)]))
    # a client that goes away after 1 MB of 6 MB, then the same object again
    c = conn()
    c.request("GET", "%s/big/6000001" % O)
    r = c.getresponse()
    out.append("aborted %d %d" % (r.status, len(r.read(1 << 20))))
    c.close()
    c = conn()
    out.append("again " + one(c, "GET", "%s/big/6000001" % O))
    c.close()
    # a slow reader with a 16 KB receive buffer
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
    s.settimeout(30)
    s.connect(("127.0.0.1", pport))
    s.sendall(b"GET %s/big/3000000 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % O.encode())
    time.sleep(0.3)
    got = b""
    while True:
        c = s.recv(16384)
        if not c:
            break
        got += c
        time.sleep(0.0005)
    s.close()
    head, _, rest = got.partition(b"\r\n\r\n")
    out.append("slow %s %d %s" % (head.split(b"\r\n")[0].decode(), len(rest), hashlib.sha256(rest).hexdigest()[:16]))
elif mode == "load":
    n, rounds, marks = int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
    res, bad, lock, passed, retried = {}, [], threading.Lock(), [0], [0]
    def worker(k):
        try:
            c, got = conn(), []
            for r in range(rounds):
                if r == rounds // 3:
                    with lock:
                        passed[0] += 1
                        if passed[0] == n:
                            open(os.path.join(marks, "mark"), "w").close()
                for attempt in range(5):
                    try:
                        if r % 4 == 3:
                            got.append(one(c, "POST", O + "/up", body(200000 + r, k)))
                        else:
                            got.append(one(c, "GET", "%s/big/%d" % (O, 5000 + 31000 * ((k + r) % 13))))
                        break
                    except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                        c.close(); c = conn(); retried[0] += 1; time.sleep(0.05)
                else:
                    raise RuntimeError("5 attempts")
                time.sleep(0.01)
            c.close()
            res[k] = got
        except Exception as e:
            bad.append("%d %r" % (k, e))
    th = [threading.Thread(target=worker, args=(k,)) for k in range(n)]
    [x.start() for x in th]; [x.join(90) for x in th]
    out = [l for k in sorted(res) for l in res[k]] + sorted(bad)
    print("retried", retried[0], file=sys.stderr)
print(json.dumps(out))
"""


def blob(n):
    """ORIGIN's /big/n."""
    b = hashlib.sha256(str(n).encode()).digest() * 64
    return (b * (n // len(b) + 1))[:n]


def files(d):
    (d / "origin.py").write_text(ORIGIN)
    (d / "client.py").write_text(CLIENT)


def member(gid, cmd, log, on):
    """cmd (under memlan when on) as the client user, a member of the fabric's group only."""
    return as_user(CLIENT_UID, gid, wrap(cmd, log, on))


def origin(d, gid, port, log, on):
    p = subprocess.Popen(member(gid, [PY, str(d / "origin.py"), str(port)], log, on),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_port(port, p)
    return p


def py_client(d, gid, pport, oport, log, on, *mode, timeout=120):
    p = subprocess.run(member(gid, [PY, str(d / "client.py"), str(pport), str(oport), *mode], log, on),
                       capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    return json.loads(p.stdout.splitlines()[-1]), p.stderr


def curl(gid, args, log, on, got, timeout=60):
    """curl as the client user; (exit status, http codes, [(length, hash) of each output])."""
    outs = []
    cmd = ["curl", "-sS", "-m", "30", "-w", "%{http_code} "]
    for a in args:
        if a == "-o":
            outs.append(str(got / f"out{len(list(got.iterdir())) + len(outs)}"))
            cmd += ["-o", outs[-1]]
        else:
            cmd.append(a)
    p = subprocess.run(member(gid, cmd, log, on), capture_output=True, text=True, timeout=timeout)
    res = []
    for o in outs:
        b = pathlib.Path(o).read_bytes() if os.path.exists(o) else b""
        res.append((len(b), hashlib.sha256(b).hexdigest()[:16]))
    return p.returncode, p.stdout.split(), res


def same(a, b):
    """a == b, or the parts that differ."""
    if a != b:
        diff = []
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y and isinstance(x, list) and isinstance(y, list):
                diff.append((i, len(x), len(y), [(j, u, v) for j, (u, v) in enumerate(zip(x, y))
                                                 if u != v][:6]))
            elif x != y:
                diff.append((i, x, y))
        raise AssertionError(f"differ: {str(diff)[:3000]}")


def half_closed(res):
    """Takes each run's half-closed tunnel out of res (lists of the edge mode's lines), and checks
    it: the proxy closes the tunnel at its client's EOF, before or after it passed on some of the
    answer (its status line, a true prefix of its body), which is the timing's to say, over kernel
    TCP as over memlan."""
    for r in res:
        h = [l for l in r if l.startswith("half-closed ")]
        assert len(h) == 1 and re.fullmatch(r"half-closed ( 0|HTTP/1.[01] 200 OK \d+) True", h[0]), h
        r.remove(h[0])


def count(log, what):
    return log.read_text().count(what) if log.exists() else 0


# ---- squid -------------------------------------------------------------------------------------

# /etc/squid/squid.conf as Debian ships it (bookworm, comments left out), with the test's port,
# CONNECT allowed to the origin's port as to 443, a disk cache (ufs, as `squid -z` makes it), and
# its pid file and logs in the test's directory; shutdown_lifetime shortened from 30 s.  And
# client_request_buffer_max_size raised from 512 KB: squid 5.7 reads a client whose request body
# filled that buffer with a zero-size read, takes the 0 for the client's EOF
# ("shouldCloseOnEof: yes", ERR_CLIENT_GONE) and closes it without an answer (access.log:
# TCP_MISS_ABORTED/000); a keep-alive client's 3-4 MB POST met it over kernel TCP too (3 in 100
# with debug_options raised, none in 300 without; under memlan 4 in 100), none with 16 MB.
SQUID_CONF = """
acl localnet src 10.0.0.0/8
acl localnet src 172.16.0.0/12
acl localnet src 192.168.0.0/16
acl SSL_ports port 443
acl SSL_ports port {oport}
acl Safe_ports port 80
acl Safe_ports port 21
acl Safe_ports port 443
acl Safe_ports port 1025-65535
http_access deny !Safe_ports
http_access deny CONNECT !SSL_ports
http_access allow localhost manager
http_access deny manager
http_access allow localhost
http_access deny all
http_port 127.0.0.1:{port}
cache_dir ufs {d}/cache 100 16 256
maximum_object_size 20 MB
coredump_dir {d}/cache
pid_filename {d}/squid.pid
cache_log {d}/log/cache.log
access_log {d}/log/access.log
cache_store_log none
shutdown_lifetime 2 seconds
client_request_buffer_max_size 16 MB
refresh_pattern ^ftp:		1440	20%	10080
refresh_pattern -i (/cgi-bin/|\\?) 0	0%	0
refresh_pattern .		0	20%	4320
"""


class Squid:
    """A squid of its own directory (config, ufs cache made by `squid -z`, pid file, logs)."""

    def __init__(self, base, oport, log, on, shipped=False):
        self.base, self.log, self.on = base, log, on
        self.port = next_port()
        owned_dir(base / "cache", "proxy")
        owned_dir(base / "log", "proxy")
        self.conf = base / "squid.conf"
        self.conf.write_text(SQUID_CONF.format(d=base, port=self.port, oport=oport))
        z = subprocess.run(["squid", "-f", str(self.conf), "--foreground", "-z"],
                           capture_output=True, text=True, timeout=60)
        assert z.returncode == 0, z.stdout + z.stderr
        # systemd's ExecStart (a master that execs its kid), or -N (one process)
        how = ["--foreground", "-sYC"] if shipped else ["-N", "-sYC"]
        self.p = subprocess.Popen(wrap([shutil.which("squid"), "-f", str(self.conf), *how], log, on),
                                  stdout=subprocess.DEVNULL, stderr=open(base / "squid.err", "w"))
        wait_port(self.port, self.p, 30)
        self.helpers = set()
        self.note_helpers()

    def note_helpers(self):
        for c in children_of(self.p.pid):
            self.helpers.add(c)
            self.helpers.update(children_of(c))

    def k(self, what):
        r = subprocess.run(["squid", "-f", str(self.conf), "-k", what], capture_output=True,
                           text=True, timeout=30)
        assert r.returncode == 0, r.stdout + r.stderr

    def stop(self):
        """SIGTERM (graceful: shutdown_lifetime), its exit status; then its helpers that outlive
        it (the pinger does, with or without memlan)."""
        self.note_helpers()
        rc = None
        if self.p.poll() is None:
            self.p.terminate()
            try:
                rc = self.p.wait(20)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
                rc = "hung after SIGTERM"
        kill_pids(self.helpers)
        return rc

    def cache_log(self):
        p = self.base / "log" / "cache.log"
        return p.read_text(errors="replace") if p.exists() else ""


def squid_setup(group_fabric, pubdir):
    have("squid", "curl")
    if os.geteuid() != 0:
        pytest.skip("squid drops from root to its user proxy: needs root")
    try:
        gid = grp.getgrnam("proxy").gr_gid
        pwd.getpwnam("proxy")
    except KeyError:
        pytest.fail("no proxy user or group: reinstall the squid package")
    group_fabric("proxy")
    files(pubdir)
    return gid


def test_squid_dash_n_matches_kernel_tcp(group_fabric, pubdir):
    """squid -N (one process: root dropping to proxy, its unlinkd and pinger, a ufs disk cache),
    in a fabric of the group proxy, in front of an origin and driven by clients of another
    member (python: keep-alive GETs of 1 KB to 6 MB and a disk-cache hit, 4 MB uploads, a CONNECT
    tunnel with keep-alive inside, a 4 MB body to an origin that reads 64 KB, 12 concurrent
    clients; curl: several URLs on one kept-alive connection, an upload of 5 MB, a CONNECT with
    -p): the same bytes and statuses as over kernel TCP, every connection accelerated at both
    ends of both hops."""
    gid = squid_setup(group_fabric, pubdir)
    up = pubdir / "up.bin"
    up.write_bytes(os.urandom(5 << 20))
    os.chmod(up, 0o644)
    res = {}
    for on in (False, True):
        base = pubdir / ("on" if on else "off")
        base.mkdir()
        got = owned_dir(base / "got", "daemon")
        slog, clog, olog, plog = (logfile(base / n) for n in ("squid.log", "client.log",
                                                              "origin.log", "plain.log"))
        oport = next_port()
        o = origin(pubdir, gid, oport, olog, on)
        sq = None
        try:
            sq = Squid(base, oport, slog, on)
            x = ["-x", f"http://127.0.0.1:{sq.port}"]
            ou = f"http://127.0.0.1:{oport}"
            r = [py_client(pubdir, gid, sq.port, oport, clog, on, "main")[0],
                 py_client(pubdir, gid, sq.port, oport, clog, on, "edge")[0]]
            r.append(curl(gid, x + ["-o", f"{ou}/big/4000000", "-o", f"{ou}/big/1000",
                                    "-o", f"{ou}/nope", "-o", f"{ou}/big/4000000"], clog, on, got))
            r.append(curl(gid, x + ["--data-binary", f"@{up}", "-o", f"{ou}/up"], clog, on, got))
            r.append(curl(gid, x + ["-p", "-o", f"{ou}/big/3000000", "-o", f"{ou}/big/10"],
                          clog, on, got))
            # a client without memlan, and an origin without memlan: TCP on that hop, said
            r.append(curl(gid, x + ["-o", f"{ou}/big/2000000"], plog, False, got))
            p2 = next_port()
            o2 = origin(pubdir, gid, p2, olog, False)
            try:
                r.append(curl(gid, x + ["-o", f"http://127.0.0.1:{p2}/big/2000000"], plog, on, got))
            finally:
                stop(o2)
            res[on] = r
            assert sq.p.poll() is None, "squid exited"
            assert sq.stop() == 0
            assert o.poll() is None, "the origin exited"
        finally:
            if sq is not None:
                sq.stop()
            stop(o)
        if on:
            c, s, og = clog.read_text(), slog.read_text(), olog.read_text()
            # the python client's 1 + 1 + 1 + 12 connections and 4 at its edges, curl's 3
            assert tcp_reasons(clog) == [] and c.count("accelerated (client)") == 22, c[-3000:]
            assert s.count("accelerated (accepted") == 23, s[-3000:]
            assert count(plog, "accelerated (client)") == 1, plog.read_text()
            assert reasons_but_tunnel(slog) == ["the client is not memlan (no offer)",
                                                "no memlan listener on this port in the fabric"], s[-3000:]
            assert reasons_but_tunnel(olog) == [], og[-3000:]
            # squid's connections to the origin: as many as the origin accepted, every one
            n = s.count("accelerated (client)")
            assert n >= 15 and og.count("accelerated (accepted") == n, (s[-3000:], og[-3000:])
        log = sq.cache_log()
        assert "FATAL" not in log and "assertion failed" not in log, log[-3000:]
    half_closed([res[True][1], res[False][1]])
    same(res[True], res[False])
    py, edge, many, upload, tunnel, plain, plain_origin = res[False]
    assert len(py) == 13 + 60 and all(" 200 " in l or " 404 " in l for l in py), py
    big = (4000000, hashlib.sha256(blob(4000000)).hexdigest()[:16])
    assert many[:2] == (0, ["200", "200", "404", "200"]) and many[2][0] == many[2][3] == big, many
    assert upload[0] == 0 and upload[1] == ["200"], upload
    assert tunnel[0] == 0 and tunnel[1] == ["200", "200"], tunnel
    two = (2000000, hashlib.sha256(blob(2000000)).hexdigest()[:16])
    assert plain == plain_origin == (0, ["200"], [two]), (plain, plain_origin)
    assert edge == ["connect HTTP/1.1 200 Connection established",
                    "aborted 200 1048576",
                    "again GET /big/6000001 200 6000001 " + hashlib.sha256(blob(6000001)).hexdigest()[:16],
                    "slow HTTP/1.1 200 OK 3000000 " + hashlib.sha256(blob(3000000)).hexdigest()[:16]], edge
    settle()


def test_squid_reconfigured_under_load(group_fabric, pubdir):
    """squid -N reconfigured (`squid -k reconfigure`: it closes its listening port and opens it
    again, its effective uid root for the bind) while 6 keep-alive clients make 45 requests each:
    the same bytes and statuses as over kernel TCP, and the clients that connect after the
    reconfigure are accelerated as before it."""
    gid = squid_setup(group_fabric, pubdir)
    res = {}
    for on in (False, True):
        base = pubdir / ("on" if on else "off")
        base.mkdir()
        got = owned_dir(base / "got", "daemon")
        marks = owned_dir(base / "marks", "daemon")
        slog, clog, alog, olog = (logfile(base / n) for n in ("squid.log", "client.log",
                                                              "after.log", "origin.log"))
        oport = next_port()
        o = origin(pubdir, gid, oport, olog, on)
        sq = c = None
        try:
            sq = Squid(base, oport, slog, on)
            c = subprocess.Popen(member(gid, [PY, str(pubdir / "client.py"), str(sq.port), str(oport),
                                              "load", "6", "45", str(marks)], clog, on),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            end = time.time() + 60
            while not (marks / "mark").exists() and c.poll() is None and time.time() < end:
                time.sleep(0.01)
            assert (marks / "mark").exists(), "the load did not reach its mark"
            sq.k("reconfigure")
            try:
                out, err = c.communicate(timeout=100)
            except subprocess.TimeoutExpired:
                c.kill()
                out, err = c.communicate()
                raise AssertionError(f"client hung: {err[-2000:]}")
            assert c.returncode == 0, err[-2000:]
            time.sleep(1)  # the reconfigure done
            assert "Reconfiguring" in sq.cache_log(), sq.cache_log()[-3000:]
            r = [json.loads(out.splitlines()[-1])]
            ou = f"http://127.0.0.1:{oport}"
            r.append(curl(gid, ["-x", f"http://127.0.0.1:{sq.port}", "-o", f"{ou}/big/2500000",
                                "-o", f"{ou}/big/99"], alog, on, got))
            res[on] = r
            assert sq.p.poll() is None, "squid exited"
            assert sq.stop() == 0
        finally:
            if c is not None and c.poll() is None:
                c.kill()
                c.wait()
            if sq is not None:
                sq.stop()
            stop(o)
        if on:
            assert tcp_reasons(clog) == [] and count(clog, "accelerated (client)") >= 6, \
                clog.read_text()[-3000:]
            assert tcp_reasons(alog) == [] and count(alog, "accelerated (client)") == 1, \
                (alog.read_text(), slog.read_text()[-3000:])
            s = slog.read_text()
            assert s.count("accelerated (accepted") == count(clog, "accelerated (client)") + 1, s[-3000:]
        log = sq.cache_log()
        assert "FATAL" not in log and "assertion failed" not in log, log[-3000:]
    assert res[True] == res[False], res
    assert len(res[False][0]) == 6 * 45 and all(" 200 " in l for l in res[False][0]), res[False][0][-5:]
    assert res[False][1][:2] == (0, ["200", "200"]), res[False][1]
    settle()


def test_squid_graceful_shutdown_mid_transfer(group_fabric, pubdir):
    """squid -N told to shut down (`squid -k shutdown`) while curl reads a 16 MB answer at 1 MB/s
    through it: squid refuses new clients at once, closes the client's connection after its
    shutdown_lifetime (2 s) and exits 0, as over kernel TCP; curl reads a true prefix of the
    answer, every byte squid says it wrote (its access.log) and no more, and fails with 18 where
    that is not all (over kernel TCP the socket buffers may hold the rest: how much squid wrote
    before the close is the buffers' to say, not the test's)."""
    gid = squid_setup(group_fabric, pubdir)
    n = 16000000
    res = {}
    for on in (False, True):
        base = pubdir / ("on" if on else "off")
        base.mkdir()
        got = owned_dir(base / "got", "daemon")
        slog, clog, olog = (logfile(base / n) for n in ("squid.log", "client.log", "origin.log"))
        oport = next_port()
        o = origin(pubdir, gid, oport, olog, on)
        sq = c = None
        try:
            sq = Squid(base, oport, slog, on)
            out = got / "slow"
            c = subprocess.Popen(member(gid, ["curl", "-sS", "-m", "40", "--limit-rate", "1M", "-x",
                                              f"http://127.0.0.1:{sq.port}", "-o", str(out),
                                              f"http://127.0.0.1:{oport}/big/{n}"], clog, on),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            end = time.time() + 20
            while (not out.exists() or out.stat().st_size < 1 << 20) and time.time() < end:
                time.sleep(0.05)
            assert out.exists() and out.stat().st_size >= 1 << 20, "the transfer did not start"
            t0 = time.time()
            sq.k("shutdown")
            time.sleep(0.3)
            # new clients are refused while the old one finishes
            late = curl(gid, ["-x", f"http://127.0.0.1:{sq.port}", "-o",
                              f"http://127.0.0.1:{oport}/big/10"], clog, on, got)
            try:
                rc = sq.p.wait(20)
            except subprocess.TimeoutExpired:
                rc = "squid hung in its shutdown"
            took = time.time() - t0
            try:
                _, err = c.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                c.kill()
                _, err = c.communicate()
                err = "curl hung: " + err
            b = out.read_bytes()
            # what squid says it wrote (its headers too) less what curl read: the headers alone
            acc = [l.split() for l in (base / "log" / "access.log").read_text().splitlines()
                   if f"/big/{n} " in l]
            assert len(acc) == 1, acc
            res[on] = [rc, late[0], (c.returncode, len(b) < n) in ((18, True), (0, False)),
                       b == blob(n)[:len(b)], int(acc[0][4]) - len(b)]
            assert took < 15, took
        finally:
            if c is not None and c.poll() is None:
                c.kill()
                c.wait()
            if sq is not None:
                sq.stop()
            stop(o)
        if on:
            assert count(clog, "accelerated (client)") == 1 and count(slog, "accelerated (accepted") == 1, \
                (clog.read_text(), slog.read_text())
        log = sq.cache_log()
        assert "FATAL" not in log and "assertion failed" not in log, log[-3000:]
    assert res[True] == res[False], res
    assert res[False][:4] == [0, 7, True, True] and 200 < res[False][4] < 400, res
    settle()


def test_squid_as_systemd_starts_it(group_fabric, pubdir):
    """squid as Debian's unit starts it (`squid --foreground -sYC`): its master, real uid proxy
    and effective uid root, execs its kid (squid-1) in secure-execution mode, where the dynamic
    linker ignores LD_PRELOAD: the kid, which accepts and connects, runs without memlan.  Its
    clients read what they read over kernel TCP, on TCP, and the logs say why: squid's names the
    kid's exec (and not the absent /usr/sbin/squid_start its master tries first), the clients'
    find no memlan listener, the origin's no offer."""
    gid = squid_setup(group_fabric, pubdir)
    res = {}
    for on in (False, True):
        base = pubdir / ("on" if on else "off")
        base.mkdir()
        got = owned_dir(base / "got", "daemon")
        slog, clog, olog = (logfile(base / n) for n in ("squid.log", "client.log", "origin.log"))
        oport = next_port()
        o = origin(pubdir, gid, oport, olog, on)
        sq = None
        try:
            sq = Squid(base, oport, slog, on, shipped=True)
            time.sleep(0.5)  # the kid's port is the master's until it listens: wait_port saw it
            ou = f"http://127.0.0.1:{oport}"
            x = ["-x", f"http://127.0.0.1:{sq.port}"]
            res[on] = [curl(gid, x + ["-o", f"{ou}/big/3000000", "-o", f"{ou}/big/3000000",
                                      "-o", f"{ou}/nope"], clog, on, got),
                       curl(gid, x + ["-p", "-o", f"{ou}/big/2000000"], clog, on, got)]
            assert sq.p.poll() is None, "squid exited"
            assert sq.stop() == 0
        finally:
            if sq is not None:
                sq.stop()
            stop(o)
        if on:
            s = slog.read_text()
            uid = pwd.getpwnam("proxy").pw_uid
            assert f"exec of {shutil.which('squid')} with real uid {uid}, effective uid 0" in s, s
            assert "squid_start" not in s and "secure-execution mode" in s, s
            assert tcp_reasons(clog) == ["no memlan listener on this port in the fabric"] * 2, \
                clog.read_text()
            assert tcp_reasons(olog) == ["the client is not memlan (no offer)"] * 2, olog.read_text()
    assert res[True] == res[False], res
    big = (3000000, hashlib.sha256(blob(3000000)).hexdigest()[:16])
    assert res[False][0][:2] == (0, ["200", "200", "404"]) and res[False][0][2][:2] == [big, big], res
    assert res[False][1][:2] == (0, ["200"]), res
    settle()



# ---- privoxy -----------------------------------------------------------------------------------

def privoxy_conf(d, port):
    """/etc/privoxy/config as Debian ships it, with the test's address and log directory (Debian's
    /var/log/privoxy is privoxy's)."""
    conf = open("/etc/privoxy/config").read()
    assert "listen-address  127.0.0.1:8118" in conf and "logdir /var/log/privoxy" in conf
    conf = conf.replace("listen-address  127.0.0.1:8118", f"listen-address  127.0.0.1:{port}")
    conf = conf.replace("listen-address  [::1]:8118", "")
    conf = conf.replace("logdir /var/log/privoxy", f"logdir {d}/log")
    (d / "config").write_text(conf)
    return d / "config"


class Privoxy:
    """privoxy as Debian's unit starts it (it forks into the background, its PID in its pid
    file), as --user user[.group]."""

    def __init__(self, base, user, log, on):
        self.port = next_port()
        owned_dir(base / "log", "privoxy")
        self.conf = privoxy_conf(base, self.port)
        self.pidfile = base / "privoxy.pid"
        p = subprocess.run(wrap(["/usr/sbin/privoxy", "--pidfile", str(self.pidfile), "--user",
                                 user, str(self.conf)], log, on),
                           capture_output=True, text=True, timeout=30)
        assert p.returncode == 0, p.stdout + p.stderr
        end = time.time() + 15
        while not (self.pidfile.exists() and self.pidfile.read_text().strip()) and time.time() < end:
            time.sleep(0.05)
        self.pid = int(self.pidfile.read_text())
        while not self.listening() and time.time() < end:
            time.sleep(0.05)
        assert self.alive() and self.listening(), "privoxy does not listen"

    def listening(self):
        from test_apps import listening
        return listening(self.port)

    def alive(self):
        try:
            st = open(f"/proc/{self.pid}/stat").read()
        except OSError:
            return False
        return st[st.rindex(")") + 2] != "Z"

    def stop(self):
        """SIGTERM (privoxy exits at once; systemd takes its 15 for success); gone within 10 s."""
        if not self.alive():
            return False
        os.kill(self.pid, signal.SIGTERM)
        end = time.time() + 10
        while self.alive() and time.time() < end:
            time.sleep(0.05)
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)
            return False
        return True


def test_privoxy_as_debian_ships_it(gfabric, group, pubdir):
    """privoxy as Debian's unit starts it (root, forking, dropping to its user privoxy), Debian's
    config and actions, in front of an origin, driven by clients of another member of a group
    fabric (python: keep-alive GETs of 1 KB to 6 MB, 4 MB uploads, a CONNECT tunnel with
    keep-alive inside, a 4 MB body to an origin that reads 64 KB, 12 concurrent clients; curl:
    several URLs on one connection, a 5 MB upload, a CONNECT with -p; then 6 clients of 45
    requests while its config is touched, which privoxy reads again at its next request).  As
    shipped (`--user privoxy`, group nogroup) privoxy listens after its drop, out of the fabric's
    reach: the same bytes, on TCP, the reason in its log (its clients find no listener).  As `--user privoxy.GROUP`: the same bytes as
    over kernel TCP, every connection accelerated at both ends of both hops."""
    if os.geteuid() != 0:
        pytest.skip("privoxy drops from root to its user privoxy: needs root")
    have("/usr/sbin/privoxy", "curl")
    try:
        pwd.getpwnam("privoxy")
    except KeyError:
        pytest.fail("no privoxy user: reinstall the privoxy package")
    _, gid = gfabric
    gname = group[0]
    files(pubdir)
    up = pubdir / "up.bin"
    up.write_bytes(os.urandom(5 << 20))
    os.chmod(up, 0o644)
    res = {}
    for how in ("tcp", "shipped", "group"):
        on = how != "tcp"
        base = pubdir / how
        base.mkdir()
        got = owned_dir(base / "got", "daemon")
        marks = owned_dir(base / "marks", "daemon")
        slog, clog, llog, olog = (logfile(base / n) for n in ("privoxy.log", "client.log",
                                                              "load.log", "origin.log"))
        oport = next_port()
        o = origin(pubdir, gid, oport, olog, on)
        pv = c = None
        try:
            pv = Privoxy(base, "privoxy" if how == "shipped" else f"privoxy.{gname}", slog, on)
            x = ["-x", f"http://127.0.0.1:{pv.port}"]
            ou = f"http://127.0.0.1:{oport}"
            r = [curl(gid, x + ["-o", f"{ou}/big/4000000", "-o", f"{ou}/big/1000",
                                "-o", f"{ou}/nope"], clog, on, got),
                 curl(gid, x + ["--data-binary", f"@{up}", "-o", f"{ou}/up"], clog, on, got),
                 curl(gid, x + ["-p", "-o", f"{ou}/big/3000000", "-o", f"{ou}/big/10"],
                      clog, on, got)]
            if how != "shipped":
                r.append(py_client(pubdir, gid, pv.port, oport, clog, on, "main")[0])
                r.append(py_client(pubdir, gid, pv.port, oport, clog, on, "edge")[0])
                c = subprocess.Popen(member(gid, [PY, str(pubdir / "client.py"), str(pv.port),
                                                  str(oport), "load", "6", "45", str(marks)],
                                            llog, on),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                end = time.time() + 60
                while not (marks / "mark").exists() and c.poll() is None and time.time() < end:
                    time.sleep(0.01)
                assert (marks / "mark").exists(), "the load did not reach its mark"
                os.utime(pv.conf)
                try:
                    out, err = c.communicate(timeout=100)
                except subprocess.TimeoutExpired:
                    c.kill()
                    out, err = c.communicate()
                    raise AssertionError(f"client hung: {err[-2000:]}")
                assert c.returncode == 0, err[-2000:]
                r.append(json.loads(out.splitlines()[-1]))
            res[how] = r
            assert pv.alive(), "privoxy exited"
            assert o.poll() is None, "the origin exited"
        finally:
            if c is not None and c.poll() is None:
                c.kill()
                c.wait()
            stopped = pv.stop() if pv is not None else None
            stop(o)
        assert stopped, "privoxy did not stop at SIGTERM"
        plog = (base / "log" / "logfile").read_text(errors="replace")
        assert "Fatal error" not in plog, plog[-3000:]
        if how == "shipped":
            # privoxy listens after its drop: it publishes nothing, and says why
            assert tcp_reasons(clog) == ["no memlan listener on this port in the fabric"] * 3, \
                clog.read_text()
            s = slog.read_text()
            assert s.count("not writable by this user; every connection stays on TCP") == 1, s
            why = tcp_reasons(slog)
            assert len(why) >= 3 and set(why) == {"fabric unavailable: not writable by this user"}, s
            assert tcp_reasons(olog) == ["the client is not memlan (no offer)"] * len(why), \
                olog.read_text()
        elif how == "group":
            c_, l_, s, og = (p.read_text() for p in (clog, llog, slog, olog))
            assert tcp_reasons(clog) == [] and tcp_reasons(llog) == [], (c_[-3000:], l_[-3000:])
            n = c_.count("accelerated (client)") + l_.count("accelerated (client)")
            assert n >= 3 + 15 + 4 + 6 and s.count("accelerated (accepted") == n, (n, s[-3000:])
            assert reasons_but_tunnel(slog) == [] and reasons_but_tunnel(olog) == [], (s[-3000:], og[-3000:])
            m = s.count("accelerated (client)")
            assert m >= 15 and og.count("accelerated (accepted") == m, (s[-3000:], og[-3000:])
    # privoxy may read the origin's early answer before its write of the body fails, and pass it
    # on, or close without it: over kernel TCP too (2 times in 30 passed it on), either is right
    short = [l for r in (res["tcp"], res["group"]) for l in r[3] if "early" in l]
    assert len(short) == 2 and set(short) <= {"early HTTP/1.1 200 OK b'read 65536'",
                                              "early  b''"}, short
    for how in ("tcp", "group"):
        res[how][3] = [l for l in res[how][3] if "early" not in l]
    half_closed([res["tcp"][4], res["group"][4]])
    assert res["shipped"] == res["tcp"][:3], res
    assert res["group"] == res["tcp"], res
    many, upload, tunnel, py, edge, load = res["tcp"]
    big = (4000000, hashlib.sha256(blob(4000000)).hexdigest()[:16])
    assert many[:2] == (0, ["200", "200", "404"]) and many[2][0] == big, many
    assert upload[:2] == (0, ["200"]) and tunnel[:2] == (0, ["200", "200"]), res
    assert len(py) == 12 + 60 and all(" 200 " in l or " 404 " in l for l in py), py
    assert len(load) == 6 * 45 and all(" 200 " in l for l in load), load[-5:]
    assert edge[0] == "connect HTTP/1.1 200 Connection established" and len(edge) == 4, edge
    settle()
