# SPDX-License-Identifier: Apache-2.0 OR MIT
"""Programs that put sockets on stdio or tunnel them, as Debian ships them, with both ends under
`memlan run`, each run compared with the same run over kernel TCP (same bytes, same status):
xinetd's services (a shell script, cat, a python script, a C program on glibc's stdio, `wait`
and `nowait`, a service run as `nobody`, a statically linked one), netcat-openbsd and bash's
/dev/tcp, socat and python subprocess pipelines, and OpenSSH's forwarding (-L, -R, -D, -W),
scp and rsync over ssh.  Each test is skipped where its program is not installed
(scripts/install-apps.sh installs them).  Every process is stopped by its PID; every wait is
bounded.
"""
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import MEMLAN, port_range, stop_proc, port_free, pubdir  # noqa: F401 (fixtures)
from test_apps import accelerated, settle, tcp_reasons, wait_port, wrap
from test_privdrop import SSHD_CONF as PRIVDROP_SSHD_CONF

next_port = port_range(19301, 19499, "test_apps_inetd")  # no other test's range, below the ephemeral range


def have(*progs):
    for p in progs:
        if not shutil.which(p) and not os.path.exists(p):
            pytest.skip(f"{p} is not installed (scripts/install-apps.sh installs it)")


stop = stop_proc


def body(n, seed=0):
    return bytes((i * 7 + 13 + seed) % 251 for i in range(n))


# A client that sends its request while it reads the answer (as socat or nc do), then
# half-closes: status, the answer's length and digest, and its first bytes.  With "--then" it
# sends everything before it reads anything.
CLIENT = r"""
import hashlib, socket, sys, threading
port, size, first = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3].encode()
data = first + bytes((i * 7 + 13) % 251 for i in range(size))
s = socket.create_connection(("127.0.0.1", port))
s.settimeout(25)
def send():
    s.sendall(data); s.shutdown(socket.SHUT_WR)
if "--then" in sys.argv:
    send()
else:
    t = threading.Thread(target=send); t.start()
got = []
while True:
    b = s.recv(1 << 16)
    if not b:
        break
    got.append(b)
got = b"".join(got)
print(len(got), hashlib.sha256(got).hexdigest(), got[:60])
"""

# ---- xinetd ------------------------------------------------------------------------------------

SVC_SH = """#!/bin/sh
read line
echo "hello $line from $(id -un)"
n=$(wc -c)
echo "rest $n"
"""

SVC_PY = """#!/usr/bin/python3
import hashlib, sys
d = sys.stdin.buffer.read()
sys.stdout.buffer.write(hashlib.sha256(d).hexdigest().encode() + b"\\n" + d[::-1])
"""

# wait = yes: the service gets the listening socket and accepts its clients itself, then leaves
# when none came for a while.
SVC_WAIT = """#!/usr/bin/python3
import hashlib, socket
l = socket.socket(fileno=0)
l.settimeout(2)
try:
    while True:
        c, _ = l.accept()
        c.settimeout(None)
        d = b"".join(iter(lambda: c.recv(65536), b""))
        c.sendall(hashlib.sha256(d).hexdigest().encode() + b"\\n" + d)
        c.close()
except socket.timeout:
    pass
"""

# glibc's stdio on the connection: getchar and putchar, fully buffered both ways.
SVC_C = r"""
#include <ctype.h>
#include <stdio.h>
int main(void)
{
    int c;
    long n = 0;
    while ((c = getchar()) != EOF) {
        putchar(toupper(c));
        n++;
    }
    printf("\n%ld bytes\n", n);
    return 0;
}
"""

XINETD_SVC = """service {name}
{{
  type = UNLISTED
  socket_type = stream
  protocol = tcp
  port = {port}
  bind = 127.0.0.1
  wait = {wait}
  user = {user}
  server = {server}
  log_on_failure =
  log_on_success =
}}
"""


class Xinetd:
    """xinetd in the foreground (-dontfork) serving the given services: [(name, server, wait,
    user)], each on a port of its own (self.port[name])."""

    def __init__(self, d, services, log, on):
        self.port = {}
        text = ["defaults\n{\n  instances = 50\n}\n"]
        for name, server, wait, user in services:
            self.port[name] = next_port()
            text.append(XINETD_SVC.format(name=name, port=self.port[name], server=server,
                                          wait="yes" if wait else "no", user=user))
        conf = d / "xinetd.conf"
        conf.write_text("".join(text))
        self.p = subprocess.Popen(wrap(["xinetd", "-dontfork", "-f", str(conf), "-pidfile",
                                        str(d / "xinetd.pid")], log, on),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for p in self.port.values():
            wait_port(p, self.p)

    def stop(self):
        stop(self.p)


def services_dir(pubdir):
    """The services' programs, readable and executable by nobody."""
    for name, text in (("svc.sh", SVC_SH), ("svc.py", SVC_PY), ("wait.py", SVC_WAIT)):
        (pubdir / name).write_text(text)
        os.chmod(pubdir / name, 0o755)
    (pubdir / "up.c").write_text(SVC_C)
    for out, extra in (("up", []), ("up-static", ["-static"])):
        subprocess.run(["cc", "-O2"] + extra + ["-o", str(pubdir / out), str(pubdir / "up.c")],
                       check=True, timeout=60)
    (pubdir / "client.py").write_text(CLIENT)


def client(pubdir, port, size, first, log, on, *extra, timeout=40):
    try:
        p = subprocess.run(wrap([sys.executable, str(pubdir / "client.py"), str(port), str(size),
                                 first] + list(extra), log, on),
                           capture_output=True, timeout=timeout)
        return p.returncode, p.stdout
    except subprocess.TimeoutExpired:
        return "timeout", b""


SERVICES = [("cat", "/bin/cat", False, "root"), ("sh", "{d}/svc.sh", False, "root"),
            ("py", "{d}/svc.py", False, "root"), ("c", "{d}/up", False, "root"),
            ("wait", "{d}/wait.py", True, "root")]


def test_xinetd_services(fabric, pubdir):
    """xinetd as root (its accepting process forks, dup2s the connection onto 0, 1 and 2 and
    execs the service) and, for `wait = yes`, the service accepting on the listener it
    inherits: cat, a shell script (read, id, wc: its own children share the connection), a
    python script, a C program on glibc's stdio; each client sends 1 MB while it reads the
    answer, then half-closes.  The answers and statuses are kernel TCP's, and every connection
    is accelerated at both ends."""
    have("xinetd", "cc")
    services_dir(pubdir)
    svcs = [(n, s.format(d=pubdir), w, u) for n, s, w, u in SERVICES]
    out = {}
    for on in (False, True):
        slog, clog = pubdir / f"server{on:d}.log", pubdir / f"client{on:d}.log"
        x = Xinetd(pubdir, svcs, slog, on)
        try:
            for name, _, _, _ in svcs:
                out[(on, name)] = client(pubdir, x.port[name], 1 << 20, "abc\n", clog, on)
            time.sleep(2.5)  # the wait service leaves; xinetd listens again
            out[(on, "wait2")] = client(pubdir, x.port["wait"], 5000, "x", clog, on)
            time.sleep(2.5)  # and leaves again (xinetd does not stop it)
        finally:
            x.stop()
    for key in [k for k in out if not k[0]]:
        plain, got = out[key], out[(True, key[1])]
        assert plain[0] == 0 and plain[1].split()[0] != b"0", (key, plain)
        assert got == plain, (key[1], got, plain, (pubdir / "client1.log").read_text()[-2000:],
                              (pubdir / "server1.log").read_text()[-3000:])
    assert out[(False, "sh")][1].split(b" ", 2)[2].startswith(b"b'hello abc from root\\nrest 1048576")
    assert accelerated(pubdir / "client1.log") == len(svcs) + 1
    s = (pubdir / "server1.log").read_text()
    assert accelerated(pubdir / "server1.log") == len(svcs) + 1, s[-3000:]
    assert s.count("accelerated (carried across exec)") >= len(svcs) - 1, s[-3000:]
    assert "split" not in s and "cannot" not in s, s[-3000:]
    settle()


def test_xinetd_static_service_ends_clearly(fabric, pubdir):
    """A service that is a statically linked program: LD_PRELOAD cannot reach it, so the
    accelerated connection cannot follow its exec.  xinetd's child shuts it down before the exec
    and says why in the log: the client reads the end of the stream at once (an error on its
    send at most), where it used to wait for ever; over kernel TCP the program answers.  A
    dynamic service on the same xinetd is still accelerated afterwards."""
    have("xinetd", "cc")
    services_dir(pubdir)
    svcs = [("static", str(pubdir / "up-static"), False, "root"), ("c", str(pubdir / "up"), False,
                                                                    "root")]
    slog, clog = pubdir / "server.log", pubdir / "client.log"
    x = Xinetd(pubdir, svcs, pubdir / "plain.log", False)
    try:
        plain = client(pubdir, x.port["static"], 10000, "q", pubdir / "pc.log", False)
    finally:
        x.stop()
    assert plain[0] == 0 and plain[1].startswith(b"10014 "), plain
    x = Xinetd(pubdir, svcs, slog, True)
    try:
        t0 = time.monotonic()
        got = client(pubdir, x.port["static"], 10000, "q", clog, True, timeout=20)
        took = time.monotonic() - t0
        after = client(pubdir, x.port["c"], 10000, "q", clog, True)
    finally:
        x.stop()
    assert got[0] != "timeout" and took < 10, (got, took)
    # What the client read: nothing, or an error on its send (the program never got the bytes).
    assert got[0] != 0 or got[1].startswith(b"0 "), got
    assert after == plain, after
    s = slog.read_text()
    assert (f"an accelerated connection cannot follow the exec of {pubdir}/up-static "
            "(statically linked: LD_PRELOAD cannot reach it): shut down before it") in s, s[-3000:]
    assert accelerated(clog) == 2, clog.read_text()
    settle()


def test_xinetd_nobody_service_with_a_plain_client(fabric, pubdir):
    """A service run as nobody (`user = nobody`: xinetd's child drops before the exec) whose
    memlan log (root's file) it cannot open, reached by a plain client over kernel TCP: memlan's
    note that it cannot open the log went to the service's stderr, which an inetd makes the
    client's connection, so the client read 98 bytes of memlan's text before the answer (and an
    accelerated client a split stream, reset).  Now nothing of memlan's is written on a stderr
    that is a network socket: the client reads what it reads over kernel TCP."""
    have("xinetd")
    services_dir(pubdir)
    svcs = [("pynobody", str(pubdir / "svc.py"), False, "nobody")]
    out = []
    for on in (False, True):
        x = Xinetd(pubdir, svcs, pubdir / "server.log", on)
        try:
            out.append(client(pubdir, x.port["pynobody"], 100000, "z", pubdir / "c.log", False))
        finally:
            x.stop()
    assert out[0][0] == 0 and out[0][1].startswith(b"100066 "), out[0]
    assert out[1] == out[0], out
    settle()


def test_xinetd_nobody_service_keeps_the_other_ports_accelerated(fabric, pubdir, monkeypatch):
    """xinetd's child for a `user = nobody` service drops to nobody while it still holds every
    listener of xinetd's (they close at its exec): cred.c marks each of those ports "clients will
    not offer" at the drop, and the mark stayed while xinetd, their last listener, lived, so
    after one connection to a nobody service every later client of every port of that xinetd
    stayed on TCP ("a server process changed its credentials: it cannot take offers"), though
    only xinetd (root) accepts on them.  Now a drop marks no port (an accept out of reach marks
    its own), so a memlan client of a root service after a nobody service's connection is
    accelerated, as the one before it.  A `wait = yes` service run as nobody accepts on the
    listener it is given, out of root's fabric's reach (it opens nobody's): the exec that keeps
    the listener marks its port, and its memlan clients go to TCP at once, before the first
    and after it (none waits for MEMLAN_ACCEPT_WAIT_MS, 5 s here)."""
    have("xinetd", "cc")
    services_dir(pubdir)
    svcs = [("c", str(pubdir / "up"), False, "root"), ("shnobody", str(pubdir / "svc.sh"), False,
                                                       "nobody"),
            ("waitnobody", str(pubdir / "wait.py"), True, "nobody")]
    slog, clog, wlog = pubdir / "server.log", pubdir / "client.log", pubdir / "wait.log"
    x = Xinetd(pubdir, svcs, slog, True)
    try:
        first = client(pubdir, x.port["c"], 10000, "q", clog, True)
        plain = client(pubdir, x.port["shnobody"], 1000, "abc\n", pubdir / "p.log", False)
        second = client(pubdir, x.port["c"], 10000, "q", clog, True)
        monkeypatch.setenv("MEMLAN_ACCEPT_WAIT_MS", "5000")
        waits = []
        for _ in range(2):
            t0 = time.monotonic()
            waits.append(client(pubdir, x.port["waitnobody"], 5000, "w", wlog, True) +
                         (round(time.monotonic() - t0, 2),))
    finally:
        x.stop()
        settle()
    assert first[0] == 0 and second == first and plain[0] == 0, (first, second, plain)
    assert accelerated(clog) == 2, (clog.read_text()[-2000:], tcp_reasons(clog))
    s = slog.read_text()
    # The one port marked is the nobody `wait = yes` service's, at its exec with the listener
    marked = {int(l.split("port ")[1].split(":")[0]) for l in s.splitlines()
              if "clients will not offer" in l}
    assert marked == {x.port["waitnobody"]}, (marked, x.port, s[-3000:])
    sent = b"w" + body(5000)
    reply = hashlib.sha256(sent).hexdigest().encode() + b"\n" + sent
    want = b"%d %s " % (len(reply), hashlib.sha256(reply).hexdigest().encode())
    assert all(w[0] == 0 and w[1].startswith(want) for w in waits), waits
    # The first client may connect before xinetd's child execs the service (and offer, then
    # see the mark and withdraw); the second finds the mark.
    w = wlog.read_text()
    assert "MEMLAN_ACCEPT_WAIT_MS" not in w and w.count("offer posted") <= 1, (waits, w)
    assert tcp_reasons(wlog) == ["a server process lost the fabric (credentials, sandbox): it "
                                 "cannot take offers"] * 2, w


def test_xinetd_nobody_service_with_a_memlan_client(fabric, pubdir):
    """A `user = nobody` service of root's xinetd, with a memlan client: the child drops to
    nobody and execs the service with the connection on fds 0 and 1.  Before, its exec could not
    open the channel's file by name in root's fabric (mode 0700), 'cannot carry the connection
    across exec (Permission denied)', and the client read nothing; then the new image could not
    open that fabric either ("not writable by this user") and shut the connection down.  Now the
    file kept open before the drop makes the bridge, and the new image takes the connection up in
    the fabric the exec names, out of its reach for anything else."""
    have("xinetd")
    services_dir(pubdir)
    svcs = [("pynobody", str(pubdir / "svc.py"), False, "nobody")]
    out = []
    for on in (False, True):
        x = Xinetd(pubdir, svcs, pubdir / f"server{on:d}.log", on)
        try:
            out.append(client(pubdir, x.port["pynobody"], 100000, "z", pubdir / "c.log", on,
                              timeout=20))
        finally:
            x.stop()
    settle()
    assert out[0][0] == 0 and out[0][1].startswith(b"100066 "), out[0]
    assert out[1] == out[0], (out, (pubdir / "server1.log").read_text()[-2000:])
    # The service's own log lines cannot reach root's log file; the client's say it was the ring.
    assert "accelerated (client)" in (pubdir / "c.log").read_text()


def test_xinetd_cat_send_all_before_reading(fabric, pubdir):
    """A client that sends 1 MB before it reads to a service that answers as it reads (cat):
    with fixed 256 KiB rings both ends blocked in write for ever (both rings full); kernel TCP's
    autotuned buffers hold it all, and so do the rings once they grow (docs/design.md, "Rings
    grow")."""
    have("xinetd")
    services_dir(pubdir)
    svcs = [("cat", "/bin/cat", False, "root")]
    out = []
    for on in (False, True):
        x = Xinetd(pubdir, svcs, pubdir / f"server{on:d}.log", on)
        try:
            out.append(client(pubdir, x.port["cat"], 1 << 20, "", pubdir / "c.log", on, "--then",
                              timeout=15))
        finally:
            x.stop()
    settle()
    assert out[0][0] == 0 and out[0][1].startswith(b"1048576 "), out[0]
    assert out[1] == out[0], out
    assert "accelerated (client)" in (pubdir / "c.log").read_text()


# ---- netcat, bash's /dev/tcp, socat, python subprocess, glibc stdio on a socket -----------------

# glibc's stdio on a connected socket: two FILEs (fdopen of the socket and of a dup), an odd
# buffer size, fflush, shutdown(SHUT_WR), then fgets the first line and fread the rest to EOF.
STDIO_CLIENT = r"""
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>
int main(int argc, char **argv)
{
    long n = atol(argv[2]);
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (connect(s, (void *)&a, sizeof a) < 0) { perror("connect"); return 2; }
    FILE *w = fdopen(dup(s), "w"), *r = fdopen(s, "r");
    setvbuf(w, NULL, _IOFBF, 3001);
    fprintf(w, "line one\n");
    for (long i = 0; i < n; i++) fputc('a' + i % 26, w);
    fputc('\n', w);
    if (fflush(w)) { perror("fflush"); return 3; }
    if (shutdown(fileno(w), SHUT_WR)) { perror("shutdown"); return 4; }
    char line[256], buf[777];
    long total = 0;
    unsigned long h = 5381;
    size_t k;
    if (fgets(line, sizeof line, r)) printf("first: %s", line);
    while ((k = fread(buf, 1, sizeof buf, r)) > 0)
        for (size_t i = 0; i < k; i++, total++) h = h * 33 + (unsigned char)buf[i];
    printf("rest %ld hash %lx eof %d err %d\n", total, h, feof(r), ferror(r));
    return fclose(r) || fclose(w);
}
"""

# A python server whose children have the connection as stdin and stdout (subprocess), and a
# client whose child writes the request into the connection while it reads the answer.
SUBPROC_SERVER = r"""
import socket, subprocess, sys
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", int(sys.argv[1]))); ls.listen(4)
print("ready", flush=True)
for cmd in (["tr", "a-z", "A-Z"], ["sha256sum"]):
    c, _ = ls.accept()
    subprocess.run(cmd, stdin=c, stdout=c, check=True)
    c.close()
"""

SUBPROC_CLIENT = r"""
import hashlib, socket, subprocess, sys, threading
for _ in range(2):
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
    p = subprocess.Popen(["cat", sys.argv[2]], stdout=s)
    def finish():
        p.wait(); s.shutdown(socket.SHUT_WR)
    t = threading.Thread(target=finish); t.start()
    got = b"".join(iter(lambda: s.recv(65536), b""))
    t.join()
    print(p.returncode, len(got), hashlib.sha256(got).hexdigest()[:32], got[:20], flush=True)
"""


def sh(cmd, log, on, timeout=30, **kw):
    try:
        p = subprocess.run(wrap(["bash", "-c", cmd], log, on), capture_output=True,
                           timeout=timeout, **kw)
        return p.returncode, p.stdout, p.stderr[-300:]
    except subprocess.TimeoutExpired:
        return "timeout", b"", b""


def test_netcat_bash_socat_stdio(fabric, pubdir):
    """The ways a shell or a small program puts a connection on stdio, each with both ends under
    memlan and then over kernel TCP, the bytes and statuses compared: bash's /dev/tcp (exec
    3<>, a redirection) to and from netcat-openbsd's `nc -l` (1 MB each way, `nc -N` shutting
    its write side at EOF), socat EXEC: of sha256sum fed by `nc -N`, ncat's --sh-exec, and glibc's stdio on a
    socket (fdopen, fwrite through a 3001-byte buffer, shutdown, fgets, fread to EOF) against
    socat EXEC:...,nofork of a C filter.  Every connection is accelerated at both ends."""
    have("nc.openbsd", "ncat", "socat", "bash", "cc", "sha256sum")
    big = pubdir / "big"
    big.write_bytes(os.urandom(1 << 20))
    (pubdir / "stdio.c").write_text(STDIO_CLIENT)
    (pubdir / "up.c").write_text(SVC_C)
    for src, out in (("stdio.c", "stdio"), ("up.c", "up")):
        subprocess.run(["cc", "-O2", "-o", str(pubdir / out), str(pubdir / src)], check=True,
                       timeout=60)
    results = {}
    for on in (False, True):
        slog, clog = pubdir / f"server{on:d}.log", pubdir / f"client{on:d}.log"
        r = results[on] = []

        def serve(cmd, port):
            # Its output to a file, read at the end: a pipe nobody reads would stop it.
            p = subprocess.Popen(wrap(cmd, slog, on), stdin=subprocess.DEVNULL,
                                 stdout=open(pubdir / "out", "wb"), stderr=subprocess.DEVNULL)
            wait_port(port, p)
            return p

        def done(p, timeout=20):
            try:
                p.wait(timeout)
                return p.returncode, (pubdir / "out").read_bytes()
            except subprocess.TimeoutExpired:
                stop(p)
                return "timeout", b""

        # bash writes 1 MB through exec 3<>/dev/tcp, nc -l keeps it.
        port = next_port()
        p = serve(["nc.openbsd", "-l", "127.0.0.1", str(port)], port)
        r.append(sh(f"exec 3<>/dev/tcp/127.0.0.1/{port}; cat {big} >&3; exec 3>&-", clog, on))
        rc, out = done(p)
        r.append((rc, hashlib.sha256(out).hexdigest()))
        # nc -N -l sends 1 MB and shuts down; bash reads it through a redirection.
        port = next_port()
        p = subprocess.Popen(wrap(["nc.openbsd", "-N", "-l", "127.0.0.1", str(port)], slog, on),
                             stdin=open(big, "rb"), stdout=subprocess.DEVNULL)
        wait_port(port, p)
        rc, out, err = sh(f"cat </dev/tcp/127.0.0.1/{port}", clog, on)
        r.append((rc, hashlib.sha256(out).hexdigest(), err))
        r.append(done(p))
        # socat EXEC:sha256sum, fed by nc -N (half-close, then the digest comes back).
        port = next_port()
        p = serve(["socat", f"TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr", "EXEC:sha256sum"],
                  port)
        r.append(sh(f"nc.openbsd -N 127.0.0.1 {port} <{big}", clog, on))
        r.append(done(p))
        # ncat's --sh-exec (a shell, then tr, on the connection), fed by socat.
        port = next_port()
        p = serve(["ncat", "-l", "127.0.0.1", str(port), "--sh-exec", "tr a-z A-Z"], port)
        rc, out, err = sh(f"socat -t 20 - TCP:127.0.0.1:{port} <{pubdir}/stdio.c", clog, on)
        r.append((rc, hashlib.sha256(out).hexdigest(), out[:30], err))
        r.append(done(p))
        # glibc stdio on the socket, against a C filter on the connection (socat nofork).
        port = next_port()
        p = serve(["socat", f"TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork",
                   f"EXEC:{pubdir}/up,nofork"], port)
        for n in (0, 10, 200000):
            r.append(sh(f"{pubdir}/stdio {port} {n}", clog, on))
        stop(p)
    assert results[False][0][0] == 0 and results[False][1][0] == 0, results[False]
    for i, (plain, got) in enumerate(zip(results[False], results[True])):
        assert got == plain, (i, got, plain, (pubdir / "client1.log").read_text()[-2000:],
                              (pubdir / "server1.log").read_text()[-2000:])
    assert results[True][1][1] == hashlib.sha256(big.read_bytes()).hexdigest()
    assert b"rest 200015" in results[True][-1][1], results[True][-1]
    c, s = (pubdir / "client1.log").read_text(), (pubdir / "server1.log").read_text()
    assert "TCP (" not in c and "TCP (" not in s, (tcp_reasons(pubdir / "client1.log"),
                                                   tcp_reasons(pubdir / "server1.log"))
    assert "split" not in c + s, (c + s)[-3000:]
    assert accelerated(pubdir / "client1.log") == 7, c[-3000:]
    settle()


def test_python_subprocess_with_the_connection_as_stdio(fabric, pubdir):
    """CPython's subprocess starts its child with vfork, dup2s the socket onto the child's stdin
    and stdout, closes the rest (close_range) and execs: a python server runs tr, then
    sha256sum, on each accepted connection, and a python client's child (cat) writes 1 MB into
    its connection while the client reads the answer.  The vfork child's dup2s went past the fd
    table (the parent's), so its exec carried nothing: the programs wrote to the idle kernel
    sockets under the accelerated connections, and each peer read 0 bytes ("bytes arrived on the
    kernel socket ...: the stream is split").  Now the exec carries what the child dup2'd: the
    answers are kernel TCP's, and the programs' ends are carried across exec."""
    have("tr", "sha256sum", "cat")
    big = pubdir / "big"
    big.write_bytes(os.urandom(1 << 20))
    (pubdir / "srv.py").write_text(SUBPROC_SERVER)
    (pubdir / "cli.py").write_text(SUBPROC_CLIENT)
    out = {}
    for on in (False, True):
        slog, clog = pubdir / f"server{on:d}.log", pubdir / f"client{on:d}.log"
        port = next_port()
        p = subprocess.Popen(wrap([sys.executable, str(pubdir / "srv.py"), str(port)], slog, on),
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        try:
            assert p.stdout.readline() == b"ready\n"
            out[on] = sh(f"{sys.executable} {pubdir}/cli.py {port} {big}", clog, on, timeout=40)
            out[on, "server"] = p.wait(20)
        finally:
            stop(p)
    want = hashlib.sha256(big.read_bytes().upper()).hexdigest()[:32]
    assert out[False][0] == 0 and want.encode() in out[False][1], out[False]
    assert out[True] == out[False] and out[True, "server"] == 0, (
        out, (pubdir / "client1.log").read_text()[-2000:], (pubdir / "server1.log").read_text()[-2000:])
    c, s = (pubdir / "client1.log").read_text(), (pubdir / "server1.log").read_text()
    assert "split" not in c + s, (c + s)[-3000:]
    # The client's cat (fd 1) and the server's tr and sha256sum (fd 0) took their channels up.
    assert c.count("fd 1: accelerated (carried across exec)") == 2, c[-3000:]
    assert s.count("fd 0: accelerated (carried across exec)") == 2, s[-3000:]
    settle()


# ---- OpenSSH: forwarding, scp, rsync and git over ssh -----------------------------------------

# test_privdrop's sshd configuration, with forwarding allowed.
SSHD_CONF = PRIVDROP_SSHD_CONF.replace("Subsystem", "AllowTcpForwarding yes\nSubsystem")

# An echo server that answers each connection with the digest of what it read, then the bytes
# reversed (threads: the forwarders' connections overlap).
ECHO_SERVER = r"""
import hashlib, socket, sys, threading
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", int(sys.argv[1]))); ls.listen(16)
print("ready", flush=True)
def serve(c):
    d = b"".join(iter(lambda: c.recv(65536), b""))
    c.sendall(hashlib.sha256(d).hexdigest().encode() + b"\n" + d[::-1]); c.close()
while True:
    c, _ = ls.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()
"""

# A SOCKS5 client (ssh -D) to 127.0.0.1:target, then the same exchange as CLIENT's.
SOCKS_CLIENT = r"""
import hashlib, socket, struct, sys, threading
s = socket.create_connection(("127.0.0.1", int(sys.argv[1]))); s.settimeout(25)
s.sendall(b"\x05\x01\x00"); assert s.recv(2) == b"\x05\x00"
s.sendall(b"\x05\x01\x00\x01" + socket.inet_aton("127.0.0.1") + struct.pack("!H", int(sys.argv[2])))
r = b""
while len(r) < 10:
    r += s.recv(10 - len(r))
assert r[1] == 0, r
data = bytes((i * 7 + 13) % 251 for i in range(int(sys.argv[3])))
def send():
    s.sendall(data); s.shutdown(socket.SHUT_WR)
threading.Thread(target=send).start()
got = b"".join(iter(lambda: s.recv(65536), b""))
print(len(got), hashlib.sha256(got).hexdigest(), got[:60])
"""


def forwarded(port, timeout=15):
    """Wait until something listens on port (a forwarder ssh or sshd opened)."""
    from test_apps import listening
    end = time.time() + timeout
    while time.time() < end:
        if listening(port):
            return True
        time.sleep(0.05)
    return False


def test_ssh_forwarding_scp_rsync_git(fabric, pubdir):
    """sshd as Debian ships it (privilege separation, the re-executed per-connection sshd, its
    sandboxed child), on a port of its own, with a key made for the test: `ssh -L`, `ssh -R`,
    `ssh -D` (SOCKS5, a python client), `ssh -W` to an echo server (1 MB each way), scp of 20 MB,
    rsync and git over ssh; all under memlan and then over kernel TCP, the bytes and statuses
    compared.  The ssh connections and the forwarded ones are accelerated."""
    have("/usr/sbin/sshd", "ssh", "scp", "ssh-keygen", "rsync", "git")
    sftp = next((p for p in ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server")
                 if os.path.exists(p)), None)
    if not sftp:
        pytest.skip("no sftp-server")
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # the privilege-separation chroot
    for k in ("hostkey", "id"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(pubdir / k)],
                       check=True, timeout=30)
    shutil.copy(pubdir / "id.pub", pubdir / "authorized_keys")
    (pubdir / "client.py").write_text(CLIENT)
    (pubdir / "socks.py").write_text(SOCKS_CLIENT)
    (pubdir / "echo.py").write_text(ECHO_SERVER)
    big = pubdir / "big"
    big.write_bytes(os.urandom(20 << 20))
    repo = pubdir / "repo"
    subprocess.run(["git", "init", "-q", "--bare", str(repo)], check=True, timeout=30)
    work = pubdir / "work"
    subprocess.run(["git", "init", "-q", str(work)], check=True, timeout=30)
    for i in range(3):
        (work / f"f{i}").write_bytes(os.urandom(200000))
        subprocess.run(["git", "-C", str(work), "add", "."], check=True, timeout=30)
        subprocess.run(["git", "-C", str(work), "-c", "user.name=t", "-c", "user.email=t@x",
                        "commit", "-q", "-m", f"c{i}"], check=True, timeout=30)
    head = subprocess.run(["git", "-C", str(work), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    results = {}
    for on in (True, False):
        slog, clog = pubdir / f"server{on:d}.log", pubdir / f"client{on:d}.log"
        port, eport = next_port(), next_port()
        conf = pubdir / "sshd_config"
        conf.write_text(SSHD_CONF.format(port=port, d=pubdir, sftp=sftp))
        opts = ["-i", str(pubdir / "id"), "-o", "StrictHostKeyChecking=no", "-o",
                "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR",
                "-o", "ExitOnForwardFailure=yes"]
        sshcmd = " ".join(["ssh", "-p", str(port)] + opts)
        r = results[on] = {}
        procs = []
        try:
            sshd = subprocess.Popen(wrap(["/usr/sbin/sshd", "-D", "-e", "-f", str(conf), "-E",
                                          str(pubdir / "sshd.log")], slog, on),
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(sshd)
            wait_port(port, sshd)
            echo = subprocess.Popen(wrap([sys.executable, str(pubdir / "echo.py"), str(eport)],
                                         slog, on), stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL)
            procs.append(echo)
            assert echo.stdout.readline() == b"ready\n"
            fw = {}
            for kind in ("L", "R", "D"):
                fw[kind] = next_port()
                spec = {"L": f"{fw[kind]}:127.0.0.1:{eport}", "R": f"{fw[kind]}:127.0.0.1:{eport}",
                        "D": f"127.0.0.1:{fw[kind]}"}[kind]
                procs.append(subprocess.Popen(
                    wrap(["ssh", "-p", str(port)] + opts + ["-N", f"-{kind}", spec,
                                                            "root@127.0.0.1"], clog, on),
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                assert forwarded(fw[kind]), f"ssh -{kind} did not listen"
            for kind in ("L", "R"):
                r[kind] = client(pubdir, fw[kind], 1 << 20, "hi", clog, on)
            try:
                p = subprocess.run(wrap([sys.executable, str(pubdir / "socks.py"), str(fw["D"]),
                                         str(eport), str(1 << 20)], clog, on),
                                   capture_output=True, timeout=40)
                r["D"] = (p.returncode, p.stdout)
            except subprocess.TimeoutExpired:
                r["D"] = ("timeout", b"")
            r["W"] = sh(f"{sshcmd} -W 127.0.0.1:{eport} root@127.0.0.1 <{big} | head -c 65",
                        clog, on, timeout=60)
            dst = pubdir / f"scp{on:d}"
            r["scp"] = sh(f"scp -P {port} {' '.join(opts)} {big} root@127.0.0.1:{dst}", clog, on,
                          timeout=60)[:1] + (dst.read_bytes() == big.read_bytes(),)
            rdst = pubdir / f"rsync{on:d}"
            r["rsync"] = sh(f"rsync -a -e '{sshcmd}' {big} {work} root@127.0.0.1:{rdst}/", clog,
                            on, timeout=60)[:1] + (
                (rdst / "big").read_bytes() == big.read_bytes(),
                sorted(os.listdir(rdst / "work")))
            gdst = pubdir / f"clone{on:d}"
            env = dict(os.environ, GIT_SSH_COMMAND=sshcmd)
            r["git"] = (sh(f"git -C {work} push -q root@127.0.0.1:{repo} HEAD:refs/heads/b{on:d} && "
                           f"git clone -q -b b{on:d} root@127.0.0.1:{repo} {gdst} && "
                           f"git -C {gdst} rev-parse HEAD", clog, on, timeout=60, env=env))
        finally:
            for p in reversed(procs):
                stop(p)
    for key in results[False]:
        assert results[True][key] == results[False][key], (key, results[True][key],
                                                           results[False][key])
    assert results[False]["L"][0] == 0 and results[False]["L"][1].startswith(b"1048643 ")
    assert results[False]["scp"] == (0, True) and results[False]["rsync"][:2] == (0, True)
    assert results[False]["git"][1].strip() == head.encode(), results[False]["git"]
    c, s = (pubdir / "client1.log").read_text(), (pubdir / "server1.log").read_text()
    # ssh -L's, -D's and -W's connections to the echo server and sshd's for -R, each client of
    # a forwarder, and every ssh and scp, rsync and git made: accelerated at both ends.
    assert "split" not in c + s, (c + s)[-3000:]
    assert accelerated(pubdir / "client1.log") >= 12, (c[-3000:], tcp_reasons(pubdir / "client1.log"))
    assert not tcp_reasons(pubdir / "client1.log"), tcp_reasons(pubdir / "client1.log")
    settle()
