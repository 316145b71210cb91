# SPDX-License-Identifier: Apache-2.0 OR MIT
"""Transparent sockets: the same workloads over kernel TCP and under `memlan run`, compared.

conform (tests/preload/conform.c) prints every deterministic result of a randomized socket
workload; the output over kernel TCP must equal the output under memlan, line for line on each
side.  Mixed pairs run one side plain.  Every test checks, from memlan's own log, that the
connection really took the path expected (accelerated, or TCP with the reason), and leaves no
fabric file behind once dead processes' files are reclaimed.
"""
import hashlib
import json
import os
import pathlib
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import BUILD, MEMLAN, PRINTING_LISTENER, ROOT, memlan, port_free

CONFORM = BUILD / "tests-preload" / "conform"
PORT = [20100]  # below the ephemeral range (32768-60999): no outgoing connection takes it


# The system's python for the scripted programs (the one `memlan run` users have), else ours.
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def next_port():
    PORT[0] += 1
    while not port_free(PORT[0]):
        PORT[0] += 1
    return PORT[0]


def by_side(out):
    """The lines of each side, in order (the two sides interleave on one stdout)."""
    lines = out.splitlines()
    return ([l for l in lines if l.startswith("S ")], [l for l in lines if l.startswith("C ")])


def run_pair(addr, seed, under_memlan, log=None, env_extra=None):
    cmd = [str(CONFORM), "pair", addr, str(next_port()), str(seed)]
    env = dict(os.environ)
    if env_extra:
        env.update(env_extra)
    if under_memlan:
        cmd = [str(MEMLAN), "run", "--log", str(log)] + ["--"] + cmd
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 0, f"{cmd} exited {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p.stdout


def settle(fabric):
    """Reclaim the files of processes that ended with _exit (no exit handlers ran)."""
    time.sleep(0.05)
    memlan("clean")


@pytest.mark.parametrize("addr", ["127.0.0.1", "::1", "mapped"])
@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5, 6, 7, 8])
def test_differential_conformance(fabric, tmp_path, addr, seed):
    plain = run_pair(addr, seed, False)
    log = tmp_path / "memlan.log"
    under = run_pair(addr, seed, True, log)
    ps, pc = by_side(plain)
    ms, mc = by_side(under)
    assert "CORRUPT" not in plain, plain
    assert ms == ps, "server side differs under memlan"
    assert mc == pc, "client side differs under memlan"
    text = log.read_text()
    assert "accelerated (client)" in text and "accelerated (accepted" in text, text
    settle(fabric)


def start_side(role, addr, port, seed, under_memlan, log, sync):
    r, w = sync
    cmd = [str(CONFORM), role, addr, str(port), str(seed), str(r), str(w)]
    if under_memlan:
        cmd = [str(MEMLAN), "run", "--log", str(log), "--"] + cmd
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            pass_fds=(r, w))


def run_split(addr, seed, server_memlan, client_memlan, log):
    """Server and client as separate programs, each plain or under memlan."""
    port = next_port()
    a_r, a_w = os.pipe()
    b_r, b_w = os.pipe()
    srv = start_side("server", addr, port, seed, server_memlan, log, (a_r, b_w))
    time.sleep(0.3 if server_memlan else 0.1)
    cli = start_side("client", addr, port, seed, client_memlan, log, (b_r, a_w))
    so, se = srv.communicate(timeout=60)
    co, ce = cli.communicate(timeout=60)
    for fd in (a_r, a_w, b_r, b_w):
        os.close(fd)
    assert srv.returncode == 0 and cli.returncode == 0, f"{so}\n{se}\n{co}\n{ce}"
    return so, co


@pytest.mark.parametrize("seed", [11, 12])
def test_mixed_pairs_fall_through(fabric, tmp_path, seed):
    """The server speaks first; either side plain: identical bytes, TCP with the reason."""
    log = tmp_path / "plain.log"
    ps, pc = run_split("127.0.0.1", seed, False, False, log)
    # memlan client, plain server: the client's offer is never taken; the server talks first.
    log1 = tmp_path / "client.log"
    s1, c1 = run_split("127.0.0.1", seed, False, True, log1)
    assert (s1, c1) == (ps, pc)
    text = log1.read_text()
    assert "no memlan listener on this port" in text, text
    # plain client, memlan server.
    log2 = tmp_path / "server.log"
    s2, c2 = run_split("127.0.0.1", seed, True, False, log2)
    assert (s2, c2) == (ps, pc)
    text = log2.read_text()
    assert "the client is not memlan" in text, text
    settle(fabric)


ECHO_SERVER = r"""
import os, socket, sys
fd = int(sys.argv[1])
l = socket.socket(fileno=fd)
c, _ = l.accept()
data = b""
while not data.endswith(b"\n"):
    d = c.recv(4096)
    if not d:
        break
    data += d
c.sendall(b"echo " + data)
c.close()
"""

# A memlan process that listens and hands its listener to a child without memlan (LD_PRELOAD
# emptied), which runs argv[2] with the listener's fd.  argv[3] "exec": an exec memlan sees
# (subprocess), "spawn": posix_spawn; "raw": one it does not, the system call made by hand
# after a fork.  argv[4]
# "again": once the child is gone, this process runs argv[2] itself.
PARENT = r"""
import ctypes, os, platform, socket, subprocess, sys
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", int(sys.argv[1])))
l.listen(4)
env = dict(os.environ, LD_PRELOAD="")   # the child runs without memlan
argv = [sys.executable, "-c", sys.argv[2], str(l.fileno())]
if sys.argv[3] == "raw":
    os.set_inheritable(l.fileno(), True)
    pid = os.fork()
    if pid == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        a = (ctypes.c_char_p * (len(argv) + 1))(*[x.encode() for x in argv], None)
        e = (ctypes.c_char_p * (len(env) + 1))(*[("%s=%s" % kv).encode() for kv in env.items()],
                                               None)
        nr = {"x86_64": 59, "aarch64": 221}[platform.machine()]
        libc.syscall(nr, argv[0].encode(), a, e)
        os._exit(127)
    print("ready", flush=True)
    rc = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
elif sys.argv[3] == "spawn":
    os.set_inheritable(l.fileno(), True)
    pid = os.posix_spawn(argv[0], argv, env)
    print("ready", flush=True)
    rc = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
else:
    p = subprocess.Popen(argv, pass_fds=[l.fileno()], env=env)
    print("ready", flush=True)
    rc = p.wait()
if rc == 0 and sys.argv[4:] == ["again"]:
    print("again", flush=True)
    code, sys.argv[1:] = sys.argv[2], [str(l.fileno())]
    exec(code, {})  # the child's part, in this process (our l stays open)
sys.exit(rc)
"""


def echo_client(port, log, *opts):
    """Under memlan run with opts: sends 70,000 x and a newline to port, reads to the end, and
    checks that the answer is "echo " and the line."""
    client = subprocess.run([str(MEMLAN), "run", "--log", str(log), *opts, "--", PY, "-c",
                             "import socket; c=socket.create_connection(('127.0.0.1',%d));"
                             "c.sendall(b'x'*70000+b'\\n'); d=b''\n"
                             "while True:\n  b=c.recv(65536)\n  if not b: break\n  d+=b\n"
                             "print(len(d), d[:5].decode(), d.endswith(b'x\\n'))" % port],
                            capture_output=True, text=True, timeout=30)
    assert client.returncode == 0, client.stderr
    assert client.stdout.split() == ["70006", "echo", "True"], client.stdout


ACCEPTED_PLAIN = ("TCP (no memlan acceptor took the offer within an eighth of "
                  "MEMLAN_ACCEPT_WAIT_MS of the server's accept)")


BLIND_HOLDER = "TCP (a process given the server's listener runs, or ran, without memlan)"


@pytest.mark.parametrize("how", ["exec", "spawn"])
def test_listener_inherited_by_plain_process(fabric, tmp_path, how):
    """A memlan listener handed to a program without memlan through an exec memlan sees (its
    LD_PRELOAD emptied): the port's record says so, and a memlan client does not offer (TCP at
    once, with the reason), then and after that process is gone (the mark goes with the
    record, as the port's other marks do).  Before, each client offered and waited until it
    saw the connection accepted and not taken: an eighth of the accept wait (270 ms a
    connection to Apache Traffic Server, an explorer; the whole accept wait before that).
    how: through subprocess (a fork or vfork, then exec), or posix_spawn."""
    port = next_port()
    log = tmp_path / "m.log"
    parent = subprocess.Popen([str(MEMLAN), "run", "--log", str(log), "--", PY, "-c", PARENT,
                               str(port), ECHO_SERVER, how, "again"], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert parent.stdout.readline().strip() == "ready"
        echo_client(port, log, "--accept-wait-ms", "5000")
        assert parent.stdout.readline().strip() == "again"
        echo_client(port, log, "--accept-wait-ms", "5000")
        assert parent.wait(timeout=10) == 0
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
    text = log.read_text()
    assert "runs without memlan: the LD_PRELOAD it is given leaves memlan out)" in text, text
    # both clients' lines (the parent's accept says it too)
    assert text.count(f"-> 127.0.0.1:{port}: {BLIND_HOLDER}") == 2, text
    assert "offer posted" not in text and "accelerated" not in text, text
    settle(fabric)


def test_listener_inherited_unseen_by_plain_process(fabric, tmp_path):
    """A memlan listener handed to a program without memlan through an exec memlan does not
    see (a system call made by hand) still serves memlan clients, and the client's offer ends
    when the kernel shows the connection accepted, not at the end of its accept wait (5 s
    here; before, the whole of it: 2 s a connection by default)."""
    port = next_port()
    log = tmp_path / "m.log"
    parent = subprocess.Popen([str(MEMLAN), "run", "--log", str(log), "--", PY, "-c", PARENT,
                               str(port), ECHO_SERVER, "raw"], stdout=subprocess.PIPE, text=True)
    assert parent.stdout.readline().strip() == "ready"
    t0 = time.monotonic()
    echo_client(port, log, "--accept-wait-ms", "5000")
    took = time.monotonic() - t0
    assert parent.wait(timeout=10) == 0
    assert ACCEPTED_PLAIN in log.read_text(), log.read_text()
    assert took < 4, took  # the accept wait is 5 s
    settle(fabric)


# A listener's child without memlan (PARENT) that reads to the end and answers with the count.
COUNT_TO_END = r"""
import socket, sys
l = socket.socket(fileno=int(sys.argv[1]))
c, _ = l.accept()
n = 0
while True:
    d = c.recv(65536)
    if not d:
        break
    n += len(d)
c.sendall(b"%d" % n)
c.close()
"""
# A client whose fork child writes 1000 bytes, shuts down its writing and ends (argv[2] "exit")
# or stays until the answer ("stay"), while the connection is undecided; the parent reads the
# answer, with a 10 s timeout.
FORKED_SHUTDOWN = r"""
import os, signal, socket, sys, time
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
pid = os.fork()
if pid == 0:
    c.sendall(b"y" * 1000)
    c.shutdown(socket.SHUT_WR)
    if sys.argv[2] == "stay":
        time.sleep(30)
    os._exit(0)
c.settimeout(10)
try:
    print(c.recv(100).decode())
except socket.timeout:
    print("no answer")
os.kill(pid, signal.SIGKILL)
os.waitpid(pid, 0)
"""


@pytest.mark.parametrize("child", ["exit", "stay"])
def test_a_fork_childs_shutdown_while_undecided_reaches_the_server(fabric, tmp_path, child):
    """A fork child writes and shuts down its writing while the connection is undecided, then
    ends (or not); the server, a process without memlan, reads to the end and answers: the
    parent's withdrawal sends the child's bytes over TCP and then the FIN, as the kernel's
    shutdown of the shared socket would.  Before, the FIN was owed in the child's own flag, the
    parent never sent it, and the server and the client waited for each other (a review)."""
    port = next_port()
    log = tmp_path / "m.log"
    parent = subprocess.Popen([str(MEMLAN), "run", "--log", str(log), "--", PY, "-c", PARENT,
                               str(port), COUNT_TO_END, "raw"], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert parent.stdout.readline().strip() == "ready"
        p = subprocess.run([str(MEMLAN), "run", "--log", str(log), "--", PY, "-c",
                            FORKED_SHUTDOWN, str(port), child], capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 0, p.stderr
        assert p.stdout.split() == ["1000"], (p.stdout, log.read_text())
        assert parent.wait(timeout=10) == 0
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
    assert ACCEPTED_PLAIN in log.read_text(), log.read_text()
    settle(fabric)


# A client that holds its connection alone, tries to exec a script whose interpreter is missing
# (ENOENT: the file itself is there, executable), then hands the connection to cat on its stdin
# and stdout; the server (ECHO_BACK) sends a line, ends its writing, and prints what came back.
FAILED_EXEC_THEN_CAT = r"""
import os, socket, sys
bad = sys.argv[2]
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
assert c.recv(5, socket.MSG_PEEK | socket.MSG_WAITALL) == b"ping\n"  # settled: accelerated
try:
    os.execv(bad, [bad])
except OSError as e:
    print("exec failed:", e.errno == 2, flush=True)
os.dup2(c.fileno(), 0)
os.dup2(c.fileno(), 1)
c.close()
os.execv("/bin/cat", ["cat"])
"""
ECHO_BACK = r"""
import socket, sys
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", int(sys.argv[1])))
l.listen(1)
print("ready", flush=True)
s, _ = l.accept()
s.sendall(b"ping\n")
s.shutdown(socket.SHUT_WR)
s.settimeout(10)
d = b""
try:
    while True:
        b = s.recv(100)
        if not b:
            break
        d += b
except socket.timeout:
    pass
print(d.decode().strip() or "nothing", flush=True)
"""


def test_a_failed_exec_leaves_the_connection_carriable(fabric, tmp_path):
    """A process that holds an accelerated connection alone tries an exec that fails after our
    checks would pass (a script whose interpreter is missing), then execs cat with the
    connection on its stdin and stdout: the server's line comes back, as over kernel TCP.  A
    first version of the removal of names at exec took the connection's file name before the
    exec, and the failed one left it unnamed: the next carry could not reopen the file, and the
    stream split (a review).  Names now go only once an exec has succeeded."""
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/nonexistent/interpreter\n")
    bad.chmod(0o755)
    port = next_port()
    log = tmp_path / "m.log"
    srv = subprocess.Popen([str(MEMLAN), "run", "--log", str(log), "--", PY, "-c", ECHO_BACK,
                            str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert srv.stdout.readline().strip() == "ready"
        cli = subprocess.run([str(MEMLAN), "run", "--log", str(log), "--", PY, "-c",
                              FAILED_EXEC_THEN_CAT, str(port), str(bad)], capture_output=True,
                             text=True, timeout=60)
        assert cli.returncode == 0, cli.stderr
        assert srv.wait(timeout=20) == 0
        assert srv.stdout.read().split() == ["ping"], log.read_text()
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()
    text = log.read_text()
    assert "accelerated (client)" in text and "cannot carry" not in text, text
    settle(fabric)


# An inetd-style server: accepts argv[2] connections; for each, says "ok", gives the client
# 0.2 s to end, then a fork child puts the connection on fd 0 and execs `timeout 10 cat` with
# its output in argv[3].N; the parent closes its copy.
INETD_CAT = r"""
import os, socket, sys, time
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", int(sys.argv[1])))
l.listen(64)
print("ready", flush=True)
kids = []
for i in range(int(sys.argv[2])):
    s, _ = l.accept()
    s.sendall(b"ok")
    time.sleep(0.2)
    pid = os.fork()
    if pid == 0:
        os.dup2(s.fileno(), 0)
        fd = os.open("%s.%d" % (sys.argv[3], i), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.execv("/usr/bin/timeout", ["timeout", "10", "cat"])
    s.close()
    kids.append(pid)
for p in kids:
    os.waitpid(p, 0)
"""
# One-shot clients, one at a time: a fork child connects, sends a line, reads the server's "ok"
# (so that the server took the connection), closes and ends by os._exit.
ONE_SHOT = r"""
import os, socket, sys
for i in range(int(sys.argv[2])):
    if os.fork() == 0:
        c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
        c.sendall(b"line-%d\n" % i)
        assert c.recv(2) == b"ok"
        c.close()
        os._exit(0)
    os.wait()
"""


def test_one_shot_clients_of_an_inetd_style_server_lose_nothing(fabric, tmp_path):
    """Ten one-shot clients (connect, send a line, read the server's "ok", close, _exit) against
    an inetd-style server whose child execs `timeout cat` with the connection on its stdin
    (carried across two execs) once the client is gone: every line arrives, as over kernel TCP,
    every connection accelerated, and the fabric is empty afterwards.  Before, the
    client's exit removed the channel file's name (and the fabric's sweep would have, its
    creator being gone), and the server side, which reopens the file by name to carry the
    connection across an exec, failed: "cannot carry the connection across exec", and the line
    was lost (a review: 2 to 4 of 10; with the client waiting for the "ok", all 10).  The
    creator now leaves the name to a live attacher, which removes it at its own close.  (The
    first version let clients close before the accept, and in a CI run none was accelerated.)"""
    port, n = next_port(), 10
    log = tmp_path / "m.log"
    out = tmp_path / "conn"
    srv = subprocess.Popen([str(MEMLAN), "run", "--log", str(log), "--", PY, "-c", INETD_CAT,
                            str(port), str(n), str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert srv.stdout.readline().strip() == "ready"
        cli = subprocess.run([str(MEMLAN), "run", "--log", str(log), "--", PY, "-c", ONE_SHOT,
                              str(port), str(n)], capture_output=True, text=True, timeout=60)
        assert cli.returncode == 0, cli.stderr
        assert srv.wait(timeout=30) == 0
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()
    got = sorted(pathlib.Path(f"{out}.{i}").read_text() for i in range(n))
    text = log.read_text()
    assert got == sorted("line-%d\n" % i for i in range(n)), (got, text[-3000:])
    assert "cannot carry" not in text, text[-3000:]
    assert text.count("accelerated (client)") == n, text[-3000:]
    assert sorted(os.listdir(fabric)) == [], (sorted(os.listdir(fabric)), text[-3000:])


# A member of an SO_REUSEPORT group on port argv[1] that answers each connection's line with
# "echo <argv[2]> <line>", for argv[3] connections.
REUSEPORT_ECHO = r"""
import socket, sys
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
l.bind(("127.0.0.1", int(sys.argv[1])))
l.listen(16)
print("ready", flush=True)
l.settimeout(60)
for _ in range(int(sys.argv[3])):
    try:
        c, _ = l.accept()
    except socket.timeout:
        break
    d = b""
    while not d.endswith(b"\n"):
        b = c.recv(65536)
        if not b:
            break
        d += b
    c.sendall(b"echo %s %s" % (sys.argv[2].encode(), d))
    c.close()
"""
REUSEPORT_CLIENT = r"""
import socket, sys, time
for i in range(int(sys.argv[2])):
    t0 = time.monotonic()
    c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
    c.sendall(b"%d\n" % i)
    d = b""
    while True:
        b = c.recv(65536)
        if not b:
            break
        d += b
    c.close()
    print(d.decode().strip(), "%.2f" % (time.monotonic() - t0), flush=True)
"""


def test_a_reuseport_group_with_a_member_without_memlan(fabric, tmp_path):
    """Two servers share a port with SO_REUSEPORT, one under memlan and one without it (a
    rolling upgrade, a helper outside memlan); a memlan client connects 16 times, its accept
    wait 5 s.  Every answer is right; the memlan member's connections are accelerated; each one
    the kernel gives the other member goes over TCP as soon as the client sees it accepted, with
    that reason, well within the accept wait.  Before, each of those waited the whole accept
    wait (2 s by default: an outside user measured 2015 ms a connection)."""
    port, n = next_port(), 16
    slog, clog = tmp_path / "s.log", tmp_path / "c.log"
    mem = subprocess.Popen([str(MEMLAN), "run", "--log", str(slog), "--", PY, "-c",
                            REUSEPORT_ECHO, str(port), "memlan", str(n)],
                           stdout=subprocess.PIPE, text=True)
    plain = subprocess.Popen([PY, "-c", REUSEPORT_ECHO, str(port), "plain", str(n)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert mem.stdout.readline().strip() == "ready"
        assert plain.stdout.readline().strip() == "ready"
        cli = subprocess.run([str(MEMLAN), "run", "--log", str(clog), "--accept-wait-ms",
                              "5000", "--", PY, "-c", REUSEPORT_CLIENT, str(port), str(n)],
                             capture_output=True, text=True, timeout=120)
        assert cli.returncode == 0, cli.stderr
    finally:
        for p in (mem, plain):
            p.kill()
            p.wait()
    rows = [ln.split() for ln in cli.stdout.splitlines()]
    assert [r[2] for r in rows] == [str(i) for i in range(n)], cli.stdout
    who = [r[1] for r in rows]
    c, s = clog.read_text(), slog.read_text()
    assert c.count("accelerated (client)") == who.count("memlan"), c
    assert s.count("accelerated (accepted") == who.count("memlan"), s
    assert c.count(ACCEPTED_PLAIN) == who.count("plain"), c
    assert [r for r in rows if r[1] == "plain" and float(r[3]) >= 4] == [], cli.stdout
    if "plain" not in who:  # the kernel's hash gave all 16 to one member: 1 in 32,768
        pytest.skip("the kernel gave every connection to the memlan member")
    settle(fabric)


# Listens, prints "ready", waits for a connection to be queued, sleeps argv[2] seconds with it
# in the accept queue, then accepts and answers the client's line.
# A server that accepts argv[2] seconds after its first connection came.
LATE_LISTEN = r"""
import hashlib, select, socket, sys, time
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", int(sys.argv[1])))
l.listen(8)
print("ready", flush=True)
select.select([l], [], [], 30)
time.sleep(float(sys.argv[2]))
s, _ = l.accept()
"""
LATE_ACCEPT = LATE_LISTEN + r"""
d = b""
while not d.endswith(b"\n"):
    d += s.recv(65536)
s.sendall(b"echo " + d)
s.close()
"""

# echo_client's exchange, nonblocking, driven by poll (as an event loop's client).
POLL_CLIENT = r"""
import select, socket, sys
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
c.setblocking(False)
out, d = b"x" * 70000 + b"\n", b""
p = select.poll()
p.register(c, select.POLLIN | select.POLLOUT)
while True:
    p.poll(30000)
    if out:
        try:
            out = out[c.send(out):]
        except BlockingIOError:
            pass
        if not out:
            p.modify(c, select.POLLIN)
    try:
        b = c.recv(65536)
    except BlockingIOError:
        continue
    if not b:
        break
    d += b
print(len(d), d[:5].decode(), d.endswith(b"x\n"))
"""


@pytest.mark.parametrize("client,queue_ms", [("poll", None), ("poll", "300"), ("blocking", None),
                                             ("blocking", "300")])
def test_a_server_that_accepts_late_takes_the_offer(fabric, tmp_path, client, queue_ms):
    """A memlan server that accepts 1.5 s after the client connected (apache2 after a graceful
    restart accepts nothing for about 2 s), the client's MEMLAN_ACCEPT_WAIT_MS 300 ms.  A client
    driven by poll, or blocked in its read (a wait that heeds signals and SO_RCVTIMEO, as the
    kernel's read would wait for the answer), waits on while its connection is in the accept
    queue, and is accelerated.  With MEMLAN_ACCEPT_QUEUE_MS 300 it gives up at 300 ms from its
    offer, goes over TCP, and the acceptor says that the client withdrew (not "the client is not
    memlan").  Before: TCP for all, and the acceptor blamed the client; the blocking client kept
    its wait from the offer and went over TCP until its wait heeded signals and timeouts."""
    port = next_port()
    slog, clog = tmp_path / "s.log", tmp_path / "c.log"
    srv = subprocess.Popen([str(MEMLAN), "run", "--log", str(slog), "--accept-wait-ms", "300",
                            "--", PY, "-c", LATE_ACCEPT, str(port), "1.5"],
                           stdout=subprocess.PIPE, text=True)
    try:
        assert srv.stdout.readline().strip() == "ready"
        opts = ["--accept-wait-ms", "300"] + (["--accept-queue-ms", queue_ms] if queue_ms else [])
        if client == "blocking":
            echo_client(port, clog, *opts)
        else:
            p = subprocess.run([str(MEMLAN), "run", "--log", str(clog), *opts, "--", PY, "-c",
                                POLL_CLIENT, str(port)], capture_output=True, text=True,
                               timeout=30)
            assert p.returncode == 0, p.stderr
            assert p.stdout.split() == ["70006", "echo", "True"], p.stdout
        assert srv.wait(timeout=10) == 0
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()
    c, s = clog.read_text(), slog.read_text()
    if queue_ms is None:
        assert "the server has not accepted the connection yet" in c, c
        assert "accelerated (client)" in c and "TCP (" not in c, c
        assert "accelerated (accepted" in s and "TCP (" not in s, s
    else:
        assert "TCP (no memlan acceptor took the offer within MEMLAN_ACCEPT_WAIT_MS)" in c, c
        assert "TCP (the client withdrew its offer before this acceptor took it" in s, s
        assert "accelerated" not in c + s, c + s
    settle(fabric)


# A client that writes 1.5 MiB and its end before its server accepts (kernel TCP's buffers
# take 3 MiB at once so, not 4: measured here; an offer takes half tcp_wmem's maximum), and
# says "sent" when its sendall returned; the server accepts 2 s after the connection, says
# "accepted", and answers with the size and digest of what it read to the end.
EARLY_WRITER = r"""
import hashlib, socket, sys
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
if len(sys.argv) > 2:  # a send buffer made small after connect, and a smaller write
    c.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, int(sys.argv[2]))
c.sendall(hashlib.sha256(b"early").digest() * (3 << 14 if len(sys.argv) < 4 else int(sys.argv[3])))
print("sent", flush=True)
c.shutdown(socket.SHUT_WR)
print(c.recv(100).decode(), flush=True)
"""
LATE_READER = LATE_LISTEN + r"""
print("accepted", flush=True)
h, n = hashlib.sha256(), 0
while True:
    d = s.recv(1 << 16)
    if not d:
        break
    h.update(d)
    n += len(d)
s.sendall(b"%d %s" % (n, h.hexdigest()[:16].encode()))
s.close()
"""


@pytest.mark.parametrize("how", ["tcp", "accelerated", "withdrawn", "sndbuf"])
def test_a_client_writes_1_5_mib_before_its_server_accepts(fabric, tmp_path, how):
    """A client's blocking sendall of 1.5 MiB returns before its server accepts, as kernel TCP's
    buffers take it: an undecided ring grows into its region as an accepted one does, up to
    half tcp_wmem's maximum (2 MiB), what a withdrawal's flush to the kernel takes at once.
    Before, the sendall waited for the decision once 256 KiB filled the ring (up to the accept
    wait, 2 s, or the accept itself).  The server reads all of it, in order, whether the
    connection is accelerated (the server takes the offer) or goes over TCP (the client gives
    up at MEMLAN_ACCEPT_QUEUE_MS 300, and the bytes in the ring and its region go out over TCP
    first).  The order of the two processes' lines is the check: "sent" before "accepted".
    (sndbuf) SO_SNDBUF 16 KiB after connect and 40,000 bytes: taken at once too (the kernel
    took 80 KB so; a review's mend first lowered the offer's limit to 16 KiB, and the sendall
    waited 2 s for the decision)."""
    port = next_port()
    slog, clog = tmp_path / "s.log", tmp_path / "c.log"
    on = how != "tcp"

    def wrap(log, opts, args):
        return ([str(MEMLAN), "run", "--log", str(log), *opts, "--"] if on else []) + args
    srv = subprocess.Popen(wrap(slog, [], [PY, "-c", LATE_READER, str(port), "2"]),
                           stdout=subprocess.PIPE, text=True)
    cli = None
    try:
        assert srv.stdout.readline().strip() == "ready"
        opts = ["--accept-queue-ms", "300"] if how == "withdrawn" else []
        more = ["16384", "1250"] if how == "sndbuf" else []
        cli = subprocess.Popen(wrap(clog, opts, [PY, "-c", EARLY_WRITER, str(port), *more]),
                               stdout=subprocess.PIPE, text=True)
        assert cli.stdout.readline().strip() == "sent"
        # nothing from the server yet: it has not accepted (it said only "ready", read whole)
        assert select.select([srv.stdout], [], [], 0)[0] == [], "the sendall waited for accept"
        assert srv.stdout.readline().strip() == "accepted"
        blob = hashlib.sha256(b"early").digest() * (1250 if how == "sndbuf" else 3 << 14)
        want, digest = len(blob), hashlib.sha256(blob).hexdigest()[:16]
        assert cli.stdout.readline().split() == [str(want), digest]
        assert cli.wait(timeout=20) == 0 and srv.wait(timeout=20) == 0
    finally:
        for p in (cli, srv):
            if p and p.poll() is None:
                p.kill()
                p.wait()
    if how in ("accelerated", "sndbuf"):
        assert "accelerated (client)" in clog.read_text(), clog.read_text()
        assert "accelerated (accepted" in slog.read_text(), slog.read_text()
    elif how == "withdrawn":
        c, s = clog.read_text(), slog.read_text()
        # _QUEUE_MS or _WAIT_MS: which of the two waits the client was in when it gave up
        assert "TCP (no memlan acceptor took the offer within MEMLAN_ACCEPT_" in c, c
        assert "TCP (the client withdrew its offer before this acceptor took it" in s, s
    settle(fabric)


# A client's bytes written before its server accepts, then one of three ways to go on (argv[2]):
#   epoll  nonblocking, 4.4 MB handed to send as the socket takes them, then EPOLLIN only;
#   fork   connect, fork: the parent's sendall of 1 MiB, then the child's "CHILD";
#   pass   a sendall of 1 MiB, the socket passed over SCM_RIGHTS and closed: the receiver's
#          "RECV";
#   passsmall  the same from a nonblocking passer after SO_SNDBUF 16 KiB and nonblocking sends
#          until they would block: the receiver says whether the server got all the passer's
#          bytes, then its own.
# The server (argv[3]: its accept delay) reads to the end and answers with the size, the digest
# and where the other writer's mark lies; the client prints that.
EARLY_ORDER = r"""
import hashlib, os, select, socket, sys, time
port, how = int(sys.argv[1]), sys.argv[2]
N = 4400000 if how == "epoll" else 1 << 20
data = (hashlib.sha256(b"order").digest() * (N // 32 + 1))[:N]
if how == "srv":
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind(("127.0.0.1", port))
    l.listen(8)
    print("ready", flush=True)
    time.sleep(float(sys.argv[3]))
    s, _ = l.accept()
    s.settimeout(20)
    got = b""
    while not got.endswith(b"END"):
        d = s.recv(1 << 16)
        if not d:
            break
        got += d
    mark = max(got.find(b"CHILD"), got.find(b"RECV"))
    s.sendall(b"%d %s %d" % (len(got), hashlib.sha256(got).hexdigest()[:16].encode(), mark))
    s.close()
    sys.exit(0)
c = socket.create_connection(("127.0.0.1", port))
if how == "epoll":
    data += b"END"
    c.setblocking(False)
    ep = select.epoll()
    ep.register(c.fileno(), select.EPOLLOUT)
    off, end = 0, time.monotonic() + 20
    while time.monotonic() < end:
        for fd, ev in ep.poll(1):
            if ev & select.EPOLLOUT:
                try:
                    while off < len(data):
                        off += c.send(data[off:off + 65536])
                except BlockingIOError:
                    pass
                if off == len(data):
                    ep.modify(c.fileno(), select.EPOLLIN)
            if ev & select.EPOLLIN:
                print(c.recv(100).decode(), flush=True)
                sys.exit(0)
    print("timeout, sent", off, flush=True)
elif how == "fork":
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.read(r, 1)
        time.sleep(0.5)
        c.sendall(b"CHILDEND")
        os._exit(0)
    c.sendall(data)
    os.write(w, b"x")
    os.waitpid(pid, 0)
    print(c.recv(100).decode(), flush=True)
else:
    a, b = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        a.close()
        msg, fds, _, _ = socket.recv_fds(b, 20, 1)
        p = socket.socket(fileno=fds[0])
        p.setblocking(True)  # (the passer's O_NONBLOCK came with it)
        time.sleep(0.2)
        p.sendall(b"RECVEND")
        got = p.recv(100)
        if how == "passsmall":  # the passer took n bytes (the kernel's buffers decide how many)
            n = int(msg)
            want = b"%d %s %d" % (n + 7, hashlib.sha256(data[:n] + b"RECVEND").hexdigest()[:16]
                                  .encode(), n)
            got = b"whole" if got == want else got
        print(got.decode(), flush=True)
        os._exit(0)
    b.close()
    n = N
    if how == "pass":
        c.sendall(data)
    else:  # passsmall: a small send buffer, nonblocking sends until it is full, a nonblocking
        c.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)  # passer
        c.setblocking(False)
        a.setblocking(False)
        n = 0
        try:
            while n < N:
                n += c.send(data[n:n + 65536])
        except BlockingIOError:
            pass
    socket.send_fds(a, [b"%d" % n], [c.fileno()])
    c.close()
    os.waitpid(pid, 0)
"""


@pytest.mark.parametrize("how", ["epoll", "fork", "pass", "passsmall"])
def test_bytes_written_before_the_accept_keep_their_order(fabric, tmp_path, how):
    """A client writes before its server (memlan, accepting 1 s late) takes the offer, and then
    (epoll) waits for input only, with 4.4 MB handed to send; (fork) its fork child writes after
    the parent's sendall of 1 MiB returned; (pass) it passes the socket over SCM_RIGHTS and the
    receiver writes.  The client gives up on the offer at MEMLAN_ACCEPT_QUEUE_MS 300 (TCP).  The
    server must read the same bytes in the same order as over kernel TCP.  A hostile review of
    the growth of undecided rings found: 233,560 bytes never sent (the ring and region held
    more than the kernel's buffers took at the fall to TCP, and nobody flushed the rest while
    the program polled for input), the child's mark at 0 (its look for unsent bytes read its
    own stale copy of the positions, before growth too with 100 KiB), the receiver's mark
    inside the passer's bytes (an undecided socket was passed as it was).  A second review:
    (passsmall) the pass waited for the decision, and with a small send buffer the flush of the
    ring, taken to the sysctl's limit, never ended (the passer hung, where its own thread was
    the server's reader); now the pass withdraws the offer without waiting, and SO_SNDBUF after
    connect lowers the offer's limit.  This case checks the bytes and their order only: here
    the server is another process, and 14c5d12's waiting pass passes it too (slowly)."""
    out = {}
    for on in (False, True):
        port = next_port()
        slog, clog = tmp_path / f"s{on}.log", tmp_path / f"c{on}.log"
        pre = [str(MEMLAN), "run", "--log", str(slog), "--"] if on else []
        srv = subprocess.Popen(pre + [PY, "-c", EARLY_ORDER, str(port), "srv", "1"],
                               stdout=subprocess.PIPE, text=True)
        try:
            assert srv.stdout.readline().strip() == "ready"
            pre = [str(MEMLAN), "run", "--log", str(clog), "--accept-queue-ms", "300",
                   "--"] if on else []
            cli = subprocess.run(pre + [PY, "-c", EARLY_ORDER, str(port), how],
                                 capture_output=True, text=True, timeout=60)
            assert cli.returncode == 0, cli.stderr
            assert srv.wait(timeout=20) == 0
        finally:
            if srv.poll() is None:
                srv.kill()
                srv.wait()
        out[on] = cli.stdout
    n = 4400003 if how == "epoll" else (1 << 20) + (8 if how == "fork" else 7)
    assert out[False].split()[0] == ("whole" if how == "passsmall" else str(n)), out[False]
    assert out[True] == out[False]
    settle(fabric)


def test_peer_sigkill_gives_eof_not_hang(fabric, tmp_path):
    """A server killed mid-connection: the blocked memlan client returns within the bound."""
    port = next_port()
    log = tmp_path / "k.log"
    py = PY
    srv = subprocess.Popen([str(MEMLAN), "run", "--log", str(log), "--", py, "-c",
                            "import socket,time; l=socket.socket(); "
                            "l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
                            "l.bind(('127.0.0.1',%d)); l.listen(1); print('ready', flush=True); "
                            "c,_=l.accept(); c.sendall(b'partial'); time.sleep(60)" % port],
                           stdout=subprocess.PIPE, text=True)
    assert srv.stdout.readline().strip() == "ready"
    cli = subprocess.Popen([str(MEMLAN), "run", "--log", str(log), "--", py, "-c",
                            "import socket,time; c=socket.create_connection(('127.0.0.1',%d)); "
                            "d=c.recv(7, socket.MSG_WAITALL); print(d.decode(), flush=True)\n"
                            "try:\n  r=c.recv(10); print('eof' if r==b'' else r)\n"
                            "except ConnectionResetError:\n  print('reset')" % port],
                           stdout=subprocess.PIPE, text=True)
    assert cli.stdout.readline().strip() == "partial"
    time.sleep(0.2)
    t0 = time.time()
    srv.send_signal(signal.SIGKILL)
    srv.wait()
    out = cli.stdout.readline().strip()
    took = time.time() - t0
    cli.wait(timeout=10)
    assert out in ("eof", "reset"), out
    assert took < 3, took
    assert "accelerated (client)" in log.read_text()
    settle(fabric)


# A listener on 127.0.0.1, port argv[1], for the scripts below (port: its number).
LISTENER = r"""
import os, select, selectors, signal, socket, sys, time
port = int(sys.argv[1])
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", port))
l.listen(16)
"""

# A server child that reads the client's "hi" and is killed; the client, its SIGPIPE ignored,
# then sends 64 KiB at a time (blocking, then nonblocking) and says how many sends went through
# before the first error.
SEND_TO_KILLED = LISTENER + r"""
nb, grown = sys.argv[2].startswith("nonblocking"), sys.argv[2].endswith("grown")
pid = os.fork()
if pid == 0:
    s, _ = l.accept()
    s.recv(2)
    time.sleep(60)
    os._exit(0)
l.close()
c = socket.create_connection(("127.0.0.1", port))
c.sendall(b"hi")
time.sleep(0.3)
if grown:  # 1 MB the live peer does not read: a ring grows into its region before the kill
    c.setblocking(False)
    sent = 0
    try:
        while sent < 1 << 20:
            sent += c.send(b"z" * 65536)
    except BlockingIOError:
        pass
os.kill(pid, signal.SIGKILL)
os.waitpid(pid, 0)
time.sleep(0.3)
signal.signal(signal.SIGPIPE, signal.SIG_IGN)
c.setblocking(not nb)
buf = b"x" * 65536
for i in range(200):
    try:
        c.send(buf)
    except BlockingIOError:
        print("EAGAIN after", i)
        break
    except OSError as e:
        print("error after", i)
        break
else:
    print("200 sends went through")
"""


@pytest.mark.parametrize("mode", ["blocking", "nonblocking", "blocking-grown",
                                  "nonblocking-grown", "nonblocking-nogrow"])
def test_sends_to_a_killed_peer_fail_within_the_ring(fabric, tmp_path, mode):
    """A peer killed (SIGKILL) after it read everything: kernel TCP fails the client's second
    send.  Under memlan the sends fail once the ring (256 KiB) is full, its region never taken
    up: before, the ring grew into its 4 MiB region first, and 68 sends of 64 KiB (4.25 MiB)
    went through to a dead peer, lost.  ("grown": killed with 1 MB of ours unread, the sender
    already in its region: kernel TCP fails the first send; memlan's fail once the region is
    full, at most 68 of them, where a nonblocking one was told EAGAIN for ever.  "nogrow": rings
    that do not grow, MEMLAN_RING_GROW_KB=0: a nonblocking sender that retried without a poll
    was told EAGAIN for ever, before rings grew too.)"""
    plain = subprocess.run([PY, "-c", SEND_TO_KILLED, str(next_port()), mode],
                           capture_output=True, text=True, timeout=60)
    kernel = "error after 0" if mode.endswith("grown") else "error after 1"
    assert plain.stdout.strip() == kernel, plain.stdout + plain.stderr
    log = tmp_path / "m.log"
    under = subprocess.run([str(MEMLAN), "run", "--log", str(log), "--", PY, "-c", SEND_TO_KILLED,
                            str(next_port()), mode], capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, MEMLAN_RING_GROW_KB="0" if "nogrow" in mode
                                    else "4096"))
    what, _, n = under.stdout.strip().rpartition(" ")
    bound = 68 if mode.endswith("grown") else 4
    assert what == "error after" and int(n) <= bound, under.stdout + under.stderr
    assert "accelerated (client)" in log.read_text(), log.read_text()
    settle(fabric)


# A server child that answers each of 8 connections' "GET" with 1 MB and then waits for the next
# request (mode: a blocking recv, an epoll set, a poll; "busy": with a ninth connection on which
# a byte comes every 30 ms, so that the loop never sleeps out its wait), while the client sums
# the blocks the fabric's files hold once the answers lie unread in their regions, reads them,
# sums the blocks again 2.5 s later, then says "bye".  (It used to sum them after reading every
# answer: under load the first regions were given back before it read the last, and the first
# sum missed them.)
IDLE_AFTER_BURST = LISTENER + r"""
import threading
mode, fab = sys.argv[2], sys.argv[3]
busy = mode.endswith("busy")
def held():  # a file may go between the listing and its stat (an offer's name, once taken)
    n = 0
    for f in os.listdir(fab):
        try:
            n += os.stat(os.path.join(fab, f)).st_blocks * 512
        except FileNotFoundError:
            pass
    return n
pid = os.fork()
if pid == 0:
    conns = [l.accept()[0] for _ in range(8)]
    chat = l.accept()[0] if busy else None
    for c in conns:
        c.recv(3)
        c.sendall(b"y" * 1000000)
    if mode == "recv":
        for c in conns:
            c.recv(3)
    elif mode.startswith("epoll"):
        sel = selectors.EpollSelector()
        for c in conns + ([chat] if chat else []):
            sel.register(c, selectors.EVENT_READ)
        left = set(conns)
        while left:
            for k, _ in sel.select(10):
                k.fileobj.recv(3)
                if k.fileobj is not chat:
                    sel.unregister(k.fileobj)
                    left.discard(k.fileobj)
    else:
        left = list(conns)
        while left:
            p = select.poll()
            for c in left + ([chat] if chat else []):
                p.register(c, select.POLLIN)
            ready = {fd for fd, _ in p.poll(10000)}
            if chat and chat.fileno() in ready:
                chat.recv(3)
            for c in [c for c in left if c.fileno() in ready]:
                c.recv(3)
                left.remove(c)
    os._exit(0)
cs = [socket.create_connection(("127.0.0.1", port)) for _ in range(8)]
stop = []
if busy:
    ch = socket.create_connection(("127.0.0.1", port))
    def chatter():
        while not stop:
            ch.send(b"p")
            time.sleep(0.03)
    th = threading.Thread(target=chatter)
    th.start()
for c in cs:  # every request first: each answer lies in its region until read, held there
    c.sendall(b"GET")
end = time.monotonic() + 20
while held() <= 8 * 4096 * 1024 and time.monotonic() < end:
    time.sleep(0.05)
first = held()
for c in cs:
    got = 0
    while got < 1000000:
        got += len(c.recv(1 << 20))
time.sleep(2.5)
print(first // 1024, held() // 1024)
stop.append(1)
if busy:
    th.join()
for c in cs:
    c.sendall(b"bye")
os.waitpid(pid, 0)
"""


@pytest.mark.parametrize("mode", ["recv", "epoll", "poll", "epollbusy", "pollbusy"])
def test_an_idle_sender_gives_its_regions_pages_back(fabric, tmp_path, mode):
    """Eight keep-alive connections whose server sent 1 MB each (the rings grew into their
    regions: the fabric holds more than 4 MiB a connection once they are read) and then waits
    for the next request, in a blocking recv, an epoll set or a poll, idle or kept busy by a
    ninth connection: 2.5 s on, the fabric holds the rings, about 520 KiB a connection (256 KiB
    both ways), the regions given back, as kernel TCP frees its buffers once read.  Before, each
    kept its 4 MiB region until its next send or its close: 8 connections held 37 MB; a first
    version gave them back only where the loop slept out its wait (busy: 37 MB still)."""
    log = tmp_path / "m.log"
    p = subprocess.run([str(MEMLAN), "run", "--log", str(log), "--", PY, "-c", IDLE_AFTER_BURST,
                        str(next_port()), mode, str(fabric)], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    first, then = (int(x) for x in p.stdout.split())
    assert first > 8 * 4096, p.stdout  # grown
    assert then < 9 * 600, p.stdout
    assert log.read_text().count("accelerated (client)") == (9 if "busy" in mode else 8), \
        log.read_text()
    settle(fabric)


CLOSED_BEFORE_ACCEPT = r"""
import socket, sys
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", int(sys.argv[1])))
l.listen(4)
c1 = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
c1.close()                       # gone before the server accepts (wrk's probe does this)
c2 = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
c2.sendall(b"after")
a1, _ = l.accept()
a2, _ = l.accept()
print(repr(a1.recv(10)), repr(a2.recv(10)))
"""


def test_client_closed_before_accept(fabric, tmp_path):
    """A memlan client that closes before the memlan server accepts: the server reads EOF, as
    over TCP, and the log says why the connection stayed on TCP without blaming the client."""
    script = tmp_path / "cba.py"
    script.write_text(CLOSED_BEFORE_ACCEPT)
    port = next_port()
    py = PY
    plain = subprocess.run([py, str(script), str(port)], capture_output=True, text=True,
                           timeout=30)
    log = tmp_path / "cba.log"
    under = subprocess.run([str(MEMLAN), "run", "--log", str(log), "--", py, str(script),
                            str(next_port())], capture_output=True, text=True, timeout=30)
    assert plain.returncode == 0 and under.returncode == 0, (plain.stderr, under.stderr)
    assert under.stdout == plain.stdout == "b'' b'after'\n", (plain.stdout, under.stdout)
    text = log.read_text()
    # Either of the acceptor's ways to see it (the claim's or the wait's): neither blames it.
    assert ("the client closed before accept" in text or
            "the client shut down its sending before accept" in text), text
    assert "not memlan" not in text and "accelerated (accepted" in text, text
    settle(fabric)


OUTQ = r"""
import fcntl, socket, struct, sys, termios, time
SIOCOUTQNSD = 0x894B
def ask(s, req):
    return struct.unpack("i", fcntl.ioctl(s.fileno(), req, b"\0\0\0\0"))[0]
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", int(sys.argv[1])))
l.listen(1)
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
a, _ = l.accept()
c.sendall(b"x"); a.recv(1); a.sendall(b"y"); c.recv(1)     # settled (memlan: on the channel)
for n in (1000, 9000):                                      # within any receive buffer
    c.sendall(b"z" * n)
    for _ in range(100):                                    # loopback's ack, at most 1 s
        if ask(c, termios.TIOCOUTQ) == 0:
            break
        time.sleep(0.01)
    print(n, "outq", ask(c, termios.TIOCOUTQ), "unsent", ask(c, SIOCOUTQNSD),
          "peer inq", ask(a, termios.FIONREAD))
print("read", len(a.recv(10000, socket.MSG_WAITALL)))
"""


def test_outq_counts_what_loopback_counts(fabric, tmp_path):
    """SIOCOUTQ and SIOCOUTQNSD after sends that the peer has not read yet, within its receive
    buffer: over kernel TCP on loopback 0 (delivered, acknowledged: the peer's FIONREAD counts
    the bytes), and so under memlan, where the ring's bytes are the peer's receive queue.  Before,
    memlan counted them in SIOCOUTQ (1000, then 10000), so a program that waits for its queue to
    empty waited for the peer program's read.  Found trying Java under memlan (helper rt)."""
    script = tmp_path / "outq.py"
    script.write_text(OUTQ)
    py = PY
    plain = subprocess.run([py, str(script), str(next_port())], capture_output=True, text=True,
                           timeout=30)
    log = tmp_path / "outq.log"
    under = subprocess.run([str(MEMLAN), "run", "--log", str(log), "--", py, str(script),
                            str(next_port())], capture_output=True, text=True, timeout=30)
    assert plain.returncode == 0 and under.returncode == 0, (plain.stderr, under.stderr)
    assert plain.stdout == ("1000 outq 0 unsent 0 peer inq 1000\n"
                            "9000 outq 0 unsent 0 peer inq 10000\nread 10000\n"), plain.stdout
    assert under.stdout == plain.stdout, under.stdout
    assert "accelerated (client)" in log.read_text()
    settle(fabric)


RING_FILL = r"""
import socket, sys
port, cbuf, lbuf = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
if lbuf:
    l.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, lbuf)
l.bind(("127.0.0.1", port))
l.listen(4)
c = socket.socket()
if cbuf:
    c.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, cbuf)
c.connect(("127.0.0.1", port))
a, _ = l.accept()
c.sendall(b"x"); assert a.recv(1) == b"x"
a.sendall(b"y"); assert c.recv(1) == b"y"
c.setblocking(False)
total, chunk = 0, b"z" * 4096
while total < (1 << 28):
    try:
        total += c.send(chunk)
    except BlockingIOError:
        break
print(total, c.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) if cbuf else 0,
      l.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) if lbuf else 0)
"""


@pytest.mark.parametrize("cbuf,lbuf", [(0, 0), (1 << 20, 0), (0, 1 << 20), (4096, 0)])
def test_so_buffers_size_the_rings(fabric, tmp_path, cbuf, lbuf):
    """SO_SNDBUF/SO_RCVBUF set before connect (client) or on the listener size the rings: a
    nonblocking sender whose peer does not read fits exactly one ring, the kernel's value of the
    largest buffer set rounded up to a power of two (such a ring does not grow, as the kernel
    does not autotune a buffer the program sized); when none is, MEMLAN_RING_KB (256 KB) and
    the 4 MiB region the full ring grows into (docs/design.md, "Rings grow")."""
    script = tmp_path / "fill.py"
    script.write_text(RING_FILL)
    log = tmp_path / "fill.log"
    py = PY
    out = subprocess.run([str(MEMLAN), "run", "--log", str(log), "--", py, str(script),
                          str(next_port()), str(cbuf), str(lbuf)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    total, ceff, leff = (int(x) for x in out.stdout.split())
    want = max(ceff, leff)
    ring = 256 * 1024 + 4096 * 1024
    if want:
        ring = 4096
        while ring < want:
            ring *= 2
    assert total == ring, (total, ceff, leff)
    assert "accelerated (client)" in log.read_text()
    settle(fabric)


GROWSECCOMP = BUILD / "tests-preload" / "growseccomp"


@pytest.mark.parametrize("how", ["prctl", "inherit"])
def test_a_ring_does_not_grow_where_a_filter_may_kill_for_it(fabric, tmp_path, how):
    """A sender fills its connection past the ring, its reader away, in a process whose seccomp
    filter kills madvise(MADV_POPULATE_WRITE) and madvise(MADV_REMOVE), with which a ring grows
    and gives its pages back (docs/design.md, "Rings grow"): the filter installed after the
    connection through prctl, or before an exec (as systemd's SystemCallFilter= does).  Over
    kernel TCP the program runs to its end; under memlan too, the ring's 256 KiB taken and no
    more, every byte read back.  Before, the growth's madvise was a SIGSYS."""
    plain = subprocess.run([str(GROWSECCOMP), how, str(next_port())], capture_output=True,
                           text=True, timeout=60)
    assert plain.returncode == 0 and plain.stdout.endswith(" intact\n"), plain.stdout + plain.stderr
    log = tmp_path / "s.log"
    under = subprocess.run([str(MEMLAN), "run", "--log", str(log), "--", str(GROWSECCOMP), how,
                            str(next_port())], capture_output=True, text=True, timeout=60)
    assert under.returncode == 0, (under.returncode, under.stdout, under.stderr)
    assert under.stdout == "filled 262144, read 262144 intact\n", under.stdout + under.stderr
    assert "accelerated (client)" in log.read_text()
    settle(fabric)


# A connected pair in one process (c the client, a the accepted end), its first byte through.
PAIR = r"""
import socket, sys, threading, time
port = int(sys.argv[1])
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", port))
l.listen(1)
c = socket.create_connection(("127.0.0.1", port))
a, _ = l.accept()
c.sendall(b"h")
assert a.recv(1) == b"h"
"""

GROWN_PEEK = PAIR + r"""
data = bytes((i * 7 + i // 251) % 256 for i in range(60000))
t = threading.Thread(target=c.sendall, args=(data,))
t.start()  # more than the ring holds, before a byte is read
p = a.recv(60000, socket.MSG_PEEK | socket.MSG_WAITALL)
t.join()
print("peek", len(p), p == data)
print("trunc", len(a.recv(30000, socket.MSG_TRUNC)))
rest = b""
while len(rest) < 30000:
    rest += a.recv(30000 - len(rest))
print("rest", len(rest), rest == data[30000:])
"""


def test_a_grown_ring_is_read_whole_by_peek_and_trunc(fabric, tmp_path):
    """60 KB sent before the reader reads (what kernel TCP's receive queue holds unread):
    under memlan with 16 KiB rings (MEMLAN_RING_KB), 16 KiB in the ring and the rest in the
    region it grew into (docs/design.md, "Rings grow").  recv(MSG_PEEK|MSG_WAITALL) of all of
    it, then recv(MSG_TRUNC) of half, then the rest: the same counts and bytes as over kernel
    TCP (a peek sees the ring's run and the region's; a discard that stopped at the switch
    returned less than asked)."""
    script = tmp_path / "grownpeek.py"
    script.write_text(GROWN_PEEK)
    want = ["peek 60000 True", "trunc 30000", "rest 30000 True"]
    plain = subprocess.run([PY, str(script), str(next_port())], capture_output=True, text=True,
                           timeout=60)
    assert plain.stdout.split("\n")[:3] == want, plain.stdout + plain.stderr
    log = tmp_path / "g.log"
    under = subprocess.run([str(MEMLAN), "run", "--ring-kb", "16", "--log", str(log), "--", PY,
                            str(script), str(next_port())], capture_output=True, text=True,
                           timeout=60)
    assert under.stdout.split("\n")[:3] == want, under.stdout + under.stderr
    assert "accelerated (client)" in log.read_text()
    settle(fabric)


PEEK_LATE = PAIR + r"""
def send():
    c.sendall(b"a" * 30000)
    time.sleep(0.3)
    c.sendall(b"b" * 30000)
t = threading.Thread(target=send)
t.start()
time.sleep(0.1)  # the peek begins with half of it there
p = a.recv(60000, socket.MSG_PEEK | socket.MSG_WAITALL)
t.join()
print("peek", len(p), p == b"a" * 30000 + b"b" * 30000)
"""


def test_a_peek_waiting_for_all_sees_what_comes_after_it_began(fabric, tmp_path):
    """recv(MSG_PEEK|MSG_WAITALL) of 60 KB begun when 30 KB are there, the rest sent 0.3 s
    later: it returns all 60 KB, as over kernel TCP.  Before, under memlan, it looked again and
    again at its cached copy of the head, which it never reloaded while that was not used up,
    and waited for ever."""
    script = tmp_path / "peeklate.py"
    script.write_text(PEEK_LATE)
    plain = subprocess.run([PY, str(script), str(next_port())], capture_output=True, text=True,
                           timeout=30)
    assert plain.stdout == "peek 60000 True\n", plain.stdout + plain.stderr
    log = tmp_path / "p.log"
    under = subprocess.run([str(MEMLAN), "run", "--log", str(log), "--", PY, str(script),
                            str(next_port())], capture_output=True, text=True, timeout=30)
    assert under.stdout == plain.stdout, under.stdout + under.stderr
    assert "accelerated (client)" in log.read_text()
    settle(fabric)


THREADS = r"""
import hashlib, socket, struct, sys, threading
port, n = int(sys.argv[1]), int(sys.argv[2])
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", port))
l.listen(4)

# 1. Four client threads send 64-byte records at once while a fifth receives the echo.
c = socket.create_connection(("127.0.0.1", port))
a, _ = l.accept()
def echo():
    while True:
        d = a.recv(777)
        if not d:
            return
        a.sendall(d)
def record(t, i):
    body = struct.pack("<II", t, i) + bytes([t]) * 48
    return body + hashlib.md5(body).digest()[:8]
def send(t):
    for i in range(n):
        c.sendall(record(t, i))
got = bytearray()
def recv():
    while len(got) < 4 * n * 64:
        d = c.recv(65536)
        if not d:
            break
        got.extend(d)
ths = [threading.Thread(target=send, args=(t,)) for t in range(4)]
ths += [threading.Thread(target=recv), threading.Thread(target=echo)]
for t in ths:
    t.start()
for t in ths[:5]:
    t.join()
c.shutdown(socket.SHUT_WR)
ths[5].join()
# Every record whole and once, each thread's in order (a send is atomic and ordered, as over TCP).
seen, bad = {}, 0
for k in range(0, len(got), 64):
    r = bytes(got[k:k + 64])
    t, i = struct.unpack_from("<II", r)
    if len(r) != 64 or t > 3 or r != record(t, i) or seen.get(t, -1) != i - 1:
        bad += 1
        continue
    seen[t] = i
print(len(got), bad, sorted(seen.items()))

# 2. Two threads blocked in recv on one socket: they share the bytes, and both see the end.
c = socket.create_connection(("127.0.0.1", port))
a, _ = l.accept()
tot = [0, 0]
def reader(k):
    while True:
        d = a.recv(777)
        if not d:
            return
        tot[k] += len(d)
rs = [threading.Thread(target=reader, args=(k,)) for k in range(2)]
for t in rs:
    t.start()
for i in range(n):
    c.sendall(b"z" * 100)
c.shutdown(socket.SHUT_WR)
for t in rs:
    t.join(20)
print(sum(tot), [t.is_alive() for t in rs], flush=True)
import json
import os
import pathlib
import re
os._exit(0)
"""


def test_threads_share_one_socket(fabric, tmp_path):
    """Four threads send on one accelerated socket while a fifth receives the echo; then two
    threads block in recv on one socket and must both see the end: the same outcome over kernel
    TCP and under memlan.  (The second part hung before the fix to the socket lock in sock.c.)"""
    script = tmp_path / "threads.py"
    script.write_text(THREADS)
    py = PY
    plain = subprocess.run([py, str(script), str(next_port()), "3000"], capture_output=True,
                           text=True, timeout=120)
    log = tmp_path / "threads.log"
    under = subprocess.run([str(MEMLAN), "run", "--log", str(log), "--", py, str(script),
                            str(next_port()), "3000"], capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0 and under.returncode == 0, (plain.stderr, under.stderr)
    want = "%d 0 %s\n%d [False, False]\n" % (4 * 3000 * 64, [(t, 2999) for t in range(4)],
                                                3000 * 100)
    assert plain.stdout == want, plain.stdout
    assert under.stdout == want, under.stdout
    assert "accelerated (client)" in log.read_text()
    settle(fabric)


REUSEPORT_SERVER = r"""
import os, socket, sys
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
l.bind(("127.0.0.1", int(sys.argv[1])))
l.listen(64)
print("ready", flush=True)
while True:
    a, _ = l.accept()
    q = a.recv(100)
    a.sendall(b"%d:%s" % (os.getpid(), q))
    a.close()
"""


def test_reuseport_listeners_in_two_processes(fabric, tmp_path):
    """Two memlan processes listen on one port with SO_REUSEPORT; the kernel spreads a memlan
    client's connections between them and each one is accelerated with whichever accepted it."""
    script = tmp_path / "rp.py"
    script.write_text(REUSEPORT_SERVER)
    port = next_port()
    while not port_free(port, strict=True):  # the servers set no SO_REUSEADDR: no TIME_WAIT
        port = next_port()
    py = PY
    logs = [tmp_path / "rp0.log", tmp_path / "rp1.log"]
    srvs = [subprocess.Popen([str(MEMLAN), "run", "--log", str(lg), "--", py, str(script),
                              str(port)], stdout=subprocess.PIPE, text=True) for lg in logs]
    try:
        for s in srvs:
            assert s.stdout.readline().strip() == "ready"
        clog = tmp_path / "rpc.log"
        code = ("import socket,sys\n"
                "out=[]\n"
                "for i in range(40):\n"
                "    c=socket.create_connection(('127.0.0.1',%d)); c.sendall(b'q%%d'%%i)\n"
                "    out.append(c.recv(100).decode()); c.close()\n"
                "print(' '.join(out))\n" % port)
        cli = subprocess.run([str(MEMLAN), "run", "--log", str(clog), "--", py, "-c", code],
                             capture_output=True, text=True, timeout=60)
        assert cli.returncode == 0, cli.stderr
        answers = cli.stdout.split()
        assert [a.split(":")[1] for a in answers] == ["q%d" % i for i in range(40)]
        pids = {a.split(":")[0] for a in answers}
        assert len(pids) == 2, pids  # 40 connections all hashed to one: odds 2 in 2^40
        text = clog.read_text()
        assert text.count("accelerated (client)") == 40, text
        assert sum(lg.read_text().count("accelerated (accepted") for lg in logs) == 40
    finally:
        for s in srvs:
            s.terminate()
            s.wait(timeout=10)
    settle(fabric)


def test_stat_shows_connections_and_reasons(fabric, tmp_path):
    port = next_port()
    py = PY
    srv = subprocess.Popen([str(MEMLAN), "run", "--", py, "-c",
                            "import socket,time; l=socket.socket(); "
                            "l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
                            "l.bind(('127.0.0.1',%d)); l.listen(4); print('ready', flush=True); "
                            "a,_=l.accept(); b,_=l.accept(); print('two', flush=True); time.sleep(30)"
                            % port], stdout=subprocess.PIPE, text=True)
    assert srv.stdout.readline().strip() == "ready"
    accel = subprocess.Popen([str(MEMLAN), "run", "--", py, "-c",
                              "import socket,time; c=socket.create_connection(('127.0.0.1',%d)); "
                              "c.sendall(b'hi'); time.sleep(30)" % port])
    plain = socket.create_connection(("127.0.0.1", port))
    assert srv.stdout.readline().strip() == "two"
    time.sleep(0.2)
    st = memlan("stat").stdout
    srv.kill()
    accel.kill()
    plain.close()
    srv.wait()
    accel.wait()
    assert "accelerated: bytes out/in" in st and "127.0.0.1:%d" % port in st, st
    assert "the client is not memlan" in st, st
    settle(fabric)


def scripted(prog, tmp_path, *args, env=None):
    """Run a scripted test program over kernel TCP, then under memlan: (plain, under, log).
    args: more arguments after the port; env: more settings for the run under memlan."""
    plain = subprocess.run([str(prog), str(next_port()), *args], capture_output=True, text=True,
                           timeout=60)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    log = tmp_path / "memlan.log"
    under = subprocess.run([str(MEMLAN), "run", "--log", str(log), "--", str(prog),
                            str(next_port()), *args], capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, **(env or {})))
    assert under.returncode == 0, under.stdout + under.stderr
    return plain, under, log.read_text()


# A server that sleeps in epoll_wait for its client's request (our doorbell rings), then checks
# with zero-timeout epoll_waits of maxevents 3, every 0.3 s, for the client's end, while a pipe
# of its own set is readable (PostgreSQL's client_connection_check_interval, its latch's fd);
# the client (a fork child) is killed between two checks.  Prints at which check the end came.
# Listens on argv[1] and forks: what follows runs in both processes.
LISTEN_FORK = r"""
import os, select, signal, socket, sys, time
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", int(sys.argv[1])))
l.listen(5)
pid = os.fork()
"""
PEER_END_CHECK = LISTEN_FORK + r"""
if pid == 0:
    l.close()
    c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
    time.sleep(0.2)
    c.sendall(b"query")
    time.sleep(30)
    os._exit(0)
s, _ = l.accept()
s.setblocking(False)
r, w = os.pipe()
ep = select.epoll()
ep.register(s.fileno(), select.EPOLLIN)
ep.register(r, select.EPOLLIN)
ep.poll(5, maxevents=3)
assert s.recv(5) == b"query"
os.write(w, b"x")
ep.modify(s.fileno(), select.EPOLLRDHUP | select.EPOLLERR | select.EPOLLHUP)
for i in range(2):
    ep.poll(0, maxevents=3)
    time.sleep(0.3)
os.kill(pid, signal.SIGKILL)
os.waitpid(pid, 0)
for check in range(1, 10):
    time.sleep(0.3)
    evs = ep.poll(0, maxevents=3)
    if any(fd == s.fileno() and e & (select.EPOLLRDHUP | select.EPOLLHUP) for fd, e in evs):
        print("the end at check", check, sorted(e for fd, e in evs if fd == s.fileno()))
        break
"""


def test_a_peers_end_is_in_the_first_check_after_it(fabric, tmp_path):
    """A killed client's end is in the server's first zero-timeout epoll_wait after it, with
    maxevents 3 and a ready fd of the server's own, as over kernel TCP.  Before, the look at the
    kernel's set asked for half the answer, 2, and our doorbell, ready since the wake-up that
    rang it and taken out by the filter, had one of them: the end came a check late (PostgreSQL
    15 with client_connection_check_interval=1s noticed a killed psql a second late; an
    explorer)."""
    out = {}
    for on in (False, True):
        log = tmp_path / f"{on}.log"
        pre = [str(MEMLAN), "run", "--log", str(log), "--"] if on else []
        p = subprocess.run(pre + [PY, "-c", PEER_END_CHECK, str(next_port())],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        out[on] = p.stdout
    assert out[False].startswith("the end at check 1 "), out[False]
    assert out[True] == out[False]
    assert "accelerated (accepted" in log.read_text(), log.read_text()
    settle(fabric)


# The child connects and stays idle; the parent waits 1 s at a time, six times, in one of
# poll, select or epoll_wait, and prints its voluntary context switches over the last four.
IDLE_WAITS = LISTEN_FORK + r"""
import resource, struct
if pid == 0:
    l.close()
    c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
    c.recv(1)
    time.sleep(0.2)
    c.sendall(b"r")
    c.recv(1)
    os._exit(0)
s, _ = l.accept()
p = select.poll()
p.register(s, select.POLLIN)
ep = select.epoll()
ep.register(s.fileno(), select.EPOLLIN)
how = sys.argv[2]
if how == "recv":
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 1, 0))
def wait(sec):
    if how == "poll":
        return bool(p.poll(sec * 1000))
    elif how == "select":
        return bool(select.select([s], [], [], sec)[0])
    elif how == "recv":
        try:
            return s.recv(1) == b"r"
        except BlockingIOError:
            return False
    return bool(ep.poll(sec))
for i in range(6):
    if i == 2:
        t0 = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw
    if wait(1.0):
        print("ready with nothing sent")
print("switches", resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw - t0)
# Then the peer answers, 0.2 s into the next wait (the first after the quiet ones).
s.sendall(b"g")
t1 = time.monotonic()
got = wait(1.0)
print("answer", got, "%.3f" % (time.monotonic() - t1))
s.sendall(b"x")
os.waitpid(pid, 0)
"""


@pytest.mark.parametrize("how", ["poll", "select", "epoll", "recv"])
def test_waits_again_and_again_on_an_idle_socket_wake_about_once_each(fabric, tmp_path, how):
    """A server that waits 1 s at a time on an idle accelerated connection (curl's poll loop on
    an idle icecast2 stream) wakes about once per wait, as over kernel TCP: a wait that ran out
    with nothing hands the liveness interval it reached to the thread's next wait.  Before,
    each wait started again at 100 ms and slept 100, 200, 400 and 300 ms: 16 to 20 voluntary
    switches in four waits, where kernel TCP makes 4 (an explorer's, with icecast2).  Now 4
    with epoll.  A poll or select of one socket, or a receive with SO_RCVTIMEO, also spent its
    brief wait on the ring's futex (10 ms) before each sleep: 8 in four waits, and 20 for the
    receive, whose long sleep started at 100 ms every time.  Now 4 each; and a peer that
    answers after the quiet waits is heard by the next wait at once."""
    log = tmp_path / "memlan.log"
    p = subprocess.run([str(MEMLAN), "run", "--log", str(log), "--", PY, "-c", IDLE_WAITS,
                        str(next_port()), how], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "accelerated (accepted" in log.read_text(), log.read_text()
    assert "ready with nothing sent" not in p.stdout, p.stdout
    n = int(p.stdout.split()[1])
    # Four waits: 4 over kernel TCP; 16-20 when each started at 100 ms; 8 with the brief waits.
    assert n <= 6, p.stdout
    # The answer, sent 0.2 s into the wait: a wake-up lost to the skipped brief wait would
    # leave it to the 1 s timeout.
    answer = p.stdout.split("answer ")[1].split()
    assert answer[0] == "True" and float(answer[1]) < 0.6, p.stdout
    settle(fabric)


OWN_FD_WAKES = LISTEN_FORK + r"""
import resource, threading
if pid == 0:
    l.close()
    c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
    c.recv(1)
    os._exit(0)
s, _ = l.accept()
r, w = os.pipe()
def ticker():
    for i in range(8):
        time.sleep(0.4)
        os.write(w, b"t")
t = threading.Thread(target=ticker)
t.start()
p = select.poll()
p.register(s, select.POLLIN)
p.register(r, select.POLLIN)
ep = select.epoll()
ep.register(s.fileno(), select.EPOLLIN)
ep.register(r, select.EPOLLIN)
how = sys.argv[2]
t0 = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
ticks = 0
while ticks < 8:
    if how == "poll":
        ev = p.poll(5000)
    elif how == "select":
        ev = select.select([s, r], [], [], 5.0)[0]
    else:
        ev = ep.poll(5.0)
    if ev:
        ticks += len(os.read(r, 8))
print("switches", resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw - t0)
t.join()
s.sendall(b"x")
os.waitpid(pid, 0)
"""


@pytest.mark.parametrize("how", ["poll", "select", "epoll"])
def test_the_programs_own_fds_do_not_restart_the_liveness_interval(fabric, tmp_path, how):
    """A wait on an idle accelerated connection and a fd of the program's own (smbd's idle
    connection child: its own timer) that the program's fd wakes every 0.4 s: the next wait
    goes on from the liveness interval reached, since the program's fds say nothing of our
    peers.  Before, each such wake-up started the next waits at 100 ms again (100, 200, then
    the program's fd): 23-24 voluntary switches of the waiting thread for 8 of its wake-ups,
    where kernel TCP makes 8 (an explorer's smbd: 48 in 30 s idle against 6); now 9-10."""
    log = tmp_path / "memlan.log"
    p = subprocess.run([str(MEMLAN), "run", "--log", str(log), "--", PY, "-c", OWN_FD_WAKES,
                        str(next_port()), how], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "accelerated (accepted" in log.read_text(), log.read_text()
    n = int(p.stdout.split()[1])
    assert n <= 14, p.stdout
    settle(fabric)


ET_OUT_ONLY = r"""
import select, socket, time
l = socket.socket()
l.bind(("127.0.0.1", 0))
l.listen()
c = socket.create_connection(l.getsockname())
a, _ = l.accept()
c.setblocking(False)
ep = select.epoll()
ep.register(c, select.EPOLLOUT | select.EPOLLET)
ev = [hex(e) for f, e in ep.poll(0.3)]
for i in range(3):
    a.send(b"x" * 100)
    time.sleep(0.05)
    ev += [hex(e) for f, e in ep.poll(0.2)]
n = 0
try:
    while True:
        n += c.send(b"y" * 65536)
except BlockingIOError:
    pass
ev += ["full"] + [hex(e) for f, e in ep.poll(0.1)]
got = 0
while got < n:
    got += len(a.recv(1 << 20))
ev += ["drained"] + [hex(e) for f, e in ep.poll(1.0)]
a.close()
time.sleep(0.1)
ev += ["closed"] + [hex(e) for f, e in ep.poll(0.3)]
print(" ".join(ev))
"""


def test_an_edge_triggered_member_waiting_for_room_alone_hears_no_data(fabric, tmp_path):
    """EPOLLOUT|EPOLLET alone: the peer's data makes no edge (the kernel's wake-ups are keyed by
    kind), a send that filled the ring and the peer's drain make one, the peer's close one.
    Before, a post for the peer's data put the member on its list and it reported EPOLLOUT
    again (the known gap of design.md's edge-triggered paragraph)."""
    plain = subprocess.run([PY, "-c", ET_OUT_ONLY], capture_output=True, text=True, timeout=60)
    log = tmp_path / "memlan.log"
    under = subprocess.run([str(MEMLAN), "run", "--log", str(log), "--", PY, "-c", ET_OUT_ONLY],
                           capture_output=True, text=True, timeout=60)
    assert plain.returncode == 0 and under.returncode == 0, (plain.stderr, under.stderr)
    assert plain.stdout.split() == ["0x4", "full", "drained", "0x4", "closed", "0x4"], plain.stdout
    assert under.stdout.split() == plain.stdout.split(), (under.stdout, plain.stdout)
    assert "accelerated (accepted" in log.read_text(), log.read_text()
    settle(fabric)


EPOLLCONF = BUILD / "tests-preload" / "epollconf"


def test_epoll_semantics_match_kernel(fabric, tmp_path):
    """Level, edge, one-shot, EEXIST/ENOENT, two sets, a set inside a set, DEL, half-close and
    close, poll; an epoll fd duplicated, used after its original closed, and asked by poll and
    select; a connection shared with a fork child that moved many rings' worth on it: the
    scripted results under memlan equal kernel TCP's, line for line."""
    plain, under, text = scripted(EPOLLCONF, tmp_path)
    assert "FAIL" not in plain.stdout
    assert "fork: parent recv: 2" in plain.stdout, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines()
    # Four connections to the scripted client, and the fork case's own (small rings).
    assert text.count("accelerated (client)") == 5 and text.count("accelerated (accepted") == 5, text
    settle(fabric)


FORKWAKE = BUILD / "tests-preload" / "forkwake"


EPOLLWATCH = BUILD / "tests-preload" / "epollwatch"


def epollwatch(tmp_path, spin_us, *args, under=True, stdin=None):
    """epollwatch PORT ARGS, under memlan with MEMLAN_SPIN_US=spin_us (or over kernel TCP)."""
    cmd = [str(EPOLLWATCH), str(next_port()), *args]
    env = dict(os.environ)
    if under:
        cmd = [str(MEMLAN), "run", "--log", str(tmp_path / "memlan.log"), "--"] + cmd
        env["MEMLAN_SPIN_US"] = str(spin_us)
    if stdin is None:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env,
                              stdin=subprocess.DEVNULL)
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=env)


def epollwatch_posts(tmp_path, spin_us, pings):
    """epollwatch count under memlan: the posts that the server's event queues counted over
    its pings (read while the server waits, before it closes)."""
    p = epollwatch(tmp_path, spin_us, "count", str(pings), stdin=True)
    try:
        line = p.stdout.readline()
        assert line == f"count: {pings} echoed\n", line
        st = json.loads(memlan("stat", "--json").stdout)
    finally:
        p.stdin.close()
        rc = p.wait(timeout=60)
    assert rc == 0, rc
    q = [o for o in st["objects"] if o["kind"] == "evq" and o["pid"] == p.pid]
    assert q, st
    return sum(o["posts"] for o in q)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cpus")
def test_epoll_spin_watches_its_members_so_senders_post_nothing(fabric, tmp_path):
    """An epoll server (level-triggered) and its client on two cpus, 5000 ping-pongs.  While
    epoll_wait spins, it looks at its members' rings itself and leaves them unarmed, so the
    client's sends find no tripwire and post nothing to the server's event queue (a post is an
    atomic read-modify-write on two more shared lines for the sender, and a drain with its locks
    for the server).  Counted, not timed: with the spin fixed at 5 ms the queues counted 3
    posts (the old way, arming each member as the spin began: 4,792); with spinning off, every
    wait sleeps armed, and nearly every ping posts (4,730)."""
    kernel = epollwatch(tmp_path, 0, "count", "5000", under=False)
    assert kernel.returncode == 0 and kernel.stdout == "count: 5000 echoed\n", kernel.stdout
    spun = epollwatch_posts(tmp_path, 5000, 5000)
    slept = epollwatch_posts(tmp_path, 0, 5000)
    print("posts: spinning", spun, "sleeping", slept)
    assert spun < 500, spun
    assert slept >= 2500, slept
    settle(fabric)


def test_epoll_members_watched_by_a_spin_are_never_lost(fabric, tmp_path):
    """Three connections in one set, served by two threads, and 3000 pings on connections and
    after gaps (0 to 120 us) drawn from a seed, with a 30 us spin: data lands before a spin, in
    it, and after it ran out.  A member the spin watched is armed before the wait sleeps or
    returns; one left unarmed and off the ready list would never be reported (a build that did
    not arm them stalled at the 3rd ping).  Every echo comes back, as over kernel TCP."""
    kernel = epollwatch(tmp_path, 0, "gaps", "3000", under=False)
    assert kernel.returncode == 0, kernel.stdout + kernel.stderr
    assert kernel.stdout == "gaps: 3000 rounds echoed\n", kernel.stdout
    under = epollwatch(tmp_path, 30, "gaps", "3000")
    assert under.returncode == 0, under.stdout + under.stderr
    assert under.stdout == kernel.stdout
    assert (tmp_path / "memlan.log").read_text().count("accelerated (accepted") == 3
    settle(fabric)


def test_epoll_wait_left_by_siglongjmp_mid_spin_keeps_its_members(fabric, tmp_path):
    """A SIGALRM handler leaves epoll_wait by siglongjmp 2 ms into a 50 ms spin, 20 times, after
    50 ping-pongs; then a ping comes and one epoll_wait must report it, as over kernel TCP.  The
    wait's cleanup puts the members its spin watched back on the ready list: a build without
    it reported nothing in 5 s (the member was neither armed nor listed)."""
    kernel = epollwatch(tmp_path, 0, "jump", under=False)
    assert kernel.returncode == 0, kernel.stdout + kernel.stderr
    assert kernel.stdout == "jump: 20 jumps, 0 events before, then 1 event\n", kernel.stdout
    under = epollwatch(tmp_path, 50000, "jump")
    assert under.returncode == 0, under.stdout + under.stderr
    assert under.stdout == kernel.stdout
    settle(fabric)


WATCHHOLE = BUILD / "tests-preload" / "watchhole"


def watchhole(tmp_path, mode, under=True):
    """watchhole PORT MODE, under memlan with a 300 ms spin (or over kernel TCP)."""
    cmd = [str(WATCHHOLE), str(next_port()), mode]
    env = dict(os.environ)
    if under:
        cmd = [str(MEMLAN), "run", "--log", str(tmp_path / f"memlan-{mode}.log"), "--"] + cmd
        env["MEMLAN_SPIN_US"] = "300000"
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env,
                          stdin=subprocess.DEVNULL)


WATCHHOLE_LINES = {
    "handler": "handler: the handler's wait got 1 event\n",
    "blocked": "blocked: the other thread's wait got 1 event\n",
    "fork": "fork: the client read EOF\n",
}


@pytest.mark.parametrize("mode", list(WATCHHOLE_LINES))
def test_epoll_members_watched_mid_spin_are_seen_by_other_waits(fabric, tmp_path, mode):
    """A level-triggered member that epoll_wait's spin watches (neither armed nor on the ready
    list) while, 5 ms into the spin: a SIGALRM handler waits on the same set ("handler"),
    or lets another thread wait on it and waits for that ("blocked"): the client's byte 50 ms
    later must be reported to that wait, as over kernel TCP; or another thread forks, and the
    child and the parent close the connection ("fork"): the client reads EOF, as over kernel
    TCP.  Before, the other waits reported nothing in 3 s (nothing posted for the watched
    member, and the spin did not run while the handler did), and the child's copy of the
    spin's socket reference was never given back, so its close did not end the connection."""
    kernel = watchhole(tmp_path, mode, under=False)
    assert kernel.stdout == WATCHHOLE_LINES[mode], kernel.stdout + kernel.stderr
    under = watchhole(tmp_path, mode)
    assert under.stdout == kernel.stdout, under.stdout + under.stderr
    assert under.returncode == kernel.returncode == 0
    assert (tmp_path / f"memlan-{mode}.log").read_text().count("accelerated (accepted") == 1
    settle(fabric)


@pytest.mark.parametrize("mode", ["mod", "del", "close", "dup2", "disconnect", "peerclose",
                                  "peerkill"])
def test_epoll_member_changed_by_another_thread_mid_spin(fabric, tmp_path, mode):
    """Another thread changes a member that epoll_wait's spin watches, 5 ms into it: MOD to
    edge-triggered, DEL (then ADD again), close, a dup2 over its fd, or connect(AF_UNSPEC);
    or the client closes, or is killed, 50 ms into the spin.  What the waits report, and what
    the client reads and its send does, are as over kernel TCP.  The spin's reference to a
    socket whose last fd went is let go of at its next look, since the kernel's epoll holds no
    reference to its members' files: held to the spin's end (300 ms), the client read no EOF
    in 150 ms after the close, dup2 or disconnect, and its send after the disconnect went
    through where the kernel's said EPIPE."""
    kernel = watchhole(tmp_path, mode, under=False)
    assert kernel.returncode == 0, kernel.stdout + kernel.stderr
    under = watchhole(tmp_path, mode)
    assert under.returncode == 0, under.stdout + under.stderr
    assert sorted(under.stdout.splitlines()) == sorted(kernel.stdout.splitlines())
    settle(fabric)


def test_fork_child_poll_leaves_parent_woken(fabric, tmp_path):
    """A fork child polls the socket its parent waits on (then exits, or sleeps): the parent,
    asleep in epoll_wait on a set made before the fork or in poll, is still woken by its peer's
    next byte, round after round, as over kernel TCP (issue 18 item 4: the child's poll rewrote
    the direction's one event-queue reference, and the parent's set was never posted again)."""
    plain, under, text = scripted(FORKWAKE, tmp_path)
    assert plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    assert plain.stdout.count("most rounds: yes") == 4, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines()
    assert text.count("accelerated (client)") == 1 and text.count("accelerated (accepted") == 1, text
    settle(fabric)


FORKASLEEP = BUILD / "tests-preload" / "forkasleep"


def test_fork_while_a_thread_sleeps_in_poll(fabric, tmp_path):
    """A process forks while another of its threads sleeps in poll (or epoll_wait, or a
    blocking recv) on a connection; the child closes its copy, the parent closes its own after
    the sleeper returned (or before the child's close): the peer reads EOF within 1 s of the
    last close, and the sleeper is still woken by each byte, as over kernel TCP.  Before, the
    child kept the references of the registrations it inherited from the sleeping poll (a
    thread that does not exist in it), so its close did not end its hold and the peer read no
    EOF while the child lived ("peer: n" in both poll cases; the epoll_wait cases held nothing
    and passed); and the blocking recv's own reference ("peer: n" in both recv cases, and the
    channel's file left in the fabric: an explorer)."""
    plain, under, text = scripted(FORKASLEEP, tmp_path)
    assert plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    assert plain.stdout.count("peer: e") == 6 and "most waits: no" not in plain.stdout, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stderr
    assert text.count("accelerated (client)") == 6, text
    settle(fabric)


RCVLOWAT = BUILD / "tests-preload" / "rcvlowat"


def test_rcvlowat_matches_kernel(fabric, tmp_path):
    """SO_RCVLOWAT 10, set on the listener, on the accepted socket and on the client's socket
    before connect: poll, select and epoll (level and edge) report nothing with 4 bytes queued
    and EPOLLIN with 10; a blocking recv waits for the mark's bytes, a nonblocking one takes
    what is there; a poll and an epoll_wait asleep wake at once when the mark comes down; the
    end below the mark is readable: as over kernel TCP, line for line.  Before, any byte made
    an accelerated socket readable and a blocking recv returned it ("poll 1 0x1" with 4 bytes,
    "recv of 256, 4 then 6 bytes come: 4")."""
    plain, under, text = scripted(RCVLOWAT, tmp_path)
    assert plain.stdout.endswith("done, peer 0\n"), plain.stdout + plain.stderr
    assert "4 bytes queued: poll 0 0, select 0, epoll 0 0" in plain.stdout, plain.stdout
    assert "within 50 ms: no" not in plain.stdout, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stderr
    assert text.count("accelerated (client)") == 3, text
    settle(fabric)


LOWATSTALE = BUILD / "tests-preload" / "lowatstale"


def test_rcvlowat_is_the_kernel_sockets(fabric, tmp_path):
    """A new connection's SO_RCVLOWAT is its kernel socket's: not a mark left on the fd number
    by a socket that fclose closed behind the preload (1, not 100), the mark of a dup'ed socket
    whose original was closed (10), and for an accepted socket the listener's mark as the kernel
    copied it, not one set on the listener later.  Found in review: the channel took the mark
    from the fd's record ("stale: ... poll 0 0x0" and a recv held to its 1 s timeout where
    kernel TCP said "poll 1 0x1"; the dup and listener cases the other way round)."""
    plain, under, text = scripted(LOWATSTALE, tmp_path)
    assert plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    assert "stale: the new socket has the closed one's number: yes" in plain.stdout
    assert "dup: mark 10, 4 bytes queued: poll 0 0x0" in plain.stdout, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stdout
    assert text.count("accelerated (client)") == 3, text
    settle(fabric)


WRITEVWHOLE = BUILD / "tests-preload" / "writevwhole"


def test_small_writev_arrives_whole(fabric, tmp_path):
    """A nonblocking writev of a 16-byte header and a 48-byte payload, 20,000 times, each after
    the reader's answer (fewer if 20 s pass first, but at least 1000): a reader spinning on another
    cpu with nonblocking recvs gets all 64 bytes in its first recv every time, as over kernel TCP.  Before, the preload published each
    piece of the vector on its own ("split reads: some": 40-52 of 20,000 on the 2-cpu VM)."""
    plain, under, text = scripted(WRITEVWHOLE, tmp_path)
    assert "split reads: 0" in plain.stdout, plain.stdout + plain.stderr
    assert "at least 1000 rounds: yes" in plain.stdout, plain.stdout + plain.stderr
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stderr
    assert text.count("accelerated (client)") == 1, text
    settle(fabric)


POLLZERO = BUILD / "tests-preload" / "pollzero"


def test_zero_timeout_polls_ask_the_kernel_once_a_millisecond(fabric, tmp_path):
    """A progress loop of zero-timeout polls (Open MPI's tcp BTL makes about 5 a message and
    rank), on the socket alone and beside a pipe, then the end of a peer killed without a close:
    under strace, which stops on the poll calls alone, the kernel is asked of an accelerated
    socket at most once a millisecond (plus a few), where it was asked at every poll before
    (4154 asks in 4154 polls over 88 ms); the pipe is reported by the first poll after its
    write, the killed peer's end is seen (within 5 s), and every line the program prints is
    kernel TCP's: the socket twice in one set, both entries report the end in the same answer
    (the entry not asked was empty: "end, the same socket again in the set:"), and a thread
    that polls the ended socket in a loop is cancelled (no system call was left to act on the
    cancellation: "a thread polling it is cancelled: no (5 s)")."""
    runs = {}
    for mode, (r, trace) in straced_both(fabric, tmp_path, POLLZERO, "poll,ppoll").items():
        m = re.search(r"sockfd (\d+) polls (\d+) ms (\d+)", r.stderr)
        assert m, r.stderr
        fd, polls, ms = (int(x) for x in m.groups())
        asks = len(re.findall(r"poll\(\[\{fd=%d," % fd, trace))
        runs[mode] = (r.stdout, polls, asks, ms)
    print({k: v[1:] for k, v in runs.items()})
    plain, under = runs["kernel"][0], runs["memlan"][0]
    assert plain.endswith("done\n") and "pipe reported at once: yes" in plain, plain
    assert "end: POLLIN POLLRDHUP" in plain and "read at the end: 0" in plain, plain
    assert "again in the set: POLLIN POLLRDHUP" in plain and "cancelled: yes" in plain, plain
    assert under.splitlines() == plain.splitlines()
    text = (tmp_path / "memlan.log").read_text()
    assert "accelerated (client)" in text, text
    _, kpolls, kasks, _ = runs["kernel"]
    assert kasks >= kpolls, runs["kernel"][1:]  # the control: strace sees every poll
    _, polls, asks, ms = runs["memlan"]
    # Once a millisecond once the connection is settled; while it is undecided (the acceptor has
    # not taken the offer yet) a poll peeks every 100 us (design.md, step 4), and under load that
    # takes a while: 239 asks in 194 ms once, with bursts of 17-25 asks within 10 ms at the start
    # (two busy loops beside it, strace -tt).  Asking at every poll, as before, is thousands.
    assert polls >= 2000 and asks <= 2 * ms + 10, runs["memlan"][1:]


FASTCLOSE = BUILD / "tests-preload" / "fastclose"


def test_close_under_a_call_that_holds_the_socket_by_its_word(fabric, tmp_path):
    """A SIGALRM handler closes the socket its thread is receiving a stream on (60 rounds, both
    ends in one process, so the preload's fast path takes the calls: it holds a socket by its
    direction's word, without a reference); then a thread's sending socket is closed by another
    thread.  As over kernel TCP: the receive after the close says EBADF, the sender whose peer
    closed gets a reset or EPIPE, the sender whose own socket was closed gets EBADF.  Before the
    close marked the record (closing), a send that started between the record's release and the
    kernel's close went to the kernel socket under the channel ("the stream is split" in the
    log) and blocked for ever: "the sender never ended", 8-10 runs in 30.  Under
    memlan the handler's close lands on top of a copy in progress in most rounds (39-59 of 60
    in a build that counted them): the teardown waits for the copy's give-back
    (mlp_fast_defer), so nothing is unmapped under it (make test-preload-asan runs it too)."""
    plain, under, text = scripted(FASTCLOSE, tmp_path)
    assert plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    assert "EBADF after: 60" in plain.stdout and "next send EBADF: 60" in plain.stdout, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stdout + under.stderr
    # Every connection accepted on the channel; a client logs its side only when its writer
    # sent before the close (on a loaded machine the writer of the second part may not have run
    # within the 0.2-3.2 ms before its socket is closed: 64 of 120 seen).
    assert text.count("accelerated (accepted") == 120, text
    assert text.count("accelerated (client)") >= 60, text
    settle(fabric)


SPINLEND = BUILD / "tests-preload" / "spinlend"


def test_handler_receives_on_top_of_a_receive_that_spins(fabric, tmp_path):
    """A SIGALRM handler (SA_RESTART) makes a blocking receive on the socket its thread is
    blocked receiving on, 300 rounds, the timer 1-25 us into the thread's receive: the handler's
    receive takes the byte sent once it started, the restarted one the byte sent after it
    returned, as over kernel TCP.  Under memlan the thread's receive first spins for its bytes
    holding the direction's fast word; the handler borrows the word from that spin.  Without
    the borrowing the handler's receive failed with EINTR in 225-228 rounds of 300 (a build with
    it turned off).  A handler that lands on the copy itself, a few hundred nanoseconds a round
    (the fast path's pass holds the word, as the regular path's does), still fails with EINTR:
    older than the spin (design.md, "The held list"), so a few such rounds are allowed; in 10
    runs on the 2-vCPU VM there were none."""
    plain, under, text = scripted(SPINLEND, tmp_path)
    assert plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    assert "first byte in 300, the thread's the second in 300" in plain.stdout, plain.stdout
    assert under.stdout.endswith("done\n"), under.stdout + under.stderr
    m = re.search(r"first byte in (\d+), the thread's the second in (\d+)", under.stdout)
    assert m and int(m.group(1)) >= 291 and int(m.group(2)) >= 291, under.stdout
    assert text.count("accelerated (accepted") == 1, text
    settle(fabric)


SPINHELD = BUILD / "tests-preload" / "spinheld"


@pytest.mark.parametrize("how", ["sigaction", "signal"])
def test_handler_on_top_of_a_receive_that_spins_holds_no_word(fabric, tmp_path, how):
    """A SIGALRM handler (SA_RESTART) makes a blocking receive on the socket its thread is
    blocked receiving on, 300 rounds, the timer 1-25 us into the thread's receive; once the
    handler started, another thread makes a MSG_DONTWAIT receive on that socket and only then
    sends the handler's byte.  Over kernel TCP the nonblocking receive answers EAGAIN every
    round.  Under memlan the thread's receive first spins holding the direction's fast word: if
    the handler ran on top of that spin with the word still held, the other thread's
    nonblocking receive waited for the word and the handler for its byte, for ever (the
    watchdog's FAIL line); with the handler installed by signal(), which glibc installs past
    our sigaction, too, until signal() went through it."""
    plain, under, text = scripted(SPINHELD, tmp_path, *(["signal"] if how == "signal" else []))
    assert plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    assert "answered EAGAIN in 300;" in plain.stdout, plain.stdout
    assert under.stdout.endswith("done\n"), under.stdout + under.stderr
    assert "answered EAGAIN in 300;" in under.stdout, under.stdout
    assert text.count("accelerated (accepted") == 1, text
    settle(fabric)


SPINJUMP = BUILD / "tests-preload" / "spinjump"


def test_jump_out_of_a_handler_on_a_receive_that_spins_keeps_nothing(fabric, tmp_path):
    """A SIGALRM handler siglongjmp()s out of a blocking receive 1-25 us into it, 300 rounds
    (in odd ones after a nonblocking receive of its own on the socket): under memlan often out
    of the receive's spin, whose word the trampoline lent back to the socket for the handler's
    run.  Each round another thread's nonblocking receive answers EAGAIN (nobody keeps the
    word); at the end a byte arrives and the close reaches the peer as the end (nobody keeps the
    socket: the lent reference was put), as over kernel TCP."""
    plain, under, text = scripted(SPINJUMP, tmp_path)
    want = ("rounds 300: jumped out 300, the helper's nonblocking recv answered EAGAIN in 300; "
            "'z' arrived; the peer's recv after the close: 0\ndone\n")
    assert plain.stdout == want, plain.stdout + plain.stderr
    assert under.stdout == want, under.stdout + under.stderr
    assert text.count("accelerated (accepted") == 1, text
    settle(fabric)


ONETHREAD = BUILD / "tests-preload" / "onethread"


def test_one_thread_takes_words_plainly_and_threads_made_later_do_not(fabric, tmp_path):
    """onethread: a process with one thread (glibc's __libc_single_threaded: under memlan its
    fast words are taken and given back with a plain load and store) moves 20,000 records
    there and back through a fork child's echo, jumps out of 300 blocking receives, then makes
    four threads, two on each cpu, that send 2,000 records each at once, three rounds: every
    record whole, each thread's in order, as over kernel TCP.  A build that kept the plain take
    once threads exist (mlp_one_thread always true) lost records, broke the connection or hung
    in 6 runs of 6."""
    plain, under, text = scripted(ONETHREAD, tmp_path)
    want = ("one thread: yes\n"
            "1 one thread: 20000 of 20000 records came back whole\n"
            "2 jumps: jumped out 300 of 300; then EAGAIN 300, records whole 300\n"
            "after pthread_create, one thread: no\n"
            "3 four threads, three rounds: 24000 records, 0 not whole, 0 out of order\n"
            "4 one thread again: 2000 of 2000 records came back whole\n"
            "done\n")
    assert plain.stdout == want, plain.stdout + plain.stderr
    assert under.stdout == want, under.stdout + under.stderr
    assert text.count("accelerated (client)") == 1, text
    settle(fabric)


CLOSEMARK = BUILD / "tests-preload" / "closemark"


def closemark(fabric, tmp_path, mode, line, stalled=True):
    """closemark MODE both ways: kernel TCP's run ends with done and has line; memlan's prints
    the same lines (and its send's copy stopped in the handler, where the mode uses the stop)."""
    plain, under, _ = scripted(CLOSEMARK, tmp_path, mode)
    assert plain.stdout.endswith("done\n") and line in plain.stdout, plain.stdout + plain.stderr
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stdout + under.stderr
    assert not stalled or "stopped in the handler" in under.stderr, under.stderr
    settle(fabric)


def test_close_mark_no_deadlock_under_a_handler_on_a_word_holder(fabric, tmp_path):
    """A thread's send holds the socket's send word (its copy stopped in the program's SIGSEGV
    handler), main closes the socket, and the handler sends a byte on it: every call ends, and
    the sender's next send says EBADF, as over kernel TCP.  The close's teardown waits for the
    word (mlp_sock_destroy) with the fd's record marked closing; the handler's send waited for
    the mark (22539bd): a deadlock, "FAIL hung (alarm)" after 30 s.  A thread that holds a lock
    of ours does not wait for a mark now (its send goes to the kernel, as before the mark)."""
    closemark(fabric, tmp_path, "handler", "a send after the close: EBADF")


def test_cancelled_close_leaves_no_mark(fabric, tmp_path):
    """A thread with a cancellation pending closes a connection (glibc's close acts on it before
    the kernel's close: the thread ends and the fd stays open); main then sends a byte on the fd:
    the send ends (1, as over kernel TCP).  The close's mark (22539bd) was never cleared: the
    send waited for ever for the gone thread ("FAIL hung (alarm)").  The mark now has a cleanup
    that glibc runs for a cancellation or a siglongjmp out of the close.  Not in the ASan build:
    a cancellation's unwinding leaves the redzones of the frames it passes poisoned, and the
    thread's exit in ASan's runtime writes there (a false stack-buffer-overflow in sigaltstack,
    google/sanitizers#1399)."""
    if b"libasan" in (BUILD / "lib" / "libmemlan-preload.so").read_bytes():
        pytest.skip("ASan: a cancelled thread's exit reports a false stack-buffer-overflow")
    closemark(fabric, tmp_path, "cancel", "the close was cancelled: yes", stalled=False)


def test_close_mark_written_over_wakes_its_waiters(fabric, tmp_path):
    """While main's close of a connection waits for a send stopped in the program's SIGSEGV
    handler, a thread's send waits for that close's mark, and another thread closes the fd
    too, gets a new connection at its number and closes it: the waiting send ends, as over
    kernel TCP.  The second mark was a plain store over the first (its waiters' flag lost), and
    neither close's end woke the waiter ("FAIL hung (alarm)").  A mark written over now wakes
    the old one's waiters, and a close clears only its own mark."""
    closemark(fabric, tmp_path, "reuse", "the waiting send: ended")


FORKDRAIN = BUILD / "tests-preload" / "forkdrain"


def test_fork_drain_passes_the_wake_up_on(fabric, tmp_path):
    """A thread forks while another's send holds the socket's send word (its copy stopped in the
    program's SIGSEGV handler for 50 ms), and a third thread sends 20 ms into the fork: both
    sends end, as over kernel TCP.  The fork's drain, asleep on the word first, took the
    give-back's one wake-up and left without passing it on: the third sender slept for ever."""
    plain, under, text = scripted(FORKDRAIN, tmp_path)
    assert plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stdout + under.stderr
    assert text.count("accelerated (client)") == 1, text
    settle(fabric)


CLOSESEND = BUILD / "tests-preload" / "closesend"


@pytest.mark.parametrize("mode", ["reading", "full"])
def test_send_racing_its_sockets_close_loses_no_byte(fabric, tmp_path, mode):
    """A thread sends without waiting while another closes the sending socket (100 rounds; with
    "full" 300, the reader reading nothing before the close, so that the sender is answered
    EAGAIN by the regular path until it): as over kernel TCP the sender ends with EBADF and the
    reader gets every byte the sends took.  close() takes the fd's record away before the
    kernel's close (the channel's teardown between), and a send in that window went to the kernel
    socket under the channel: 99 rounds of 100 lost bytes, on 7819344 and before it.  The
    regular path then still looked at the record and took its reference in two steps, and a
    close between them did the same: "full" lost bytes in 20-82 rounds of 300 on d398f4b (and
    the reading mode in 4-6 runs of 100)."""
    rounds = 300 if mode == "full" else 100
    plain, under, text = scripted(CLOSESEND, tmp_path, *(["full"] if mode == "full" else []))
    assert plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    assert f"got every byte sent: {rounds}" in plain.stdout, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stdout + under.stderr
    assert text.count("accelerated (accepted") == rounds, text
    assert "arrived on the kernel socket" not in text, text
    settle(fabric)


CLOSEFORK = BUILD / "tests-preload" / "closefork"


def test_fork_during_a_close_leaves_the_child_no_mark(fabric, tmp_path):
    """A process forks while a thread is inside close() of a connection (under memlan its
    teardown waits for another thread's send, whose copy a SIGSEGV handler holds until the child
    has answered), and the child receives on that fd number without waiting: the call returns,
    as over kernel TCP.  Before, the child kept the record's closing mark with no closer to clear it, and its
    receive waited for ever ("returned: no (it waited)", the child's 5 s alarm)."""
    plain, under, text = scripted(CLOSEFORK, tmp_path)
    assert plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    assert "returned: yes" in plain.stdout, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stdout + under.stderr
    assert "accelerated (client)" in text, text
    settle(fabric)


RECVMSGCHAN = BUILD / "tests-preload" / "recvmsgchan"


def test_recvmsg_header_on_the_fast_path_is_the_kernels(fabric, tmp_path):
    """sendmsg, then recvmsg with a name buffer, a control buffer and msg_flags preset, with and
    without MSG_DONTWAIT, on a connection settled on the channel with the bytes already there:
    the preload's fast path takes both calls, and the header comes back as the kernel's (0, 0, 0,
    no control message), as over kernel TCP.  (A fast recvmsg that left the header alone gave
    "msg_namelen 32, msg_controllen 64, msg_flags 0x1234, cmsg present".)"""
    plain, under, text = scripted(RECVMSGCHAN, tmp_path)
    assert plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    assert "MSG_DONTWAIT: 5, msg_namelen 0" in plain.stdout, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stdout + under.stderr
    assert "accelerated (client)" in text, text
    settle(fabric)


SHUTRDWRITE = BUILD / "tests-preload" / "shutrdwrite"


@pytest.mark.parametrize("args", [("0",), ("10",), ("0", "killed")])
def test_own_shut_rd_leaves_the_peer_alive(fabric, tmp_path, args):
    """After our own shutdown(SHUT_RD) a program writes for 1.5 s, each write after a poll for
    POLLOUT (zero timeout, and 10 ms): every write succeeds and the peer reads every byte, as
    over kernel TCP.  The kernel socket's own RDHUP was taken for the peer's FIN, and a second
    later the live peer was declared dead ("after SHUT_RD: POLLOUT POLLHUP POLLERR, some writes
    failed").  Then our SHUT_WR too: poll says POLLHUP at once, the peer still alive, as the
    kernel does (memlan said "after SHUT_WR too: POLLIN POLLOUT POLLRDHUP", its POLLHUP only
    after the peer's end).  killed: the peer killed after our SHUT_RD is still seen, its writes
    failing within a second (its liveness lock tells)."""
    plain, under, text = scripted(SHUTRDWRITE, tmp_path, *args)
    assert plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    if "killed" in args:
        assert "POLLHUP POLLERR, some writes failed" in plain.stdout, plain.stdout
    else:
        assert "POLLOUT, no writes failed" in plain.stdout, plain.stdout
        assert "SHUT_WR too: POLLIN POLLOUT POLLRDHUP POLLHUP" in plain.stdout, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines()
    assert "accelerated (client)" in text, text
    settle(fabric)


IOVEDGE = BUILD / "tests-preload" / "iovedge"


def test_bad_vectors_answer_as_the_kernel(fabric, tmp_path):
    """send, writev, sendmsg, recv and readv with vectors the kernel refuses (a NULL base under a
    length, a NULL vector, a length negative as an ssize_t, lengths whose sum wraps): the errno
    the kernel gives and nothing moved, on accelerated connections as over kernel TCP.  Before,
    a NULL base crashed the program (SIGSEGV) or sent the pieces before it, and a wrapped sum
    moved a short count (8) of a vector the kernel refuses, or crashed."""
    plain, under, text = scripted(IOVEDGE, tmp_path)
    assert plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    assert "SIGSEGV" not in plain.stdout, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stdout
    assert text.count("accelerated (client)") == plain.stdout.count("exit 0"), text
    settle(fabric)


IOVTCP = BUILD / "tests-preload" / "iovtcp"


def test_bad_vector_pointer_on_a_tcp_settled_socket_is_the_kernels(fabric, tmp_path):
    """readv and writev with a vector pointer to no page, on a connection memlan offered and that
    settled on TCP (its server spoke first): EFAULT from the kernel both, as without memlan.
    The fast path (7819344) summed the vector before it looked at the socket: SIGSEGV."""
    plain, under, text = scripted(IOVTCP, tmp_path)
    assert plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    assert "readv: -1 Bad address" in plain.stdout, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stdout + under.stderr
    assert "TCP (the server spoke over TCP first" in text, text
    settle(fabric)


BIGIO = BUILD / "tests-preload" / "bigio"


def test_one_call_moves_at_most_max_rw_count(fabric, tmp_path):
    """A blocking write of 3 GiB, a writev of two 1.5 GiB pieces and a recv(MSG_WAITALL) into
    3 GiB each return 2147479552 (Linux's MAX_RW_COUNT), as over kernel TCP, and every byte
    arrives.  Before, under memlan, each returned 3221225472, which a program keeping the count
    in an int reads as negative."""
    plain, under, text = scripted(BIGIO, tmp_path)
    assert "write of 3221225472 returned 2147479552" in plain.stdout, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stdout + under.stderr
    assert text.count("accelerated (client)") == 1, text
    settle(fabric)


SPLICEJUMP = BUILD / "tests-preload" / "splicejump"


def test_splice_left_by_a_jump_moves_each_byte_once(fabric, tmp_path):
    """splice from an accelerated socket into a pipe, with a 200 us timer whose handler
    siglongjmps out of the splicing thread's calls: every byte reaches the pipe once and in
    order, as over kernel TCP.  Before, a jump between the pipe write and the ring's release
    left the bytes in both ("stream: CORRUPT (MORE than sent bytes read)", 3 runs of 3)."""
    for _ in range(3):
        plain, under, text = scripted(SPLICEJUMP, tmp_path)
        assert "stream: intact" in plain.stdout, plain.stdout + plain.stderr
        assert "stream: intact" in under.stdout, under.stdout + under.stderr
        assert "accelerated" in text, text
    settle(fabric)


LISTENRACE = BUILD / "tests-preload" / "listenrace"


def test_client_connecting_as_the_port_opens_is_accelerated(fabric, tmp_path):
    """A client that retries connect until the server's port answers (20 rounds, the server
    listening 0-3 ms after it bound): most connections accelerated, because the listener is
    published before the kernel's listen.  Published after it, such a client found no record
    and stayed on TCP: 0 to 2 of the 20 were accelerated in three runs.  What is left (an
    attempt whose look-up precedes the publication and whose connect succeeds after the
    listen) stays on TCP with its reason, bytes intact: 0 or 1 of 20 on fresh ports, but 3 to
    10 in runs repeated on the same ports within a minute (cause not found; design.md)."""
    plain, under, text = scripted(LISTENRACE, tmp_path)
    PORT[0] += 40  # each run used its port and the 19 after it
    assert plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stdout + under.stderr
    accel = text.count("accelerated (client)")
    assert accel >= 8, text
    late = text.count("TCP (no memlan listener on this port in the fabric)")
    assert late == 20 - accel, text
    assert text.count("TCP (") == 2 * late, text  # and the acceptor's "(no offer)" for each
    settle(fabric)


RESETCONF = BUILD / "tests-preload" / "resetconf"


def test_resets_match_kernel(fabric, tmp_path):
    """A close with bytes unread, SO_LINGER 0 (set on the socket, before connect, on the
    listener), a write after the peer closed, a child still holding the socket, a thread asleep
    in recv: what the other end sees (poll and epoll bits, recv, send, SO_ERROR, the reset
    reported once) under memlan equals kernel TCP's, line for line."""
    plain, under, text = scripted(RESETCONF, tmp_path)
    assert plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    assert "Connection reset by peer" in plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines()
    assert text.count("accelerated (client)") == 11, text
    assert text.count("accelerated (accepted") == 11, text
    settle(fabric)


FINRESET = BUILD / "tests-preload" / "finreset"


def test_reset_after_fin_reads_the_end(fabric, tmp_path):
    """finreset: the server shuts down writing, the client's next request crosses it, and the
    server closes (or dies) with it unread: the kernel's reset comes after the FIN it already
    has, so the client's recv reads the response and then the end, never ECONNRESET, and the
    error left is EPIPE (none when the client had shut down too before the close; kept when it
    shuts down after: memlan dropped it then).  Under memlan recv read ECONNRESET: ab -k against
    Apache's lingering close stopped with "apr_socket_recv: Connection reset by peer".  Line for
    line as over kernel TCP."""
    plain, under, text = scripted(FINRESET, tmp_path)
    assert plain.stdout.endswith("done\n") and "FAIL" not in plain.stdout, plain.stdout
    assert "Connection reset" not in plain.stdout, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines()
    assert text.count("accelerated (client)") == 11, text
    assert text.count("accelerated (accepted") == 11, text
    settle(fabric)


SHUTRESET = BUILD / "tests-preload" / "shutreset"


def test_shutdown_after_reset_matches_kernel(fabric, tmp_path):
    """shutreset: shutdown (SHUT_WR, SHUT_RD, SHUT_RDWR) on a connection its peer reset (closed
    with bytes unread, SO_LINGER 0, a holder killed with bytes unread, a write after its close),
    before and after the reset was read, fails with ENOTCONN as over kernel TCP, whose socket
    the reset closed; after plain FINs, on a live connection, and once both FINs are through
    (ENOTCONN again) as over kernel TCP too.  Under memlan shutdown returned 0 after a reset,
    and after both FINs.  Line for line as over kernel TCP."""
    plain, under, text = scripted(SHUTRESET, tmp_path)
    assert plain.stdout.endswith("done\n") and "FAIL" not in plain.stdout, plain.stdout
    assert plain.stdout.count("not connected") >= 15, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines()
    assert text.count("accelerated (client)") == 22, text
    assert text.count("accelerated (accepted") == 22, text
    settle(fabric)


SHUTCLOSE = BUILD / "tests-preload" / "shutclose"


def test_a_shutdown_whose_reader_closes_and_reconnects_at_once(fabric, tmp_path):
    """shutclose: a shutdown (SHUT_RD, SHUT_WR, SHUT_RDWR, 150 rounds each) while another thread
    reads the connection; that thread, its read ended, closes the fd and at once opens a new
    connection at the same number and echoes one message on it.  Over kernel TCP every shutdown
    returns 0 and every new connection echoes.  Under memlan the shutdown woke the reader
    through the ring and then called the kernel's shutdown by the number, which the reader had
    closed or reused meanwhile: shutdowns failed with EBADF or ENOTCONN (9 and 14 of 150), and
    a new connection was shut down under its owner (found by an explorer with Boost.Asio, whose
    shutdown is posted to one io thread while another has a read pending)."""
    plain, under, text = scripted(SHUTCLOSE, tmp_path)
    assert plain.stdout.count("150 of 150 shutdowns returned 0, 150 new connections echoed") \
        == 3, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), (under.stdout, under.stderr)
    assert text.count("accelerated (client)") == 900, text[-2000:]
    settle(fabric)


# A daemon that clears its environment at start-up (exim keeps only keep_environment's), then
# listens: the settings memlan run gave it still hold.
CLEARENV_SERVER = r"""
import os, socket, sys
os.environ.clear()            # unsetenv of every variable: the C environment is empty now
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", int(sys.argv[1])))
l.listen(4)
print("ready", flush=True)
c, _ = l.accept()
got = b""
while len(got) < 300000:
    d = c.recv(65536)
    if not d:
        break
    got += d
c.sendall(got[::-1])
c.close()
"""

CLEARENV_CLIENT = r"""
import os, socket, sys
data = os.urandom(300000)
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=20)
s.sendall(data)
got = b""
while len(got) < len(data):
    d = s.recv(65536)
    if not d:
        break
    got += d
print("ok" if got == data[::-1] else "bad %d" % len(got))
"""


def test_cleared_environment_keeps_the_fabric(fabric, tmp_path):
    """A server that clears its environment before its first socket call (exim4 as Debian ships
    it: keep_environment) listens in the fabric memlan run named, not in the default one: its
    clients there are accelerated.  Before, its fabric was opened by name only at the first
    socket call, from the emptied environment: the listener went to /dev/shm/memlan-UID and the
    clients read "TCP (no memlan listener on this port in the fabric)"."""
    port = next_port()
    srv, cli = tmp_path / "srv.py", tmp_path / "cli.py"
    srv.write_text(CLEARENV_SERVER)
    cli.write_text(CLEARENV_CLIENT)
    slog, clog = tmp_path / "server.log", tmp_path / "client.log"
    s = subprocess.Popen([str(MEMLAN), "run", "--fabric", str(fabric), "--log", str(slog), "--",
                          sys.executable, str(srv), str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert s.stdout.readline().strip() == "ready"
        c = subprocess.run([str(MEMLAN), "run", "--fabric", str(fabric), "--log", str(clog), "--",
                            sys.executable, str(cli), str(port)], capture_output=True, text=True,
                           timeout=30)
        assert c.stdout.strip() == "ok", c.stdout + c.stderr
        assert s.wait(timeout=20) == 0
    finally:
        if s.poll() is None:
            s.kill()
            s.wait()
    st, ct = slog.read_text(), clog.read_text()
    assert f"published in {fabric}" in st, st
    assert "accelerated (client)" in ct and "accelerated (accepted" in st, st + ct
    settle(fabric)


SETENV_SERVER = r"""
import os, socket, sys
os.environ["MEMLAN_FABRIC"] = sys.argv[2]   # its own fabric, set before its first socket
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", int(sys.argv[1])))
l.listen(4)
print(" ".join(sorted(os.listdir(sys.argv[2]))), flush=True)
"""


def test_program_that_sets_its_fabric_listens_there(fabric, tmp_path):
    """A program that sets MEMLAN_FABRIC itself before its first socket call listens in the
    fabric it named, as it did before 2fbaff7 (and as libmemlan's memlan_fabric_open(NULL) in
    the same process reads it); the value read at start-up serves only when the environment has
    none by then (test_cleared_environment_keeps_the_fabric).  After 2fbaff7 the start-up value
    won: the listener went to the fabric memlan run named, its clients in the other found none."""
    port = next_port()
    own = pathlib.Path(tempfile.mkdtemp(prefix="memlan-own-", dir="/dev/shm"))
    try:
        srv = tmp_path / "srv.py"
        srv.write_text(SETENV_SERVER)
        r = subprocess.run([str(MEMLAN), "run", "--fabric", str(fabric), "--", sys.executable,
                            str(srv), str(port), str(own)], capture_output=True, text=True,
                           timeout=30)
        assert r.returncode == 0, r.stdout + r.stderr
        names = r.stdout.split()
        assert len(names) == 1 and re.fullmatch(r"ls-[0-9a-f]+-%d" % port, names[0]), r.stdout
        assert os.listdir(own) == [] and sorted(os.listdir(fabric)) == []
    finally:
        shutil.rmtree(own, ignore_errors=True)
    settle(fabric)


SIGCONF = BUILD / "tests-preload" / "sigconf"


def test_signals_and_cancellation_match_kernel(fabric, tmp_path):
    """A blocking recv interrupted by a handler with SA_RESTART goes on, without it fails with
    EINTR, with SO_RCVTIMEO fails with EINTR; a handler that uses the socket whose recv it
    interrupted gets EAGAIN and sends, never deadlocks; pthread_cancel cancels a thread blocked
    in recv and leaves the socket usable: as over kernel TCP, line for line (issue 19: 6, 12, 13)."""
    plain, under, text = scripted(SIGCONF, tmp_path)
    assert plain.stdout.endswith("done\n") and "hang" not in plain.stdout, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines()
    assert text.count("accelerated (client)") == 5, text
    settle(fabric)


def test_signals_while_spinning_match_kernel(fabric, tmp_path, monkeypatch):
    """The same with a spin of a second (MEMLAN_SPIN_US=1000000): a handler that runs while
    the blocking call spins, not sleeps, ends it as it would have ended the kernel's (EINTR
    without SA_RESTART, EINTR with SO_RCVTIMEO whatever the flag) and a cancellation acts; with
    handlers memlan cannot count (siginterrupt), waits do not spin.  Before: the nores and timeo
    cases received the next byte, cancel hung, and siginterrupt hung."""
    monkeypatch.setenv("MEMLAN_SPIN_US", "1000000")
    plain, under, text = scripted(SIGCONF, tmp_path)
    assert plain.stdout.endswith("done\n") and "hang" not in plain.stdout, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines()
    plain, under, text = scripted(BUILD / "tests-preload" / "siginterrupt", tmp_path)
    assert "Interrupted system call" in plain.stdout, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines()
    settle(fabric)


LOCKCONF = BUILD / "tests-preload" / "lockconf"


def test_no_lock_held_across_a_sleep(fabric, tmp_path):
    """A thread asleep in recv or send on a socket: another thread's nonblocking recv and send
    answer at once, its shutdown(SHUT_WR) ends the send with a short count the peer gets exactly;
    a handler that siglongjmp()s out of the recv leaves the socket usable by every thread;
    close() of the fd leaves the socket working (no FIN, the peer's byte still arrives) until
    the recv returns; exec with the recv asleep leaves the socket to the new image: as over
    kernel TCP, line for line (issue 19: 9, 10, 12, 13).  The first four hung before."""
    plain, under, text = scripted(LOCKCONF, tmp_path)
    assert plain.stdout.endswith("done\n") and "killed" not in plain.stdout, plain.stdout
    assert not [ln for ln in plain.stdout.splitlines() if ln.endswith(": no")], plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines()
    assert text.count("accelerated (client)") == 6, text
    settle(fabric)


LOCKHOLE = BUILD / "tests-preload" / "lockhole"


def test_lock_holes_match_kernel(fabric, tmp_path):
    """The holes a review found in the lock rules: a peer that writes over the shared copies of
    the indices only we write makes neither poll report readiness that is not there nor a
    blocked recv spin (its CPU time stays under a third of the wait; it was 1.35 s of 1.5 s);
    dup2 over the last fd of a socket another thread is asleep in recv on keeps the socket (no
    FIN; before, the peer saw POLLIN|POLLRDHUP and the recv hung) and closes the file dup2'd in
    when its last fd goes (close_range(CLOSE_RANGE_UNSHARE) too: that passed before); a
    handler that siglongjmp()s out of recv or send while the lock is held for the copy leaves
    the socket usable by the next call (before, every later call said EINTR);
    recv(MSG_PEEK|MSG_WAITALL) returns the bytes there when SO_RCVTIMEO runs out or a handler
    runs (before, it waited until the alarm killed it);
    as over kernel TCP, line for line."""
    plain, under, text = scripted(LOCKHOLE, tmp_path)
    assert plain.stdout.endswith("done\n") and "killed" not in plain.stdout, plain.stdout
    assert ": no" not in plain.stdout, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines()
    settle(fabric)


def test_handler_inside_the_fork_gate(fabric, tmp_path):
    """A handler that duplicates and closes a socket on threads that are doing the same, while
    another thread forks again and again: no deadlock (the handler waited for the fork gate its
    own thread was inside, the fork for that thread; the old code hung 10 runs in 10), as over
    kernel TCP.  Bounded: 3 s."""
    plain, under, text = scripted(BUILD / "tests-preload" / "gatesig", tmp_path)
    assert plain.stdout == "forks many, handlers many\ndone\n", plain.stdout
    assert under.stdout == plain.stdout, under.stdout + under.stderr
    settle(fabric)


def test_fork_racing_connect_accept_close(fabric, tmp_path):
    """fork() in one thread while two others make short connections (connect, accept, echo,
    close): every echo right, every close seen as EOF, no hang, as over kernel TCP (issue 19:
    14).  A stress test of fdtable.c's fork gate; bounded (300 forks and 100 connections, or
    10 s).  The race it guards is narrow: the old code passed it too in the runs tried."""
    plain, under, text = scripted(BUILD / "tests-preload" / "forkrace", tmp_path)
    assert plain.stdout == "forks many, connections many, bad 0, failed forks 0\n", plain.stdout
    assert under.stdout == plain.stdout, under.stdout + under.stderr
    assert "accelerated (client)" in text, text
    settle(fabric)


def test_handler_polls_socket_its_thread_waits_on(fabric, tmp_path):
    """A handler polls (poll and epoll, timeout 0) the socket its thread is asleep on in poll or
    epoll_wait: it gets POLLOUT, no deadlock, and the wait fails with EINTR, as over kernel TCP
    (issue 19: 12).  poll.c's mutexes are not held across the sleep: the old code passed this
    too; it guards the rule."""
    plain, under, text = scripted(BUILD / "tests-preload" / "pollsig", tmp_path)
    assert plain.stdout.count("handler poll 1 0x4 epoll 1") == 2, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines()
    assert "accelerated (client)" in text, text
    settle(fabric)


FORKSHARE = BUILD / "tests-preload" / "forkshare"


def test_fork_shared_connection_moves_every_byte_once(fabric, tmp_path):
    """A process, its fork child and its grandchild (on a dup2'd fd) write one connection at
    once, then read it at once, then two of them do both at once in two threads each; also with
    the fork before the server accepted, and with the connection made after an earlier fork:
    the peer gets every writer's bytes whole and in order, the readers' reads are runs of the
    stream and add up to it, as over kernel TCP.  Each process must reload the ring position it
    owns when it takes a direction after another had it: with that reload left out (the check
    in mlp_lock_dir removed) the writes were reset or crossed and the readers hung."""
    plain, under, text = scripted(FORKSHARE, tmp_path)
    assert plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    assert plain.stdout.count("bad bytes none") == 8, plain.stdout
    assert plain.stdout.count("bytes all, bad reads none") == 4, plain.stdout
    assert under.stdout == plain.stdout, under.stdout + under.stderr
    assert text.count("accelerated (accepted") == 10, text
    settle(fabric)


FORKSHUT = BUILD / "tests-preload" / "forkshut"


def test_shutdown_in_fork_child_stops_parent_writes(fabric, tmp_path):
    """A fork child's shutdown(SHUT_WR) stops the parent's writes (EPIPE) and the peer reads
    EOF and nothing after it, as with the kernel's shared socket (issue 19: 10)."""
    plain, under, text = scripted(FORKSHUT, tmp_path)
    assert "EPIPE" in plain.stdout and plain.stdout.endswith("done\n"), plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines()
    assert text.count("accelerated (client)") == 1, text
    settle(fabric)


FORKEXIT = BUILD / "tests-preload" / "forkexit"


def test_fork_child_leaving_without_close_ends_promptly(fabric, tmp_path):
    """A fork child that leaves without closing its copy of the accepted end (_exit, SIGKILL, a
    failed exec then _exit; before or after the parent's close): the client's blocking recv,
    blocking send, poll, epoll (level, edge) and nonblocking recv see EOF, or ECONNRESET when
    bytes were left unread, within 300 ms of the end, as over kernel TCP (issue 19, item 11).
    Before, a blocking recv or send learned of it at its next liveness look, about 0.9 s late,
    and a nonblocking recv answered EAGAIN for ever (poll and epoll already woke on the FIN)."""
    plain, under, text = scripted(FORKEXIT, tmp_path)
    assert plain.stdout.endswith("done\n") and "LATE" not in plain.stdout, plain.stdout
    assert "ECONNRESET" in plain.stdout and "exit-nb: after 0" in plain.stdout, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stderr
    assert text.count("accelerated (client)") == 13, text
    settle(fabric)


# A connection pool's health check (redis-py's can_read before it hands a pooled connection
# out: one recv with a zero timeout, no poll), before and after a round trip with a server (a
# fork child) that then ends by argv[2]: exit() without a close (redis-server on SIGTERM),
# _exit, or SIGKILL.  0.3 s after the end, one nonblocking recv: what it answered.
POOL_CHECK = LISTEN_FORK + r"""
if pid == 0:
    s, _ = l.accept()
    s.sendall(s.recv(10))
    if sys.argv[2] == "kill":
        time.sleep(30)
    if sys.argv[2] == "_exit":
        os._exit(0)
    sys.exit(0)
l.close()
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
def check():
    c.settimeout(0)
    try:
        return repr(c.recv(10))
    except BlockingIOError:
        return "EAGAIN"
    finally:
        c.settimeout(None)
print("before:", check())
c.sendall(b"ping")
print("answer:", c.recv(10))
if sys.argv[2] == "kill":
    time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
os.waitpid(pid, 0)
time.sleep(0.3)
print("after the end:", check())
"""


@pytest.mark.parametrize("how", ["exit", "_exit", "kill"])
def test_a_pools_one_nonblocking_recv_sees_a_dead_servers_end(fabric, tmp_path, how):
    """One nonblocking recv, 0.3 s after the server's process ended without a close of ours
    (exit() with the socket open, _exit, SIGKILL), answers the end, as over kernel TCP.  Before,
    the kernel socket was looked at only from the second empty answer in a row: the first said
    EAGAIN, redis-py's pool handed out the dead server's connection, and a Celery task failed
    with "Connection closed by server" after a Redis restart (an explorer)."""
    script = tmp_path / "pool.py"
    script.write_text(POOL_CHECK)
    plain = subprocess.run([PY, str(script), str(next_port()), how], capture_output=True,
                           text=True, timeout=60)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.splitlines()[-1] == "after the end: b''", plain.stdout
    log = tmp_path / "m.log"
    under = subprocess.run([str(MEMLAN), "run", "--log", str(log), "--", PY, str(script),
                            str(next_port()), how], capture_output=True, text=True, timeout=60)
    assert under.returncode == 0, under.stderr
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stdout
    assert log.read_text().count("accelerated (client)") == 1, log.read_text()
    settle(fabric)


EXITRACE = BUILD / "tests-preload" / "exitrace"


@pytest.mark.parametrize("case,rounds", [("poll", 20), ("thread", 20), ("dtor", 5), ("linger", 5),
                                         ("shared", 5), ("flush", 3), ("shutwr", 5),
                                         ("lateshut", 3), ("undecided", 3), ("lateconn", 3),
                                         ("forklate", 3), ("lateshutcred", 1),
                                         ("taken", 3), ("peershutrd", 2), ("shutrddead", 3)])
def test_exit_ends_no_connection_before_the_process_does(fabric, tmp_path, case, rounds):
    """exitrace: a child's main thread calls exit() while its other threads send and busy-poll
    (epoll_wait and poll with timeout 0), or an ELF destructor and glibc's final stdio flush write
    after memlan's exit handler, or the socket has SO_LINGER 0, or a grandchild that shares the
    connection exits first, or glibc's last flush at exit meets a full ring (flush: it took the
    parent for dead once memlan's handler had taken the channel file's name, and lost all but
    256 KiB of 4 MiB; the queue its wait made was left in the fabric), or the child shut its
    writing down and read the parent's end before it exits (shutwr: its channel file kept its
    name and stayed in the fabric), or a thread of the child shuts its writing down after
    memlan's handler (lateshut: the parent's sends to the gone child must fail; they waited for
    room until SO_SNDTIMEO, for ever without it), or the child exits before the parent accepts
    (undecided: its withdrawn offer's channel file stayed in the fabric), or a thread of the
    child connects anew after memlan's handler (lateconn: that connection stays on TCP; its
    channel file stayed in the fabric, on 9fe2d4b too), or a grandchild that shares the connection
    closes it after the child's handler, before the child's last flush (forklate: the child's
    handler had given its holders count back, the grandchild's close ended the connection, and
    the parent read "" for "late"; lateshutcred: lateshut with the parent's euid 65534 while it
    sends, one round, as the listener's record refuses offers after that), or the child exits
    without touching its socket after the parent accepted (taken: the offer, found taken only
    at exit, kept its channel file's name), or the parent shut its reading down and sends to a
    child whose thread reads after memlan's handler (peershutrd: the parent took its own
    SHUT_RD's RDHUP for the child's FIN, and its sends failed with ECONNRESET; shutrddead
    guards that a child gone after such a SHUT_RD still fails the sends).  Over kernel TCP every
    byte whose send returned reaches the parent,
    the child exits 0, and the lingering socket's end is a reset; under memlan too, with nothing
    of the children left in the fabric (shared: the grandchild's exit() takes the channel's name).  Before, the exit
    handler ended the connections: later sends went to the kernel socket under the channel,
    unread (poll: 8 and 11 rounds of 20 lost about 4 MB each; dtor, linger and shared passed
    then: linger and shared guard the end's reset and the files now that the process's end is
    the connection's)."""
    plain, under, text = scripted(EXITRACE, tmp_path, case, str(rounds))
    assert plain.stdout.endswith(f"{case} rounds {rounds} bad 0\n"), plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stderr
    # undecided: withdrawn, TCP, said at the exit; taken: accelerated, the client never looked
    # before its exit, which says so (test_apps_logs.py::test_write_only_client_is_told_accelerated)
    per_round = {"poll": 3, "undecided": 0}.get(case, 1)
    assert text.count("accelerated (client)") == rounds * per_round, text
    if case == "undecided":
        assert text.count("TCP (closed before a memlan acceptor took the offer)") == rounds, text
    assert "split" not in text, text
    assert os.listdir(fabric) == [], os.listdir(fabric)  # every name went at exit()


def test_a_program_built_with_addresssanitizer_runs_accelerated(fabric, tmp_path):
    """A program built with -fsanitize=address, run as its developers run it (LeakSanitizer on:
    a leak makes the exit status 23), under the ordinary preload: exitrace's thread and poll
    cases, byte for byte as over kernel TCP, exit 0, every connection accelerated.  Before, the
    sanitizer's runtime, initialising itself from the program's preinit array, called setrlimit,
    which reached our initialisation, whose atexit() it refused: "AddressSanitizer: CHECK failed:
    asan_interceptors.cpp:568", dead before main.  And since exit() frees nothing of ours, the
    records hanging from our mmap'd tables are shown to LeakSanitizer as roots (else "Direct leak
    ... mlp_sock_new" for every socket)."""
    lib = BUILD / "lib" / "libmemlan-preload.so"
    if "libasan" in subprocess.run(["ldd", str(lib)], capture_output=True, text=True).stdout:
        # make test-preload-asan: our own instrumented code would run inside the program's
        # sanitizer initialisation, before its shadow memory exists.  Users run the plain build.
        pytest.skip("the preload itself is built with AddressSanitizer")
    exe = tmp_path / "exitrace-asan"
    cc = subprocess.run(["cc", "-std=c11", "-D_GNU_SOURCE", "-O1", "-g", "-fsanitize=address",
                         "-pthread", "-o", str(exe), str(ROOT / "tests" / "preload" / "exitrace.c")],
                        capture_output=True, text=True, timeout=120)
    if cc.returncode != 0:
        pytest.skip("no AddressSanitizer here: " + cc.stderr[-300:])
    env = dict(os.environ, ASAN_OPTIONS="verify_asan_link_order=0:detect_leaks=1")
    for case, conns in (("thread", 1), ("poll", 3)):
        plain = subprocess.run([str(exe), str(next_port()), case, "3"], capture_output=True,
                               text=True, timeout=120, env=env)
        if "LeakSanitizer has encountered a fatal error" in plain.stderr:
            pytest.skip("LeakSanitizer cannot run here (ptrace): " + plain.stderr[-300:])
        assert plain.returncode == 0, plain.stdout + plain.stderr
        log = tmp_path / f"memlan-{case}.log"
        under = subprocess.run([str(MEMLAN), "run", "--log", str(log), "--", str(exe),
                                str(next_port()), case, "3"], capture_output=True, text=True,
                               timeout=120, env=env)
        assert "Sanitizer" not in under.stderr, under.stderr[-3000:]
        assert under.returncode == 0 and under.stdout == plain.stdout, under.stdout + under.stderr
        assert log.read_text().count("accelerated (client)") == 3 * conns, log.read_text()


def test_many_blocked_receivers_see_a_fork_childs_end(fabric, tmp_path):
    """forkexit many-recv: 72 threads blocked in recv without SO_RCVTIMEO, one per connection,
    more than memlan makes eventfds for (64, under the limit of 1024 fds the program sets); a
    fork child holds every accepted end and leaves by _exit.  Every receiver reads EOF within
    400 ms of the child's end, as over kernel TCP.  Before, the 8 without an eventfd slept on
    the ring's futex until their next liveness look (64 of 72 prompt, the last about 910 ms
    late); they now sleep in slices of 50 ms growing to 200 ms (the program's receivers wait
    1.6 s before the end, in the longest slices)."""
    plain, under, text = scripted(FORKEXIT, tmp_path, "many-recv")
    assert plain.stdout.endswith("done\n") and "LATE" not in plain.stdout, plain.stdout
    assert "72 of 72 within 400 ms" in plain.stdout, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stderr
    assert text.count("accelerated (client)") == 72, text
    settle(fabric)


CLEARENVSPAWN = BUILD / "tests-preload" / "clearenvspawn"


def test_spawns_after_clearenv(fabric, tmp_path):
    """clearenvspawn: after clearenv() (environ NULL), system(), system(NULL) and posix_spawn with
    environ, with and without an accelerated connection open, answer as over kernel TCP.  Before,
    the carry's environment walked the NULL environ: SIGSEGV at the first system()."""
    plain, under, text = scripted(CLEARENVSPAWN, tmp_path)
    assert plain.stdout.endswith("done\n") and "environ NULL" in plain.stdout, plain.stdout
    assert "a connection: system: 3" in plain.stdout, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stdout + under.stderr
    assert "accelerated (client)" in text, text
    settle(fabric)


def test_an_unset_ld_preload_stays_unset(fabric):
    """`env -u LD_PRELOAD CMD` under memlan: CMD runs without LD_PRELOAD, as the caller asked.
    The start-up copy of our settings is carried only after clearenv() (dovecot's master);
    before, an LD_PRELOAD unset on purpose came back from it (review of 5304f5f)."""
    r = subprocess.run([str(MEMLAN), "run", "--", "/usr/bin/env", "-u", "LD_PRELOAD", "/bin/sh",
                        "-c", 'echo "[$LD_PRELOAD]"'], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout == "[]\n", r.stdout + r.stderr
    settle(fabric)


TRUNCATED_ENV = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None)
environ = ctypes.POINTER(ctypes.c_char_p).in_dll(libc, "environ")
environ[0] = None                      # postfix's clean_env(): the array cut, no clearenv()
libc.setenv(b"LANG", b"C", 1)          # and what import_environment names put back
os.execv("/bin/sh", ["sh", "-c", 'echo "[${LD_PRELOAD:+set}] [$LANG]"'])
"""


@pytest.mark.parametrize("how", ["truncated", "env-i", "env-u", "env-i-own"])
def test_an_environment_emptied_by_hand_keeps_memlan(fabric, tmp_path, how):
    """A program that empties its environment without clearenv() and execs: postfix's
    clean_env() sets environ[0] = 0 and puts back what import_environment names, so `memlan run
    -- postfix start` ran master and every daemon without memlan, silently (their clients read
    "no memlan listener on this port"); `env -i` replaces environ.  Both now carry LD_PRELOAD
    from the start-up copy; an LD_PRELOAD unset by name (`env -u`) stays unset, and a MEMLAN_*
    setting the caller gives (`env -i MEMLAN_OFF=1`) is the caller's: ours fill in only the
    names it did not give (a review found them replaced by the start-up copy's)."""
    (tmp_path / "t.py").write_text(TRUNCATED_ENV)
    cmd = {"truncated": [PY, str(tmp_path / "t.py")],
           "env-i": ["/usr/bin/env", "-i", "LANG=C", "/bin/sh", "-c",
                     'echo "[${LD_PRELOAD:+set}] [$LANG]"'],
           "env-u": ["/usr/bin/env", "-u", "LD_PRELOAD", "LANG=C", "/bin/sh", "-c",
                     'echo "[${LD_PRELOAD:+set}] [$LANG]"'],
           "env-i-own": ["/usr/bin/env", "-i", "LANG=C", "MEMLAN_OFF=1", "/bin/sh", "-c",
                         'echo "[${LD_PRELOAD:+set}] [$LANG] [$MEMLAN_OFF]"']}[how]
    r = subprocess.run([str(MEMLAN), "run", "--"] + cmd, capture_output=True, text=True, timeout=30)
    want = {"env-u": "[] [C]\n", "env-i-own": "[set] [C] [1]\n"}.get(how, "[set] [C]\n")
    assert r.returncode == 0 and r.stdout == want, r.stdout + r.stderr
    settle(fabric)


FASTOPEN = r"""
import errno, hashlib, select, socket, sys, threading
port, dead = int(sys.argv[1]), int(sys.argv[2])
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", port)); ls.listen(8)
def serve():
    for _ in range(6):
        c, _ = ls.accept(); n = int.from_bytes(c.recv(4, socket.MSG_WAITALL), "big"); got = b""
        while len(got) < n:
            b = c.recv(min(65536, n - len(got)))  # what follows the message is left unread
            if not b: break
            got += b
        c.sendall(hashlib.sha256(got).digest()); c.close()
threading.Thread(target=serve, daemon=True).start()
data = bytes(range(256)) * 1000
msg = len(data).to_bytes(4, "big") + data
def reply(s):
    r = s.recv(32, socket.MSG_WAITALL); s.close()
    return r == hashlib.sha256(data).digest()
def err(f):
    try:
        return f()
    except OSError as e:
        return errno.errorcode[e.errno]
out = []
s = socket.socket()                                 # blocking sendto: connects, sends it all
out.append(err(lambda: s.sendto(msg, socket.MSG_FASTOPEN, ("127.0.0.1", port)) == len(msg)))
out.append(reply(s))
s = socket.socket()                                 # blocking sendmsg
out.append(err(lambda: s.sendmsg([msg[:100], msg[100:]], [], socket.MSG_FASTOPEN, ("127.0.0.1", port))))
out.append(reply(s))
s = socket.socket(); s.setblocking(False)           # non-blocking: EINPROGRESS, nothing sent
out.append(err(lambda: s.sendto(msg, socket.MSG_FASTOPEN, ("127.0.0.1", port))))
select.select([], [s], [], 10); out.append(s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR))
s.setblocking(True); s.sendall(msg)
out.append(err(lambda: s.sendto(b"x", socket.MSG_FASTOPEN, ("127.0.0.1", port))))  # taken
out.append(reply(s))
s = socket.socket()                                 # connected by connect(): EISCONN too
s.connect(("127.0.0.1", port)); out.append(err(lambda: s.sendto(b"x", socket.MSG_FASTOPEN, ("127.0.0.1", port))))
s.sendall(msg); out.append(reply(s))
s = socket.socket()                                 # nobody listens
out.append(err(lambda: s.sendto(msg, socket.MSG_FASTOPEN, ("127.0.0.1", dead)))); s.close()
s = socket.socket()                                 # MSG_DONTWAIT: a blocking socket's TFO
out.append(err(lambda: s.sendto(msg, socket.MSG_FASTOPEN | socket.MSG_DONTWAIT, ("127.0.0.1", port))))
select.select([], [s], [], 10); out.append(s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR))
out.append(err(lambda: s.send(msg[:1], socket.MSG_FASTOPEN)))  # no address: its TFO takes it
s.sendall(msg[1:]); out.append(reply(s))            # still blocking: the reply waits
s = socket.socket(); s.connect(("127.0.0.1", port))  # no address after connect(): EISCONN
out.append(err(lambda: s.send(b"x", socket.MSG_FASTOPEN))); s.sendall(msg); out.append(reply(s))
print(out)
"""


def test_tcp_fast_open_connects_through_memlan(fabric, tmp_path):
    """TCP Fast Open's implicit connect (sendto/sendmsg with MSG_FASTOPEN and an address on a
    socket not yet connected; unbound's upstream queries over TCP, as Debian builds it): the
    connection was the kernel's, said nowhere (the server read "the client is not memlan").  Now
    it is memlan's: a blocking call sends everything, a non-blocking one answers EINPROGRESS as
    the kernel does without a cookie; a socket connected by connect() answers EISCONN (before,
    memlan sent the bytes), a dead port ECONNREFUSED; the answers are kernel TCP's and the four
    connections are accelerated."""
    (tmp_path / "t.py").write_text(FASTOPEN)
    dead = next_port()
    res = []
    log = tmp_path / "memlan.log"
    for on in (False, True):
        cmd = [PY, str(tmp_path / "t.py"), str(next_port()), str(dead)]
        r = subprocess.run(([str(MEMLAN), "run", "--log", str(log), "--"] if on else []) + cmd,
                           capture_output=True, text=True, timeout=60)
        res.append((r.returncode, r.stdout, r.stderr[-1500:]))
    # After its own TFO connect the kernel takes more MSG_FASTOPEN data on the socket (x: 1);
    # after connect() it answers EISCONN.
    # MSG_DONTWAIT makes a blocking socket's implicit connect non-blocking, the socket staying
    # blocking; MSG_FASTOPEN without an address is taken on the socket's own TFO connection and
    # refused (EISCONN) after connect() (a review of dfe5be1: memlan blocked in the connect, and
    # sent the bytes where the kernel refuses them).  Kernel TCP's answers where the client bit
    # of net.ipv4.tcp_fastopen is set (Linux's default); memlan's must be the same.
    with open("/proc/sys/net/ipv4/tcp_fastopen") as f:
        if not int(f.read(), 0) & 1:
            pytest.skip("TCP Fast Open's client side is off here (net.ipv4.tcp_fastopen)")
    assert res[0] == (0, "[True, True, 256004, True, 'EINPROGRESS', 0, 1, True, 'EISCONN', "
                         "True, 'ECONNREFUSED', 'EINPROGRESS', 0, 1, True, 'EISCONN', True]\n",
                      ""), res[0]
    assert res[1] == res[0], (res, log.read_text()[-2000:])
    assert log.read_text().count("accelerated (client)") == 6, log.read_text()


# Racket's ports wait so (rktio): a nonblocking send that meets EAGAIN adds the socket to an epoll
# set for EPOLLOUT, polls the set's own fd (a set asked about by poll: nested), takes its events
# with a zero-timeout epoll_wait, removes the socket and sends again.  The reader reads 700 bytes
# at a time, slowly: room comes back a little at a time.
EPOLL_IN_POLL_WRITER = r"""#!/usr/bin/python3
import hashlib, os, select, socket, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2]) << 20
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", port)); ls.listen(1)
if os.fork() == 0:
    ls.close(); c = socket.create_connection(("127.0.0.1", port)); got = 0; h = hashlib.sha256()
    while b := c.recv(700):
        got += len(b); h.update(b); time.sleep(0.00002)
    print("reader", got, h.hexdigest()[:16], flush=True); os._exit(0)
s = ls.accept()[0]; s.setblocking(False); ep = select.epoll()
data = bytes(range(256)) * (n // 256); off = 0
while off < n:
    try:
        off += s.send(data[off:off + 65536])
    except BlockingIOError:
        ep.register(s.fileno(), select.EPOLLOUT)
        p = select.poll(); p.register(ep.fileno(), select.POLLIN)
        if not p.poll(5000):
            print("writer: no room within 5 s", flush=True); break
        ep.poll(0); ep.unregister(s.fileno())
s.close(); print("writer", off, hashlib.sha256(data[:off]).hexdigest()[:16], flush=True); os.wait()
"""


def test_a_writer_that_polls_its_epoll_set_gets_its_room(fabric, tmp_path):
    """EPOLL_IN_POLL_WRITER, 32 MB: the writer's set is nested (poll asks about its fd), and each
    post of the reader's ("a byte of room") listed the writer's socket on the set's ready list
    without its eventfd rung (writable wants a third of the ring) and without its room armed
    again: the poll slept for ever with the ring empty (Racket's bulk transfers stalled, 5 runs
    of 9: an explorer; this script stalled 4 runs of 4 on 7883d47, "no room within 5 s")."""
    (tmp_path / "w.py").write_text(EPOLL_IN_POLL_WRITER)
    (tmp_path / "w.py").chmod(0o755)
    plain, under, text = scripted(tmp_path / "w.py", tmp_path, "32")
    assert sorted(plain.stdout.splitlines()) == ["reader 33554432 e09320c5b00b34bb",
                                                 "writer 33554432 e09320c5b00b34bb"], plain.stdout
    assert sorted(under.stdout.splitlines()) == sorted(plain.stdout.splitlines()), \
        under.stdout + under.stderr + text
    assert text.count("accelerated (accepted") == 1, text
    settle(fabric)  # (the reader ends by _exit)


# A process that is its own server: a daemon thread accepts, answers and is still holding the
# connection (asleep) when the main thread, its client closed, exits.
OWN_SERVER_EXIT = r"""
import socket, sys, threading, time
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", int(sys.argv[1]))); ls.listen(8)
def serve():
    c, _ = ls.accept(); c.recv(10); c.sendall(b"x" * 32); time.sleep(float(sys.argv[2])); c.close()
threading.Thread(target=serve, daemon=True).start()
s = socket.socket(); s.connect(("127.0.0.1", int(sys.argv[1]))); s.sendall(b"hi")
print(len(s.recv(32, socket.MSG_WAITALL))); s.close()
"""


@pytest.mark.parametrize("late", ["0", "0.05"])
def test_an_exit_with_its_own_accepted_connection_open_leaves_no_file(fabric, tmp_path, late):
    """The client closes, and the process exits while a daemon thread of its own still holds
    the accepted side (asleep for `late` s first, or closing it as the exit comes).  The
    client's close parks its channel's file in the pool, and exit() drains the pool: the file is
    left to the acceptor's side, which is open.  That side's look at exit must come after the
    drain, or the name stays in the fabric after the process (7883d47: every run with the
    thread 0.05 s late; 1 in 100 of the fast-open test's teardowns)."""
    (tmp_path / "t.py").write_text(OWN_SERVER_EXIT)
    log = tmp_path / "memlan.log"
    for i in range(3):
        r = subprocess.run([str(MEMLAN), "run", "--log", str(log), "--", PY,
                            str(tmp_path / "t.py"), str(next_port()), late],
                           capture_output=True, text=True, timeout=60)
        assert (r.returncode, r.stdout) == (0, "32\n"), r.stdout + r.stderr
        assert sorted(os.listdir(fabric)) == [], (i, os.listdir(fabric))
    assert log.read_text().count("accelerated (client)") == 3, log.read_text()


CHROOT_CLIENT = r"""
import encodings.idna, os, socket, sys  # idna: socket's host names, not importable in the jail
os.chroot(sys.argv[2]); os.chdir("/")  # before the first connect, as postfix's smtp client
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
s.sendall(b"ping"); print(s.recv(10).decode())
"""

ECHO_ONCE = r"""
import socket, sys
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", int(sys.argv[1]))); ls.listen(1); print("ready", flush=True)
c, _ = ls.accept(); c.sendall(c.recv(10)); c.close()
"""


def test_a_client_chrooted_before_its_first_connect(gfabric, tmp_path):
    """A memlan client that chroots before its first connect (postfix's smtp, lmtp and relay
    clients, chrooted as Debian's master.cf ships them) to a memlan server: the fabric opens
    lazily, by its path, which the chroot hides, so the connection stayed on TCP with
    "fabric unavailable: no such directory (MEMLAN_FABRIC_CREATE=1 creates it)".  Now chroot()
    opens a group-shared fabric first (a user's private one: nothing changes, since a chroot goes
    with a drop to another account there), and the connection is accelerated."""
    if os.geteuid() != 0:
        pytest.skip("chroot needs root")
    (tmp_path / "c.py").write_text(CHROOT_CLIENT)
    (tmp_path / "s.py").write_text(ECHO_ONCE)
    (tmp_path / "jail").mkdir()
    port = next_port()
    log = tmp_path / "memlan.log"
    srv = subprocess.Popen([str(MEMLAN), "run", "--log", str(log), "--", PY, str(tmp_path / "s.py"),
                            str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert srv.stdout.readline() == "ready\n"
        r = subprocess.run([str(MEMLAN), "run", "--log", str(log), "--", PY, str(tmp_path / "c.py"),
                            str(port), str(tmp_path / "jail")], capture_output=True, text=True,
                           timeout=30)
        assert (r.returncode, r.stdout) == (0, "ping\n"), r.stderr  # the bytes are right either way
        srv.wait(10)
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()
    settle(gfabric[0])
    text = log.read_text()
    assert "fabric unavailable" not in text, text
    assert text.count("accelerated (client)") == 1, text


IDLEWAKE = BUILD / "tests-preload" / "idlewake"


@pytest.mark.parametrize("nofile", [4096, 1024])
def test_threads_blocked_on_idle_connections_stay_asleep(fabric, tmp_path, nofile):
    """idlewake: 100 threads, each blocked in recv on an idle connection, as a thread-per-
    connection server's (mariadbd's, a JVM's) wait between requests, with RLIMIT_NOFILE's soft
    limit set through setrlimit as such servers raise theirs.  Over kernel TCP no receiver runs
    while it waits.  Under memlan a blocked receive sleeps on an eventfd of its thread with the
    kernel socket (so that the peer's end wakes it), made for a sixteenth of the limit's threads
    (at least 64, at most 1024); the others sleep on the ring's futex in slices, looking at the
    kernel socket between two.  Counted over 1.5 s after a second's settling, the wake-ups of
    the busiest receiver: with 4096 fds every thread has its eventfd and wakes only for the
    liveness looks (1 s apart by then; 2 counted); with 1024, the 36 past the 64 wake once a
    slice (200 ms by then; 7 counted).  Before, 64 eventfds whatever the limit, and slices of
    50 ms: 30 wake-ups in both, and 300 such threads kept 8 % of a cpu busy (`/tmp` program; 0.5 %
    now with a limit of 20000 fds, 2.4 % with 1024)."""
    plain, under, text = scripted(IDLEWAKE, tmp_path, "100", str(nofile))
    assert plain.stdout.splitlines()[0] == "received: 100 of 100", plain.stdout
    assert "wakes: most 0 total 0 eventfds 0" in plain.stdout, plain.stdout
    assert under.stdout.splitlines()[0] == plain.stdout.splitlines()[0], under.stdout + under.stderr
    m = re.search(r"wakes: most (\d+) total (\d+) eventfds (\d+)", under.stdout)
    assert m, under.stdout
    most, efds = int(m.group(1)), int(m.group(3))
    if nofile == 4096:
        assert efds >= 100, under.stdout  # one per blocked thread: 4096 / 16 = 256 may be made
        assert most <= 4, under.stdout
    else:
        assert 64 <= efds < 100, under.stdout  # 1024 / 16 = 64
        assert most <= 12, under.stdout
    assert text.count("accelerated (client)") == 100, text
    settle(fabric)


SLOTSFULL = BUILD / "tests-preload" / "slotsfull"


def test_waiter_without_a_registration_slot_still_hears(fabric, tmp_path):
    """Nine processes wait on one connection, one more than a direction has event-queue
    registration slots: eight fork children poll it, then the parent waits with epoll, then with
    poll.  Every waiter reports the byte the server sends, as over kernel TCP.  Before, the
    parent's epoll member, whose registration could not be made, left the ready list unarmed
    and was never reported: epoll_wait timed out with the byte in the ring."""
    plain, under, text = scripted(SLOTSFULL, tmp_path)
    assert plain.stdout.endswith("done\n") and "reported 1; 8 of 8" in plain.stdout, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stderr
    assert text.count("accelerated (client)") == 3, text
    settle(fabric)


EXECCONF = BUILD / "tests-preload" / "execconf"


def test_connections_carried_across_exec(fabric, tmp_path):
    """Both ends exec with an accelerated connection open and bytes in flight: the client
    re-executes itself on the inherited fd, the server hands its side to cat through dup2 onto
    0 and 1 after a first exec that fails.  A child whose copy closes at exec leaves the parent's
    connection working.  The output under memlan equals kernel TCP's, and the log shows both
    carried sides taken up by the new images (were they not, cat would read the idle kernel
    socket and the run would hang)."""
    plain, under, text = scripted(EXECCONF, tmp_path)
    assert "FAIL" not in plain.stdout and "CORRUPT" not in plain.stdout
    assert "S first exec failed: ENOENT" in plain.stderr
    assert under.stdout.splitlines() == plain.stdout.splitlines()
    assert "S first exec failed: ENOENT" in under.stderr
    assert text.count("accelerated (carried across exec)") == 2, text
    assert text.count("accelerated (client)") == 2 and text.count("accelerated (accepted") == 2
    assert "lost" not in text and "cannot carry" not in text, text
    settle(fabric)


EXECODD = BUILD / "tests-preload" / "execodd"


def test_odd_exec_calls_fail_as_the_kernels(fabric, tmp_path):
    """execodd: exec calls that fail with odd arguments (a null path to execveat with a
    directory fd, or to execve; a missing file; a PATH search that finds nothing; fexecve of a
    bad fd), from fork and vfork children: the same errno under memlan as without.  The
    secure-execution note (5dde705) read execveat's path before the kernel did: SIGSEGV where
    the kernel gives EFAULT."""
    plain, under, _ = scripted(EXECODD, tmp_path)
    assert plain.stdout.endswith("done\n") and "signal" not in plain.stdout, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines()
    settle(fabric)


def test_accepting_server_keeps_few_channel_mappings(fabric, tmp_path):
    """A server keeps the mappings of its clients' pooled channel files for the next offer of
    the same file (segment.c's mapping cache): at most 8, and no per-connection lock mapping
    left once its connection closed.  Thousands of short connections from two client
    processes (two pools), every answer checked, then the server's address space is read."""
    shortconn = BUILD / "bench" / "shortconn"
    port = next_port()
    log = tmp_path / "log"
    srv = subprocess.Popen([str(MEMLAN), "run", "--log", str(log), "--", str(shortconn), "server",
                            str(port)], stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(100):
            if not port_free(port):
                break
            time.sleep(0.02)
        total = 0
        for _ in range(2):
            p = subprocess.run([str(MEMLAN), "run", "--", str(shortconn), "client", str(port),
                                "0.2"], capture_output=True, text=True, timeout=60)
            assert p.returncode == 0, p.stderr
            fields = p.stdout.split()
            conns, bad = int(fields[1]), int(fields[5])
            assert conns > 100 and bad == 0, p.stdout
            total += conns
        maps = pathlib.Path(f"/proc/{srv.pid}/maps").read_text().splitlines()
        mine = [l.split() for l in maps if str(fabric) in l]
        files = {m[4] for m in mine}                      # inodes of fabric files mapped
        holds = [m for m in mine if int(m[0].split("-")[1], 16) - int(m[0].split("-")[0], 16)
                 == 4096 and m[1].startswith("r--s")]
        # the process's own stat segment is one fabric file; the rest are cached channels
        assert len(files) <= 8 + 1, f"{len(files)} fabric files mapped after {total} connections"
        assert len(files) >= 2, f"no mapping kept: {mine}"
        assert not holds, f"lock pages of closed connections still mapped: {holds}"
    finally:
        srv.terminate()
        srv.wait(timeout=10)
    settle(fabric)
    assert "accelerated (accepted" in log.read_text()


EPOLLHERD = BUILD / "tests-preload" / "epollherd"


def herd_run(tmp_path, *args):
    """epollherd over kernel TCP, then under memlan with spinning off (every wait that finds
    nothing sleeps); both outputs, memlan's log, and how long the memlan run took."""
    plain = subprocess.run([str(EPOLLHERD), *args], capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    log = tmp_path / "memlan.log"
    env = dict(os.environ, MEMLAN_SPIN_US="0")
    t0 = time.monotonic()
    under = subprocess.run([str(MEMLAN), "run", "--log", str(log), "--", str(EPOLLHERD), *args],
                           capture_output=True, text=True, timeout=120, env=env)
    took = time.monotonic() - t0
    assert under.returncode == 0, under.stdout + under.stderr
    return json.loads(plain.stdout), json.loads(under.stdout), log.read_text(), took


def herd_bound(took):
    """Wake-ups allowed to a thread that no post is for: its sleeps are capped at the liveness
    interval (100 ms doubling to 1 s), so a few at first and then one a second, plus its exit."""
    return 12 + 2 * int(took + 1)


def herd_served_alone(fabric, tmp_path, *mode):
    """epollherd 4 threads, 5000 pings on the first one's connection: every echo right, each
    idle thread sees its EOF and nothing else, the busy one slept, and the idle ones woke only
    for their liveness looks (herd_bound)."""
    k, m, text, took = herd_run(tmp_path, "4", "5000", *mode)
    settle(fabric)  # the client child ends with _exit
    # The client accelerates a connection at its first byte: only the busy one says so.
    assert text.count("accelerated (accepted") == 4 and "accelerated (client)" in text, text
    print(k, m, took)
    assert k["ok"] and m["ok"] and k["echoed"] == m["echoed"] == 5000 * 64
    assert m["idle_returns"] == k["idle_returns"] == [1, 1, 1], (k, m)
    assert m["busy_switches"] >= 100, m
    assert max(m["idle_switches"]) <= herd_bound(took), (m, took)


def test_threads_with_a_set_each_serve_their_own_connections(fabric, tmp_path):
    """Four server threads, each waiting in an epoll set of its own (as memcached's workers
    do), and 5000 pings on the first one's connection only, with spinning off so that every
    wait that finds nothing sleeps.  Every echo must come back right, each idle thread must see
    its connection's EOF and nothing else (one return of epoll_wait), and the busy thread must
    have slept (posts woke it).  A post wakes only the set its socket is in (each set has its own
    queue and doorbell): the idle threads' voluntary context switches are counted, and each may
    have only its liveness wake-ups (herd_bound), not one per post.  With one process doorbell
    in every set they woke 3,600 to 4,900 times each here (5000 pings), 1 each over kernel TCP.
    This test found a lost wake-up once: a ping that arrived while epoll_wait armed the socket
    went back on the ready list unreported, and the server slept past it."""
    herd_served_alone(fabric, tmp_path)


def test_threads_that_poll_their_own_connection_are_not_woken_for_others(fabric, tmp_path):
    """The same with poll(2): four server threads, each polling a connection of its own before
    reading it (as thread-per-connection servers and libtirpc's clients do), 5000 pings on the
    first one's, spinning off.  An idle thread may wake only for its liveness looks.  When every
    thread asleep in poll watched the process's doorbell, each post woke all of them and one
    forwarded it to the thread it was for: the idle threads switched 570 to 1,700 times each
    (once over kernel TCP), and four ONC RPC client threads on one core made 0.9x kernel TCP's
    calls.  A poll of one socket for reading now sleeps first on the ring's own futex, which the
    peer's send wakes, as a blocking recv does."""
    herd_served_alone(fabric, tmp_path, "poll")


def test_a_set_held_with_no_events_is_not_woken(fabric, tmp_path):
    """UCX's pattern (MPICH over UCX-TCP): an async thread sleeps in a set that holds the busy
    thread's epoll set with no events asked (added with EPOLLIN, then modified to 0) and an
    eventfd.  The kernel never reports the inner set there, so nothing of ours may wake that
    thread: not its epoll_wait (one return, for the eventfd at the end) and not its sleep
    (voluntary context switches within herd_bound).  Counted as nested, the inner set put the
    process's doorbell in every set and the async thread woke about 4,000 times for 5000 pings
    (MPICH's rank ran 2.4x slower than over kernel TCP)."""
    k, m, text, took = herd_run(tmp_path, "4", "5000", "nest")
    settle(fabric)
    print(k, m, took)
    assert k["ok"] and m["ok"] and k["echoed"] == m["echoed"] == 5000 * 64
    assert m["async_returns"] == k["async_returns"] == 1, (k, m)
    assert m["async_switches"] <= herd_bound(took), (m, took)
    assert max(m["idle_switches"]) <= herd_bound(took), (m, took)


EPOLLREARM = BUILD / "tests-preload" / "epollrearm"


def test_a_rearm_that_finds_nothing_wakes_no_sleeper(fabric, tmp_path):
    """nfs-ganesha's loop (libntirpc): a thread sleeps in epoll_wait on a connection registered
    one-shot while a worker reads the request, re-arms it with EPOLL_CTL_MOD and then replies.
    The kernel wakes a set's sleepers on MOD only if the fd is ready then, and it is not (the
    client waits for the reply): the loop thread sleeps through it.  2000 pings, spinning off;
    the worker re-arms once the loop thread sleeps in its epoll wait and then counts the loop
    thread's sleeps until it is back there (/proc says so): under memlan no more of them than
    over kernel TCP (0), the loop thread's voluntary context switches within a quarter of kernel
    TCP's, and every echo right.  Before, a MOD put the member on the ready list and rang the
    set's eventfd whether it was ready or not: the loop thread woke, found nothing and slept
    again (2,776 to 3,447 such sleeps in four runs, 0 over kernel TCP); in ganesha, whose threads
    share one cpu, the woken thread took the worker's cpu before it could reply, and its pool
    grew from 16 to 78 threads in a 2 s NULL loop."""
    pings = 2000
    plain = subprocess.run([str(EPOLLREARM), str(pings)], capture_output=True, text=True,
                           timeout=120)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    log = tmp_path / "memlan.log"
    env = dict(os.environ, MEMLAN_SPIN_US="0")
    t0 = time.monotonic()
    under = subprocess.run([str(MEMLAN), "run", "--log", str(log), "--", str(EPOLLREARM),
                            str(pings)], capture_output=True, text=True, timeout=120, env=env)
    took = time.monotonic() - t0
    assert under.returncode == 0, under.stdout + under.stderr
    settle(fabric)  # the client child ends with _exit
    k, m = json.loads(plain.stdout), json.loads(under.stdout)
    print(k, m, took)
    text = log.read_text()
    assert "accelerated (accepted" in text and "accelerated (client)" in text, text
    assert k["ok"] and m["ok"] and k["echoed"] == m["echoed"] == pings * 64
    assert m["loop_returns"] == k["loop_returns"] == pings + 2, (k, m)
    assert m["mod_wakes"] <= k["mod_wakes"] + herd_bound(took), (k, m, took)
    assert m["loop_switches"] <= k["loop_switches"] * 1.25 + herd_bound(took), (k, m, took)


def test_a_loop_thread_does_not_spin_ahead_of_the_reply(fabric, tmp_path):
    """libntirpc's loop moves: the pool thread that gets an event hands the loop to an idle
    thread and handles the request itself (read, re-arm with MOD, reply), and nfs-ganesha's
    threads share one cpu in bench/seeds' split placement.  The new loop thread must not spin in
    epoll_wait for the next request while the thread that must send this reply waits for that
    cpu: it cannot come before the reply.  epollrearm's pool mode (server threads on cpu 0,
    client on cpu 1, each handler letting the next loop thread into its wait before it replies)
    counts the times a thread was preempted inside epoll_wait: a thread asleep there never is.
    With a spin budget of 20 ms (MEMLAN_SPIN_US) the loop threads were preempted 616 times in
    300 requests (0 over kernel TCP); under the default adaptive budget the spin took 6 to 50 µs
    of the cpu ahead of every reply in ganesha, whose NULL p50 was 64-113 µs (17-21 µs with its
    spinning off)."""
    pings = 300
    plain = subprocess.run([str(EPOLLREARM), str(pings), "pool"], capture_output=True,
                           text=True, timeout=120)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    log = tmp_path / "memlan.log"
    env = dict(os.environ, MEMLAN_SPIN_US="20000")
    t0 = time.monotonic()
    under = subprocess.run([str(MEMLAN), "run", "--log", str(log), "--", str(EPOLLREARM),
                            str(pings), "pool"], capture_output=True, text=True, timeout=120,
                           env=env)
    took = time.monotonic() - t0
    assert under.returncode == 0, under.stdout + under.stderr
    settle(fabric)
    k, m = json.loads(plain.stdout), json.loads(under.stdout)
    print(k, m, took)
    text = log.read_text()
    assert "accelerated (accepted" in text and "accelerated (client)" in text, text
    assert k["ok"] and m["ok"] and k["echoed"] == m["echoed"] == pings * 64
    assert m["loop_returns"] == k["loop_returns"] == pings + 2, (k, m)
    assert m["wait_preempted"] <= k["wait_preempted"] + pings // 20, (k, m, took)


def strace_seccomp_ok():
    """strace that can stop on the traced calls alone (--seccomp-bpf, strace 5.3 and later):
    the other calls run at full speed."""
    if shutil.which("strace") is None:
        return False
    r = subprocess.run(["strace", "-f", "--seccomp-bpf", "-qq", "-e", "trace=getppid", "-o",
                        os.devnull, "true"], capture_output=True, text=True, timeout=30)
    return r.returncode == 0


def strace_env(**more):
    """The environment for a program under strace: LeakSanitizer cannot run under ptrace (make
    test-preload-asan's ASAN_OPTIONS turn it on), so it is off there."""
    env = dict(os.environ, **more)
    if "ASAN_OPTIONS" in env:
        env["ASAN_OPTIONS"] += ":detect_leaks=0"
    return env


def straced_both(fabric, tmp_path, prog, calls, timeout=180):
    """prog (its port appended) over kernel TCP, then under memlan, each under strace tracing
    calls (stopping on those alone): {mode: (the run, the trace's text)}."""
    runs = {}
    for mode in ("kernel", "memlan"):
        trace = tmp_path / f"strace-{mode}.out"
        argv = [str(prog), str(next_port())]
        if mode == "memlan":
            argv = [str(MEMLAN), "run", "--log", str(tmp_path / "memlan.log"), "--"] + argv
        r = subprocess.run(["strace", "-f", "--seccomp-bpf", "-qq", "-e", f"trace={calls}",
                            "-e", "signal=none", "-o", str(trace)] + argv,
                           capture_output=True, text=True, timeout=timeout, env=strace_env())
        if mode == "memlan":
            settle(fabric)
        assert r.returncode == 0, r.stdout + r.stderr
        runs[mode] = (r, trace.read_text(errors="replace"))
    return runs


ZERO_WAIT = re.compile(r"epoll_(?:p)?wait2?\(\d+, \[.*?\], \d+, (?:0|\{tv_sec=0, tv_nsec=0\}),")


@pytest.mark.skipif(not strace_seccomp_ok(), reason="needs strace with --seccomp-bpf")
def test_a_loop_handoff_asks_the_kernel_set_once_a_wait(fabric, tmp_path):
    """libntirpc's loop (nfs-ganesha): the thread that an epoll_wait woke hands the loop to an
    idle pool thread, whose epoll_wait follows a few microseconds later.  memlan's epoll_wait
    asks the kernel set with a zero timeout when it was last asked longer ago than 50 us; that
    time was stamped before the previous sleep, so every wait that slept longer made the next
    thread's epoll_wait ask again at once, for nothing: a system call per request (ganesha, a
    4 KB WRITE loop on one core: 1.58 epoll_pwait calls a request, 1.01 with the stamp taken at
    the sleep's return).  epollrearm's pool mode (300 requests, spinning off) under strace,
    which stops on the epoll calls alone: zero-timeout epoll waits, 303 before, none over kernel
    TCP; at most half the requests now (a few at start-up; each hand-off that takes the cpu
    longer than 50 us may add one)."""
    pings = 300
    counts = {}
    for mode in ("kernel", "memlan"):
        trace = tmp_path / f"strace-{mode}.out"
        argv = [str(EPOLLREARM), str(pings), "pool"]
        if mode == "memlan":
            argv = [str(MEMLAN), "run", "--log", str(tmp_path / "memlan.log"), "--"] + argv
        r = subprocess.run(["strace", "-f", "--seccomp-bpf", "-qq", "-e",
                            "trace=epoll_wait,epoll_pwait,epoll_pwait2", "-e", "signal=none",
                            "-o", str(trace)] + argv, capture_output=True, text=True,
                           timeout=180, env=strace_env(MEMLAN_SPIN_US="0"))
        if mode == "memlan":
            settle(fabric)
        assert r.returncode == 0, r.stdout + r.stderr
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert out["ok"] and out["echoed"] == pings * 64, out
        text = trace.read_text(errors="replace")
        counts[mode] = (len(ZERO_WAIT.findall(text)), text.count("epoll_"))
    print(counts)
    log = (tmp_path / "memlan.log").read_text()
    assert "accelerated (accepted" in log and "accelerated (client)" in log, log
    assert counts["kernel"][0] == 0, counts
    assert counts["memlan"][0] <= pings // 2, counts


LIBCCONF = BUILD / "tests-preload" / "libcconf"


def test_libc_surface_matches_kernel(fabric, tmp_path):
    """The rest of libc's socket surface, in a program built with -O2 -D_FORTIFY_SOURCE=2:
    __read_chk, __recv_chk, __recvfrom_chk, __poll_chk, __ppoll_chk (and the abort of a read
    longer than its buffer), recvmmsg/sendmmsg and preadv2/pwritev2 facing the plain calls,
    splice both ways and the kernel's refusals (splice, tee, copy_file_range), a blocking 1 MiB
    write while the offer is undecided (taken at once, as the kernel's buffers take it; its
    server accepts after its close, so it goes over TCP), SO_RCVTIMEO/SO_SNDTIMEO set before
    connect and on the listener, MSG_WAITALL on nonblocking calls: line for line as over kernel
    TCP, and every other connection accelerated (a call that took the idle kernel socket shows
    as a different line, or as a timeout that kills the run)."""
    plain, under, text = scripted(LIBCCONF, tmp_path)
    assert plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    for s in ("__read_chk", "__recv_chk", "__recvfrom_chk", "__poll_chk", "__ppoll_chk"):
        assert s.encode() in LIBCCONF.read_bytes(), f"{s}: the test program is not fortified"
    assert "CORRUPT" not in plain.stdout and "WRONG" not in plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines()
    assert text.count("accelerated (client)") == 6, text
    assert text.count("accelerated (accepted") == 6, text
    # the undecided write's: its server accepts after its close (it waited for the accept)
    assert text.count("TCP (closed before a memlan acceptor took the offer)") == 1, text
    settle(fabric)



STDIOCONF = BUILD / "tests-preload" / "stdioconf"


def test_stdio_on_moved_connections_matches_kernel(fabric, tmp_path):
    """stdio on connections moved onto fd 0, 1 and 2 (tests/preload/stdioconf.c): exit's flush
    of an inetd-style stdout, a dup2 onto 0 while a thread is blocked in fgets(stdin), a closed
    stdout left closed, stdin's read-ahead kept, 200 swaps without a leak, wide output on a
    connection that is not memlan's, fdopen's EINVAL and O_APPEND: line for line as over
    kernel TCP."""
    plain, under, text = scripted(STDIOCONF, tmp_path)
    assert plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    assert "FAIL" not in plain.stdout and "LEAK" not in plain.stdout
    assert "A got 18 bytes" in plain.stdout and "D after: line2" in plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines()
    assert "stdout is a stream through the channel" in text, text
    assert "stdin is a stream through the channel" in text, text
    assert "another thread holds stdin" in text, text
    # case F: the dup2 onto 1 settles the connection (on TCP, its acceptor is not memlan)
    # before glibc's stdout stays for its wide output (stdioearly.c)
    assert "fd 1: TCP (no memlan acceptor took the offer" in text, text
    assert "split" not in text, text
    settle(fabric)

STDIOEARLY = BUILD / "tests-preload" / "stdioearly"


def test_stdio_on_a_connection_moved_before_accept(fabric, tmp_path):
    """A connection dup2'd onto stdout before the server accepted it, then printf (bash's
    `exec 3<>/dev/tcp/...; echo hi >&3`; tests/preload/stdioearly.c): the server gets the line,
    as over kernel TCP.  glibc's stdout stayed on the undecided connection and wrote to the
    kernel socket; the connection was then accelerated and the server read 0 bytes."""
    plain, under, text = scripted(STDIOEARLY, tmp_path)
    assert plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    assert "the server got 13 bytes" in plain.stdout, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stdout + text
    assert text.count("accelerated (client)") == 3, text
    assert "split" not in text, text
    settle(fabric)

LOCKPAGE = BUILD / "tests-preload" / "lockpage"


def test_lock_page_only_for_forked_sockets(fabric, tmp_path):
    """A connection's shared lock page is made when the socket is forked, not with every
    connection (tests/preload/lockpage.c): 8 connections, both ends in one process, map no
    shared page until a fork, then one per end.  O_NONBLOCK set and cleared by the fork child
    is the parent's too, also when another thread toggles it during the fork that moves it to
    the page.  Made with every connection (f08d1f7 to 611a604), the page cost short connections
    on one core a third of their rate (docs/results.md, bench/conn)."""
    plain, under, text = scripted(LOCKPAGE, tmp_path)
    assert plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    assert "toggle: 100 rounds, 0 wrong" in plain.stdout, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stdout + text
    assert "unforked: 0 pages" in under.stderr, under.stderr
    # one per end, and the fork family's page of notes said (init.c, mlp_family_page)
    assert "forked: 17 pages" in under.stderr, under.stderr
    assert text.count("accelerated (client)") == 108, text
    assert "split" not in text, text
    settle(fabric)

SHARERACE_GDB = """
set pagination off
set breakpoint pending on
set follow-fork-mode parent
set detach-on-fork on
break getpgrp
run
break mlp_locks_share
continue
set $s = s
rwatch -l $s->locks
delete 2
continue
delete 3
printf "A stopped: locks %s\\n", $s->locks == &$s->own_locks ? "private" : "page"
set scheduler-locking on
break getppid
thread 3
continue
printf "B sent: locks %s\\n", $s->locks == &$s->own_locks ? "private" : "page"
thread 2
finish
printf "A took: %s\\n", $ == $s->locks ? "the socket's locks" : "other locks"
set scheduler-locking off
delete
continue
"""


@pytest.mark.skipif(shutil.which("gdb") is None, reason="needs gdb")
def test_lock_page_made_while_another_thread_looks(fabric, tmp_path):
    """sharerace, under gdb: two threads' first sends on a connection another process holds
    (this one exec'd itself, its fork child kept the connection), so each takes the mutex and the
    first makes the socket's lock page.  Thread A is stopped just after it read the socket's
    locks pointer (the private locks, no page yet); B sends and makes the page; A goes on and
    must take the page's mutex.  Before, A read the private pointer, then the page's "made" flag,
    and took the private mutex while B and every later holder took the page's: two holders of
    one direction at once ("A took: other locks")."""
    prog = BUILD / "tests-preload" / "sharerace"
    plain = subprocess.run([str(prog), str(next_port())], capture_output=True, text=True,
                           timeout=60)
    assert plain.stdout == "peer read 2\n", plain.stdout + plain.stderr
    pre = subprocess.run([str(MEMLAN), "run", "--", "printenv", "LD_PRELOAD"],
                         capture_output=True, text=True, timeout=30).stdout.strip()
    script = tmp_path / "race.gdb"
    script.write_text(SHARERACE_GDB)
    g = subprocess.run(["gdb", "-q", "-batch", "-nx", "-iex", f"set environment LD_PRELOAD={pre}",
                        "-x", str(script), "--args", str(prog), str(next_port())],
                       capture_output=True, text=True, timeout=120)
    out = g.stdout + g.stderr
    if "Hardware read watchpoint" not in out and "A stopped" not in out:
        pytest.skip("gdb could not stop the thread here: " + out[-2000:])
    assert "A stopped: locks private" in out, out
    assert "B sent: locks page" in out, out
    assert "A took: the socket's locks" in out, out
    assert "peer read 2" in out, out
    time.sleep(3.2)  # the fork child that held the connection
    settle(fabric)


EXECSHARE_SERVER = r"""
import socket, sys, time
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", int(sys.argv[1])))
l.listen()
print("ready", flush=True)
c, _ = l.accept()
c.recv(3)
for line in (b"A\n", b"B\n"):
    c.sendall(line)
    time.sleep(0.5)
n = 0
while True:
    b = c.recv(65536)
    if not b:
        break
    n += len(b)
print("server got", n, flush=True)
"""

# A shell's connection used in turn by the shell and by the commands it runs on it (exec'd
# children that inherit fd 3), as bash users do with /dev/tcp.
EXECSHARE_CLIENT = """exec 3<>/dev/tcp/127.0.0.1/$1
echo go >&3
head -n1 <&3
if read -t 0 -u 3; then echo "ready after head"; else echo "nothing after head"; fi
read -r l <&3; echo "shell read: $l"
cat "$2" >&3
printf xyz >&3
head -c 1000 "$2" >&3
printf xyz >&3
exec 3>&-
echo done
"""


def test_exec_child_and_its_shell_take_turns_on_a_connection(fabric, tmp_path):
    """bash's `exec 3<>/dev/tcp/...`, then `head -n1 <&3` and `cat FILE >&3` (exec'd children
    that carry the connection across exec) and the shell's own read -t 0, read and printf in
    turn: the bytes arrive once and in order, as over kernel TCP.  The shell's lock page never
    heard of what the exec'd children moved: its next read served again the line head had read
    ("shell read: A"), its next write failed with ECONNRESET ("corrupt indices from the peer"),
    and its select said the socket readable for the line head had read ("ready after head")."""
    big = tmp_path / "big"
    big.write_bytes(os.urandom(300000))  # more than a 256 KiB ring
    (tmp_path / "srv.py").write_text(EXECSHARE_SERVER)
    (tmp_path / "cli.sh").write_text(EXECSHARE_CLIENT)
    outs = []
    for on in (False, True):
        port = next_port()
        log = tmp_path / f"memlan{int(on)}.log"
        pre = [str(MEMLAN), "run", "--log", str(log), "--"] if on else []
        srv = subprocess.Popen(pre + [sys.executable, str(tmp_path / "srv.py"), str(port)],
                               stdout=subprocess.PIPE, text=True)
        try:
            assert srv.stdout.readline() == "ready\n"
            cli = subprocess.run(pre + ["bash", str(tmp_path / "cli.sh"), str(port), str(big)],
                                 capture_output=True, text=True, timeout=30)
            got = srv.communicate(timeout=30)[0]
        finally:
            srv.kill()
            srv.wait()
        outs.append((cli.returncode, cli.stdout, cli.stderr, got))
    assert outs[0] == (0, "A\nnothing after head\nshell read: B\ndone\n", "",
                       "server got 301006\n"), outs[0]
    assert outs[1] == outs[0], outs[1]
    text = (tmp_path / "memlan1.log").read_text()
    assert "accelerated (carried across exec)" in text and "corrupt" not in text, text
    settle(fabric)

SPLIT = r"""
import ctypes, os, socket, sys, time
port = int(sys.argv[1])
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", port))
l.listen()
if os.fork() == 0:
    c = socket.create_connection(("127.0.0.1", port))
    c.recv(1)
    c.sendall(b"x")
    c.recv(1)
    # sendto(2) straight to the kernel, as a path no interposer sees would
    ctypes.CDLL(None).syscall(44, c.fileno(), b"bypass", 6, 0, None, 0)
    time.sleep(0.2)
    c.close()
    os._exit(0)
s, _ = l.accept()
s.sendall(b"h")
s.recv(1)
s.sendall(b"k")
print(repr(s.recv(10)))
s.close()
os.wait()
"""


def test_bytes_on_the_kernel_socket_are_reported(fabric, tmp_path):
    """Bytes that reach the idle kernel socket under an accelerated connection (here a raw
    sendto system call) split the stream: the reader that reaches the end says so in the log,
    and on stderr (the log alone said it: a Python program whose Go library wrote a socket Python
    had connected lost its request with nothing said on stderr, an explorer)."""
    log = tmp_path / "memlan.log"
    p = subprocess.run([str(MEMLAN), "run", "--log", str(log), "--", sys.executable, "-c", SPLIT,
                        str(next_port())], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    text = log.read_text()
    assert text.count("accelerated (") == 2, text
    assert "6 bytes arrived on the kernel socket" in text and "the stream is split" in text, text
    assert p.stderr.count("the stream is split") == 1, p.stderr
    settle(fabric)


POLLTHREADS = BUILD / "tests-preload" / "pollthreads"


@pytest.mark.parametrize("how", ["poll", "select"])
def test_threads_polling_their_own_sockets(fabric, tmp_path, how):
    """Eight threads on each side, a connection each, every read waiting in poll (or select)
    first, 2000 round trips each: a wake-up drained by another thread of the process shows as a
    5 s poll timeout.  Under memlan the outcome equals kernel TCP's, every connection
    accelerated, three runs in a row."""
    args = ["8", "2000"] + (["select"] if how == "select" else [])
    plain = subprocess.run([str(POLLTHREADS), str(next_port())] + args, capture_output=True,
                           text=True, timeout=120)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    for run in range(3):
        log = tmp_path / ("memlan%d.log" % run)
        under = subprocess.run([str(MEMLAN), "run", "--log", str(log), "--", str(POLLTHREADS),
                                str(next_port())] + args, capture_output=True, text=True,
                               timeout=150)
        assert under.returncode == 0, under.stdout + under.stderr
        assert under.stdout == plain.stdout
        text = log.read_text()
        assert text.count("accelerated (client)") == 8, text
    settle(fabric)


KS_SERVER = r"""
import os, selectors, socket, sys
port = int(sys.argv[1])
sel = selectors.EpollSelector()
def listener(p):
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind(("127.0.0.1", p))
    l.listen(128)
    l.setblocking(False)
    return l
l, ctl = listener(port), listener(int(sys.argv[2]))
sel.register(l, selectors.EVENT_READ, "l")
sel.register(ctl, selectors.EVENT_READ, "ctl")
conns = set()
print("ready", flush=True)
while True:
    for key, ev in sel.select():
        if key.data == "l":
            c, _ = l.accept()
            c.setblocking(False)
            sel.register(c, selectors.EVENT_READ, "c")
            conns.add(c)
        elif key.data == "ctl":
            c, _ = ctl.accept()
            c.sendall(b"%d %d\n" % (len(conns), len(os.listdir("/proc/self/fd"))))
            c.close()
        else:
            c = key.fileobj
            try:
                d = c.recv(4096)
            except BlockingIOError:
                continue
            except ConnectionResetError:
                d = b""
            if d:
                c.sendall(d)
            else:
                sel.unregister(c)
                c.close()
                conns.discard(c)
"""

KS_CLIENT = r"""
import socket, sys, time
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
c.sendall(b"hello")
assert c.recv(5) == b"hello"
print("up", flush=True)
time.sleep(60)
"""


def test_sigkill_storm_against_an_epoll_server(fabric, tmp_path):
    """Twenty clients, each SIGKILLed after one round trip, against an epoll server: every
    connection ends at the server (its FIN may come before the killed peer's liveness lock goes,
    and an epoll member's FIN is reported once), and its fds come back to where they were."""
    port, cport = next_port(), next_port()
    log = tmp_path / "memlan.log"
    srv = subprocess.Popen([str(MEMLAN), "run", "--log", str(log), "--", sys.executable, "-c",
                            KS_SERVER, str(port), str(cport)], stdout=subprocess.PIPE, text=True)
    try:
        assert srv.stdout.readline().strip() == "ready"

        def held():
            with socket.create_connection(("127.0.0.1", cport)) as c:
                return [int(x) for x in c.makefile().readline().split()]
        base = None
        for i in range(21):  # the first one makes the server's own queue and set's fds
            cl = subprocess.Popen([str(MEMLAN), "run", "--", sys.executable, "-c", KS_CLIENT,
                                   str(port)], stdout=subprocess.PIPE, text=True)
            assert cl.stdout.readline().strip() == "up"
            cl.kill()
            cl.wait()
            if i == 0:
                deadline = time.time() + 10
                while held()[0] != 0 and time.time() < deadline:
                    time.sleep(0.1)
                base = held()
        deadline = time.time() + 10
        while held()[0] != 0 and time.time() < deadline:
            time.sleep(0.1)
        assert base[0] == 0 and held() == base, (held(), base)
        assert log.read_text().count("accelerated (accepted") == 21
    finally:
        srv.kill()
        srv.wait()
    settle(fabric)


@pytest.mark.parametrize("prog", ["pollcancel", "nopwait2"])
def test_host_process_events_match_kernel(fabric, tmp_path, prog):
    """pollcancel: a thread cancelled in poll, and one that leaves poll by siglongjmp, then
    another thread reusing their stacks while data arrives; nopwait2: a seccomp sandbox that
    kills on epoll_pwait2, which the program never calls.  Same output as over kernel TCP, the
    connection accelerated."""
    plain, under, text = scripted(BUILD / "tests-preload" / prog, tmp_path)
    assert plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    assert under.stdout.splitlines() == plain.stdout.splitlines()
    assert "accelerated (accepted" in text, text
    settle(fabric)


def test_waits_left_by_siglongjmp_keep_nothing(fabric, tmp_path):
    """pollcancel two: threads leave poll (its long sleep, and the ring's futex) and epoll_wait
    by siglongjmp and live on without another poll; the program then closes the connections
    they waited on, and the peer reads EOF on each, as over kernel TCP; the epoll set the third
    one slept on still reports, and then sleeps.  Before, each abandoned wait kept its
    reference to the socket until the thread's next poll (the close did not end the connection:
    "peer: A no eof", "peer: B no eof"), and the set's sleeper count stayed up, so that its
    eventfd stayed rung and a later epoll_wait of 300 ms spun for all of it ("BUSY")."""
    plain, under, text = scripted(BUILD / "tests-preload" / "pollcancel", tmp_path, "two")
    assert plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    assert "no eof" not in plain.stdout and "slept" in plain.stdout, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stderr
    assert text.count("accelerated (accepted") == 4, text
    settle(fabric)


def test_calls_left_by_siglongjmp_or_cancel_keep_nothing(fabric, tmp_path):
    """callleft: blocking recv, read, send and write left by a SIGALRM handler's siglongjmp or
    by pthread_cancel (in the kernel socket's ppoll and on the ring's futex), then the program
    closes each connection and the peer reads EOF, as over kernel TCP; accept left the same
    ways; and a storm of jumps out of a receiving thread's calls (in the ring copy too), after
    each of which another thread's nonblocking recv answers at once.  Before, each call kept its
    reference to the socket ("peer: A no eof" for all six) and a jump out of the copy left the
    receive lock held ("another thread's nonblocking recv is stuck")."""
    plain, under, text = scripted(BUILD / "tests-preload" / "callleft", tmp_path)
    assert plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    assert "no eof" not in plain.stdout and "storm: jumped" in plain.stdout, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stderr
    assert text.count("accelerated (accepted") == 8, text
    settle(fabric)


VFORKEXEC = BUILD / "tests-preload" / "vforkexec"


def test_vfork_exec_leaves_no_memory_behind(fabric, tmp_path):
    """A process holding a connection vforks and execs /bin/true 300 times: its heap does not
    grow, and the connection still works, as over kernel TCP.  Before: what memlan allocated in
    the vfork child for each exec (the environment, the carried lists) stayed in the parent's
    heap, about 400 bytes per exec (LeakSanitizer found it: make test-preload-asan)."""
    plain, under, text = scripted(VFORKEXEC, tmp_path)
    assert plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    assert "as before" in plain.stdout, plain.stdout + plain.stderr
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stderr
    assert text.count("accelerated (client)") == 1, text
    settle(fabric)


def test_vfork_child_waits_make_nothing_in_the_parent(fabric, tmp_path):
    """vforkpoll: a vfork child polls, selects and epoll_waits (20 ms each) on its parent's
    connection, with and without a byte waiting, then leaves by _exit or by exec; the parent then
    waits 300 ms in an idle poll (it must sleep), and gets a byte through poll and through an
    epoll set of its own, as over kernel TCP.  Before, the child made the process's event queue
    and the thread's eventfd in the parent's memory, with descriptors only the child had: every
    later poll of the parent found the dead doorbell and spun (about 290 ms of cpu in 300 ms:
    "BUSY")."""
    plain, under, text = scripted(BUILD / "tests-preload" / "vforkpoll", tmp_path)
    assert plain.stdout.endswith("done\n") and "BUSY" not in plain.stdout, plain.stdout
    assert "exit-byte: child poll 1 0x1, select 1; exit 0" in plain.stdout, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stderr
    assert text.count("accelerated (client)") == 1, text
    settle(fabric)


def test_vfork_child_exit_leaves_the_parent_accelerated(fabric, tmp_path):
    """vforkexit: a vfork child whose exec failed leaves by exit(), which runs the exit handlers
    in the parent's memory; the parent's old connection and a new one to its listener then
    carry their bytes, and the new one is accelerated.  Before, memlan's exit handler ran there
    for the parent: its listener record went and every later connection of the parent stayed
    on TCP ("TCP (exit() has begun in this process)")."""
    plain, under, text = scripted(BUILD / "tests-preload" / "vforkexit", tmp_path)
    assert plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stderr
    assert "exit() has begun" not in text, text
    assert text.count("accelerated (client)") == 2, text
    assert text.count("accelerated (accepted") == 2, text
    settle(fabric)


def test_exit_from_a_signal_handler_ends(fabric, tmp_path):
    """exithandler: exit() called from a signal handler (uWSGI's graceful reload ends its worker
    so) while the main thread makes and accepts connections, 40 times with the timer at another
    point each; and a handler that closes the listening socket instead (close is
    async-signal-safe), or an accelerated connection: every run ends, as over kernel TCP.
    (Before, memlan's exit handlers, the listener's release at its close and the connection's
    parking in the channel pool waited for a lock the interrupted thread held, the channel
    pool's or the negotiation's: 6 of 40 exits hung, 4 of 200 listener closes, 8 of 150
    connection closes.)"""
    for args in ([], ["150", "close"], ["150", "closeconn"]):
        plain, under, text = scripted(BUILD / "tests-preload" / "exithandler", tmp_path, *args)
        assert re.match(r"runs (\d+): ended \1, hung 0", plain.stdout), plain.stdout
        assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stdout + under.stderr
        settle(fabric)


def test_socket_calls_in_a_signal_handler_leave_the_heap_alone(fabric, tmp_path):
    """heaphandler: close, dup2, shutdown, send, recv, poll, select, accept, socket, connect and
    listen in a signal handler (each async-signal-safe; a send there that wakes another thread's
    poll), and exit() from one, with the program's own malloc, calloc, realloc and free writing
    "HEAP <call>" when called in its handler: no such line, and every peer reads what it reads
    over kernel TCP; accept, connect and listen there are the kernel's, with the reason in the
    log.  Before, the teardown of an accelerated connection closed in a handler freed its state
    there (4 frees a close), an accept there allocated the channel, a poll there the thread's
    waiter and the process's queue, a listen its record: a handler that interrupted malloc so
    corrupted the heap (exithandler's closeconn aborted once in 150 runs, "free(): corrupted
    unsorted chunks")."""
    if b"libasan" in (BUILD / "lib" / "libmemlan-preload.so").read_bytes():
        pytest.skip("ASan: the program replaces malloc, which ASan's runtime owns")
    plain, under, text = scripted(BUILD / "tests-preload" / "heaphandler", tmp_path)
    assert plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    assert "HEAP" not in plain.stdout and "exit in a child: status 7" in plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stdout + text
    assert text.count("accelerated (accepted") == 7, text
    assert "TCP (accepted in a signal handler" in text, text
    assert "TCP (connected in a signal handler" in text, text
    assert "not published (it listened in a signal handler)" in text, text
    settle(fabric)


def test_jumps_out_of_handlers_give_the_thread_back(fabric, tmp_path):
    """altjmp: handlers that leave by siglongjmp on the thread's own stack, then a connection:
    accelerated, the thread no longer counted as in a handler (before: for good, and its
    connect stayed on kernel TCP without a word, "the client is not memlan" at the server);
    then jumps from an alternate stack above the jump's target and pthread_exit: the program
    ends, as over kernel TCP (a first version's cleanup buffer stayed linked there after its
    frame, and pthread_exit's unwinding looped for ever: a review)."""
    plain, under, text = scripted(BUILD / "tests-preload" / "altjmp", tmp_path)
    assert plain.stdout.endswith("pthread_exit from main\n"), plain.stdout + plain.stderr
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stdout + text
    assert text.count("accelerated (client)") == 1, text
    assert "signal handler" not in text, text
    settle(fabric)


REFUSED_CONNECTS = r"""
import errno, select, socket, sys
closed, open_port = int(sys.argv[1]), int(sys.argv[2])
n = 0
for i in range(300):   # a worker retrying a server that is gone (gearman's)
    s = socket.socket(); s.setblocking(False)
    e = s.connect_ex(("127.0.0.1", closed))
    if e == errno.EINPROGRESS:
        select.select([], [s], [], 2); e = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    n += e == errno.ECONNREFUSED
    s.close()
print("refused", n)
s = socket.socket(); s.setblocking(False)
e = s.connect_ex(("127.0.0.1", open_port))
select.select([], [s], [], 2)
print("to a plain server", errno.errorcode.get(e), s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR))
"""


def test_refused_nonblocking_connects_write_no_log_line(fabric, tmp_path):
    """A nonblocking connect the kernel refuses (no server on the port) made no connection: no
    "TCP (no memlan listener ...)" line for it, as none for a blocking one, and the program still
    reads ECONNREFUSED from SO_ERROR; a nonblocking connect to a plain server is said.  Before,
    each refused attempt wrote its line: a gearman worker retrying a stopped gearmand wrote
    733,297 lines (79 MB) in 20 s (an explorer)."""
    script = tmp_path / "refused.py"
    script.write_text(REFUSED_CONNECTS)
    plain_srv = socket.socket()
    plain_srv.bind(("127.0.0.1", 0))
    plain_srv.listen(4)
    try:
        args = [str(next_port()), str(plain_srv.getsockname()[1])]
        plain = subprocess.run([PY, str(script), *args], capture_output=True, text=True,
                               timeout=60)
        assert plain.stdout.splitlines() == ["refused 300", "to a plain server EINPROGRESS 0"]
        log = tmp_path / "m.log"
        r = subprocess.run([str(MEMLAN), "run", "--log", str(log), "--", PY, str(script), *args],
                           capture_output=True, text=True, timeout=60)
        assert r.stdout == plain.stdout, r.stdout + r.stderr
        text = log.read_text()
        assert text.count("TCP (no memlan listener on this port in the fabric)") == 1, text[-2000:]
    finally:
        plain_srv.close()
    settle(fabric)


def test_no_listener_in_the_default_fabric_names_it_once(fabric, tmp_path):
    """A client in the default fabric (this user's own) that finds no memlan listener says once
    which fabric it looked in, and how to share one: a server that runs as another user (clamd,
    started as root, listens as clamav) publishes in its own, and both logs said only "no memlan
    listener" and "not memlan (no offer)" (an explorer); and that a server that could not publish
    says why in its own log (saned under inetd: the hint alone sent a user looking for a fabric
    that does not exist).  Not said where a fabric was chosen."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    code = ("import socket, sys\nfor i in range(3):\n"
            "    socket.create_connection(('127.0.0.1', int(sys.argv[1]))).close()\nprint('ok')")
    try:
        for chosen in (False, True):
            env = dict(os.environ)
            if not chosen:
                env.pop("MEMLAN_FABRIC", None)
            log = tmp_path / f"m{chosen}.log"
            r = subprocess.run([str(MEMLAN), "run", "--log", str(log), "--", PY, "-c", code,
                                str(srv.getsockname()[1])], capture_output=True, text=True,
                               timeout=60, env=env)
            assert r.returncode == 0 and r.stdout == "ok\n", r.stdout + r.stderr
            text = log.read_text()
            assert text.count("TCP (no memlan listener on this port in the fabric)") == 3, text
            want = 0 if chosen else 1
            assert text.count(f"this process's fabric is /dev/shm/memlan-{os.getuid()}, the "
                              "default") == want, text
            assert text.count("memlan fabric create --group") == want, text
            # and a server that could not publish at all (saned as saned under inetd)
            assert text.count("one that could not publish (its own log says why)") == want, text
            assert "memlan fabric create" not in r.stderr, r.stderr  # the log's alone
    finally:
        srv.close()
    settle(fabric)


def test_posix_spawn_carries_the_connections_its_child_gets(fabric, tmp_path):
    """spawnconn: posix_spawn, whose exec glibc makes inside libc.  A connection the file
    actions dup2 onto the child's 0 and 1 (close-on-exec in the parent: an inetd, Rust's
    Command with a socket for stdin), one inherited at its own number (posix_spawnp, the parent
    answering after the child), one the child does not get, a spawn that fails: the client reads
    the child's answer, the parent's, and the end at once, as over kernel TCP.  (Before, the
    child read the idle kernel socket: "the client read EOF" instead of the answer.)"""
    plain, under, text = scripted(BUILD / "tests-preload" / "spawnconn", tmp_path)
    assert plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    assert plain.stdout.count('read "got:hello"') == 2, plain.stdout
    assert plain.stdout.count("the end within 2 s: yes") == 4, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stdout + text
    assert text.count("accelerated (carried across exec)") == 2, text
    settle(fabric)


def test_vfork_exec_child_moves_bytes_then_the_parent(fabric, tmp_path):
    """spawnshare: a process vforks and execs a child that sends on its connection (then reads
    five bytes of it); then the parent sends (reads the rest), twice: the peer reads the child's
    bytes and then the parent's, and the parent reads what the child left, as over kernel TCP.
    Before, no fork handler marked the parent's socket shared (vfork runs none), so the parent
    kept its fast words and its own stale ring positions: its send went at its old head over the
    child's bytes (the peer read "parent"), its receive served again what the child had read."""
    plain, under, text = scripted(BUILD / "tests-preload" / "spawnshare", tmp_path)
    assert plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    assert plain.stdout.count('the peer read "childparent"') == 2, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stdout + text
    assert text.count("accelerated (client)") == 1, text
    assert text.count("carried across exec") == 4, text
    settle(fabric)


def test_reset_drawn_by_our_write_is_an_edge(fabric, tmp_path):
    """etreset: the peer closed, we read its end and write once more; the peer's kernel answers
    with a reset, and an edge-triggered member (EPOLLIN|EPOLLOUT|EPOLLRDHUP, or EPOLLIN alone)
    reports EPOLLERR|EPOLLHUP at the next epoll_wait, once, as over kernel TCP.  Before, the write
    changed the socket's readiness without a post: "in-out-rdhup: our write drew a reset: epoll
    0" after 2 s."""
    plain, under, text = scripted(BUILD / "tests-preload" / "etreset", tmp_path)
    assert plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    assert "in-out-rdhup: our write drew a reset: epoll 1 [IN OUT RDHUP HUP ERR]" in plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stderr
    assert text.count("accelerated (client)") == 3, text
    settle(fabric)


def test_edge_after_settling_carries_the_whole_mask(fabric, tmp_path):
    """etsettle: an edge-triggered member of a client added while its connect is in progress;
    after the connect's EPOLLOUT, the server's first byte (or its close) is reported with
    EPOLLOUT too, as the kernel reports every wake-up with the whole mask.  Before, what the
    undecided socket had reported was taken out of its first report once settled: "after the
    server's byte: epoll 1 [IN ]"."""
    plain, under, text = scripted(BUILD / "tests-preload" / "etsettle", tmp_path)
    assert plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    assert "after the server's byte: epoll 1 [IN OUT ]" in plain.stdout, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stderr
    assert text.count("accelerated (client)") == 2, text
    settle(fabric)


def test_edge_triggered_room_is_reported_once_until_it_is_new(fabric, tmp_path):
    """etout: an edge-triggered EPOLLIN|EPOLLOUT member of an idle client with room reports
    EPOLLOUT once when added, then only at the kernel's edges (the peer's bytes, room again
    after none), wait for wait as over kernel TCP.  Before, its registration in the set's queue
    posted the readiness already there and armed the room tripwire while there was room: "added,
    again: epoll 1 [OUT ]", and each read of our bytes by the peer another EPOLLOUT."""
    plain, under, text = scripted(BUILD / "tests-preload" / "etout", tmp_path)
    assert plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    assert "added, again: epoll 0" in plain.stdout and "room again: epoll 1 [OUT ]" in plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stderr
    assert text.count("accelerated (client)") == 1, text
    settle(fabric)


def test_peek_offset_moves_as_the_kernels(fabric, tmp_path):
    """peekoff: SO_PEEK_OFF on an accelerated connection: peeks start at the offset and move it
    on, receives move it back (not below 0), a peek past the bytes there says EAGAIN and 0 at
    the end, -1 turns it off; every answer as over kernel TCP (where the kernel has no
    SO_PEEK_OFF for TCP, before 6.10, both say EOPNOTSUPP).  Before, every peek returned the
    first bytes again and getsockopt said 0: the option reached the idle kernel socket only."""
    plain, under, text = scripted(BUILD / "tests-preload" / "peekoff", tmp_path)
    assert plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    if "set 0: 0" in plain.stdout:
        assert "peek 4: 4 '4567'" in plain.stdout, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stderr
    assert text.count("accelerated (client)") == 1, text
    settle(fabric)


def test_disconnect_by_connect_af_unspec_then_a_new_connection(fabric, tmp_path):
    """disconnect: connect(fd, AF_UNSPEC) on an accelerated client resets the connection (the
    peer's poll POLLERR|POLLHUP, its recv ECONNRESET; ours ECONNRESET once, then EPIPE and
    ENOTCONN; an epoll set reports the kernel socket's state), and a new connection on the fd
    carries its bytes both ways, accelerated, as over kernel TCP.  Before, the fd kept its
    record: the peer read end-of-file, a send went into the old ring, and the new connection's
    bytes went to the old channel ("server2 recv: nothing in 2 s")."""
    plain, under, text = scripted(BUILD / "tests-preload" / "disconnect", tmp_path)
    assert plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    assert "server2 recv: 1 n" in plain.stdout, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stderr
    assert text.count("accelerated (client)") == 2, text
    settle(fabric)


FORKQUEUE = BUILD / "tests-preload" / "forkqueue"


def test_fork_child_keeps_no_queue_of_its_parent_alive(fabric, tmp_path):
    """A process that slept in poll and in epoll_wait (two event queues of its own) forks a child
    and leaves by _exit: while the child lives, memlan clean removes the parent's queues (the
    child lets go of its copies at fork).  Before: the child's copies held the dead parent's
    queues' liveness lock, and their files stayed until the child went."""
    log = tmp_path / "memlan.log"
    p = subprocess.Popen([str(MEMLAN), "run", "--log", str(log), "--", str(FORKQUEUE),
                          str(next_port())], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    try:
        line = p.stdout.readline()
        assert line.startswith("child "), line
        p.wait(timeout=10)
        time.sleep(0.05)
        memlan("clean")
        left = sorted(f for f in os.listdir(fabric) if f.startswith("bell-"))
        assert left == [], left
    finally:
        p.stdin.close()  # the child leaves
        p.stdout.close()
        time.sleep(0.2)
        settle(fabric)


FDLIFECONF = BUILD / "tests-preload" / "fdlifeconf"


def test_fd_released_other_ways_matches_kernel(fabric, tmp_path):
    """close_range(3, ~0U) at start (varnishd), close_range over an accelerated socket (with and
    without SO_LINGER 0, and CLOSE_RANGE_CLOEXEC), closefrom, dup2 over one, fds above 65536
    (skipped when the hard limit is lower) and a vfork child that closes its copy and execs
    while the parent reads, and a close of every fd /proc/self/fd lists (memlan's own are
    listed: their close said EBADF, where the program saw them open): what each end sees, and
    how the next socket at a released number ends, equal kernel TCP's line for line.  The log
    shows memlan still at work after the close_range at start (it kept its own fds out of the
    range) and after the close loop."""
    plain, under, text = scripted(FDLIFECONF, tmp_path)
    assert plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    assert "timeout" not in plain.stdout and "FAIL" not in plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines()
    assert text.count("accelerated (client)") >= 14, text
    assert text.count("accelerated (client)") == text.count("accelerated (accepted"), text
    settle(fabric)


def test_calls_of_nothing_match_kernel(fabric, tmp_path):
    """recv, recvfrom, recvmsg and recvmmsg of zero bytes wait as TCP's do (EAGAIN on an empty
    socket nonblocking; blocking, one wait for a byte, the end, the timeout or a signal, then
    0), read and readv of nothing are 0 at once, and a send of nothing says EPIPE once the
    socket is shut for writing.  memlan answered every receive of nothing 0 at once (which a
    nonblocking caller takes for the end) and every send of nothing 0.  Line for line as over
    kernel TCP, on accelerated connections."""
    plain, under, text = scripted(BUILD / "tests-preload" / "zerolen", tmp_path)
    assert plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    assert "recv 0 dontwait, empty: -1 Resource temporarily unavailable" in plain.stdout
    assert "waited for the timeout: yes" in plain.stdout, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines()
    assert text.count("accelerated (client)") == 5, text
    assert text.count("accelerated (accepted") == 5, text
    settle(fabric)


# Urgent data, each case on its own connection within one process, with the receiver's
# SO_OOBINLINE on or off (argv[1]); prints every answer: bytes, errno, SIOCATMARK, select's and
# poll's bits.  1: "abc", "XY!" urgent, "def", read around the mark; 2: two urgent sends while
# the reader stands at the first (Linux drops that byte out of line); 3: "jk", then "Z" and "W"
# urgent, "ghi"; 4: 300000 bytes sent urgent by a thread (more than a ring), read to the mark;
# 5: an urgent byte alone, which out of line is not readable: poll, epoll (level and edge) and
# select wait their timeouts, without spinning; 6: MSG_WAITALL receives and peeks end at the mark;
# 7: a wait for POLLPRI alone beside unread bytes, then epoll's EPOLLPRI and peeks at the mark;
# 8: three urgent sends while the reader stands at the first (Linux drops each in turn); 9: a
# MSG_TRUNC receive beside an urgent byte alone, and an SO_RCVLOWAT receive ended by the mark.
URGENT = r"""
import errno, fcntl, hashlib, resource, select, socket, struct, sys, threading, time
inline = sys.argv[1] == "inline"
l = socket.socket()
l.bind(("127.0.0.1", 0))
l.listen(8)
def pair():
    c = socket.create_connection(l.getsockname())
    s, _ = l.accept()
    if inline:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_OOBINLINE, 1)
    return c, s
def mark(s):
    return struct.unpack("i", fcntl.ioctl(s.fileno(), 0x8905, b"\0" * 4))[0]  # SIOCATMARK
def rcv(s, flags=0, n=10):
    try:
        return s.recv(n, flags)
    except OSError as e:
        return errno.errorcode[e.errno]
def sel(s, t=1):
    r, w, x = select.select([s], [], [s], t)
    p = select.poll()
    p.register(s, select.POLLIN | select.POLLPRI)
    return len(r), len(x), p.poll(0)[0][1] if p.poll(0) else 0
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
D = socket.MSG_DONTWAIT
c, s = pair()
print(1, rcv(s, socket.MSG_OOB), mark(s), sel(s, 0))
c.sendall(b"abc")
c.send(b"XY!", socket.MSG_OOB)
c.sendall(b"def")
time.sleep(0.2)
print(1, sel(s), mark(s), rcv(s), mark(s), rcv(s, socket.MSG_OOB | socket.MSG_PEEK))
print(1, rcv(s), mark(s), rcv(s, socket.MSG_OOB), sel(s, 0), rcv(s, D), rcv(s, socket.MSG_OOB))
c.close()
print(1, rcv(s), sel(s, 0))
c, s = pair()
c.sendall(b"ab")
print(2, rcv(s, 0, 2))
c.send(b"!", socket.MSG_OOB)
c.send(b"!", socket.MSG_OOB)
time.sleep(0.2)
print(2, mark(s), sel(s), rcv(s, socket.MSG_OOB))
c.sendall(b"cd")
c.close()
print(2, rcv(s), rcv(s))
c, s = pair()
c.send(b"jk")
c.send(b"Z", socket.MSG_OOB)
c.send(b"W", socket.MSG_OOB)
c.sendall(b"ghi")
time.sleep(0.2)
print(3, mark(s), rcv(s), mark(s), rcv(s, socket.MSG_OOB), mark(s), rcv(s, D), rcv(s, D))
c, s = pair()
big = hashlib.sha256(b"u").digest() * 9375
t = threading.Thread(target=lambda: print(4, "sent", c.send(big, socket.MSG_OOB), flush=True))
t.start()
got = b""
while not mark(s):
    got += s.recv(65536)
t.join()
print(4, len(got), got == big[:-1], rcv(s, socket.MSG_OOB), rcv(s, D), mark(s))
c, s = pair()
c.send(b"\xff", socket.MSG_OOB)  # Java's sendUrgentData, whose peer reads nothing of it
time.sleep(0.2)
t0 = cpu()
p = select.poll()
p.register(s, select.POLLIN)
e = select.epoll()
e.register(s, select.EPOLLIN)
e2 = select.epoll()
e2.register(s, select.EPOLLIN | select.EPOLLET)
print(5, p.poll(500), e.poll(0.5), e2.poll(0.5), len(select.select([s], [], [], 0.5)[0]),
      rcv(s, D))
c.send(b"a")
print(5, rcv(s), "quiet" if cpu() - t0 < 0.5 else "busy")
c, s = pair()
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 2, 0))
c.sendall(b"abc")
c.send(b"!", socket.MSG_OOB)
c.sendall(b"def")
time.sleep(0.2)
W = socket.MSG_WAITALL
print(6, rcv(s, W | socket.MSG_PEEK), rcv(s, W), rcv(s, W | socket.MSG_PEEK, 4), rcv(s, D))
c, s = pair()
c.sendall(b"abc")
time.sleep(0.2)
t0 = cpu()
p = select.poll()
p.register(s, select.POLLPRI)
print(7, p.poll(500), len(select.select([], [], [s], 0.5)[2]),
      "quiet" if cpu() - t0 < 0.3 else "busy")
c.send(b"!", socket.MSG_OOB)
time.sleep(0.2)
e = select.epoll()
e.register(s, select.EPOLLPRI | select.EPOLLIN)
print(7, p.poll(500), e.poll(0.5), rcv(s, socket.MSG_PEEK), rcv(s), mark(s),
      rcv(s, socket.MSG_PEEK | D), rcv(s, socket.MSG_OOB | socket.MSG_PEEK), sel(s, 0))
c, s = pair()
c.sendall(b"ab")
print(8, rcv(s, 0, 2))
for b in (b"!", b"?", b"#"):
    c.send(b, socket.MSG_OOB)
c.sendall(b"x")
time.sleep(0.2)
print(8, mark(s), rcv(s), rcv(s, D), rcv(s, socket.MSG_OOB))
c, s = pair()
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 1, 0))
c.sendall(b"abc")
c.send(b"!", socket.MSG_OOB)
time.sleep(0.2)
t0 = cpu()
got, tr = rcv(s), rcv(s, socket.MSG_TRUNC)  # (TRUNC: what the buffer held is not said)
print(9, got, tr if isinstance(tr, str) else len(tr), "quiet" if cpu() - t0 < 0.3 else "busy",
      mark(s))
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 5)
c.sendall(b"fg")
threading.Timer(0.3, lambda: c.send(b"hi?", socket.MSG_OOB)).start()
print(9, rcv(s), mark(s), rcv(s, socket.MSG_OOB))
"""


def test_urgent_data_is_carried_as_tcp_carries_it(fabric, tmp_path):
    """send(MSG_OOB) on an accelerated connection, which was refused (EOPNOTSUPP: telnetd's
    every Ctrl-C ended the session, an explorer): its last byte is the urgent one, marked in the
    sender's side block before it is published; the receiver's reads stop at it and read it in
    line or skip it as SO_OOBINLINE says, and SIOCATMARK, recv(MSG_OOB), select's except set
    and POLLPRI answer from the mark.  Every answer equals kernel TCP's, in both modes: around
    the mark, a second urgent byte while the reader stands at the first (which Linux drops),
    two adjacent ones, a send larger than the ring, and a byte alone that nobody reads (Java's
    sendUrgentData), which out of line leaves the socket unreadable: a poll or epoll_wait for
    reading waits its time out, without spinning.  Nothing is refused or said."""
    script = tmp_path / "urgent.py"
    script.write_text(URGENT)
    for mode in ("plain", "inline"):
        outs = []
        for on in (False, True):
            pre = [str(MEMLAN), "run", "--log", str(tmp_path / f"m{mode}.log"), "--"] if on else []
            outs.append(subprocess.run(pre + [PY, str(script), mode], capture_output=True,
                                       text=True, timeout=60))
        assert outs[0].returncode == 0 and outs[0].stdout.count("\n") == 19, outs[0]
        assert "4 299999 True" in outs[0].stdout and "quiet" in outs[0].stdout, outs[0].stdout
        assert (outs[1].returncode, outs[1].stdout) == (0, outs[0].stdout), (outs, mode)
        assert "urgent" not in outs[1].stderr, outs[1].stderr
        text = (tmp_path / f"m{mode}.log").read_text()
        assert text.count("accelerated (client)") == 9 and "urgent" not in text, text
    settle(fabric)


def plain_then_memlan(tmp_path, server, client, timeout=60):
    """Argument lists of a server that prints its port first and of a client (given the port
    last): run over kernel TCP, then both under memlan (one log, mTrue.log).  For each: (the
    client's CompletedProcess, the server's exit status and the rest of its output)."""
    outs = []
    for on in (False, True):
        pre = [str(MEMLAN), "run", "--log", str(tmp_path / f"m{on}.log"), "--"] if on else []
        srv = subprocess.Popen(pre + server, stdout=subprocess.PIPE, text=True)
        try:
            port = srv.stdout.readline().strip()
            p = subprocess.run(pre + client + [port], capture_output=True, text=True,
                               timeout=timeout)
            got, _ = srv.communicate(timeout=20)
        finally:
            if srv.poll() is None:
                srv.kill()
                srv.wait()
        outs.append((p, srv.returncode, got))
    return outs


# A server of two connections, each read to its end (its urgent byte, out of band, is not in
# it), printed; and a client that on each sends "ab", then "!" as urgent data, then "cd".
URGENT_SERVER = PRINTING_LISTENER + r"""
import time
time.sleep(1)  # the first client sends its urgent byte before it is accepted
for i in range(2):
    c, _ = ls.accept()
    print(b"".join(iter(lambda: c.recv(10), b"")), flush=True)
    c.close()
"""

URGENT_CLIENT = r"""
import errno, socket, sys, time
for i in range(2):
    c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
    c.sendall(b"ab")
    try:
        c.send(b"!", socket.MSG_OOB)
        print("urgent sent")
    except OSError as e:
        print("urgent:", errno.errorcode[e.errno])
    c.sendall(b"cd")
    c.close()
    time.sleep(0.2)  # the server reads this one to its end first
"""


def test_urgent_data_before_accept_goes_over_tcp(fabric, tmp_path):
    """Urgent data on a connection its server has not accepted yet cannot ride in its offer,
    which the server may still take over TCP, where the urgency would be lost.  It was refused
    (EOPNOTSUPP: Java's sendUrgentData right after connect threw, an explorer), and the refusal
    kept the port's later connections on TCP.  Now the offer is withdrawn without waiting, what
    the ring held goes to the kernel first, and the urgent send is the kernel's: every answer and
    byte as over kernel TCP.  (An accepted connection carries urgent data:
    test_urgent_data_is_carried_as_tcp_carries_it.)"""
    (tmp_path / "s.py").write_text(URGENT_SERVER)
    (tmp_path / "c.py").write_text(URGENT_CLIENT)
    outs = [(p.returncode, p.stdout, st, got) for p, st, got in
            plain_then_memlan(tmp_path, [PY, str(tmp_path / "s.py")], [PY, str(tmp_path / "c.py")])]
    assert outs[0] == (0, "urgent sent\nurgent sent\n", 0, "b'abcd'\nb'abcd'\n"), outs
    assert outs[1] == outs[0], outs
    text = (tmp_path / "mTrue.log").read_text()
    assert "TCP (urgent data (MSG_OOB) was sent before a memlan acceptor took the offer)" in text, \
        text
    assert "refused (EOPNOTSUPP)" not in text and "stay on TCP" not in text, text
    settle(fabric)


# TCP_ULP ("tls", kernel TLS) on connections: (1) an accelerated one, client and server side,
# then 300 KB each way; (2) a client whose server has not accepted yet, after 5 bytes sent, then
# 300 KB; (3) Python's ssl with OP_ENABLE_KTLS on both ends (OpenSSL sets TCP_ULP "tls" after
# the handshake, and goes on in user space where it is refused), 2 MB from server to client.
# Prints each setsockopt's answer and a digest of what arrived.  argv: port, key, certificate.
ULP_COMMON = r"""
import errno, hashlib, socket, ssl, sys, threading
port = int(sys.argv[1])
def ulp(s, who, ok="ok", err=""):
    try:
        s.setsockopt(socket.IPPROTO_TCP, 31, b"tls")  # TCP_ULP
        print(who, ok)
    except OSError as e:
        print(who, err + errno.errorcode[e.errno])
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", port))
l.listen(4)
c = socket.create_connection(("127.0.0.1", port))
a, _ = l.accept()
c.sendall(b"x"); assert a.recv(1) == b"x"
"""
ULP = ULP_COMMON + r"""
key, cert = sys.argv[2], sys.argv[3]
def blob(n, seed):
    return (hashlib.sha256(seed).digest() * (n // 32 + 1))[:n]
def drain(s, n):
    d = b""
    while len(d) < n:
        b = s.recv(65536)
        if not b:
            break
        d += b
    return hashlib.sha256(d).hexdigest()[:16], len(d)
a.sendall(b"y"); assert c.recv(1) == b"y"
ulp(c, "1 client"); ulp(a, "1 server")
t = threading.Thread(target=lambda: a.sendall(blob(300000, b"a"))); t.start()
c.sendall(blob(300000, b"c"))
print("1 to server", drain(a, 300000), "to client", drain(c, 300000))
t.join(); c.close(); a.close()
c = socket.create_connection(("127.0.0.1", port))
c.sendall(b"hello")
ulp(c, "2 client")
t = threading.Thread(target=lambda: c.sendall(blob(300000, b"2"))); t.start()
a, _ = l.accept()
print("2 to server", drain(a, 300005))
t.join(); c.close(); a.close()
sc = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); sc.load_cert_chain(cert, key)
cc = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT); cc.check_hostname = False
cc.verify_mode = ssl.CERT_NONE
for x in (sc, cc):
    x.options |= getattr(ssl, "OP_ENABLE_KTLS", 1 << 3)
def serve():
    s = sc.wrap_socket(l.accept()[0], server_side=True)
    s.sendall(blob(2000000, b"tls")); s.close()
t = threading.Thread(target=serve); t.start()
c = cc.wrap_socket(socket.create_connection(("127.0.0.1", port)))
print("3 tls", drain(c, 2000000))
t.join(); c.close()
"""


def test_tcp_ulp_is_refused_on_a_channel(fabric, tmp_path):
    """setsockopt(TCP_ULP, "tls") on an accelerated connection says ENOENT, as a kernel
    without the tls module says (an upper-layer protocol acts on the kernel socket, which a
    channel's bytes never pass through: with kernel TLS on, OpenSSL would write plaintext into
    the ring where its peer reads TLS records), logged; the connection goes on.  A client not
    yet taken is settled on TCP first, with that reason, and the kernel answers.  Python's ssl
    with OP_ENABLE_KTLS (OpenSSL sets TCP_ULP after the handshake) goes on in user space.  Bytes
    as over kernel TCP.  (This machine's kernel has no tls module either: what tells memlan's
    refusal from the kernel's here is the log.)"""
    key, cert = tmp_path / "k.pem", tmp_path / "c.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                    str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=localhost"],
                   check=True, capture_output=True, timeout=60)
    script = tmp_path / "ulp.py"
    script.write_text(ULP)
    plain = subprocess.run([PY, str(script), str(next_port()), str(key), str(cert)],
                           capture_output=True, text=True, timeout=60)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    log = tmp_path / "m.log"
    r = subprocess.run([str(MEMLAN), "run", "--log", str(log), "--", PY, str(script),
                        str(next_port()), str(key), str(cert)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    want = [ln if not ln.startswith("1 ") or " to " in ln else ln.rsplit(" ", 1)[0] + " ENOENT"
            for ln in plain.stdout.splitlines()]
    assert r.stdout.splitlines() == want, (r.stdout, plain.stdout)
    text = log.read_text()
    assert text.count("TCP_ULP refused (ENOENT)") == 1, text
    assert "TCP (a TCP upper-layer protocol (TCP_ULP, kernel TLS) was set before" in text, text
    assert text.count("accelerated (client)") == 2, text
    settle(fabric)


# A kernel that grants TCP_ULP, for a machine whose kernel has no tls module: loaded after
# memlan, so that memlan's call to the kernel's setsockopt reaches it.  It answers 0 and writes
# "|ULP|" into the kernel socket at the grant: every byte sent before must come before it.
FAKE_ULP = r"""
#define _GNU_SOURCE
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>
int setsockopt(int fd, int level, int name, const void *val, socklen_t len)
{
    if (level == IPPROTO_TCP && name == 31)
        return syscall(SYS_sendto, fd, "|ULP|", 5, MSG_DONTWAIT, NULL, 0) == 5 ? 0 : -1;
    return (int)syscall(SYS_setsockopt, fd, level, name, val, len);
}
"""

# (1) an accelerated connection: TCP_ULP, then "after"; (2) a client not yet taken: "hello" into
# its ring, TCP_ULP, "world", then a sendmsg with a control message the kernel refuses (EINVAL
# from TCP; kernel TLS's record type travels so).  Prints the answers and what the server read.
ULP_GRANTED = ULP_COMMON + r"""
def rest(a):
    d = b""
    while True:
        b = a.recv(100)
        if not b:
            return d
        d += b
ulp(c, "1", "ulp ok", "ulp ")
c.sendall(b"after"); c.close()
print("1 server read", rest(a))
c = socket.create_connection(("127.0.0.1", port))
c.sendall(b"hello")
ulp(c, "2", "ulp ok", "ulp ")
c.sendall(b"world")
try:
    print("2 sendmsg", c.sendmsg([b"!"], [(socket.SOL_SOCKET, 0x7777, b"\0\0\0\0")]))
except OSError as e:
    print("2 sendmsg", errno.errorcode[e.errno])
c.close()
a, _ = l.accept()
print("2 server read", rest(a))
"""


def test_tcp_ulp_granted_by_the_kernel_comes_after_the_rings_bytes(fabric, tmp_path):
    """With a kernel that grants TCP_ULP (a stand-in preloaded after memlan, this machine's
    kernel having no tls module): on an accelerated connection memlan says ENOENT and the kernel
    is never asked; a client not yet taken is settled on TCP, what its ring held goes to the
    kernel before the grant (the stand-in marks it in the stream), and its later sendmsg's
    control messages reach the kernel (before, they were dropped: kernel TLS's alerts and
    handshake records would have gone out as application data)."""
    shim = tmp_path / "fakeulp.so"
    (tmp_path / "fakeulp.c").write_text(FAKE_ULP)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(shim), str(tmp_path / "fakeulp.c")],
                   check=True, capture_output=True, timeout=60)
    script = tmp_path / "ulp2.py"
    script.write_text(ULP_GRANTED)
    env = dict(os.environ, LD_PRELOAD=str(shim))
    plain = subprocess.run([PY, str(script), str(next_port())], capture_output=True, text=True,
                           timeout=60, env=env)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert plain.stdout.splitlines() == [
        "1 ulp ok", "1 server read b'|ULP|after'",
        "2 ulp ok", "2 sendmsg EINVAL", "2 server read b'hello|ULP|world'"], plain.stdout
    log = tmp_path / "m.log"
    r = subprocess.run([str(MEMLAN), "run", "--log", str(log), "--", PY, str(script),
                        str(next_port())], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == [
        "1 ulp ENOENT", "1 server read b'after'",
        "2 ulp ok", "2 sendmsg EINVAL", "2 server read b'hello|ULP|world'"], r.stdout
    text = log.read_text()
    assert "accelerated (client)" in text, text
    assert "TCP (a TCP upper-layer protocol (TCP_ULP, kernel TLS) was set before" in text, text
    settle(fabric)


# SO_ZEROCOPY and MSG_ZEROCOPY sends, each followed by a wait (poll for POLLERR, at most 2 s)
# for every completion on the error queue, as the kernel's msg_zerocopy tool waits: (1) set on an
# accelerated connection; (2) set before connect; (3) set on the listener, whose accepted socket
# sends; (4) set on a client its server has not accepted yet; (5) set before listen(); (6) set on
# a socket whose dup connects; (7) set on the listener after a client connected, before accept
# (that accepted socket has no flag: the kernel copied the listener's before).  Prints each
# setsockopt's answer, whether the completions all came, and a digest of what arrived.  argv:
# four ports.
ZEROCOPY = r"""
import errno, hashlib, select, socket, struct, sys, threading
p1, p2, p3, p4 = (int(a) for a in sys.argv[1:5])
SO_ZEROCOPY, MSG_ZEROCOPY, N = 60, 0x4000000, 300000
data = (hashlib.sha256(b"zc").digest() * (N // 32 + 1))[:N]
def zc(s, who):
    try:
        s.setsockopt(socket.SOL_SOCKET, SO_ZEROCOPY, 1)
        print(who, "zerocopy ok")
        return True
    except OSError as e:
        print(who, "zerocopy", errno.errorcode[e.errno])
        return False
def drain(r, out):
    d = b""
    while len(d) < N:
        b = r.recv(65536)
        if not b:
            break
        d += b
    out.append((hashlib.sha256(d).hexdigest()[:16], len(d)))
def send(s, r, who, z):
    out = []
    t = threading.Thread(target=drain, args=(r, out)); t.start()
    sent = calls = 0
    while sent < N:
        sent += s.send(data[sent:], MSG_ZEROCOPY if z else 0)
        calls += 1
    done = -1
    seen = set()
    if z:  # the error queue's POLLERR through epoll too (edge-triggered, nothing asked)
        e = select.epoll(); e.register(s, select.EPOLLET)
        seen.add(("epoll", any(ev & select.EPOLLERR for _, ev in e.poll(2))))
        e.close()
    p = select.poll(); p.register(s, 0)
    while z and done < calls - 1 and p.poll(2000):
        try:
            _, anc, flags, _ = s.recvmsg(0, 1024, socket.MSG_ERRQUEUE)
        except BlockingIOError:
            continue
        for lvl, typ, c in anc:
            ee_errno, origin, _, code, _, lo, hi = struct.unpack("=IBBBBII", c[:16])
            seen.add((lvl, typ, len(c), ee_errno, code, flags))
            if origin == 5 and lo == done + 1:  # SO_EE_ORIGIN_ZEROCOPY, in order
                done = hi
    t.join()
    print(who, "completions", ("all" if done == calls - 1 else "missing") if z else "not asked",
          sorted(seen, key=str), out)
def listener(port):
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind(("127.0.0.1", port))
    l.listen(4)
    return l
l1, l2 = listener(p1), listener(p2)
c = socket.create_connection(("127.0.0.1", p1))
a, _ = l1.accept()
c.sendall(b"x"); assert a.recv(1) == b"x"
a.sendall(b"y"); assert c.recv(1) == b"y"
send(c, a, "1", zc(c, "1")); c.close(); a.close()
c = socket.socket()
z = zc(c, "2")
c.connect(("127.0.0.1", p1))
a, _ = l1.accept()
send(c, a, "2", z); c.close(); a.close()
z = zc(l2, "3")
c = socket.create_connection(("127.0.0.1", p2))
a, _ = l2.accept()
send(a, c, "3", z); c.close(); a.close()
c = socket.create_connection(("127.0.0.1", p1))
c.sendall(b"hello")
z = zc(c, "4")
a, _ = l1.accept()
assert a.recv(5) == b"hello"
send(c, a, "4", z); c.close(); a.close()
l3 = socket.socket()
l3.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
z = zc(l3, "5")
l3.bind(("127.0.0.1", p3)); l3.listen(4)
c = socket.create_connection(("127.0.0.1", p3))
a, _ = l3.accept()
send(a, c, "5", z); c.close(); a.close()
s = socket.socket()
z = zc(s, "6")
c = s.dup(); s.close()
c.connect(("127.0.0.1", p1))
a, _ = l1.accept()
send(c, a, "6", z); c.close(); a.close()
l4 = listener(p4)
c = socket.create_connection(("127.0.0.1", p4))
zc(l4, "7")
a, _ = l4.accept()
print("7 accepted with the flag", a.getsockopt(socket.SOL_SOCKET, SO_ZEROCOPY))
c.sendall(b"seven"); assert a.recv(5) == b"seven"
c.close(); a.close()
c = socket.create_connection(("127.0.0.1", p1))
a, _ = l1.accept()
c.sendall(b"x"); assert a.recv(1) == b"x"
zc(c, "8")
c.send(b"one", MSG_ZEROCOPY); assert a.recv(3) == b"one"
p = select.poll(); p.register(c, 0)
ev = [ev for _, ev in p.poll(2000)]
print("8 completion", ev, c.recvmsg(0, 1024, socket.MSG_ERRQUEUE)[1][0][2][12:16])
c.setsockopt(socket.SOL_SOCKET, SO_ZEROCOPY, 0)
c.send(b"two", MSG_ZEROCOPY); assert a.recv(3) == b"two"
print("8 after the flag went off", [ev for _, ev in p.poll(300)])
c.setsockopt(socket.SOL_SOCKET, SO_ZEROCOPY, 1)
c.send(b"three", MSG_ZEROCOPY); assert a.recv(5) == b"three"
p.poll(2000)
anc = c.recvmsg(0, 1024, socket.MSG_ERRQUEUE)[1]
print("8 on again: ids", struct.unpack("=II", anc[0][2][8:16]))
"""


def test_zerocopy_sends_get_their_completions(fabric, tmp_path):
    """SO_ZEROCOPY: a send with MSG_ZEROCOPY leaves its buffer to the kernel, and the program
    waits for the completion on the error queue before it reuses it (QEMU's multifd migration,
    the kernel's msg_zerocopy tool); a channel's send made none, and such a program waited for
    ever.  Set before connect (on the socket or a dup of it) or on a client not yet taken, the
    connection is on TCP with that reason, and the completions come as over kernel TCP.  Set on
    a listener it is not looked at, and a
    MSG_ZEROCOPY send on an accepted, accelerated connection that inherited it gets its
    completion from memlan, as one on an accelerated connection that was given the flag: each
    says the data was copied (SO_EE_CODE_ZEROCOPY_COPIED), as the kernel's over loopback say, and
    the socket is POLLERR until it is read (poll, and epoll edge-triggered)."""
    script = tmp_path / "zc.py"
    script.write_text(ZEROCOPY)
    ports = lambda: [str(next_port()) for _ in range(4)]  # noqa: E731
    plain = subprocess.run([PY, str(script), *ports()], capture_output=True, text=True,
                           timeout=60)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    lines = plain.stdout.splitlines()
    assert lines[0:12:2] == [f"{i} zerocopy ok" for i in range(1, 7)], plain.stdout
    assert all(ln.startswith(f"{i} completions all ") for i, ln in zip(range(1, 7), lines[1:12:2]))
    assert lines[12:14] == ["7 zerocopy ok", "7 accepted with the flag 0"], plain.stdout
    assert lines[14:] == ["8 zerocopy ok", "8 completion [8] b'\\x00\\x00\\x00\\x00'",
                          "8 after the flag went off []", "8 on again: ids (1, 1)"], plain.stdout
    log = tmp_path / "m.log"
    r = subprocess.run([str(MEMLAN), "run", "--log", str(log), "--", PY, str(script), *ports()],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    # A listener's flag is not looked at (gRPC sets it on every listener, and sends with
    # MSG_ZEROCOPY only when told to): cases 3 and 5 are accelerated, their accepted sockets
    # inherit it, and memlan makes their completions, as case 1's, whose accelerated connection
    # was given the flag: the same control messages, codes and flags as the kernel's.
    assert "(0, 11, 32, 0, 1, 8192)" in lines[1] and "('epoll', True)" in lines[1], lines
    assert r.stdout.splitlines() == lines, (r.stdout, plain.stdout)
    assert "MSG_ZEROCOPY" not in r.stderr, r.stderr
    text = log.read_text()
    assert text.count("SO_ZEROCOPY on an accelerated connection: its MSG_ZEROCOPY sends") == 1
    # cases 3 and 5 (case 1's and 8's are told at their setsockopt, once per process)
    assert text.count("MSG_ZEROCOPY sends on an accelerated connection with SO_ZEROCOPY") == 2
    assert text.count("TCP (SO_ZEROCOPY is set on the socket") == 2, text  # cases 2 and 6
    assert "TCP (SO_ZEROCOPY was set before a memlan acceptor took the offer)" in text, text
    assert text.count("accelerated (client)") == 5, text  # cases 1, 3, 5, 7 and 8
    settle(fabric)


def test_signal_corners_match_kernel(fabric, tmp_path):
    """A vfork child's own handler leaves the parent's in place (it used to replace it in the
    table memlan keeps in the memory they share); two threads installing handlers at once leave
    the one sigaction reports running, with its convention; and (as root) a handler that drops
    and takes back its euid every 200 us while the program connects and accepts does not
    deadlock in memlan's credential path.  Line for line as over kernel TCP."""
    plain, under, text = scripted(BUILD / "tests-preload" / "sigrace", tmp_path)
    assert plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    assert "parent's" in plain.stdout and " 0 of " in plain.stdout, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines()
    settle(fabric)


def test_uncounted_handlers_interrupt_recv(fabric, tmp_path):
    """signal() then siginterrupt(sig, 1), and sysv_signal() (signal() in strict ISO C): the
    handler is installed without SA_RESTART by a path memlan does not count, and an alarm()
    interrupts a blocking recv with EINTR as over kernel TCP (it once restarted: a hang)."""
    plain, under, text = scripted(BUILD / "tests-preload" / "siginterrupt", tmp_path)
    assert plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    assert "Interrupted system call" in plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines()
    assert "accelerated (accepted" in text, text
    settle(fabric)


FDPASSLISTEN = BUILD / "tests-preload" / "fdpasslisten"
SANDBOXRECV = BUILD / "tests-preload" / "sandboxrecv"
RECVMSGTCP = BUILD / "tests-preload" / "recvmsgtcp"


def test_recvmsg_on_a_connection_settled_on_tcp_matches_kernel(fabric, tmp_path):
    """recvmsg and recvmmsg with a name, a control buffer and flags preset, on a memlan socket
    whose connection settled on TCP (the client's offer gone before the server's accept): the
    header comes back as the kernel leaves it.  (Before: the caller's msg_namelen 16,
    msg_controllen 64 and msg_flags 0x40000 came back as set, with a 'control message' made of
    the caller's own buffer.)"""
    plain = subprocess.run([str(RECVMSGTCP), str(next_port())], capture_output=True, text=True,
                           timeout=60)
    assert plain.returncode == 0 and plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    log = tmp_path / "memlan.log"
    # (the wait from the connect, not from the accept: MEMLAN_ACCEPT_QUEUE_MS)
    env = dict(os.environ, MEMLAN_ACCEPT_WAIT_MS="1", MEMLAN_ACCEPT_QUEUE_MS="1")
    under = subprocess.run([str(MEMLAN), "run", "--log", str(log), "--", str(RECVMSGTCP),
                            str(next_port())], capture_output=True, text=True, timeout=60,
                           env=env)
    assert under.returncode == 0, under.stdout + under.stderr
    text = log.read_text()
    assert "no memlan acceptor took the offer" in text, text  # the client's socket, TCP
    assert sorted(under.stdout.splitlines()) == sorted(plain.stdout.splitlines()), under.stdout
    settle(fabric)  # the client's stat record: it ended with _exit


DECIDEINTR_FIRST = {"intr": "read -1 EINTR after 1 s", "restart": "read 5 hello after 3 s",
                    "timeo": "read -1 EAGAIN after 1 s", "timeo-restart": "read -1 EINTR after 1 s",
                    "sysv": "read 5 hello after 3 s", "sndtimeo": "write a part after 1 s",
                    "sendfile": "sendfile 1000 after 0 s", "splice": "splice 1000 after 0 s",
                    "huge-restart": "read -1 EINTR after 1 s", "1m-sndtimeo": "write all after 0 s",
                    "sendfile-timeo": "sendfile-timeo 1000 after 0 s",
                    "splice-timeo": "splice-timeo 1000 after 0 s", "read0": "read0 0  after 0 s"}


@pytest.mark.parametrize("mode", list(DECIDEINTR_FIRST))
def test_a_read_waiting_for_the_decision_is_interrupted_as_over_tcp(fabric, tmp_path, mode):
    """tests/preload/decideintr.c: a client's blocking call while the server has not accepted
    yet (3 s).  alarm(1) with a handler without SA_RESTART: the read ends with EINTR and the
    next one gets the answer, as over kernel TCP; with SA_RESTART the read returns the answer.
    Before, the read's wait for the decision went on through the handler and returned the
    answer: "read 5 hello" where the kernel says EINTR.  SO_RCVTIMEO of 1 s: EAGAIN at 1 s and
    2 s, the answer at 3 s (the wait heeded no timeout: the answer at 3 s, no EAGAIN); with a
    timeout any handler ends the read (it went on); SO_SNDTIMEO and a 64 MiB write: a part at 1
    s (at 3 s); a program that called siginterrupt() and gets no signal: the answer at 3 s
    (every read ended at once with EINTR).  A nonblocking sendfile or splice of 1000 bytes
    returns them at once (it waited for the decision: at 2 s), and the server reads them.  A
    review's cases: a SO_RCVTIMEO of 634 years is a timeout still (it wrapped round: EAGAIN at
    once); a 1 MiB write with SO_SNDTIMEO is taken whole, as the kernel's buffers take it (256
    KiB, then EAGAIN); a blocking sendfile or splice with SO_SNDTIMEO writes at once (EAGAIN at
    1 s); a read of 0 bytes is 0 at once (at 2 s)."""
    plain, under, text = scripted(BUILD / "tests-preload" / "decideintr", tmp_path, mode)
    assert plain.stdout.startswith(DECIDEINTR_FIRST[mode]), plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stdout + under.stderr
    assert "offer posted" in text, text
    settle(fabric)


def test_sandboxed_receiver_of_fds_is_not_killed(fabric, tmp_path):
    """A child whose seccomp filter kills for getsockopt (vsftpd's post-login child takes its
    data connections over SCM_RIGHTS so) receives a pipe, a connected and a listening TCP
    socket: it lives, as over kernel TCP; and one that reads the connection it received, under
    a filter that kills for fstat and openat too (the look for a connection passed to it, which
    memlan makes at a descriptor's first call, is not made in a sandbox it knows of).  (A review
    of the first publication of received listeners, made at receipt, found it killed by SIGSYS
    in all three cases.)"""
    plain, under, text = scripted(SANDBOXRECV, tmp_path)
    assert plain.stdout.count("the child exited 0") == 4, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stdout + under.stderr


SANDBOXPASS = BUILD / "tests-preload" / "sandboxpass"


def test_sandboxed_passer_of_fds_is_not_killed(fabric, tmp_path):
    """A broker whose seccomp filter allows little more than read, write and sendmsg (vsftpd's
    privileged broker passes PASV data connections to its session child so) passes a TCP
    connection that is not memlan's, then a pipe: it lives, as without memlan.  (7df1336's look
    at the descriptors passed asked getpid whether it ran in a vfork child before looking at
    them: SIGSYS in both cases.)"""
    plain, under, text = scripted(SANDBOXPASS, tmp_path)
    assert plain.stdout.count("the broker exited 0") == 2, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stdout + under.stderr
    settle(fabric)


def test_listener_received_over_scm_rights_is_published(fabric, tmp_path):
    """A listening socket handed to another process over a unix socket (SCM_RIGHTS), as
    haproxy's reload hands its listeners from the old worker to the new master: the receiver's
    accept takes the client's offer, promptly, whether the sender has closed its copy or still
    holds it.  Before, the receiver did not publish the socket: with the sender gone the client
    found no listener record (TCP), with the sender still there it offered to a record nobody
    that accepted looked at and waited 2 s (MEMLAN_ACCEPT_WAIT_MS) before going on over TCP."""
    plain, under, text = scripted(FDPASSLISTEN, tmp_path)
    assert plain.stdout.count("prompt") == 2 and plain.stdout.endswith("done\n"), plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stdout + under.stderr
    assert text.count("a listening socket received over SCM_RIGHTS: published") == 2, text
    assert text.count("accelerated (client)") == 2 and text.count("accelerated (accepted") == 2, text
    assert "TCP (" not in text, text
    settle(fabric)


def test_listener_received_published_at_its_first_accept(fabric, tmp_path):
    """fdpasslisten accept: the receiver never forks once it holds the received listener (its
    client was forked before), so the socket is published at its first accept, not at a fork.
    Sender alive: its record stands, the client offers, the receiver's first accept publishes
    and takes the offer, and both connections are accelerated.  Sender gone: the first client
    finds no record (TCP, as for any listener nobody published), the second finds the one the
    first accept made.  (With mlp_accept_received disabled: no publication, and each client of
    the alive case offered to a record whose only holder never accepts and waited
    MEMLAN_ACCEPT_WAIT_MS: "connection 1 SLOW (over 1 s)".)"""
    plain, under, text = scripted(FDPASSLISTEN, tmp_path, "accept")
    assert plain.stdout.count("prompt") == 4 and plain.stdout.endswith("done\n"), plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stdout + under.stderr
    assert text.count("received over SCM_RIGHTS: published (its first accept)") == 2, text
    assert "published (before a fork)" not in text, text
    assert text.count("accelerated (client)") == 3 and text.count("accelerated (accepted") == 3, text
    assert text.count("TCP (no memlan listener on this port") == 1, text
    settle(fabric)


PASSCONN = BUILD / "tests-preload" / "passconn"


def test_acceptor_passing_connections_keeps_its_clients_on_tcp(fabric, tmp_path):
    """passconn: the acceptor hands each connection to a worker over SCM_RIGHTS and closes its
    copy (Node.js's cluster primary does so by default on Linux).  The first connection passed
    is left to the worker, which takes its channel up; that pass also marks the port's record,
    and every later client stays on TCP, where the descriptor carries the connection whatever
    the receiver is.  (Before 7df1336: every connection was accelerated, then lost: all six
    "failed (Connection reset by peer)" or "failed (end of stream)", and nothing in the log said
    why.)"""
    plain, under, text = scripted(PASSCONN, tmp_path, "6")
    assert plain.stdout.count(" ok\n") == 6 and plain.stdout.endswith("done\n"), plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stdout + under.stderr
    assert text.count("passed to another process over SCM_RIGHTS: left to it") == 1, text
    assert text.count("accelerated (passed over SCM_RIGHTS)") == 1, text
    assert text.count("TCP (the server passes its accepted connections to other processes") == 10, text
    settle(fabric)


@pytest.mark.parametrize("mode", ["poll", "read", "epoll", "fionread", "thread", "keep"])
def test_acceptor_passing_connections_loses_none(fabric, tmp_path, mode):
    """The connection an acceptor passes over SCM_RIGHTS before its port is marked is taken up
    by the receiving process at its first call on the descriptor (poll, a blocking read, epoll_ctl,
    ioctl FIONREAD, a poll and a read in two threads at once) whether the acceptor closed its copy at once or
    keeps it: the worker reads the client's request from the channel and answers there, as over
    kernel TCP.  Three clients at once (a batch) as well as one after another.  (Before: the
    first connection was lost, "failed (Connection reset by peer)" or "no answer within 5 s":
    the channel could not follow its descriptor.)"""
    for args in (["3", mode], ["6", mode, "3"]):
        try:
            plain, under, text = scripted(PASSCONN, tmp_path, *args)
            assert plain.stdout.count(" ok\n") == int(args[0]), plain.stdout
            assert under.stdout.splitlines() == plain.stdout.splitlines(), \
                under.stdout + under.stderr + text
            assert text.count("accelerated (passed over SCM_RIGHTS)") >= 1, text
            assert "is lost" not in text and "lost" not in under.stderr, text + under.stderr
        finally:
            settle(fabric)


def test_receiver_in_a_sandbox_takes_nothing_up(fabric, tmp_path):
    """A worker under a seccomp filter (one that would let our calls through, but memlan cannot
    know which a filter allows) receives the first connection: memlan makes no call of its own
    there to look for it (design.md, "Passing a connection"), so the connection is lost, as
    before the take-up existed, and the passer says so; later clients stay on TCP and are
    answered, as over kernel TCP.  (b888bea looked, and shut the socket down: a filter that
    kills for fstat or openat killed the worker, see sandboxuse.)"""
    try:
        plain, under, text = scripted(PASSCONN, tmp_path, "3", "sandbox")
        assert plain.stdout.count(" ok\n") == 3, plain.stdout
        got = under.stdout.splitlines()
        assert got[1:] == plain.stdout.splitlines()[1:], under.stdout
        assert got[0].startswith("connection 0 failed ("), got
        assert "could not take it up" in under.stderr and "it is lost" in under.stderr, \
            under.stderr
        assert "accelerated (passed over SCM_RIGHTS)" not in text, text
    finally:
        settle(fabric)


PASSEXIT = BUILD / "tests-preload" / "passexit"


@pytest.mark.parametrize("mode", ["epoll", "poll", "read", "epoll-close", "epoll-_exit",
                                  "poll-_exit"])
def test_passed_connection_follows_its_descriptor(fabric, tmp_path, mode):
    """passexit: a client passes its accelerated connection to another process over SCM_RIGHTS
    and exits (or _exits), as pgbouncer's online restart (`pgbouncer -R`) does with every
    connection: the taker takes the channel up and its request is answered, as over kernel TCP,
    whatever the server waits in and however the passer ends."""
    plain, under, text = scripted(PASSEXIT, tmp_path, mode)
    assert sorted(plain.stdout.splitlines()) == [
        "done", "passer: pong 1", "server: the connection ended (end of stream)",
        "taker: pong 2"], plain.stdout
    assert sorted(under.stdout.splitlines()) == sorted(plain.stdout.splitlines()), \
        under.stdout + under.stderr + text
    assert text.count("accelerated (passed over SCM_RIGHTS)") == 1, text
    settle(fabric)


@pytest.mark.parametrize("mode", ["epoll-sandbox", "poll-sandbox", "epoll-_exit-sandbox",
                                  "poll-_exit-sandbox"])
def test_passed_connection_lost_ends_for_its_peer(fabric, tmp_path, mode):
    """passexit with a taker under a seccomp filter, where memlan takes nothing up: the
    connection is lost, but the server must see it end, not wait for ever.  The passer's side
    is flagged passed (ML_SOCK_PASSED) until a receiver takes it up, and once the passer is
    gone (its exit() waits up to 200 ms for a take-up, then keeps the young record for a late
    receiver and logs it; _exit waits for nothing) the server's epoll_wait or poll asks its lock
    when its sleep runs to the liveness bound, and reads the end.  Before (trial6's finding):
    pgbouncer -R's server slept in epoll_wait for ever ("server: no end within 5 s") and the
    client's query hung."""
    plain, under, text = scripted(PASSEXIT, tmp_path, mode)
    assert sorted(plain.stdout.splitlines()) == [
        "done", "passer: pong 1", "server: the connection ended (end of stream)",
        "taker: pong 2"], plain.stdout
    assert sorted(under.stdout.splitlines()) == [
        "done", "passer: pong 1", "server: the connection ended (end of stream)",
        "taker: the connection ended"], under.stdout + under.stderr
    assert "accelerated (passed" not in text, text
    if "_exit" not in mode:
        assert "was not taken up by its receiver before this process exited" in text, text
    settle(fabric)


PASSEND = BUILD / "tests-preload" / "passend"


@pytest.mark.parametrize("mode", ["close", "dup2"])
def test_passed_connection_closed_unused_ends(fabric, tmp_path, mode):
    """passend close, dup2: the worker closes the connection it received (or dup2s another file
    over it) without any other call on it, the acceptor having closed its copy: the client reads
    the end at once, as over kernel TCP, and nothing says the connection lost: the close takes
    it up first and ends it.  (b888bea took nothing up at a close: the record and the passer's
    bridge stayed, the client read the end only at its liveness look a second later, and the
    passer said on stderr that the connection was lost, "the passer exited before its receiver
    took it up".)"""
    try:
        plain, under, text = scripted(PASSEND, tmp_path, mode)
        assert plain.stdout == "client: end of stream\ndone\n", plain.stdout
        assert under.stdout == plain.stdout, under.stdout + under.stderr
        assert "lost" not in under.stderr and "is lost" not in text, under.stderr + text
        assert text.count("accelerated (passed over SCM_RIGHTS)") == 1, text
    finally:
        settle(fabric)


@pytest.mark.parametrize("mode", ["twice", "mtwice"])
def test_connection_passed_twice_is_left_once(fabric, tmp_path, mode):
    """passend twice, mtwice: the acceptor passes the same connection twice before the worker's
    first call (two sendmsg, or one sendmmsg of two messages) and closes its copy; the worker
    answers on the first copy and closes both.  The client reads the line and the end, as over
    kernel TCP: one record, one bridge, one holder counted, and nothing said lost.  (b888bea:
    the second sendmsg said on stderr that the connection was lost, "no record of it could be
    left"; sendmmsg's second message removed the first's record, made a second one and counted
    a second holder that no close took away, so the worker's close did not end the side and the
    client read the end only at its liveness look a second later: "left to it" logged twice.)"""
    try:
        plain, under, text = scripted(PASSEND, tmp_path, mode)
        assert plain.stdout == "client: got hello\nclient: end of stream\ndone\n", plain.stdout
        assert under.stdout == plain.stdout, under.stdout + under.stderr
        assert "lost" not in under.stderr and "lost" not in text, under.stderr + text
        assert text.count("left to it") == 1, text
        assert text.count("accelerated (passed over SCM_RIGHTS)") == 1, text
    finally:
        settle(fabric)


# A connection accepted by A and passed over SCM_RIGHTS, each passer ending by _exit right after
# its pass (each holds the write end of a pipe alone, so its receiver sees its end):
#   chain  A passes to B; B, 0.8 s after A's end, polls it (its take-up), passes it to C and
#          ends; C, 0.9 s after B's end, writes "chain"
#   shut   A writes "banner", shuts down its writing and passes to C; the client reads the
#          banner and the end, writes "req" and closes; C, 0.5 s after A's end, reads to the end
#   late   A passes to C; C, 3 s after A's end, writes "late"
#   fork   the same, C 1.6 s after A's end, the client's fork child waiting 1.3 s in select on
#          the connection meanwhile (its own look at the passed side), the client itself only
#          reading after it
# The client (the parent) prints what it read; C what its calls gave (Python ignores SIGPIPE).
PASS_ON = r"""#!/usr/bin/python3
import os, select, socket, sys, time
port, mode = int(sys.argv[1]), sys.argv[2]
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", port)); ls.listen(4)
def stage(first, after, run):  # a child that takes the connection, or accepts it (first)
    r, w = os.pipe(); u, v = socket.socketpair()
    if os.fork() == 0:
        os.close(r); v.close()
        s = ls.accept()[0] if first else socket.socket(fileno=socket.recv_fds(after[1], 9, 1)[1][0])
        if after:
            os.read(after[0], 1)  # the passer's end
        run(s, u); os._exit(0)
    os.close(w); u.close()
    return r, v
def pass_on(s, u):
    socket.send_fds(u, [b"x"], [s.fileno()]); s.close()
def a_run(s, u):
    if mode == "shut":
        s.sendall(b"banner\n"); s.shutdown(socket.SHUT_WR)
    pass_on(s, u)
def b_run(s, u):
    time.sleep(0.8); select.select([s], [], [], 0); pass_on(s, u)
def c_run(s, u):
    time.sleep({"chain": 0.9, "shut": 0.5, "late": 3.0, "fork": 1.6}[mode])
    try:
        if mode == "shut":
            print("C: read", b"".join(iter(lambda: s.recv(100), b"")), flush=True)
        else:
            s.sendall(mode.encode() + b"\n"); print("C: sent", flush=True)
    except OSError as e:
        print("C:", os.strerror(e.errno), flush=True)
    s.close()
ab = stage(True, None, a_run)
bc = stage(False, ab, b_run) if mode == "chain" else ab
stage(False, bc, c_run)
c = socket.create_connection(("127.0.0.1", port)); c.settimeout(8); got = b""
if mode == "fork":
    if os.fork() == 0:
        select.select([c], [], [], 1.3); os._exit(0)
    os.wait(); time.sleep(1.0)
while True:
    b = c.recv(100)
    if not b:
        break
    got += b
    if got == b"banner\n":
        time.sleep(0.2); c.sendall(b"req\n")
print("client: read", got, flush=True)
c.close()
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
"""


@pytest.mark.parametrize("mode", ["chain", "shut", "late", "fork"])
def test_a_passed_connection_on_its_way(fabric, tmp_path, mode):
    """PASS_ON (a review of 369fb6c): "chain": the peer's grace for a passed side restarts at
    each pass (the side's pass count), so C, 0.9 s after B's end, is still in time (before, the
    grace counted from A's end: the client read the end without "chain").  "shut": a passed
    socket past both FINs (its passer shut down its writing, the client closed) has no peer
    name, and its record was taken for another socket's: C read the end without "req"; now the
    socket's cookie tells.  "late": C comes 3 s after its passer's end, past the peer's grace,
    which took the side for ended (the client's looks, whose sleeps double to a second, come at
    about 0.1, 0.3, 0.7, 1.5 and 2.5 s: 3 s leaves a margin past the one that ends the grace);
    over kernel TCP the client reads "late".  That stays a loss (design.md,
    "Passing a connection"), but no longer a silent one: C's take-up finds the peer's word,
    says the connection lost, and shuts it down (C's send fails, EPIPE), where before C's send
    succeeded into a ring nobody read.  "fork": the same C, but the client's side is shared with
    a fork child, whose own look ran past the grace: that is no end for the client, which reads
    "fork" as over kernel TCP (the first version set the word for the whole side: C said lost,
    the client read the end)."""
    (tmp_path / "p.py").write_text(PASS_ON)
    (tmp_path / "p.py").chmod(0o755)
    plain, under, text = scripted(tmp_path / "p.py", tmp_path, mode)
    want = {"chain": "C: sent\nclient: read b'chain\\n'\n",
            "shut": "client: read b'banner\\n'\nC: read b'req\\n'\n",
            "late": "C: sent\nclient: read b'late\\n'\n",
            "fork": "C: sent\nclient: read b'fork\\n'\n"}[mode]
    assert sorted(plain.stdout.splitlines()) == sorted(want.splitlines()), plain.stdout
    if mode != "late":
        assert sorted(under.stdout.splitlines()) == sorted(plain.stdout.splitlines()), \
            under.stdout + under.stderr + text
        assert "lost" not in text, text
    else:
        assert sorted(under.stdout.splitlines()) == ["C: Broken pipe", "client: read b''"], \
            under.stdout + under.stderr + text
        assert "is lost (its peer had taken it for ended" in text, text
    settle(fabric)

@pytest.mark.parametrize("mode", ["passerexit", "passer_exit"])
def test_passed_connection_outlives_a_passer_that_exits(fabric, tmp_path, mode):
    """passend passerexit, passer_exit: the acceptor passes the connection, closes its copy and
    calls exit() (or _exit); the worker waits for the acceptor's end and 300 ms more, then writes
    "hello" and closes.  The client reads the line and the end, as over kernel TCP: the record
    stays after the passer's exit, and the client's liveness looks give the passed side a second
    from the first that finds its lock free, so the worker takes it up in time.  (b888bea's
    exit() removed the record and said the connection lost: the worker wrote to the idle kernel
    socket and the client read the end of stream alone, a silent truncation; with _exit it was
    taken up.  7883d47's client declared the side dead at its first look after the passer's
    end: "hello" lost, the end read alone, in 1 run in 7 with no delay, in every run with it.)"""
    try:
        plain, under, text = scripted(PASSEND, tmp_path, mode)
        assert plain.stdout == "client: got hello\nclient: end of stream\ndone\n", plain.stdout
        assert under.stdout == plain.stdout, under.stdout + under.stderr
        assert "lost" not in under.stderr, under.stderr
        assert text.count("accelerated (passed over SCM_RIGHTS)") == 1, text
    finally:
        settle(fabric)


@pytest.mark.parametrize("mode", ["vfork", "vforkmove", "usevfork", "vforkfail", "vforkkeep",
                                  "vforkkeep0"])
def test_passed_connection_goes_across_vfork_exec(fabric, tmp_path, mode):
    """passend vfork: the worker vforks at once; the child puts the connection it received on
    fd 1 (vforkmove: and closes the received number) and execs echo hello, the parent closes its
    copy.  Over kernel TCP the client reads "hello" and the end.  A vfork child looks at nothing
    (it shares its parent's memory), so before, the exec carried no channel, echo wrote to the
    idle kernel socket and the parent's close took the connection up and ended it: the client
    read the end alone.  Now the new image looks at its start ("R" in the carry list).  usevfork:
    the worker writes "first" before (the connection is its own, carried as one).  vforkfail:
    the child's exec fails, and the worker writes "hello" itself: the parent's mark, set aside
    for the exec, is back.  vforkkeep: the program only inherits the fd at its number (true)
    and the worker writes "hello": the connection stays the worker's (a first version handed it
    to every exec that inherited it, and the worker's bytes went to the kernel socket);
    vforkkeep0: the same with the connection received at 0 (a second version still handed
    that one over)."""
    try:
        plain, under, text = scripted(PASSEND, tmp_path, mode)
        want = ("client: got first\n" if mode == "usevfork" else "") + \
            "client: got hello\nclient: end of stream\ndone\n"
        assert plain.stdout == want, plain.stdout
        assert under.stdout == plain.stdout, under.stdout + under.stderr
        assert "lost" not in under.stderr and "split" not in text, under.stderr + text
        assert text.count("accelerated (passed over SCM_RIGHTS)") == 1, text
    finally:
        settle(fabric)


PASSUNDO = BUILD / "tests-preload" / "passundo"


@pytest.mark.parametrize("mode", ["epipe", "mmsg", "tcp"])
def test_pass_that_passes_nothing_leaves_the_connection_ours(fabric, tmp_path, mode):
    """passundo: the acceptor sends its accelerated connection over SCM_RIGHTS and the kernel
    passes nothing: sendmsg to a unix socket whose peer closed (EPIPE), sendmmsg whose second
    datagram, the one with the connection, does not go (it says 1), sendmsg over a TCP socket
    (its kernel sends the byte and ignores SCM_RIGHTS).  The connection stays the acceptor's:
    its line and its close reach the client as over kernel TCP, nothing is said lost and the
    port is not marked.  (b888bea took the TCP case for a pass: a record and a bridge left, the
    receiver counted as a holder, the port marked, the client's end a second late and "it is
    lost" said on stderr at exit.)"""
    try:
        plain, under, text = scripted(PASSUNDO, tmp_path, mode)
        assert plain.stdout.endswith("connection 0: got hello 0\nconnection 0: end of stream\n"
                                     "done\n"), plain.stdout
        assert under.stdout == plain.stdout, under.stdout + under.stderr
        assert "lost" not in under.stderr and "lost" not in text, under.stderr + text
        assert "left to it" not in text and "this process passes" not in text, text
    finally:
        settle(fabric)


SANDBOXUSE = BUILD / "tests-preload" / "sandboxuse"


def test_sandboxed_receiver_reads_what_it_received(fabric, tmp_path):
    """sandboxuse: a child under a seccomp filter installed with prctl (as vsftpd's session
    child) that kills for fstat, or for openat, receives a pipe or a kernel TCP connection over
    SCM_RIGHTS and reads a byte from it: it exits 0, as without memlan.  (b888bea looked for a
    passed connection at that first read, fstat and openat of a px- record, before it asked
    whether the process was sandboxed: SIGSYS, signal 31, in the fstat cases and the TCP
    openat case.)"""
    plain, under, text = scripted(SANDBOXUSE, tmp_path)
    assert plain.stdout.count("the child exited 0") == 4, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stdout + under.stderr
    settle(fabric)


SANDBOXYIELD = BUILD / "tests-preload" / "sandboxyield"


def test_sandboxed_threads_that_meet_on_our_locks_never_yield(fabric, tmp_path):
    """sandboxyield: a fork child with a settled connection puts on a seccomp filter that kills
    the process for sched_yield (OpenSSH's pre-authentication filter allows none), then four
    threads at once install a handler 20,000 times each, then a SIGBUS handler 5,000 times
    each, then one forks 1,000 times while the other three dup() and close() the connection;
    last a byte each way: it exits 0, as over kernel TCP.  The preload's waits for its signal
    table's lock, the SIGBUS guard's and the fd table's fork gate gave the cpu away with
    sched_yield, and the child was killed by signal 31 in the first of the three, in 3 runs of
    3 (each phase alone too, in scratch copies); they pause, then sleep briefly on a futex
    (__ml_brief_wait).  The third phase once made and closed plain sockets, which never pass
    the gate: it exited 0 with the old waits as well."""
    plain, under, _ = scripted(SANDBOXYIELD, tmp_path)
    want = ("child: sigaction done\nchild: sigbus done\nchild: fork gate done\n"
            "child: the connection works\nchild exited 0\ndone\n")
    assert plain.stdout == want, plain.stdout + plain.stderr
    assert under.stdout == want, under.stdout + under.stderr
    settle(fabric)


EPOLLPARK = BUILD / "tests-preload" / "epollpark"


@pytest.mark.skipif(not strace_seccomp_ok(), reason="needs strace with --seccomp-bpf")
def test_epoll_ctl_of_our_members_skips_the_kernel(fabric, tmp_path):
    """A member deleted and added back, modified, one-shot, edge-triggered, EPOLLEXCLUSIVE,
    the socket's peer shut down while it was out of the set, the fd closed and its number
    reused: epoll_ctl's answers and epoll_wait's events under memlan are kernel TCP's, line for
    line.  Under memlan a DEL parks the member (its kernel entry stays) and MOD and ADD back
    change only our record: strace counts the epoll_ctl system calls, every one of the
    program's over kernel TCP (the control), at most half of them under memlan (14 of 32 when
    written: the first ADD of each socket, EPOLLEXCLUSIVE's, the closed fd's).  redis-benchmark
    with one client made five a request (src/preload/epoll.c, "Parked members")."""
    runs = {}
    for mode, (r, trace) in straced_both(fabric, tmp_path, EPOLLPARK, "epoll_ctl", 120).items():
        # the program's fds only: memlan's own doorbells (numbers from 10000 up) are added too
        fds = re.findall(r"epoll_ctl\(\d+, EPOLL_CTL_\w+, (\d+),", trace)
        runs[mode] = (r.stdout, sum(1 for fd in fds if int(fd) < 1000))
    plain, under = runs["kernel"][0], runs["memlan"][0]
    assert plain.endswith("done\n"), plain
    assert "add again: -1 File exists" in plain and "mod after del: -1 No such file" in plain
    assert "wait, the end: 1 [7 0x2001]" in plain and "same number: yes" in plain, plain
    assert under.splitlines() == plain.splitlines()
    calls = sum(1 for line in plain.splitlines() if re.match(r"(add|del|mod)", line))
    assert runs["kernel"][1] == calls, (runs["kernel"][1], calls)  # strace sees every call
    assert runs["memlan"][1] <= calls // 2, (runs["memlan"][1], calls)
    text = (tmp_path / "memlan.log").read_text()
    assert text.count("accelerated (client)") == 2, text


EPOLLPARK2 = BUILD / "tests-preload" / "epollpark2"


def test_epoll_parked_member_answers_dup_close_nested_fork_exec(fabric, tmp_path):
    """A member deleted under memlan is parked, its kernel entry kept (src/preload/epoll.c,
    "Parked members"): a MOD with EPOLLEXCLUSIVE of it must still get the kernel's EINVAL (not
    ENOENT), and its fd closed while a duplicate keeps the socket open must take the entry with
    it, so that the socket brought back under that number (dup2) is added (0), not refused
    (EEXIST: the entry, keyed by file and fd number, had outlived the fd), and reported; and a
    set inside another must not look readable there when the peer of a member deleted from it
    shuts down (the parked entry's FIN did make it so); and a member deleted before fork, added
    back by the child and then by the parent, must get the kernel's 0 and then EEXIST (the set
    is shared: each answered 0 from its own copy of the parked record); one in the set at fork
    deleted by either process must be ENOENT to the other's MOD and 0 to its ADD (they answered
    0 and EEXIST from their own copies); and one deleted before exec must be added by the new
    image (0, not the parked entry's EEXIST).  Line for line against kernel TCP."""
    plain = subprocess.run([str(EPOLLPARK2), str(next_port())], capture_output=True, text=True,
                           timeout=60)
    log = tmp_path / "memlan.log"
    under = subprocess.run([str(MEMLAN), "run", "--log", str(log), "--", str(EPOLLPARK2),
                            str(next_port())], capture_output=True, text=True, timeout=60)
    settle(fabric)
    assert plain.returncode == 0 and plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    assert "mod exclusive after del: -1 Invalid argument" in plain.stdout, plain.stdout
    assert "add it back under its number: 0" in plain.stdout, plain.stdout
    assert "the other set, the peer of one deleted inside shut down: 0\n" in plain.stdout
    assert "the parent adds it back: -1 File exists" in plain.stdout, plain.stdout
    assert "the parent modifies it: -1 No such file" in plain.stdout, plain.stdout
    assert "the fork child adds it: 0" in plain.stdout, plain.stdout
    assert "after exec, add: 0" in plain.stdout, plain.stdout
    assert under.returncode == 0, under.stdout + under.stderr
    assert under.stdout.splitlines() == plain.stdout.splitlines()
    text = log.read_text()
    assert text.count("accelerated (client)") == 3, text


EPOLLPASSBACK = BUILD / "tests-preload" / "epollpassback"


def test_epoll_parked_member_passed_away_and_back(fabric, tmp_path):
    """A connection deleted from an epoll set (parked under memlan, its kernel entry kept), passed
    over SCM_RIGHTS to a process that passes it straight back and closes its copy, and closed
    here: it comes back under the number it had, and its ADD must be the kernel's 0, its peer's
    byte reported and read, twice.  The parked entry outlived the close (the file lived on in the
    other process) and the ADD met EEXIST (dovecot's imap-hibernate died of it); and the
    forwarder's close took the connection up from the record it had been passed with, ending
    its hold and leaving us an idle kernel socket.  Line for line against kernel TCP."""
    plain = subprocess.run([str(EPOLLPASSBACK), str(next_port())], capture_output=True,
                           text=True, timeout=60)
    log = tmp_path / "memlan.log"
    under = subprocess.run([str(MEMLAN), "run", "--log", str(log), "--", str(EPOLLPASSBACK),
                            str(next_port())], capture_output=True, text=True, timeout=60)
    settle(fabric)
    assert plain.returncode == 0 and plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    assert plain.stdout.count("add it back: 0") == 2 and plain.stdout.count("read: 1") == 2
    assert under.returncode == 0, under.stdout + under.stderr
    assert under.stdout.splitlines() == plain.stdout.splitlines()
    text = log.read_text()
    assert text.count("accelerated (client)") == 1 and "lost" not in text, text


RAWCLOSE = BUILD / "tests-preload" / "rawclose"


def test_raw_syscall_close_releases_the_fd(fabric, tmp_path):
    """Connections closed by syscall(SYS_close, fd), as libuv (Node.js) closes every fd, and by
    syscall(SYS_close_range): the peer reads end-of-file, and a connection and a pipe opened at
    the numbers work, as over kernel TCP, line for line.  Before, the raw close left the fd's
    record: the next connection at the number was taken for the old one ("second: client recv:
    nothing in 3 s") and the pipe's write raised SIGPIPE (exit -13); Node's echo clients after
    20 destroyed sockets all failed with EPIPE."""
    plain, under, text = scripted(RAWCLOSE, tmp_path)
    assert plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    assert plain.stdout.count("at the old number: yes") == 4, plain.stdout
    assert "pipe read: ok" in plain.stdout, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stderr
    assert text.count("accelerated (client)") == 4, text
    assert text.count("accelerated (accepted") == 4, text
    settle(fabric)


RAWCLONE = BUILD / "tests-preload" / "rawclone"


def test_raw_clone_child_serves_its_parents_connection(fabric, tmp_path):
    """A child made by syscall(SYS_clone, SIGCHLD, NULL) and by syscall(SYS_fork), as vsftpd
    makes each session's process, moves an accepted connection its parent then closes onto its
    stdio, writes a greeting, reads a line and answers 100 KB: the client reads them all and
    end-of-file, as over kernel TCP.  Before, the child took itself for a vfork child and went
    past memlan: its greeting reached the idle kernel socket ("26 bytes arrived on the kernel
    socket under an accelerated connection", the stream split; "greeting: missing"), and every
    vsftpd login under memlan read end-of-file.  And a parent and its raw child sending on one
    connection at once: glibc named the child by its parent's thread id, and a socket lock one
    held read EDEADLK in the other, reported as a reset."""
    plain, under, text = scripted(RAWCLONE, tmp_path)
    assert plain.stdout.count(": greeting: ok") == 3, plain.stdout + plain.stderr
    assert plain.stdout.count("102400 bytes right, end-of-file") == 3, plain.stdout
    assert plain.stdout.count("nested: 10000 C records, 10000 G records, 0 mixed, end-of-file; "
                              "status 0") == 3, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stdout + under.stderr
    assert text.count("accelerated (client)") == 9, text
    assert text.count("accelerated (accepted") == 9, text
    assert "arrived on the kernel socket" not in text, text
    # Both at once on one connection: every record whole, none refused (before the child's
    # thread id was set: "send: Connection reset by peer" and the lock said broken).
    assert plain.stdout.count("shared: 10000 P records, 10000 C records, 0 mixed, end-of-file; "
                              "child status 0") == 3, plain.stdout
    assert "lock is unrecoverable" not in text, text
    settle(fabric)


URINGCTL = BUILD / "tests-preload" / "uringctl"


def io_uring_available():
    r = subprocess.run([str(URINGCTL), str(next_port())], capture_output=True, text=True,
                       timeout=30)
    return r.returncode == 0 and r.stdout.startswith("io_uring: used\n")


def test_io_uring_epoll_ctl_is_refused_so_libuv_uses_epoll_ctl(fabric, tmp_path):
    """uringctl adds its connection to its epoll set as libuv 1.45 and later does (uvloop,
    Node.js's own builds): by an io_uring IORING_OP_EPOLL_CTL through libc's syscall(), with
    epoll_ctl when io_uring_setup fails.  Under memlan io_uring_setup is refused (ENOSYS, said in
    the log), the fallback's epoll_ctl reaches the preload, and every round is answered.  Before,
    the io_uring's epoll_ctl never reached memlan: the set waited on the idle kernel socket
    ("round 0: no answer within 5 s"; uvloop's server and client hung at their first message)."""
    if not io_uring_available():
        pytest.skip("this kernel (or its seccomp filter) gives no io_uring: nothing to refuse")
    plain, under, text = scripted(URINGCTL, tmp_path)
    assert plain.stdout.splitlines() == ["io_uring: used", "round 0 ok", "round 1 ok",
                                         "round 2 ok", "done"], plain.stdout + plain.stderr
    assert under.stdout.splitlines() == ["io_uring: refused"] + plain.stdout.splitlines()[1:], \
        under.stdout + under.stderr
    assert text.count("io_uring_setup refused (ENOSYS)") == 1, text
    assert text.count("accelerated (client)") == 1, text
    settle(fabric)


def test_io_uring_is_left_alone_when_memlan_is_off(fabric, tmp_path):
    """With --off the library is loaded but changes nothing: io_uring_setup reaches the kernel."""
    if not io_uring_available():
        pytest.skip("this kernel (or its seccomp filter) gives no io_uring")
    r = subprocess.run([str(MEMLAN), "run", "--off", "--", str(URINGCTL), str(next_port())],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("io_uring: used\n"), r.stdout + r.stderr
    assert "round 2 ok" in r.stdout, r.stdout
    settle(fabric)


POLLROOM = BUILD / "tests-preload" / "pollroom"


def test_pollout_means_room_for_a_piece(fabric, tmp_path):
    """Both ends stream 32 MiB at each other as socat relays do: after POLLOUT, a blocking write
    of 8 KiB, then a read of 4 KiB.  Over kernel TCP POLLOUT means a third of the buffer free, the
    write does not wait, and both finish.  Before, POLLOUT meant one free byte in the ring: both
    ends waited in their writes for ever ("stuck in a write after POLLOUT", exit 3; two socat
    relays, TCP-LISTEN,fork to TCP echoing through cat, hung so)."""
    plain, under, text = scripted(POLLROOM, tmp_path)
    assert plain.stdout == "both ends streamed 32 MiB each way: yes\ndone\n", plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stderr
    assert text.count("accelerated (client)") == 1, text
    settle(fabric)


EPOLLBEFORE = BUILD / "tests-preload" / "epollbefore"


def test_epoll_entry_made_before_connect(fabric, tmp_path):
    """A socket put in an epoll set before its connect (nginx's upstream connections, Netty's
    channels): edge- and level-triggered, changed before the connect, deleted before it, in two
    sets, EPOLLEXCLUSIVE, its set closed first, its set's fd closed first while a duplicate keeps
    the set.  The set reports the peer's answer with the data the program gave, as over kernel
    TCP ("dup: no reply within 2 s" before mlp_epoll_renote).  Before, the connection was accelerated while the set
    kept watching the kernel socket: "et: no reply within 2 s" (lt, mod, two and excl too), and
    nginx proxying to a memlan backend hung on every request."""
    plain, under, text = scripted(EPOLLBEFORE, tmp_path)
    assert "et: re:et, data as set" in plain.stdout, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stdout + under.stderr
    assert "dup: re:dup, data as set" in plain.stdout, plain.stdout
    # et, lt, mod, del, gone and dup are accelerated; two sets and EPOLLEXCLUSIVE stay on TCP.
    assert text.count("accelerated (client)") == 6, text
    assert "more than one epoll set before it connected" in text, text
    assert "with EPOLLEXCLUSIVE before it connected" in text, text
    settle(fabric)


def test_disconnect_ends_the_calls_inside_as_the_kernel(fabric, tmp_path):
    """disconnectwait: a thread blocked in recv and one in poll on an accelerated client when
    another disconnects it (connect(AF_UNSPEC)), the peer silent: as over kernel TCP (Linux 6.6
    and later, whose blocked recv ends with EPIPE) recv says EPIPE, poll POLLERR|POLLHUP, the next
    recv ECONNRESET; a send blocked so says ECONNRESET and the next one EPIPE.  Before, the
    channel's end was taken for the peer's: "recv: 0" and "poll: 1 0x1"; and the send's reset
    stayed in the kernel socket: "send after: -1 Connection reset by peer"."""
    plain, under, text = scripted(BUILD / "tests-preload" / "disconnectwait", tmp_path)
    assert plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    if "recv: -1 Broken pipe" not in plain.stdout:
        pytest.skip("this kernel ends a recv blocked across a disconnect otherwise: "
                    + plain.stdout)
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stdout + under.stderr
    assert text.count("accelerated (client)") == 2, text
    settle(fabric)


def test_epoll_member_disconnected_and_connected_again(fabric, tmp_path):
    """epollreconnect: an accelerated client in an epoll set, disconnected by connect(AF_UNSPEC)
    and connected again on the same fd, its entry kept, changed or deleted in between, and a
    client that fell to TCP (no accept within 2 s) whose entry the program changed before: the
    set reports the new connection's bytes with the entry's data (or nothing, deleted) as over
    kernel TCP, the new connections accelerated (MEMLAN_ACCEPT_QUEUE_MS 2 s: the client that
    falls to TCP waits no longer).  Before, the new connection was never taken
    back into the set, whose kernel entry watched the kernel socket: "kept: after the server's
    byte: 0" (and "fell to TCP: ... 0")."""
    # The client that falls to TCP is accepted 2.5 s after its connect, past its wait in all.
    plain, under, text = scripted(BUILD / "tests-preload" / "epollreconnect", tmp_path,
                                  env={"MEMLAN_ACCEPT_QUEUE_MS": "2000"})
    assert plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    assert "kept: after the server's byte: 1 [7 0x1]" in plain.stdout, plain.stdout
    assert "fell to TCP: after the server's byte: 1 [9 0x1]" in plain.stdout, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stdout + under.stderr
    assert "vforked: after the server's byte: 1 [7 0x1]" in plain.stdout, plain.stdout
    # A vfork child's entry for the socket in its own set says nothing of the parent's: the
    # parent's reconnected client is accelerated too.
    assert text.count("accelerated (client)") == 9, text
    assert "no memlan acceptor took the offer within" in text, text
    assert "more than one epoll set" not in text, text
    settle(fabric)


CONNECTPENDING = BUILD / "tests-preload" / "connectpending"


def test_connecting_socket_is_not_writable(fabric, tmp_path):
    """A nonblocking connect that stays in SYN-SENT (the listener's accept queue full): poll
    reports nothing for 300 ms, SO_ERROR 0, getpeername ENOTCONN, as over kernel TCP.  Before,
    the undecided socket said POLLOUT at once ("poll for POLLOUT within 300 ms: 1"), and also
    for the second connection filling the queue ("2 of 2"): a program took it for connected."""
    plain, under, text = scripted(CONNECTPENDING, tmp_path)
    assert "poll for POLLOUT within 300 ms: 0" in plain.stdout, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stderr
    settle(fabric)


DEFERRED = r"""
import socket, sys, time
role, port, when = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if role == "server":
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if when == "before":
        l.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, 30)
    l.bind(("127.0.0.1", port))
    l.listen(16)
    if when in ("after", "cleared"):
        l.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, 30)
    if when == "cleared":  # pgbouncer's RELOAD with tcp_defer_accept = 0
        l.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, 0)
    if when == "raw":  # past libc's setsockopt, so memlan does not see it
        import ctypes, platform
        nr = {"x86_64": 54, "aarch64": 208}[platform.machine()]
        v = ctypes.c_int(30)
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.syscall(nr, l.fileno(), socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT,
                            ctypes.byref(v), 4) == 0
    print("ready", l.getsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT) > 0, flush=True)
    for i in range(3):
        a, _ = l.accept()
        a.sendall(a.recv(100).upper())
        a.close()
else:
    for i in range(3):
        t0 = time.monotonic()
        c = socket.create_connection(("127.0.0.1", port))
        c.sendall(b"ping %d" % i)
        r = c.recv(100)
        print(r.decode(), time.monotonic() - t0 < 1.0)
"""


def deferred_round(pre, py, script, port, when):
    """One server and one client of the DEFERRED script on port (pre: the memlan run prefix, or
    none): the client's output."""
    srv = subprocess.Popen(pre + [py, str(script), "server", str(port), when],
                           stdout=subprocess.PIPE, text=True)
    try:
        assert srv.stdout.readline().strip() == "ready %s" % (when not in ("none", "cleared"))
        cli = subprocess.run(pre + [py, str(script), "client", str(port), when],
                             capture_output=True, text=True, timeout=60)
        assert srv.wait(timeout=30) == 0 and cli.returncode == 0, cli.stderr
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()
    return cli.stdout


@pytest.mark.parametrize("when", ["before", "after", "raw", "none", "cleared"])
def test_deferred_accept_listener_does_not_hold_memlan_clients(fabric, tmp_path, when):
    """A listener with TCP_DEFER_ACCEPT (Apache's default on Linux, nginx's "deferred") gets a
    connection from the kernel only once TCP data has come; a memlan client's data goes into the
    ring.  Each client used to wait its MEMLAN_ACCEPT_WAIT_MS (2 s) and then go over TCP.  Now
    clients of such a port stay on TCP from the start, with the reason, and are as quick as
    without memlan; a listener without the option still accelerates.  Set by a raw system call,
    the option is not seen: then the client finds its handshake held open by the server's
    kernel (sock_diag, 200 ms after its offer, bytes waiting) and sends them over TCP, as it does
    when a full accept queue dropped its last ACK.  Set and then cleared again (pgbouncer does
    so at every RELOAD when told tcp_defer_accept = 0), the port accelerates again: its mark
    stayed, and every later client stayed on TCP."""
    import platform
    if when == "raw" and platform.machine() not in ("x86_64", "aarch64"):
        pytest.skip("the raw setsockopt's system call number is known for x86-64 and arm64 only")
    script = tmp_path / "deferred.py"
    script.write_text(DEFERRED)
    py = PY
    outs = {}
    for under in (False, True):
        port = next_port()
        log = tmp_path / f"deferred-{under}.log"
        pre = [str(MEMLAN), "run", "--log", str(log), "--"] if under else []
        outs[under] = deferred_round(pre, py, script, port, when)
    want = "".join("PING %d True\n" % i for i in range(3))
    assert outs[False] == want and outs[True] == want, outs
    text = log.read_text()
    assert "MEMLAN_ACCEPT_WAIT_MS" not in text, text
    if when in ("none", "cleared"):
        assert text.count("accelerated (client)") == 3, text
    elif when == "raw":
        assert text.count("TCP (the server's kernel held the handshake open: only TCP data "
                          "completes it)") == 3, text
        assert "accelerated" not in text, text
    else:
        assert text.count("TCP (the server's listener defers accept until data "
                          "(TCP_DEFER_ACCEPT))") == 6, text
        assert "accelerated" not in text, text
    settle(fabric)


DEAD_DEFERRED = r"""
import os, signal, socket, sys
port, how = int(sys.argv[1]), sys.argv[2]
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, 30)
l.bind(("127.0.0.1", port))
l.listen(16)
print("ready", flush=True)
if how == "exit":
    os._exit(0)  # as tinyproxy and squid -N stop: the listener is never closed
signal.pause()   # "kill": SIGKILL
"""


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_a_dead_listeners_record_is_not_the_next_ones(fabric, tmp_path, how):
    """A listener with TCP_DEFER_ACCEPT that exits without closing it (exit(), SIGKILL) leaves
    its port's record in the fabric with no_offer set; the next server on the port, without the
    option, used to take the record over as it was: every client stayed on TCP, "the server's
    listener defers accept until data", until a `memlan clean` (found with tinyproxy restarted
    after its Group was changed to the fabric's: "a server process changed its credentials").
    Now the next listener removes it: it names the dead listener's socket, which the kernel no
    longer lists (test_a_live_listener_holding_no_lock_keeps_its_record: a live one is kept)."""
    dead, script = tmp_path / "dead.py", tmp_path / "deferred.py"
    dead.write_text(DEAD_DEFERRED)
    script.write_text(DEFERRED)
    py = PY
    port = next_port()
    log = tmp_path / "restart.log"
    pre = [str(MEMLAN), "run", "--log", str(log), "--"]
    first = subprocess.Popen(pre + [py, str(dead), str(port), how], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert first.stdout.readline().strip() == "ready"
        if how == "kill":
            first.kill()
        assert first.wait(timeout=30) in (0, -signal.SIGKILL)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert "TCP_DEFER_ACCEPT set" in log.read_text(), log.read_text()
    out = deferred_round(pre, py, script, port, "none")
    assert out == "".join("PING %d True\n" % i for i in range(3)), out
    text = log.read_text()
    assert "defers accept until data" not in text, text
    assert text.count("accelerated (client)") == 3, text
    settle(fabric)


def test_a_clients_sweep_removes_a_dead_listeners_record(fabric, tmp_path):
    """The fabric's lazy sweep (a process's first offer) removes what dead processes left,
    listener records included: one whose listener exited without closing goes at the next
    client's sweep, though nothing listens on its port again.  A record now names its sockets,
    and a sweep that would not ask the kernel which of them listen kept every such record (a
    review of 07d2978: records of ports never used again piled up in /dev/shm until a
    `memlan clean`); a client outside a sandbox asks."""
    dead, script = tmp_path / "dead.py", tmp_path / "deferred.py"
    dead.write_text(DEAD_DEFERRED)
    script.write_text(DEFERRED)
    pre = [str(MEMLAN), "run", "--"]
    gone_port = next_port()
    first = subprocess.Popen(pre + [PY, str(dead), str(gone_port), "exit"],
                             stdout=subprocess.PIPE, text=True)
    assert first.stdout.readline().strip() == "ready"
    assert first.wait(timeout=30) == 0
    rec = fabric / ("ls-%x-%d" % (os.stat("/proc/self/ns/net").st_ino, gone_port))
    assert rec.exists()
    out = deferred_round(pre, PY, script, next_port(), "none")
    assert out == "".join("PING %d True\n" % i for i in range(3)), out
    assert not rec.exists(), "a dead listener's record outlived a client's sweep"
    settle(fabric)


def layout_offset(expr, tmp_path):
    """A C expression over memlan/layout.h (an offsetof, a sizeof), from the header."""
    src = tmp_path / "off.c"
    src.write_text('#include <stdio.h>\n#include <stddef.h>\n#include "memlan/layout.h"\n'
                   'int main(void) { printf("%%zu\\n", (size_t)(%s)); }\n' % expr)
    subprocess.run(["cc", "-I", str(ROOT / "include"), "-o", str(tmp_path / "off"), str(src)],
                   check=True, timeout=60)
    return int(subprocess.run([str(tmp_path / "off")], capture_output=True, text=True,
                              check=True).stdout)


@pytest.mark.parametrize("then", ["clean", "next"])
def test_a_dead_listeners_record_forged_full_still_goes(fabric, tmp_path, then):
    """A dead listener's record whose lsock_full another member of the fabric wrote (the chaos
    suite's vandal did): `memlan clean` removes it ("clean"), and so does the next listener on
    the port ("next"), since nothing listens on the port any more.  Before, a record whose slots
    could not tell was kept as unknown, for ever: "A's or B's files left after clean:
    ['ls-...']" (make test's chaos), and the next server's clients read the dead one's
    TCP_DEFER_ACCEPT ("defers accept until data")."""
    dead, script = tmp_path / "dead.py", tmp_path / "deferred.py"
    dead.write_text(DEAD_DEFERRED)
    script.write_text(DEFERRED)
    port = next_port()
    log = tmp_path / "restart.log"
    pre = [str(MEMLAN), "run", "--log", str(log), "--"]
    first = subprocess.Popen(pre + [PY, str(dead), str(port), "exit"], stdout=subprocess.PIPE,
                             text=True)
    assert first.stdout.readline().strip() == "ready"
    assert first.wait(timeout=30) == 0
    rec = fabric / ("ls-%x-%d" % (os.stat("/proc/self/ns/net").st_ino, port))
    off = layout_offset("offsetof(struct ml_listen_rec, lsock_full)", tmp_path)
    with open(rec, "r+b") as f:  # the vandal's write
        f.seek(off)
        f.write((1).to_bytes(4, "little"))
    if then == "clean":
        p = subprocess.run([str(MEMLAN), "clean"], capture_output=True, text=True, timeout=30)
        assert p.returncode == 0, p.stderr
        assert not rec.exists(), p.stdout + p.stderr
    else:
        out = deferred_round(pre, PY, script, port, "none")
        assert out == "".join("PING %d True\n" % i for i in range(3)), out
        text = log.read_text()
        assert "defers accept until data" not in text, text
        assert text.count("accelerated (client)") == 3, text
    settle(fabric)


BROKEN_WORD_CLIENT = r"""
import glob, os, socket, sys, time
port, fab, off = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
s = socket.create_connection(("127.0.0.1", port))
s.sendall(b"precious-bytes!")
time.sleep(0.05)
offer = glob.glob(fab + "/cx-*")[0]  # the offer's name is a link to the channel's file
fd = os.open(offer, os.O_RDWR)
os.pwrite(fd, (7).to_bytes(4, "little"), off)  # garbage in the attach word
os.close(fd)
s.close()
"""

LATE_SERVER = r"""
import socket, sys, time
l = socket.socket()
l.bind(("127.0.0.1", 0))
l.listen(4)
print(l.getsockname()[1], flush=True)
time.sleep(0.5)  # accepts after the client closed
c, _ = l.accept()
data = b""
while True:
    d = c.recv(65536)
    if not d:
        break
    data += d
print(data.decode(), flush=True)
"""


def test_a_close_over_a_broken_attach_word_sends_the_rings_bytes(fabric, tmp_path):
    """A client writes, then closes before its server accepts, its channel's attach word
    overwritten with garbage meanwhile (written by no attacher: nobody can attach any more):
    the server reads the bytes over TCP, as it reads them over kernel TCP.  Before, that close
    took the broken word for a claim and kept the bytes in the ring, and the server read
    end-of-file (a review's reproduction)."""
    off = layout_offset("sizeof(struct ml_seg_hdr) + offsetof(struct ml_chan_hdr, attached)",
                        tmp_path)
    (tmp_path / "c.py").write_text(BROKEN_WORD_CLIENT)
    (tmp_path / "s.py").write_text(LATE_SERVER)
    log = tmp_path / "b.log"
    pre = [str(MEMLAN), "run", "--log", str(log), "--"]
    srv = subprocess.Popen(pre + [PY, str(tmp_path / "s.py")], stdout=subprocess.PIPE, text=True)
    try:
        port = srv.stdout.readline().strip()
        subprocess.run(pre + [PY, str(tmp_path / "c.py"), port, str(fabric), str(off)],
                       check=True, timeout=30)
        out = srv.stdout.readline().strip()
        assert srv.wait(timeout=30) == 0
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()
    assert out == "precious-bytes!", (out, log.read_text())
    settle(fabric)


LOCKLESS = r"""
import os, socket, sys
role, port, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def listener():
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    l.bind(("127.0.0.1", port))
    l.listen(8)
    return l
if role == "maker":      # publishes, hands its listener on, dies without closing it
    u = socket.socket(socket.AF_UNIX)
    u.bind(path)
    u.listen(1)
    print("ready", flush=True)
    c, _ = u.accept()
    l = listener()
    socket.send_fds(c, [b"L"], [l.fileno()])
    c.recv(1)
    os._exit(0)
if role == "holder":     # holds the listener, never publishes it (no accept, no fork)
    u = socket.socket(socket.AF_UNIX)
    u.connect(path)
    _, fds, _, _ = socket.recv_fds(u, 1, 1)
    u.send(b"k")
    print("holding", fds[0], flush=True)
else:                    # "next": a listener of its own on the port
    l = listener()
    print("listening", flush=True)
sys.stdin.readline()
os._exit(0)
"""


def test_a_live_listener_holding_no_lock_keeps_its_record(fabric, tmp_path):
    """A port's record is removed by the next listener when the listeners that published it
    all died without closing, and only then.  Its lock cannot tell alone: a live listener need
    not hold it (haproxy's re-executed master gets its listeners over SCM_RIGHTS while the old
    worker serves them).  Here the maker publishes, passes its listening socket to a holder that
    never publishes, and exits without closing: nobody holds the record's lock.  A new listener
    on the port (SO_REUSEPORT) keeps the record, whose socket still listens in the holder; when
    the holder and that listener are gone too, the next listener removes it and makes its own.
    (ec75050, which removed every unlocked record, fails the first; the code before it, which
    removed none, the second.)"""
    script = tmp_path / "lockless.py"
    script.write_text(LOCKLESS)
    port = next_port()
    log = tmp_path / "lockless.log"
    pre = [str(MEMLAN), "run", "--log", str(log), "--", PY, str(script)]
    path = str(tmp_path / "pass.sock")
    rec = fabric / ("ls-%x-%d" % (os.stat("/proc/self/ns/net").st_ino, port))
    procs = []

    def start(role, want):
        p = subprocess.Popen(pre + [role, str(port), path], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        procs.append(p)
        line = p.stdout.readline()
        assert line.startswith(want), line
        return p

    def stop(p):
        p.stdin.write("\n")
        p.stdin.close()
        assert p.wait(timeout=30) == 0

    try:
        maker = start("maker", "ready")
        holder = start("holder", "holding")
        assert maker.wait(timeout=30) == 0
        ino = rec.stat().st_ino
        nxt = start("next", "listening")
        assert rec.stat().st_ino == ino, "a record whose socket still listens was removed"
        assert "dead listeners left" not in log.read_text(), log.read_text()
        stop(holder)
        stop(nxt)
        assert rec.exists() and rec.stat().st_ino == ino  # all died without closing
        last = start("next", "listening")
        assert rec.stat().st_ino != ino, "the dead listeners' record was taken over"
        assert log.read_text().count("the record its dead listeners left") == 1, log.read_text()
        stop(last)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    settle(fabric)


# The scripted servers' start: listen on 127.0.0.1:port, say "ready", take one connection.
ACCEPT_ONE = r"""
import socket
def accept_one(port):
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind(("127.0.0.1", port))
    l.listen(4)
    print("ready", flush=True)
    return l, l.accept()[0]
"""

BLIND_EXEC_SERVER = ACCEPT_ONE + r"""
import os, sys
port, prog, order = int(sys.argv[1]), sys.argv[2], sys.argv[3]
l, c = accept_one(port)
r, w = os.pipe()
pid = os.fork()
if pid == 0:  # inetd's way (socat EXEC:): the connection on 0 and 1, then the program
    os.close(r if order == "shared" else w)
    if order == "last":
        os.read(r, 1)  # the parent has closed its copy: the exec is the last holder's
    os.dup2(c.fileno(), 0)
    os.dup2(c.fileno(), 1)
    argv = prog.split(" ")  # "LOADER PROGRAM": the dynamic loader runs the program
    if sys.argv[4:] == ["emptied"]:  # the program's environment leaves LD_PRELOAD empty
        os.execve(argv[0], argv, dict(os.environ, LD_PRELOAD=""))
    os.execv(argv[0], argv)  # "shared": w is close-on-exec, its end tells the parent
os.close(w if order == "shared" else r)
if order == "shared":
    os.read(r, 1)  # end of file: the child has exec'd, holding the connection with us
c.close()
if order == "last":
    os.write(w, b"x")
_, st = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(st), flush=True)
"""

BLIND_EXEC_CLIENT = r"""
import errno, socket, sys
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
c.settimeout(10)
c.sendall(b"hello\n")
try:
    got = c.recv(100)
    print("got", repr(got), flush=True)
except socket.timeout:
    print("timeout", flush=True)
except OSError as e:
    print("error", errno.errorcode[e.errno], flush=True)
"""

UPPER_C = r"""
#include <ctype.h>
#include <unistd.h>
int main(void)
{
    char b[100];
    ssize_t n = read(0, b, sizeof b);
    if (n <= 0)
        return 3;
    for (ssize_t i = 0; i < n; i++)
        b[i] = (char)toupper((unsigned char)b[i]);
    return write(1, b, (size_t)n) == n ? 0 : 4;
}
"""


@pytest.mark.parametrize("order", ["last", "shared"])
@pytest.mark.parametrize("prog", ["static", "setuid", "loader", "emptied"])
def test_a_connection_exec_cannot_carry_ends_instead_of_hanging(fabric, tmp_path, prog, order):
    """A server hands an accepted connection to a program it execs (inetd's way, socat's
    `EXEC:`), and that program runs without memlan: statically linked (a Go program too), or
    set-user-ID for another user (secure execution: the dynamic linker ignores LD_PRELOAD).
    Over kernel TCP it answers.  Under memlan the connection was carried to an image that could
    not take it up: the carried bridge kept the side alive to the peer, the client waited for
    ever for an answer and the program for its request.  No byte can follow such an exec (they
    are in the rings), so the connection now ends at it, with the reason in the log: the
    client reads the end of the stream (or a reset) within seconds, and the program the end of
    file.  order "last": the server closed its copy first, and the exec, the last holder's,
    shuts the connection down; "shared": the server closes its copy after the exec, which only
    gave this process's hold back, and that close ends it.  prog "loader": a dynamic program
    started through the dynamic loader (`ld.so PROGRAM`, as bundling launchers do), which has
    no interpreter of its own but honours LD_PRELOAD: the connection follows it, as over TCP.
    prog "emptied": a dynamic program whose environment the server gives LD_PRELOAD="" (the
    exec's environment was not judged: the connection was carried to nothing)."""
    src = tmp_path / "upper.c"
    src.write_text(UPPER_C)
    exe = tmp_path / "upper"
    if prog == "static":
        if subprocess.run(["cc", "-static", "-o", str(exe), str(src)]).returncode != 0:
            pytest.skip("no static C library")
    elif prog == "emptied":
        subprocess.run(["cc", "-o", str(exe), str(src)], check=True)
    elif prog == "loader":
        subprocess.run(["cc", "-o", str(exe), str(src)], check=True)
        interp = subprocess.run(["readelf", "-l", str(exe)], capture_output=True, text=True)
        m = re.search(r"interpreter: (\S+)\]", interp.stdout)
        if not m:
            pytest.skip("no program interpreter found")
        exe = f"{m.group(1)} {exe}"
    else:
        if os.geteuid() != 0:
            pytest.skip("needs root, to make a set-user-ID program of another user")
        subprocess.run(["cc", "-o", str(exe), str(src)], check=True)
        os.chown(exe, 65534, 65534)
        os.chmod(exe, 0o4755)
        os.chmod(tmp_path, 0o755)
        if os.statvfs(exe).f_flag & os.ST_NOSUID:
            pytest.skip("the test directory is on a nosuid mount")
    srv_py, cli_py = tmp_path / "srv.py", tmp_path / "cli.py"
    srv_py.write_text(BLIND_EXEC_SERVER)
    cli_py.write_text(BLIND_EXEC_CLIENT)
    outs = {}
    log = tmp_path / "blind.log"
    for under in (False, True):
        port = next_port()
        pre = [str(MEMLAN), "run", "--log", str(log), "--"] if under else []
        srv = subprocess.Popen(pre + [PY, str(srv_py), str(port), str(exe), order] +
                               (["emptied"] if prog == "emptied" else []),
                               stdout=subprocess.PIPE, text=True)
        cli = None
        try:
            assert srv.stdout.readline().strip() == "ready"
            t0 = time.monotonic()
            cli = subprocess.run(pre + [PY, str(cli_py), str(port)], capture_output=True,
                                 text=True, timeout=30)
            took = time.monotonic() - t0
            outs[under] = (cli.stdout.strip(), srv.stdout.readline().strip())
        finally:
            if srv.poll() is None:
                srv.kill()
            srv.wait()
    assert outs[False] == ("got b'HELLO\\n'", "child 0"), outs
    text = log.read_text()
    if prog == "loader":
        assert outs[True] == outs[False], outs
        assert "cannot follow" not in text and "accelerated" in text, text
        settle(fabric)
        return
    said, child = outs[True]
    # the request cannot reach the program: the client reads the end instead of waiting
    assert said in ("got b''", "error ECONNRESET"), outs
    assert took < 8, took
    assert child == "child 3", outs  # the program read the end of file, not a hang
    assert f"cannot follow the exec of {exe}" in text, text
    assert {"static": "statically linked", "setuid": "set-user-ID",
            "emptied": "the LD_PRELOAD it is given leaves memlan out"}[prog] in text, text
    assert ("shut down before it" if order == "last" else "stays with the other processes") \
        in text, text
    settle(fabric)


def server_and_client(script, log, *args):
    """script's server (it prints "ready" once it listens) and client, plain then both under
    memlan: {under: server's lines + client's lines}; both must exit 0, the server saying
    nothing on stderr."""
    outs = {}
    for under in (False, True):
        port = next_port()
        pre = [str(MEMLAN), "run", "--log", str(log), "--"] if under else []
        srv = subprocess.Popen(pre + [PY, str(script), "server", str(port), *args],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert srv.stdout.readline().strip() == "ready"
            cli = subprocess.Popen(pre + [PY, str(script), "client", str(port), *args],
                                   stdout=subprocess.PIPE, text=True)
            out, err = srv.communicate(timeout=30)
            assert srv.returncode == 0 and err == "", (under, out, err)
            outs[under] = out.splitlines() + cli.communicate(timeout=30)[0].splitlines()
            assert cli.returncode == 0
        finally:
            if srv.poll() is None:
                srv.kill()
                srv.wait()
    return outs


# A client writes its request to a server that never accepts, and the server's listener goes
# (closed, or the server dies): the kernel resets the queued connection.
RESET_UNACCEPTED = r"""
import errno, os, signal, socket, sys, time
role, port, how = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if role == "server":
    ls = socket.create_server(("127.0.0.1", port))
    print("ready", flush=True)
    time.sleep(1)  # the client's request is written meanwhile
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    ls.close()
    time.sleep(1)
else:
    c = socket.create_connection(("127.0.0.1", port))
    c.sendall(b"GET / HTTP/1.0\r\n\r\n")
    c.settimeout(10)
    out = []
    for call in ("recv", "send", "recv"):
        try:
            r = c.recv(100) if call == "recv" else c.send(b"x", socket.MSG_NOSIGNAL)
            out.append("%s %r" % (call, r))
        except OSError as e:
            out.append("%s %s" % (call, errno.errorcode.get(e.errno, e.errno)))
    print(" ".join(out), flush=True)
"""


@pytest.mark.parametrize("how", ["close", "kill"])
def test_a_request_reset_before_the_accept_reads_econnreset(fabric, tmp_path, how):
    """A client that wrote its request to a server that then closes its listener without
    accepting (or dies) reads ECONNRESET over kernel TCP: the reset drops the request.  Under
    memlan the request was in the ring, and the fall to TCP sent it after the reset had come:
    that send took the reset's error, and the read said end of file (Node's 'end' where TCP
    says ECONNRESET, curl's "Empty reply from server": an explorer).  Now the bytes are dropped
    with the connection, the error left for the program's calls."""
    script = tmp_path / "reset.py"
    script.write_text(RESET_UNACCEPTED)
    log = tmp_path / "reset.log"
    outs = {}
    for under in (False, True):
        port = next_port()
        pre = [str(MEMLAN), "run", "--log", str(log), "--"] if under else []
        srv = subprocess.Popen(pre + [PY, str(script), "server", str(port), how],
                               stdout=subprocess.PIPE, text=True)
        try:
            assert srv.stdout.readline().strip() == "ready"
            cli = subprocess.run(pre + [PY, str(script), "client", str(port), how],
                                 capture_output=True, text=True, timeout=30)
            outs[under] = cli.stdout.strip()
        finally:
            if srv.poll() is None:
                srv.kill()
            srv.wait()
    assert outs[False] == "recv ECONNRESET send EPIPE recv b''", outs
    assert outs[True] == outs[False], (outs, log.read_text()[-3000:])
    assert "dropped with it" in log.read_text(), log.read_text()
    settle(fabric)


# FTP's active mode, vsftpd's way: the server connects to the client's data port from a chroot
# (no /proc), and the client accepts only once the server's reply on the control connection says
# that the connect went through, which the server sends once its nonblocking connect is writable.
CHROOT_CONNECT = ACCEPT_ONE + r"""
import os, select, sys
role, port, root = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if role == "server":
    l, c = accept_one(port)
    dport = int(c.recv(100).split()[1])
    os.chroot(root)
    os.chdir("/")
    d = socket.socket()
    d.setblocking(False)
    try:
        d.connect(("127.0.0.1", dport))
    except BlockingIOError:
        pass
    _, w, _ = select.select([], [d], [], 5)
    print("writable", bool(w), flush=True)
    c.sendall(b"150 here it comes\n" if w else b"425 no\n")
    if w:
        d.setblocking(True)
        d.sendall(b"hello from the chroot")
    d.close()
    c.recv(100)
else:
    dl = socket.socket()
    dl.bind(("127.0.0.1", 0))
    dl.listen(1)
    c = socket.create_connection(("127.0.0.1", port))
    c.sendall(b"PORT %d\n" % dl.getsockname()[1])
    reply = c.recv(100)
    print("reply", reply[:3], flush=True)
    if reply.startswith(b"150"):
        d = dl.accept()[0]
        got = b""
        while True:
            b = d.recv(100)
            if not b:
                break
            got += b
        print("data", got, flush=True)
    c.close()
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="chroot needs root")
def test_a_connect_from_a_chroot_is_writable_before_the_accept(fabric, tmp_path):
    """A client whose /proc is out of reach (a chroot, as vsftpd's session; a container's
    /proc) could not read how much the kernel's buffers take before an accept, and its offer
    was given no room at all: its nonblocking connect never turned writable and its sends
    waited for the server's accept.  vsftpd's active mode (it connects from its chroot, and
    the ftp client accepts only after the 150 that vsftpd sends once the connect is writable)
    waited out MEMLAN_ACCEPT_QUEUE_MS, 60 s, per transfer (an explorer).  The offer now has its
    ring, as before rings grew: writable at once, as over TCP."""
    script = tmp_path / "chroot.py"
    script.write_text(CHROOT_CONNECT)
    root = tmp_path / "empty"
    root.mkdir()
    log = tmp_path / "chroot.log"
    outs = server_and_client(script, log, str(root))
    assert outs[False] == ["writable True", "reply b'150'",
                           "data b'hello from the chroot'"], outs
    assert outs[True] == outs[False], (outs, log.read_text()[-3000:])
    assert "accelerated (accepted" in log.read_text(), log.read_text()
    settle(fabric)


POLL_IN, SI_KERNEL = 1, 0x80  # si_codes of a SIGIO (asm-generic/siginfo.h)

ASYNC_IO = ACCEPT_ONE + r"""
import fcntl, os, signal, sys, termios, time
role, port, how, case = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
SIG = signal.SIGRTMIN + 2 if case == "setsig" else signal.SIGIO
def wait_sig(t):
    got = signal.sigtimedwait([SIG], t)
    return "none" if got is None else "sig %d code %d" % (got.si_signo - SIG, got.si_code)
def set_async(c, on):
    if how == "fcntl":
        fl = fcntl.fcntl(c, fcntl.F_GETFL)
        fcntl.fcntl(c, fcntl.F_SETFL, (fl | os.O_ASYNC) if on else (fl & ~os.O_ASYNC))
    else:
        fcntl.ioctl(c, termios.FIOASYNC, (1 if on else 0).to_bytes(4, sys.byteorder))
if role == "server":
    l, c = accept_one(port)
    signal.pthread_sigmask(signal.SIG_BLOCK, [SIG])
    if case not in ("owner-late", "ioctl-owner"):
        fcntl.fcntl(c, fcntl.F_SETOWN, os.getpid())
    if case == "setsig":
        fcntl.fcntl(c, 10, SIG)  # F_SETSIG
    set_async(c, True)
    if case == "ioctl-owner":  # FIOSETOWN, F_SETOWN's ioctl, once O_ASYNC is on
        fcntl.ioctl(c, 0x8901, os.getpid().to_bytes(4, sys.byteorder))
    if case == "owner-late":  # no owner yet: no signal; then one
        c.sendall(b"go")
        print("before owner", wait_sig(0.5), c.recv(10).decode(), flush=True)
        fcntl.fcntl(c, fcntl.F_SETOWN, os.getpid())
    c.sendall(b"go")
    # one signal for one send: F_SETSIG's real-time ones queue, each counted (two came once)
    print("data", wait_sig(5), wait_sig(0.3), c.recv(10).decode(), flush=True)
    if case == "exec-child":  # another image holds the socket a while (system(), inetd)
        import subprocess
        child = ("import socket, sys, time\n"  # it takes the connection up, then leaves
                 "s = socket.socket(fileno=int(sys.argv[1])); s.setblocking(False)\n"
                 "try: s.recv(1, socket.MSG_PEEK)\n"
                 "except BlockingIOError: pass\n"
                 "time.sleep(1); s.detach()\n")
        p = subprocess.Popen([sys.executable, "-c", child, str(c.fileno())],
                             pass_fds=[c.fileno()])
        time.sleep(0.5)
        c.sendall(b"go")
        print("the child there", wait_sig(5), c.recv(10).decode(), flush=True)
        assert p.wait() == 0
        for r in ("after the child", "again"):
            c.sendall(b"go")
            print(r, wait_sig(5), c.recv(10).decode(), flush=True)
    if case == "poll-asleep":  # a poll asleep on the socket: the signal comes too
        import select
        c.sendall(b"go")
        p = select.poll()
        p.register(c, select.POLLIN)
        print("poll", p.poll(5000) != [], wait_sig(1), c.recv(10).decode(), flush=True)
    if case == "recv-blocked":  # a receive asleep on the socket takes the bytes: no signal
        runs = []
        signal.signal(SIG, lambda *a: runs.append(1))
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [SIG])
        c.sendall(b"go")
        print("blocked recv", c.recv(10).decode(), "handler runs", len(runs), flush=True)
    if case == "cleared":
        set_async(c, False)
        c.sendall(b"go")
        print("cleared", wait_sig(0.5), c.recv(10).decode(), flush=True)
    if case == "end":  # the peer's end raises it too, then reads end of file
        c.sendall(b"go")
        print("end", wait_sig(5), c.recv(10), flush=True)
    if case.startswith("room"):  # a writer that waits for SIGIO once its socket is full
        c.setblocking(False)
        n = 0
        try:
            while n < 256 << 20:
                n += c.send(b"x" * 65536)
        except BlockingIOError:
            pass
        if case == "room-little":  # a read of 1000 bytes makes no room worth a signal
            print("little", wait_sig(1.2), flush=True)
        # (room-part: its reader pauses after a quarter; the signal must come before it reads on)
        print("full", n < 256 << 20, "room", wait_sig(2.5 if case == "room-part" else 5),
              flush=True)
        c.setblocking(True)
        c.sendall(b"END")
    c.close()
else:
    c = socket.create_connection(("127.0.0.1", port))
    rounds = {"owner-late": 2, "cleared": 2, "exec-child": 4, "recv-blocked": 2,
              "poll-asleep": 2}.get(case, 1)
    for i in range(rounds):
        assert c.recv(2) == b"go"
        if case in ("recv-blocked", "poll-asleep") and i == 1:
            time.sleep(0.3)  # the server sleeps in recv first
        c.sendall(b"ping%d" % i)
    if case == "end":
        assert c.recv(2) == b"go"
        time.sleep(0.3)
        c.close()
    elif case.startswith("room"):
        time.sleep(0.5)  # the server fills its socket first
        got = bytearray()
        if case == "room-little":
            got += c.recv(1000)
            time.sleep(1.5)
        if case == "room-part":  # a quarter of what it holds, then a pause: room enough
            while len(got) < 1 << 20:
                got += c.recv((1 << 20) - len(got))
            time.sleep(3)
        while not got.endswith(b"END"):
            b = c.recv(1 << 20)
            assert b
            got += b
        print("client read", got[:-3].strip(b"x") == b"", flush=True)
    else:
        c.recv(1)
"""


@pytest.mark.parametrize("how,case", [("fcntl", "plain"), ("ioctl", "plain"),
                                      ("fcntl", "setsig"), ("fcntl", "owner-late"),
                                      ("fcntl", "cleared"), ("ioctl", "cleared"),
                                      ("fcntl", "end"), ("fcntl", "ioctl-owner"),
                                      ("fcntl", "exec-child"), ("ioctl", "recv-blocked"),
                                      ("fcntl", "poll-asleep"), ("fcntl", "room"),
                                      ("fcntl", "room-little"), ("fcntl", "room-part")])
def test_o_async_raises_sigio_for_a_channels_bytes(fabric, tmp_path, how, case):
    """A program that asks for SIGIO on an accepted connection (O_ASYNC through fcntl F_SETFL or
    ioctl FIOASYNC) and waits for the signal before it reads gets it from the kernel when the
    bytes come over TCP.  An accelerated connection's bytes never reach the kernel socket: no
    SIGIO came, and the program waited for ever (gdbserver's interrupt).  The channel carries it
    now (design.md, "SIGIO"): the same signals, with the same si_code, as kernel TCP: F_SETSIG's
    signal, none before an owner is set, none once O_ASYNC is cleared, one for the peer's end,
    an owner set by ioctl (FIOSETOWN), after another image held the socket a while (each image
    made its own FIFO under the same name, and the first's was left unrung: a review), none for
    a receive asleep on the socket (the kernel's sk_wait_data holds it back; memlan's signal
    made Python's recv run the handler: a review), but one for a poll asleep on it (a version
    that held it back for any sleeper sent none: a review), and one when room comes to a writer
    whose nonblocking send found the socket full (POLL_OUT's; none came, and a writer that waits
    for it waited for ever), but not for a little room (one at each of the reader's releases: a
    review), and for a quarter of a grown ring read (the signal waited for all but 128 KiB: the
    second review)."""
    script = tmp_path / "async.py"
    script.write_text(ASYNC_IO)
    log = tmp_path / "async.log"
    outs = server_and_client(script, log, how, case)
    assert outs[True] == outs[False], outs
    # what the kernel does: F_SETSIG's signal carries POLL_IN, plain SIGIO SI_KERNEL
    code = POLL_IN if case == "setsig" else SI_KERNEL
    n = 1 if case == "owner-late" else 0
    assert f"data sig 0 code {code} none ping{n}" in outs[False], outs
    text = log.read_text()
    assert "accelerated (accepted" in text and "raised through its FIFO" in text, text
    assert "O_ASYNC asks for SIGIO" not in text, text
    if case == "setsig":
        assert "si_fd names memlan's descriptor" in text, text
    settle(fabric)
    assert not list(fabric.glob("sio*")), list(fabric.iterdir())  # the FIFO went with the socket


URG_SIG = ACCEPT_ONE + r"""
import fcntl, os, signal, sys, time
role, port, case = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def wait_sig(t):
    got = signal.sigtimedwait([signal.SIGURG], t)
    return "none" if got is None else "sigurg"
if role == "server":
    l, c = accept_one(port)
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGURG])
    if case == "inline":
        c.setsockopt(socket.SOL_SOCKET, socket.SO_OOBINLINE, 1)
    if case != "no-owner":
        fcntl.fcntl(c, fcntl.F_SETOWN, -os.getpgrp() if case == "pgrp" else os.getpid())
    c.sendall(b"go")
    print("first", wait_sig(5 if case != "no-owner" else 0.5), flush=True)
    if case == "inline":
        print("read", c.recv(10), flush=True)
    else:
        print("read", c.recv(10), c.recv(1, socket.MSG_OOB), flush=True)
    c.sendall(b"go")
    print("second", wait_sig(5 if case != "no-owner" else 0.5), c.recv(10), flush=True)
    if case == "owner-dropped":  # no owner: no signal
        fcntl.fcntl(c, fcntl.F_SETOWN, 0)
        c.sendall(b"go")
        print("third", wait_sig(0.5), c.recv(10), flush=True)
else:
    c = socket.create_connection(("127.0.0.1", port))
    rounds = 3 if case == "owner-dropped" else 2
    for i in range(rounds):
        assert c.recv(2) == b"go"
        c.send(b"ab%d!" % i, socket.MSG_OOB)
    try:  # an urgent byte left unread makes the server's close a reset, over TCP too
        print(c.recv(1), flush=True)
    except ConnectionResetError:
        print("reset", flush=True)
"""


@pytest.mark.parametrize("case", ["owner", "pgrp", "inline", "no-owner", "owner-dropped"])
def test_urgent_data_raises_sigurg_for_the_owner(fabric, tmp_path, case):
    """A socket with an owner (F_SETOWN) gets SIGURG from the kernel when TCP's urgent pointer
    comes: vsftpd learns of an ABOR during a transfer so.  A channel's urgent byte never reaches
    the kernel socket, so no SIGURG came, and vsftpd's transfer ran to its end before the ABOR
    was read (an explorer).  Now the owner's side makes a FIFO with SIGURG as its signal, which
    the peer's urgent send rings (design.md, "SIGIO"): the signal comes as over TCP, for an owner
    process or group, in line or not, and none without an owner."""
    script = tmp_path / "urg.py"
    script.write_text(URG_SIG)
    log = tmp_path / "urg.log"
    outs = server_and_client(script, log, case)
    assert outs[True] == outs[False], outs
    want = "none" if case == "no-owner" else "sigurg"
    assert outs[False][0] == f"first {want}", outs  # what the kernel does
    text = log.read_text()
    assert "accelerated (accepted" in text and "could not be made" not in text, text
    settle(fabric)
    assert not [p for p in fabric.iterdir() if p.name.startswith(("sio", "urg"))], \
        list(fabric.iterdir())  # the FIFO went with the socket


STDIO_CHAIN = r"""
import hashlib, os, socket, subprocess, sys
role, port = sys.argv[1], int(sys.argv[2])
if role == "server":   # a daemon with 0, 1 and 2 closed: the accepted socket lands on fd 0
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind(("127.0.0.1", port))
    l.listen(4)
    out = os.fdopen(os.dup(1), "w")
    print("ready", file=out, flush=True)
    devnull = os.open(os.devnull, os.O_RDWR)
    for n in (0, 1, 2):
        os.close(n)
    c, _ = l.accept()
    # stdout=0 is a stdio slot: CPython's child dup()s it away before its dup2 onto 1 (a chain)
    r = subprocess.run(["cat"], stdin=c, stdout=c, stderr=devnull)
    print("server", c.fileno(), r.returncode, file=out, flush=True)
else:
    data = os.urandom(100000)
    c = socket.create_connection(("127.0.0.1", port))
    c.sendall(data)
    c.shutdown(socket.SHUT_WR)
    got = c.makefile("rb").read()  # to the end of the stream
    print("client", len(got), got == data, flush=True)
"""


def test_a_vfork_childs_dup_chain_carries_the_connection(fabric, tmp_path):
    """A server whose accepted connection landed on fd 0 (its stdio closed, a daemon's way) runs
    `cat` on it with CPython's subprocess: the vfork child dup()s the socket away from 0 before
    it dup2s it onto 1 (stdout is a stdio slot), then execs.  4ea00a2 carried the connection at
    the numbers a vfork child dup2'd it onto, but not through a chain of dups: `cat` wrote to the
    idle kernel socket and the stream split (a review of 4ea00a2).  The client must get its
    bytes back, as over kernel TCP."""
    script = tmp_path / "chain.py"
    script.write_text(STDIO_CHAIN)
    outs = {}
    log = tmp_path / "chain.log"
    for under in (False, True):
        port = next_port()
        pre = [str(MEMLAN), "run", "--log", str(log), "--"] if under else []
        srv = subprocess.Popen(pre + [PY, str(script), "server", str(port)],
                               stdout=subprocess.PIPE, text=True)
        try:
            assert srv.stdout.readline().strip() == "ready"
            cli = subprocess.run(pre + [PY, str(script), "client", str(port)],
                                 capture_output=True, text=True, timeout=30)
            outs[under] = (cli.stdout.strip(), srv.stdout.readline().strip())
        finally:
            if srv.poll() is None:
                srv.kill()
            srv.wait()
    assert outs[False] == ("client 100000 True", "server 0 0"), outs
    assert outs[True] == outs[False], (outs, log.read_text()[-2000:])
    text = log.read_text()
    assert "split" not in text and "accelerated (carried across exec)" in text, text
    settle(fabric)


LATE_WRITE = r"""
import os, socket, sys, tempfile, time
how = sys.argv[1]
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen()
cli = socket.create_connection(srv.getsockname())
conn, _ = srv.accept()
cli.sendall(b"hello")
conn.recv(100)
conn.close()  # it read everything: a FIN, and TCP takes the next write up to its buffer
time.sleep(0.2)
N = 10 << 20
res = []
if how == "sendall":
    try:
        cli.sendall(b"x" * N)
        res.append("sent all")
    except OSError as e:
        res.append(type(e).__name__)
else:
    f = tempfile.TemporaryFile()
    f.write(b"x" * N)
    f.flush()
    off = 0
    for i in range(3):
        try:
            n = os.sendfile(cli.fileno(), f.fileno(), off, N - off) if how == "sendfile" \
                else cli.send(b"x" * (N - off))
            res.append("1MiB+" if n > (1 << 20) else "some" if n > 0 else str(n))
            off += n
        except OSError as e:
            res.append(type(e).__name__)
            break
print(how, " ".join(res), flush=True)
"""


@pytest.mark.parametrize("how", ["sendall", "send", "sendfile"])
def test_a_write_after_the_peers_close_takes_what_a_buffer_holds(fabric, tmp_path, how):
    """The peer read everything and closed; then a write of 10 MiB.  TCP takes the first write
    up to its send buffer's room (the peer's kernel answers it with a reset) and fails the next
    with EPIPE: sendall raises BrokenPipeError.  Under memlan the first write returned its
    whole length, its bytes dropped: a sendall of 10 MiB, or a sendfile of the whole file,
    returned as sent (CPython's test_sendfile_close_peer_in_the_middle_of_receiving, an
    explorer's).  Now it takes at most the ring's size, and the next call says EPIPE."""
    log = tmp_path / "memlan.log"
    plain = subprocess.run([PY, "-c", LATE_WRITE, how], capture_output=True, text=True,
                           timeout=60)
    under = subprocess.run([str(MEMLAN), "run", "--log", str(log), "--", PY, "-c", LATE_WRITE,
                            how], capture_output=True, text=True, timeout=60)
    assert plain.returncode == 0 and under.returncode == 0, (plain.stderr, under.stderr)
    expect = "sendall BrokenPipeError" if how == "sendall" else how + " some BrokenPipeError"
    assert plain.stdout.strip() == expect, plain.stdout
    assert under.stdout.strip() == expect, under.stdout
    assert "accelerated (accepted" in log.read_text(), log.read_text()
    settle(fabric)


KILLED_IDLE = ACCEPT_ONE + r"""
import errno, signal, sys, time
role, port = sys.argv[1], int(sys.argv[2])
if role == "server":
    l, a = accept_one(port)
    a.sendall(a.recv(100).upper())
    print("served", flush=True)
    signal.pause()
else:
    c = socket.create_connection(("127.0.0.1", port))
    c.sendall(b"one")
    print(c.recv(100).decode(), flush=True)
    sys.stdin.readline()  # the server is SIGKILLed now: idle, nothing of ours unread
    res = []
    for i in range(2):
        try:
            res.append("send %d" % c.send(b"two"))
        except OSError as e:
            res.append("send " + errno.errorcode[e.errno])
        time.sleep(0.2)
        c.settimeout(5)
        try:
            res.append("recv %r" % c.recv(100))
        except socket.timeout:
            res.append("recv timeout")
        except OSError as e:
            res.append("recv " + errno.errorcode[e.errno])
    print(" ".join(res), flush=True)
"""


@pytest.mark.xfail(strict=True, reason="not fixed: a write into the ring of a peer that was "
                   "killed while idle reads as a reset that came instead of its FIN")
def test_a_request_to_a_server_killed_while_idle_reads_as_over_tcp(fabric, tmp_path):
    """A keep-alive client whose server (an Apache worker, killed -9) died while the connection
    was idle, nothing unread, sends its next request.  Over kernel TCP the dead server's FIN came
    at its death, the request draws a reset after it: send takes the bytes, recv returns 0 (the
    kernel checks its end of stream first), the next send EPIPE.  Under memlan recv said
    ECONNRESET: the request, unread in the dead peer's ring, made it a reset instead of a FIN.
    Found with apache2 (mpm_event) and a raw keep-alive client; curl and urllib3 retry a
    reused connection after either, but the error is not the kernel's."""
    script = tmp_path / "killed.py"
    script.write_text(KILLED_IDLE)
    py = PY
    outs = {}
    for under in (False, True):
        port = next_port()
        pre = [str(MEMLAN), "run", "--log", str(tmp_path / "k.log"), "--"] if under else []
        srv = subprocess.Popen(pre + [py, str(script), "server", str(port)],
                               stdout=subprocess.PIPE, text=True)
        cli = None
        try:
            assert srv.stdout.readline().strip() == "ready"
            cli = subprocess.Popen(pre + [py, str(script), "client", str(port)],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            assert cli.stdout.readline().strip() == "ONE"
            assert srv.stdout.readline().strip() == "served"
            srv.kill()
            srv.wait()
            time.sleep(0.3)
            cli.stdin.write("go\n")
            cli.stdin.flush()
            outs[under] = cli.stdout.readline().strip()
            assert cli.wait(timeout=30) == 0
        finally:
            for p in (cli, srv):
                if p and p.poll() is None:
                    p.kill()
                    p.wait()
    settle(fabric)
    assert outs[False] == "send 3 recv b'' send EPIPE recv b''", outs
    assert "accelerated (client)" in (tmp_path / "k.log").read_text()
    assert outs[True] == outs[False], outs


CONNREFUSED = BUILD / "tests-preload" / "connrefused"


def test_refused_nonblocking_connect_keeps_its_error(fabric, tmp_path):
    """A nonblocking connect refused at an address the port's memlan listener does not listen on
    (127.0.0.2, ::1; the listener is on 127.0.0.1): poll says POLLOUT|POLLERR|POLLHUP and
    SO_ERROR ECONNREFUSED, as over kernel TCP.  Before, the undecided socket's decision peeked
    the kernel socket and took the error: "poll 1: OUT HUP", "SO_ERROR 0" (a client of
    "localhost" took ::1 for connected)."""
    plain, under, text = scripted(CONNREFUSED, tmp_path)
    assert "127.0.0.2: SO_ERROR Connection refused" in plain.stdout, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stderr
    assert "offer posted" in text, text  # the offers were posted: the path under test ran
    settle(fabric)


SANDBOXDIAG = BUILD / "tests-preload" / "sandboxdiag"


@pytest.mark.parametrize("when", ["after", "before"])
def test_undecided_client_in_a_sandbox_survives_the_handshake_look(fabric, tmp_path, when):
    """A client that sends, then confines itself in a seccomp sandbox that kills for socket()
    ("after"), or that is confined before it connects in one that kills for socket(AF_NETLINK)
    ("before"), against a listener whose TCP_DEFER_ACCEPT (set by a raw system call) holds the
    handshake open: it gets its answer and exits 0, as over kernel TCP, its bytes sent over TCP
    once the look at the server's handshake says so ("after") or after the accept wait
    ("before": no looks in a sandbox).  Before, the look made a netlink socket inside the
    sandbox: "client: killed by signal 31"."""
    args = [] if when == "after" else ["before"]
    plain = subprocess.run([str(SANDBOXDIAG), str(next_port()), *args], capture_output=True,
                           text=True, timeout=60)
    if plain.returncode == 77:
        pytest.skip("no seccomp filter for this architecture")
    plain, under, text = scripted(SANDBOXDIAG, tmp_path, *args)
    assert "client: pong" in plain.stdout, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stderr
    if when == "after":
        assert "TCP (the server's kernel held the handshake open" in text, text
    else:
        assert "TCP (no memlan acceptor took the offer within" in text, text
    settle(fabric)


CONNECTINTR = BUILD / "tests-preload" / "connectintr"


def test_interrupted_connect_offers_at_eintr(fabric, tmp_path):
    """A blocking connect interrupted by a signal (EINTR) while its SYN waits out a full accept
    queue; the server accepts once the retransmitted SYN gets through, the program connects
    again (0) and sends: the server has the request at once, as over kernel TCP, and the
    connection is accelerated.  Before, the second connect posted an offer for a connection
    already accepted over TCP, and the request stayed in the ring ("server: nothing late")."""
    plain, under, text = scripted(CONNECTINTR, tmp_path)
    assert "server: ping within 0.5 s" in plain.stdout, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stderr
    # the interrupted connection (fd 5), and the one that filled the queue (fd 4), which sent
    # nothing and is told at its close
    assert text.count("fd 5: accelerated (client)") == 1, text
    assert text.count("accelerated (client)") == 2, text
    settle(fabric)


SHUTUNDECIDED = BUILD / "tests-preload" / "shutundecided"


def test_shutdown_of_undecided_socket_does_not_wait_for_the_claim(fabric, tmp_path):
    """A nonblocking client sends and shuts its writing down before the server accepts: the
    shutdown returns at once, and the server reads the request and the end, as over kernel TCP,
    the connection accelerated (the end goes into the ring after the bytes).  Before, the
    shutdown waited for the acceptor's claim, here for the whole accept wait: "shutdown: 0,
    blocked"."""
    plain, under, text = scripted(SHUTUNDECIDED, tmp_path)
    assert "shutdown: 0, returned within 0.5 s" in plain.stdout, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stderr
    assert "accelerated (client)" in text, text
    settle(fabric)


SIGCONNECT = BUILD / "tests-preload" / "sigconnect"


@pytest.mark.parametrize("how", ["sigaction", "signal"])
def test_connect_in_a_signal_handler_does_not_hang(fabric, tmp_path, how):
    """A handler (every 200 us) connects to the port a thread connects to in a loop: every
    connect completes, as over kernel TCP.  Before, the handler's connect waited for the
    negotiation's lock that the interrupted connect held: "hung".  signal: the handler
    installed by signal(), which goes behind our trampoline too (signals.c)."""
    plain, under, text = scripted(SIGCONNECT, tmp_path, *([] if how == "sigaction" else [how]))
    assert plain.stdout.splitlines()[0] == "connects: all made; handler connects: all made"
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stderr
    assert "offer posted" in text, text  # the thread's connects negotiated
    settle(fabric)


SIGFORK = BUILD / "tests-preload" / "sigfork"


@pytest.mark.parametrize("how", ["plain", "nested", "return"])
def test_child_forked_in_a_signal_handler_connects_accelerated(fabric, tmp_path, how):
    """A child forked inside a signal handler (PostgreSQL 15's postmaster forks its walreceiver
    and background workers in its SIGUSR1 handler, and they never leave it) connects to its
    parent's listener: accelerated, the echo matching, as over kernel TCP.  Before, the child
    inherited the handler depth and took itself for a handler for ever: its connect stayed on
    TCP without a word, the parent's log saying "the client is not memlan (no offer)" (a
    standby's WAL stream, test_apps_db).  nested: forked from a handler inside another;
    return: the child returns from the handler and connects from the loop it interrupted (the
    depth, reset at the fork, is not counted down past 0)."""
    plain, under, text = scripted(SIGFORK, tmp_path, *([] if how == "plain" else [how]))
    assert plain.stdout.splitlines() == ["child: echo matches", "parent: child exited 0"], plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stderr
    assert text.count("accelerated (client)") == 1 and "no offer" not in text, text
    settle(fabric)


DISSOLVE = BUILD / "tests-preload" / "dissolve"


@pytest.mark.parametrize("when", ["accelerated", "undecided"])
def test_connect_af_unspec_keeps_the_bytes_written_before(fabric, tmp_path, when):
    """connect(AF_UNSPEC), then a connect of the same socket to a second server: the first
    server reads what was written before the dissolve, then a reset, and the second what was
    sent after, as over kernel TCP.  On 4723f26 the undecided client's bytes were lost with the
    reset ("first server: recv: Connection reset by peer" where kernel TCP says "3 bytes
    \\"old\\"")."""
    args = ["undecided"] if when == "undecided" else []
    plain, under, text = scripted(DISSOLVE, tmp_path, *args)
    assert 'second server: 3 bytes "new"' in plain.stdout, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stderr
    assert text.count("offer posted") == 2, text  # both connects offered: the path under test
    settle(fabric)


FORKSTAT = BUILD / "tests-preload" / "forkstat"


def test_a_fork_childs_first_use_is_listed_without_side_effects(fabric, tmp_path):
    """forkstat: a fork child's first use of an inherited connection lists it in the child's
    memlan stat entry, but not from a vfork child of it (the entry's fd, opened in the vfork
    child's fd table, was left marked ours in the fork child: its own fd there read EBADF), not
    with errno changed (a recv that succeeded after the peer's reset left ENOTCONN), and not
    during exit (stdio's flush after our exit handler made an entry that stayed in the fabric,
    a dead process's): the same lines as over kernel TCP, and no dead process's entry left
    (a review of the commit that lists them)."""
    plain, under, text = scripted(FORKSTAT, tmp_path)
    assert plain.stdout.endswith("done\n"), plain.stdout + plain.stderr
    assert "dup of the program's fd at our high numbers: ok" in plain.stdout, plain.stdout
    assert "errno: recv 3, errno kept" in plain.stdout, plain.stdout
    assert under.stdout.splitlines() == plain.stdout.splitlines(), under.stderr
    assert text.count("accelerated (client)") == 3, text
    stat = json.loads(subprocess.run([str(MEMLAN), "stat", "--json"], capture_output=True,
                                     text=True, timeout=30).stdout)
    # The first two children leave by _exit, whose entries the next sweep removes (design.md);
    # the third, by exit(), must have made none after its exit handler.
    child = int(re.search(r"exit child (\d+)", under.stderr).group(1))
    assert [o for o in stat["objects"] if o.get("pid") == child] == [], (child, stat)
    settle(fabric)


BOTH_WRITE = r"""
import socket, sys
role, port = sys.argv[1], int(sys.argv[2])
N = 1 << 20
if role == "server":
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind(("127.0.0.1", port))
    l.listen(1)
    print("ready", flush=True)
    s, _ = l.accept()
else:
    s = socket.create_connection(("127.0.0.1", port))
s.sendall(role[0].encode() * N)  # all of it before a byte is read
got = b""
while len(got) < N:
    b = s.recv(1 << 16)
    if not b:
        break
    got += b
print(role, len(got), set(got) == {("c" if role == "server" else "s").encode()[0]}, flush=True)
"""


def test_both_ends_writing_before_they_read_is_said(fabric, tmp_path):
    """Each end sends 1 MiB before it reads (a blocking sendall).  Kernel TCP's buffers hold
    it, and so do memlan's rings, which grow into their 4 MiB regions once full (docs/design.md,
    "Rings grow"; before, both sends waited for each other for ever).  With growth off
    (MEMLAN_RING_GROW_KB=0) the two 256 KiB rings do not hold it: that is said, once per socket,
    in the log and on stderr, after 10 s (2 s also caught peers that were only slow), with the
    way out (larger rings), rather than a silent hang; and with MEMLAN_RING_KB=2048 the
    exchange completes as over TCP."""
    script = tmp_path / "both.py"
    script.write_text(BOTH_WRITE)
    want = ["client 1048576 True", "server 1048576 True"]

    def run(pre, env=None, limit=30):
        port = next_port()
        srv = subprocess.Popen(pre + [PY, str(script), "server", str(port)], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        cli = None
        try:
            assert srv.stdout.readline().strip() == "ready"
            cli = subprocess.Popen(pre + [PY, str(script), "client", str(port)], env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                cli.wait(timeout=limit)
                srv.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                pass
        finally:
            for p in (cli, srv):
                if p and p.poll() is None:
                    p.kill()
        outs = [p.communicate() for p in (cli, srv)]
        return sorted(o[0].strip() for o in outs if o[0].strip()), [o[1] for o in outs]

    plain, _ = run([])
    assert plain == want, plain
    log = tmp_path / "g.log"
    grown, _ = run([str(MEMLAN), "run", "--log", str(log), "--"])
    settle(fabric)
    text = log.read_text()
    assert grown == want and text.count("accelerated") == 2, (grown, text)
    log = tmp_path / "m.log"
    said, errs = run([str(MEMLAN), "run", "--log", str(log), "--"],
                     dict(os.environ, MEMLAN_RING_GROW_KB="0"), limit=20)
    settle(fabric)
    text = log.read_text()
    assert said == [] and text.count("accelerated") == 2, (said, text)
    stall = re.findall(r"a send from port \d+ to port \d+ has waited \d+ s for room in its "
                       r"256 KiB ring while 262144 bytes from the peer wait unread", text)
    assert len(stall) == 2, text  # each end, once
    assert all("larger rings: MEMLAN_RING_GROW_KB, MEMLAN_RING_KB" in e for e in errs), errs
    env = dict(os.environ, MEMLAN_RING_KB="2048", MEMLAN_RING_GROW_KB="0")
    big, _ = run([str(MEMLAN), "run", "--"], env=env)
    settle(fabric)
    assert big == want, big


SHUT_THEN_KILLED = ACCEPT_ONE + r"""
import errno, os, select, signal, sys, time
role, port, how = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if role == "server":
    l, a = accept_one(port)
    a.sendall(a.recv(100).upper())
    a.shutdown(socket.SHUT_WR)  # half-closed: it answers, then only reads (it never does)
    print("served", flush=True)
    signal.pause()
else:
    c = socket.create_connection(("127.0.0.1", port))
    c.sendall(b"one")
    print(c.recv(100).decode(), flush=True)
    sys.stdin.readline()  # the server is SIGKILLed now
    c.setblocking(False)
    err = None
    for i in range(400):  # until the ring or the kernel says no
        try:
            c.send(b"x" * 65536)
        except OSError as e:
            err = e.errno
            break
    t0 = time.monotonic()
    busy = os.pipe()  # "busy": another member of the set, always ready (never drained)
    os.write(busy[1], b"x")
    ev = []
    if how.startswith("poll"):
        p = select.poll()
        p.register(c.fileno(), select.POLLOUT)
        if how.endswith("busy"):
            p.register(busy[0], select.POLLIN)
        while not ev and time.monotonic() - t0 < 8:
            ev = [e for f, e in p.poll(10000) if f == c.fileno()]
    else:
        ep = select.epoll()
        ep.register(c.fileno(), select.EPOLLOUT)
        if how.endswith("busy"):
            ep.register(busy[0], select.EPOLLIN)
        while not ev and time.monotonic() - t0 < 8:
            ev = [e for f, e in ep.poll(10) if f == c.fileno()]
    took = time.monotonic() - t0
    try:
        c.send(b"y")
        last = "sent"
    except OSError as e:
        last = errno.errorcode[e.errno]
    print("flood %s, woke %s within 3 s, then %s" % (
        errno.errorcode.get(err, err), bool(ev) and bool(ev[0] & select.POLLOUT) and took < 3,
        last), flush=True)
"""


@pytest.mark.parametrize("how", ["poll", "epoll", "pollbusy", "epollbusy"])
def test_a_writer_to_a_half_closed_peer_that_died_is_woken(fabric, tmp_path, how):
    """A server answers, shuts down its writing and is killed; the client floods it without
    blocking, then waits for POLLOUT.  Over kernel TCP the dead server's kernel resets the
    client: the flood ends with EPIPE, POLLOUT comes at once and the next send says EPIPE.
    Under memlan the peer's death told our kernel socket nothing (its FIN had come at its
    shutdown), nobody asked its lock, and the writer waited for POLLOUT for ever.  Now a wait
    that runs out asks the lock of such a peer (poll.c, mlp_peer_passed_gone): POLLOUT comes
    within the liveness interval and the next send says EPIPE.  The flood ends with EPIPE too,
    once the ring is full: a sender at a full ring looks at its peer's life (it used to end
    with EAGAIN, the ring full, where the kernel refuses the first send after the reset).
    busy: another member of the set is always ready, so no wait runs out (only a wait that ran
    out looked, and the writer waited as long as the loop was busy: a review of 82db04e)."""
    script = tmp_path / "shutkilled.py"
    script.write_text(SHUT_THEN_KILLED)
    outs = {}
    for under in (False, True):
        port = next_port()
        pre = [str(MEMLAN), "run", "--log", str(tmp_path / "s.log"), "--"] if under else []
        srv = subprocess.Popen(pre + [PY, str(script), "server", str(port), how],
                               stdout=subprocess.PIPE, text=True)
        cli = None
        try:
            assert srv.stdout.readline().strip() == "ready"
            cli = subprocess.Popen(pre + [PY, str(script), "client", str(port), how],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            assert cli.stdout.readline().strip() == "ONE"
            assert srv.stdout.readline().strip() == "served"
            srv.kill()
            srv.wait()
            time.sleep(0.3)
            cli.stdin.write("go\n")
            cli.stdin.flush()
            outs[under] = cli.stdout.readline().strip()
            assert cli.wait(timeout=30) == 0
        finally:
            for p in (cli, srv):
                if p and p.poll() is None:
                    p.kill()
                    p.wait()
    settle(fabric)
    assert outs[False] == "flood EPIPE, woke True within 3 s, then EPIPE", outs
    assert "accelerated (client)" in (tmp_path / "s.log").read_text()
    assert outs[True] == outs[False], outs


# ---- dlopen(RTLD_DEEPBIND) -------------------------------------------------------------------

# A connect to 127.0.0.1:port through libc, as NAME (the library's, and the program's own).
CONNECT_C = r"""
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
int NAME(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    return connect(fd, (struct sockaddr *)&a, sizeof a) == 0 ? fd : -1;
}
"""

DEEP_LIB = CONNECT_C.replace("NAME", "deep_connect") + r"""
#include <string.h>
#include <unistd.h>
/* A line written and one read back, through libc's write and read. */
int deep_echo(int fd, const char *msg, char *out, int cap)
{
    if (write(fd, msg, strlen(msg)) != (ssize_t)strlen(msg))
        return -1;
    int n = 0;
    while (n < cap - 1) {
        ssize_t r = read(fd, out + n, 1);
        if (r <= 0 || out[n++] == '\n')
            break;
    }
    out[n] = 0;
    return n;
}
"""

DEEP_MAIN = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv)
{
    /* A bare name: found through this program's DT_RUNPATH ($ORIGIN/lib) alone, which glibc
     * takes from dlopen's caller. */
    void *h = dlopen("libdeep.so", RTLD_NOW | RTLD_DEEPBIND);
    if (!h) {
        printf("dlopen: %s\n", dlerror());
        return 2;
    }
    int (*dconnect)(int) = (int (*)(int))dlsym(h, "deep_connect");
    int (*decho)(int, const char *, char *, int) =
        (int (*)(int, const char *, char *, int))dlsym(h, "deep_echo");
    char out[128];
    int port = atoi(argv[1]);
    /* the program's own connect (through the preload), used by the library */
    extern int main_connect(int);
    int a = main_connect(port);
    printf("main's: %d %s", decho(a, "main's\n", out, sizeof out), out);
    /* the library's own connect */
    int b = dconnect(port);
    printf("lib's: %d %s", decho(b, "lib's\n", out, sizeof out), out);
    return 0;
}
"""


DEEP_SERVER = PRINTING_LISTENER + r"""
cs = []
for i in range(2):
    c, _ = ls.accept()
    c.sendall(b"re " + c.makefile("rb").readline())
    cs.append(c)
"""


def test_a_library_loaded_with_deepbind_talks_through_memlan(fabric, tmp_path):
    """dlopen(RTLD_DEEPBIND) binds a library's symbols in its own dependencies (libc) before the
    global scope, where LD_PRELOAD puts the preload: PHP loads every extension so, and their
    connections stayed on TCP without a word, while a connection the program made, accelerated,
    then read through the library's libc read was an idle kernel socket (php's ftp_connect timed
    out; an explorer).  The preload's dlopen takes the flag off (said once in the log) and jumps
    to libc's, so that glibc still sees the program as the caller (the library here is found
    through the program's DT_RUNPATH alone): both connections are accelerated, with the bytes
    kernel TCP gives."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (tmp_path / "deep.c").write_text(DEEP_LIB)
    (tmp_path / "main.c").write_text(DEEP_MAIN + CONNECT_C.replace("NAME", "main_connect"))
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib / "libdeep.so"),
                    str(tmp_path / "deep.c")], check=True, timeout=60)
    subprocess.run(["cc", "-o", str(tmp_path / "main"), str(tmp_path / "main.c"),
                    "-Wl,--enable-new-dtags,-rpath,$ORIGIN/lib", "-ldl"], check=True, timeout=60)
    (tmp_path / "srv.py").write_text(DEEP_SERVER)
    outs = []
    for on in (False, True):
        pre = [str(MEMLAN), "run", "--log", str(tmp_path / f"s{on}.log"), "--"] if on else []
        srv = subprocess.Popen(pre + [PY, str(tmp_path / "srv.py")], stdout=subprocess.PIPE,
                               text=True)
        try:
            port = srv.stdout.readline().strip()
            cpre = [str(MEMLAN), "run", "--log", str(tmp_path / f"c{on}.log"), "--"] if on else []
            p = subprocess.run(cpre + [str(tmp_path / "main"), port], capture_output=True,
                               text=True, timeout=30)
            outs.append((p.returncode, p.stdout))
            assert srv.wait(10) == 0
        finally:
            if srv.poll() is None:
                srv.kill()
                srv.wait()
    assert outs[0] == (0, "main's: 10 re main's\nlib's: 9 re lib's\n"), outs
    assert outs[1] == outs[0], (outs, (tmp_path / "cTrue.log").read_text())
    c = (tmp_path / "cTrue.log").read_text()
    assert c.count("accelerated (client)") == 2, c
    assert c.count("asks for RTLD_DEEPBIND") == 1, c
    assert (tmp_path / "sTrue.log").read_text().count("accelerated (accepted") == 2
    settle(fabric)


SELECT_HUP = r"""
import os, select, socket, sys, time
mode, port = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0
if mode == "srv":
    l = socket.socket()
    l.bind(("127.0.0.1", 0))
    l.listen(1)
    print(l.getsockname()[1], flush=True)
    c, _ = l.accept()
    c.recv(10)
    time.sleep(0.3)
    c.sendall(b"x")
    c.recv(10)
else:
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"hi")
    r, w = os.pipe()
    os.close(w)  # the pipe hung up: poll says POLLHUP, select's except set does not count it
    got = select.select([s], [], [r])  # no timeout: until the socket has its byte
    print([len(x) for x in got], s in got[0], s.recv(10))
    got = select.select([s], [], [r, s], 0.2)  # nothing more comes: 0 at the timeout
    print([len(x) for x in got])
    s.close()
"""


def test_select_does_not_count_a_hang_up_in_the_except_set(fabric, tmp_path):
    """select counts a descriptor's hang-up only in the read set; poll reports POLLHUP whatever
    was asked.  Under memlan, select (through poll, where a set holds a connection of ours)
    returned 0 at once, its NULL timeout notwithstanding, when a pipe whose writer had closed was
    in the except set alone: ncat's client, whose stdin is so, spun at 75% of a core (an
    explorer).  Now such a descriptor is left out of the next poll: the results are the
    kernel's."""
    (tmp_path / "sel.py").write_text(SELECT_HUP)
    outs = []
    for on in (False, True):
        pre = [str(MEMLAN), "run", "--log", str(tmp_path / f"m{on}.log"), "--"] if on else []
        srv = subprocess.Popen(pre + [PY, str(tmp_path / "sel.py"), "srv"],
                               stdout=subprocess.PIPE, text=True)
        try:
            port = srv.stdout.readline().strip()
            p = subprocess.run(pre + [PY, str(tmp_path / "sel.py"), "cli", port],
                               capture_output=True, text=True, timeout=30)
            outs.append((p.returncode, p.stdout, p.stderr))
            srv.wait(10)
        finally:
            if srv.poll() is None:
                srv.kill()
                srv.wait()
    assert outs[0] == (0, "[1, 0, 0] True b'x'\n[0, 0, 0]\n", ""), outs
    assert outs[1] == outs[0], outs
    assert (tmp_path / "mTrue.log").read_text().count("accelerated (client)") == 1
    settle(fabric)


NONBLOCK_CONNECT_TWICE = r"""
import errno, select, socket, sys
port = int(sys.argv[1])
codes = []
for i in range(3):
    s = socket.socket()
    s.setblocking(False)
    codes.append(s.connect_ex(("127.0.0.1", port)))  # EINPROGRESS (loopback may say 0)
    select.select([], [s], [], 5)
    codes.append(s.connect_ex(("127.0.0.1", port)))  # completes it: 0
    codes.append(s.connect_ex(("127.0.0.1", port)))  # EISCONN
    s.close()
print(" ".join(errno.errorcode.get(c, str(c)) for c in codes))
"""


def test_a_connect_that_completes_another_is_not_decided_again(fabric, tmp_path):
    """A nonblocking connect, then a second connect once the socket is writable (ab and other
    programs complete theirs so: the kernel says 0 once, then EISCONN): the first decides the
    connection, here plain TCP with no memlan listener, and the second decided and logged it
    again (4000 lines for `ab -n 2000`: an explorer).  Now one line per connection, and the
    calls' results are the kernel's."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    port = srv.getsockname()[1]
    (tmp_path / "c.py").write_text(NONBLOCK_CONNECT_TWICE)
    log = tmp_path / "c.log"
    try:
        plain = subprocess.run([PY, str(tmp_path / "c.py"), str(port)], capture_output=True,
                               text=True, timeout=30)
        under = subprocess.run([str(MEMLAN), "run", "--log", str(log), "--", PY,
                                str(tmp_path / "c.py"), str(port)], capture_output=True,
                               text=True, timeout=30)
    finally:
        srv.close()
    assert plain.returncode == 0 and plain.stdout.split()[1::3] == ["0"] * 3, plain
    assert (under.returncode, under.stdout) == (0, plain.stdout), (plain, under)
    text = log.read_text()
    assert text.count("TCP (no memlan listener") == 3, text
    settle(fabric)


# A nonblocking connect to a plain listener (argv[1]) completed through select, its socket then
# closed inside libc (fclose of an fdopen'd stream), and a new socket at that number connecting
# to the echo server at argv[2].
STALE_PENDING = r"""
import ctypes, select, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.fdopen.restype = ctypes.c_void_p
libc.fclose.argtypes = [ctypes.c_void_p]
s = socket.socket()
s.setblocking(False)
s.connect_ex(("127.0.0.1", int(sys.argv[1])))
select.select([], [s], [], 5)
fd = s.detach()
assert libc.fclose(libc.fdopen(fd, b"r+")) == 0  # glibc's own close: no interposer sees it
t = socket.socket()  # (no name look-up: its files would take the number in between)
t.connect(("127.0.0.1", int(sys.argv[2])))
print(t.fileno() == fd, flush=True)
t.sendall(b"hello\n")
print(t.makefile("rb").readline().decode().strip())
"""


def test_a_close_inside_libc_leaves_no_connect_undecided(fabric, tmp_path):
    """The note that a nonblocking connect was decided on TCP (for the connect that completes
    it) outlived a close memlan does not see (fclose of an fdopen'd socket), and the next
    socket at that number, connecting to a memlan listener, stayed on TCP with nothing said (a
    review).  The note names its socket's inode now."""
    plain = socket.socket()
    plain.bind(("127.0.0.1", 0))
    plain.listen(8)
    (tmp_path / "echo.py").write_text(PRINTING_LISTENER + r"""
c, _ = ls.accept()
c.sendall(c.makefile("rb").readline())
""")
    (tmp_path / "c.py").write_text(STALE_PENDING)
    pre = [str(MEMLAN), "run", "--log", str(tmp_path / "m.log"), "--"]
    echo = subprocess.Popen(pre + [PY, str(tmp_path / "echo.py")], stdout=subprocess.PIPE,
                            text=True)
    try:
        eport = echo.stdout.readline().strip()
        p = subprocess.run(pre + [PY, str(tmp_path / "c.py"), str(plain.getsockname()[1]), eport],
                           capture_output=True, text=True, timeout=30)
        assert echo.wait(10) == 0
    finally:
        plain.close()
        if echo.poll() is None:
            echo.kill()
            echo.wait()
    assert (p.returncode, p.stdout) == (0, "True\nhello\n"), p  # the same number, reused
    text = (tmp_path / "m.log").read_text()
    assert text.count("accelerated (client)") == 1 and "accelerated (accepted" in text, text
    settle(fabric)


# A forking server that prints its port, then serves argv[2] connections: "dbl", a double fork
# whose middle child leaves by _exit at once (OCaml's Unix.establish_server; daemons) and whose
# grandchild answers and closes; "exit", one fork whose child answers and leaves by _exit
# without a close.  Each child sends back what it read.
FORKING_SERVER = PRINTING_LISTENER + r"""
import os
how, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    c, _ = ls.accept()
    pid = os.fork()
    if pid == 0:
        if how == "dbl" and os.fork():
            os._exit(0)
        ls.close()
        c.sendall(c.recv(100))
        if how == "dbl":
            c.close()
        os._exit(0)
    c.close()
    os.waitpid(pid, 0)
"""

# Its client: each connection sends a line and reads until the end in blocking recv, after a
# wait for it in select or poll where argv[2] says so; it prints what came back, then the median
# time from the answer to the end (on stderr).
FORKING_CLIENT = r"""
import select, socket, statistics, sys, time
n, wait, waited = int(sys.argv[1]), sys.argv[2], []
for i in range(n):
    s = socket.create_connection(("127.0.0.1", int(sys.argv[3])))
    s.sendall(b"line %d" % i)
    got = s.recv(100)
    t = time.monotonic()
    if wait == "select":
        select.select([s], [], [])
    elif wait == "poll":
        p = select.poll()
        p.register(s, select.POLLIN)
        p.poll()
    end = s.recv(100)
    waited.append(time.monotonic() - t)
    print(got.decode(), repr(end))
    s.close()
print("median %.2f ms" % (statistics.median(waited) * 1000), file=sys.stderr)
"""


@pytest.mark.parametrize("wait", ["recv", "select", "poll"])
@pytest.mark.parametrize("how", ["dbl", "exit"])
def test_a_fork_childs_end_reaches_a_blocking_reader_at_once(fabric, tmp_path, how, wait):
    """The end of a connection whose last holder left without a close of ours: a double fork's
    grandchild (its middle child's _exit had kept that child's count in the holders for good, so
    the grandchild's close only let go), or a child's _exit.  The kernel socket's FIN told it,
    and a blocking recv watched that socket only after a first slice of 10 ms on the ring's
    futex: every end came 10 ms late (an explorer: 300 connections to OCaml's establish_server
    took 5 s, 0.7 s over kernel TCP).  Now a single-threaded _exit gives its counts back, and a
    process ending so says it in its side's block (ML_SOCK_EXITING) and wakes its peer, whose
    waits then watch the kernel socket at once.  A select or poll of the one socket waited so
    too (its own slice on the futex: 6-7 ms after a child's _exit), until it looked at the flag
    as well.  The bytes and ends are kernel TCP's; the median wait for the end is under 5 ms (the
    slice alone made every wait 10 ms or more; a mean let a loaded machine's few long waits fail
    it: an explorer of flakes)."""
    n = 30
    (tmp_path / "s.py").write_text(FORKING_SERVER)
    (tmp_path / "c.py").write_text(FORKING_CLIENT)
    runs = plain_then_memlan(tmp_path, [PY, str(tmp_path / "s.py"), how, str(n)],
                             [PY, str(tmp_path / "c.py"), str(n), wait])
    assert [st for _, st, _ in runs] == [0, 0], runs
    outs = [p for p, _, _ in runs]
    assert outs[0].returncode == 0 and outs[0].stdout.count(" b''\n") == n, outs[0]
    assert (outs[1].returncode, outs[1].stdout) == (0, outs[0].stdout), outs[1]
    med = [float(x) for x in re.findall(r"median ([0-9.]+) ms", outs[1].stderr)]
    assert med and med[0] < 5.0, (outs[1].stderr, outs[0].stderr)
    text = (tmp_path / "mTrue.log").read_text()
    assert text.count("accelerated (client)") == n, text
    settle(fabric)
