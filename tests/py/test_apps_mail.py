# SPDX-License-Identifier: Apache-2.0 OR MIT
"""Mail and relay programs under `memlan run`, as Debian ships them (scripts/install-apps.sh
installs them): dovecot (master, login and mail processes, as root and rootless, where its login
processes hand each connection to the mail process over SCM_RIGHTS), exim4's daemon (forking per
connection, re-executing itself to deliver), stunnel4 (threads, client mode, exec mode) and socat
(EXEC and SYSTEM, across fork and exec), with both ends under memlan, each workload's bytes and
status compared with the same run over kernel TCP.  Every process is stopped by its PID; every
wait is bounded.
"""
import hashlib
import os
import pwd
import shutil
import subprocess
import sys
import time

import pytest

from conftest import MEMLAN, port_range, stop_proc, gfabric, group, port_free, pubdir  # noqa: F401 (fixtures)
from test_apps import accelerated, member, need, settle, tcp_reasons, wait_port, wrap

next_port = port_range(18801, 18999, "test_apps_mail")  # no other test's range, below the ephemeral range


stop = stop_proc


# ---- dovecot -----------------------------------------------------------------------------------

DOVECOT_CONF = """
base_dir = {d}/run
state_dir = {d}/state
log_path = {d}/dovecot.log
protocols = imap pop3
listen = 127.0.0.1
ssl = no
disable_plaintext_auth = no
auth_mechanisms = plain
first_valid_uid = 100
passdb {{
  driver = passwd-file
  args = scheme=PLAIN {d}/users
}}
userdb {{
  driver = passwd-file
  args = {d}/users
}}
mail_location = maildir:{d}/mail/%u
doveadm_password = secret
service imap-login {{
  inet_listener imap {{
    address = 127.0.0.1
    port = {imap}
  }}
  inet_listener imaps {{
    port = 0
  }}
}}
service pop3-login {{
  inet_listener pop3 {{
    address = 127.0.0.1
    port = {pop3}
  }}
  inet_listener pop3s {{
    port = 0
  }}
}}
service doveadm {{
  inet_listener http {{
    address = 127.0.0.1
    port = {http}
  }}
}}
"""

MAIL_CLIENT = r"""
import hashlib, imaplib, poplib, random, sys
imap, pop3 = int(sys.argv[1]), int(sys.argv[2])
def msg(i, size):
    r = random.Random(i); lines = []; n = 0
    while n < size:
        l = "".join(r.choice("abcdefghij klmnop.") for _ in range(r.randint(1, 76)))
        lines.append(l); n += len(l) + 2
    return ("From: a@x.org\r\nSubject: m%d\r\n\r\n" % i + "\r\n".join(lines) + "\r\n").encode()
msgs = [msg(i, s) for i, s in enumerate((300, 40000, 2000000))]
if sys.argv[3] in ("append", "imap-only"):
    c = imaplib.IMAP4("127.0.0.1", imap); c.login("tuser", "secret")
    for m in msgs:
        assert c.append("INBOX", None, None, m)[0] == "OK"
    c.logout()
got = []
c = imaplib.IMAP4("127.0.0.1", imap); c.login("tuser", "secret")
n = int(c.select("INBOX", readonly=True)[1][0])
for i in range(1, n + 1):
    got.append(hashlib.sha256(c.fetch(str(i), "(BODY.PEEK[])")[1][0][1]).hexdigest())
c.logout()
want = [hashlib.sha256(m).hexdigest() for m in msgs]
if sys.argv[3] != "imap-only":
    p = poplib.POP3("127.0.0.1", pop3); p.user("tuser"); p.pass_("secret")
    for i in range(1, p.stat()[0] + 1):
        got.append(hashlib.sha256(b"\r\n".join(p.retr(i)[1]) + b"\r\n").hexdigest())
    p.quit()
    want *= 2
print("ok" if got == want else "BAD %r" % got)
"""


def test_dovecot_as_debian_ships_it(fabric, pubdir):
    """dovecot as root, its login processes dropping to dovenull in a chroot: its master empties
    its environment at start-up (import_environment) and execs its service processes with what
    is left, so they ran without memlan while the master's listeners stood published, and a memlan
    client of doveadm's HTTP API (the client speaks first) waited MEMLAN_ACCEPT_WAIT_MS for every
    request.  Now the service processes run under memlan: doveadm's requests are accelerated, and
    the IMAP and POP3 clients of the login processes that cannot reach the fabric stay on TCP with
    the reason, their messages the same as over kernel TCP."""
    if os.geteuid() != 0:
        pytest.skip("dovecot's master runs as root here, as Debian starts it")
    need("dovecot", "/usr/lib/dovecot/imap", "/usr/lib/dovecot/pop3", "curl")
    nobody = pwd.getpwnam("nobody")
    for sub in ("run", "state", "mail", "home"):
        (pubdir / sub).mkdir()
    for sub in ("mail", "home"):
        os.chown(pubdir / sub, nobody.pw_uid, nobody.pw_gid)
    (pubdir / "users").write_text(
        f"tuser:{{PLAIN}}secret:{nobody.pw_uid}:{nobody.pw_gid}::{pubdir}/home/tuser\n")
    imap, pop3, http = next_port(), next_port(), next_port()
    conf = pubdir / "dovecot.conf"
    conf.write_text(DOVECOT_CONF.format(d=pubdir, imap=imap, pop3=pop3, http=http))
    (pubdir / "client.py").write_text(MAIL_CLIENT)
    slog, clog = pubdir / "server.log", pubdir / "client.log"
    srv = subprocess.Popen(wrap(["dovecot", "-F", "-c", str(conf)], slog),
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for p in (imap, pop3, http):
            wait_port(p, srv)

        def client(on, step):
            p = subprocess.run(wrap(["/usr/bin/python3", str(pubdir / "client.py"), str(imap),
                                     str(pop3), step], clog, on),
                               capture_output=True, text=True, timeout=60)
            return p.returncode, p.stdout.strip(), p.stderr[-2000:]

        # IMAP APPEND, FETCH and POP3 RETR: over kernel TCP, then under memlan; the same.
        plain = client(False, "append")
        assert plain[:2] == (0, "ok"), plain
        assert client(True, "fetch") == (0, "ok", ""), clog.read_text()[-3000:]
        # doveadm's HTTP API, whose client speaks first: each request as quick as over TCP.
        url = f"http://127.0.0.1:{http}/doveadm/v1"
        curl = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-u", "doveadm:secret", url]
        for on in (False, True, True, True):
            cmd = [str(MEMLAN), "run", "--log", str(clog), "--accept-wait-ms", "5000", "--"] + curl
            t0 = time.monotonic()
            p = subprocess.run(cmd if on else curl, capture_output=True, text=True, timeout=30)
            took = time.monotonic() - t0
            assert (p.returncode, p.stdout) == (0, "200"), (on, p.returncode, p.stdout, p.stderr)
            assert took < 3, f"a doveadm request took {took:.1f} s (MEMLAN_ACCEPT_WAIT_MS 5000)"
        c, s = clog.read_text(), slog.read_text()
        assert c.count("accelerated (client)") == 3, c[-3000:]
        assert "no memlan acceptor took the offer" not in c, c[-3000:]
        # The login processes (dovenull, chrooted) cannot reach root's fabric: said.
        assert accelerated(slog) == 3, s[-3000:]
        assert tcp_reasons(clog) and all("cannot take offers" in r or "will not offer" in r
                                         for r in tcp_reasons(clog)), tcp_reasons(clog)
        assert srv.poll() is None, "dovecot exited"
    finally:
        stop(srv)
    err = (pubdir / "dovecot.log").read_text()
    assert "Panic" not in err and "Fatal" not in err, err[-3000:]


# dovecot run by one user: its rootless set-up (no chroot, one account for every process)
ROOTLESS = """
default_internal_user = nobody
default_internal_group = nogroup
default_login_user = nobody
service imap-login {
  chroot =
}
service pop3-login {
  chroot =
}
service anvil {
  chroot =
}
"""

HIBERNATE = """
imap_hibernate_timeout = 1s
service imap-hibernate {
  unix_listener imap-hibernate {
    mode = 0660
  }
}
service imap {
  unix_listener imap-master {
    mode = 0660
  }
}
"""


POP3_KILLED = r"""
import os, signal, socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1]))); f = s.makefile("rb")
f.readline(); s.sendall(b"USER tuser\r\n"); f.readline(); s.sendall(b"PASS secret\r\n"); f.readline()
s.sendall(b"RETR 3\r\n"); f.read(100000)  # 100 KB of the 2 MB message, then killed
os.kill(os.getpid(), signal.SIGKILL)
"""


def mail_procs(root):
    """The imap and pop3 processes among root's descendants."""
    kids, names = {}, {}
    for q in filter(str.isdigit, os.listdir("/proc")):
        try:
            st = open(f"/proc/{q}/stat").read()
        except OSError:
            continue
        comm, rest = st[st.index("(") + 1:st.rindex(")")], st[st.rindex(")") + 2:].split()
        kids.setdefault(int(rest[1]), []).append(int(q))
        names[int(q)] = comm
    found, todo = [], [root]
    while todo:
        for k in kids.get(todo.pop(), []):
            todo.append(k)
            if names[k] in ("imap", "pop3"):
                found.append(k)
    return found


def test_dovecot_rootless_hands_connections_over(tmp_path, pubdir):
    """dovecot run by one user (its rootless set-up: no chroot, one account for every process):
    each login process hands the client's connection, once logged in, to an imap or pop3
    process over SCM_RIGHTS.  The first connection to each port is accelerated and taken up by
    the mail process (APPEND of 2 MB, FETCH, RETR); a POP3 client killed in the middle of a
    RETR ends its pop3 process; the later clients stay on TCP with the reason.  Every client's
    answers are kernel TCP's."""
    if os.geteuid() != 0:
        pytest.skip("the test runs dovecot and its clients as nobody (setpriv)")
    need("dovecot", "/usr/lib/dovecot/imap", "/usr/lib/dovecot/pop3")
    nobody = pwd.getpwnam("nobody")
    fab = pubdir / "fabric"
    fab.mkdir(mode=0o700)
    for sub in ("run", "state", "mail", "home"):
        (pubdir / sub).mkdir()
    (pubdir / "users").write_text(
        f"tuser:{{PLAIN}}secret:{nobody.pw_uid}:{nobody.pw_gid}::{pubdir}/home/tuser\n")
    (pubdir / "client.py").write_text(MAIL_CLIENT)
    (pubdir / "killed.py").write_text(POP3_KILLED)
    os.chown(pubdir, nobody.pw_uid, nobody.pw_gid)
    for dirpath, dirs, files in os.walk(pubdir):
        for x in dirs + files:
            os.chown(os.path.join(dirpath, x), nobody.pw_uid, nobody.pw_gid)
    env = dict(os.environ, MEMLAN_FABRIC=str(fab), HOME=str(pubdir))
    as_nobody = ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}",
                 "--clear-groups", "--"]
    py = [*as_nobody, "/usr/bin/python3"]
    out = {}
    for on in (False, True):
        for sub in ("run", "state", "mail"):
            shutil.rmtree(pubdir / sub)
            (pubdir / sub).mkdir()
            os.chown(pubdir / sub, nobody.pw_uid, nobody.pw_gid)
        imap, pop3, http = next_port(), next_port(), next_port()
        conf = pubdir / "dovecot.conf"
        conf.write_text(DOVECOT_CONF.format(d=pubdir, imap=imap, pop3=pop3, http=http) + ROOTLESS)
        slog, clog = pubdir / f"server{on}.log", pubdir / f"client{on}.log"
        for f in (slog, clog):
            f.write_text("")
            os.chown(f, nobody.pw_uid, nobody.pw_gid)
        srv = subprocess.Popen(as_nobody + wrap(["dovecot", "-F", "-c", str(conf)], slog, on),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        try:
            for p in (imap, pop3):
                wait_port(p, srv)
            res = []
            for cmd in (["client.py", str(imap), str(pop3), "imap-only"], ["killed.py", str(pop3)],
                        ["client.py", str(imap), str(pop3), "fetch"]):
                p = subprocess.run(wrap(py + [str(pubdir / cmd[0])] + cmd[1:], clog, on),
                                   capture_output=True, text=True, timeout=60, env=env)
                res.append((p.returncode, p.stdout.strip()))
            out[on] = res
            # The killed client's pop3 process ends: no mail process outlives its client.
            end = time.monotonic() + 10
            while mail_procs(srv.pid) and time.monotonic() < end:
                time.sleep(0.1)
            assert mail_procs(srv.pid) == [], (on, mail_procs(srv.pid))
            assert srv.poll() is None, "dovecot exited"
        finally:
            stop(srv)
        log = (pubdir / "dovecot.log").read_text()
        assert "Panic" not in log and "Fatal" not in log, log[-3000:]
    assert out[False] == [(0, "ok"), (-9, ""), (0, "ok")], out
    assert out[True] == out[False], out
    c, s = clog.read_text(), slog.read_text()
    # The first IMAP and the first POP3 connection: accelerated, passed, taken up.
    assert c.count("accelerated (client)") == 2, c[-3000:]
    assert s.count("accelerated (passed over SCM_RIGHTS)") == 2, s[-3000:]
    assert "lost" not in s, s[-3000:]
    assert all("passes its accepted connections" in r for r in tcp_reasons(clog)), tcp_reasons(clog)


IDLE_CLIENT = r"""
import hashlib, imaplib, socket, sys, time
port, rounds = int(sys.argv[1]), int(sys.argv[2])
s = socket.create_connection(("127.0.0.1", port), timeout=30); f = s.makefile("rb")
def cmd(tag, c):
    s.sendall(tag + b" " + c + b"\r\n"); out = []
    while True:
        l = f.readline(); out.append(l)
        if l.startswith(tag + b" ") or not l: return out
f.readline(); cmd(b"a", b"LOGIN tuser secret"); cmd(b"b", b"SELECT INBOX")
res = []
for r in range(rounds):
    s.sendall(b"i IDLE\r\n"); f.readline()
    time.sleep(2)  # imap_hibernate_timeout is 1 s: the connection goes to imap-hibernate
    m = (b"Subject: r%d\r\n\r\n" % r) + bytes(range(65, 91)) * 20000 + b"\r\n"
    c = imaplib.IMAP4("127.0.0.1", port); c.login("tuser", "secret")
    c.append("INBOX", None, None, m); c.logout()
    l = f.readline()
    while l.startswith(b"* OK Still here"):  # IDLE's keep-alive may come first (RFC 2177)
        l = f.readline()
    res.append(l.strip().decode())  # "* N EXISTS", from imap-hibernate
    s.sendall(b"DONE\r\n"); f.readline()  # back to a new imap process
    s.sendall(b"f FETCH %d (BODY.PEEK[])\r\n" % (r + 1))
    l = f.readline()
    while b"BODY[] {" not in l:
        l = f.readline()
    body = f.read(int(l[l.rindex(b"{") + 1:l.rindex(b"}")]))
    while not f.readline().startswith(b"f "):
        pass
    res.append(body == m)
cmd(b"z", b"LOGOUT")
print(res)
"""


def test_dovecot_imap_hibernate(pubdir):
    """dovecot's IMAP hibernation (rootless): an IDLE client's connection goes from its imap
    process to imap-hibernate over SCM_RIGHTS after a second, back to a new imap process when
    the client speaks, and to imap-hibernate again at its next IDLE, where it lands on the fd
    number it had.  Under memlan, imap-hibernate's epoll_ctl DEL before passing it on had left
    the kernel's entry in place (parked) and its close did not remove it (the file lived on in
    the receiver): the connection's return met EEXIST on its ADD, and imap-hibernate died of
    "Panic: epoll_ctl(add, 14) failed: File exists" (the client's connection cut).  Three IDLE
    rounds, each with a new message: the same answers as over kernel TCP."""
    if os.geteuid() != 0:
        pytest.skip("the test runs dovecot and its clients as nobody (setpriv)")
    need("dovecot", "/usr/lib/dovecot/imap", "/usr/lib/dovecot/imap-hibernate")
    nobody = pwd.getpwnam("nobody")
    fab = pubdir / "fabric"
    fab.mkdir(mode=0o700)
    (pubdir / "users").write_text(
        f"tuser:{{PLAIN}}secret:{nobody.pw_uid}:{nobody.pw_gid}::{pubdir}/home/tuser\n")
    (pubdir / "idle.py").write_text(IDLE_CLIENT)
    env = dict(os.environ, MEMLAN_FABRIC=str(fab), HOME=str(pubdir))
    as_nobody = ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}",
                 "--clear-groups", "--"]
    out = {}
    for on in (False, True):
        for sub in ("run", "state", "mail", "home"):
            shutil.rmtree(pubdir / sub, ignore_errors=True)
            (pubdir / sub).mkdir()
        imap, pop3, http = next_port(), next_port(), next_port()
        conf = pubdir / "dovecot.conf"
        conf.write_text(DOVECOT_CONF.format(d=pubdir, imap=imap, pop3=pop3, http=http) +
                        ROOTLESS + HIBERNATE)
        slog, clog = pubdir / f"server{on}.log", pubdir / f"client{on}.log"
        for f in (slog, clog):
            f.write_text("")
        os.chown(pubdir, nobody.pw_uid, nobody.pw_gid)
        for dirpath, dirs, files in os.walk(pubdir):
            for x in dirs + files:
                os.chown(os.path.join(dirpath, x), nobody.pw_uid, nobody.pw_gid)
        srv = subprocess.Popen(as_nobody + wrap(["dovecot", "-F", "-c", str(conf)], slog, on),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        try:
            wait_port(imap, srv)
            p = subprocess.run(wrap(as_nobody + ["/usr/bin/python3", str(pubdir / "idle.py"),
                                                 str(imap), "3"], clog, on),
                               capture_output=True, text=True, timeout=60, env=env)
            out[on] = (p.returncode, p.stdout.strip(), p.stderr[-300:])
            assert srv.poll() is None, "dovecot exited"
        finally:
            stop(srv)
        log = (pubdir / "dovecot.log").read_text()
        assert "Panic" not in log and "Fatal" not in log, (on, log[-1500:])
    assert out[False] == (0, str(["* 1 EXISTS", True, "* 2 EXISTS", True, "* 3 EXISTS", True]),
                          ""), out
    assert out[True] == out[False], out
    s = slog.read_text()
    # imap-login to imap, then imap to imap-hibernate and back at each of the three rounds
    assert s.count("accelerated (passed over SCM_RIGHTS)") >= 1 + 2 * 3, s[-3000:]
    assert "lost" not in s, s[-3000:]


# ---- socat -------------------------------------------------------------------------------------

def socat_pair(port, addr, data, slog, clog, on):
    """A forking socat server `addr` on port, one `socat - TCP:` client sending data and then
    its end (half-close); the client's status and what it read."""
    srv = subprocess.Popen(wrap(["socat", f"TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork", addr],
                                slog, on), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_port(port, srv)
        try:
            p = subprocess.run(wrap(["socat", "-t", "20", "-", f"TCP:127.0.0.1:{port}"], clog, on),
                               input=data, capture_output=True, timeout=30)
            return p.returncode, p.stdout
        except subprocess.TimeoutExpired:
            return "timeout", b""
    finally:
        stop(srv)


@pytest.mark.parametrize("addr", ["EXEC:cat,nofork", "EXEC:sha256sum,nofork", "EXEC:sha256sum",
                                  "SYSTEM:cat,nofork", "SYSTEM:sha256sum,nofork",
                                  "EXEC:valgrind -q cat,nofork"])
def test_socat_exec_and_system(fabric, tmp_path, addr):
    """socat's forking server hands each connection to a program: EXEC through a socketpair, or
    with nofork the accelerated socket itself as its stdin and stdout, across fork and exec;
    SYSTEM through system(), whose shell glibc spawns inside libc, past the exec interposers: it
    got an idle kernel socket, read nothing, and the client waited for ever.  Each client sends
    2 MB and half-closes; what it reads back and its status are kernel TCP's (before, SYSTEM with
    nofork timed out).  A shell (dash) leaves by _exit, so its files wait for the lazy reclaim.
    `valgrind cat`: the connection is carried through valgrind's launcher and its statically
    linked tool into the guest, which runs memlan (before, it was judged by the tool's file and
    shut down before that exec: the client read nothing back, and memlan said on stderr that
    the program ran without it)."""
    need("socat", "sha256sum", *(["valgrind"] if "valgrind" in addr else []))
    data = os.urandom(2 << 20)
    port = next_port()
    plain = socat_pair(port, addr, data, tmp_path / "ps.log", tmp_path / "pc.log", False)
    assert plain[0] == 0 and len(plain[1]) in (len(data), 68), plain[0]
    slog, clog = tmp_path / "server.log", tmp_path / "client.log"
    got = socat_pair(port, addr, data, slog, clog, True)
    assert got[0] == plain[0] and got[1] == plain[1], (got[0], len(got[1]), clog.read_text()[-2000:],
                                                        slog.read_text()[-2000:])
    assert accelerated(clog) == 1 and accelerated(slog) == 1, (clog.read_text(), slog.read_text())
    assert "cannot follow the exec" not in slog.read_text(), slog.read_text()[-2000:]
    assert "statically linked" not in slog.read_text(), slog.read_text()[-2000:]
    if "valgrind" in addr:
        assert slog.read_text().count("accelerated (carried across exec)") == 3, \
            slog.read_text()[-2000:]  # socat's child into valgrind.bin, its tool, the guest cat
    settle()


SYSTEM_CLIENT = r"""
import os, signal, socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1]))); os.set_inheritable(s.fileno(), True)
fd = s.fileno()
out = [os.system("exit 3"), os.system("kill -TERM $$"), os.system("/nonexistent/prog 2>/dev/null")]
out.append(os.system(f"printf via-shell >&{fd}"))                 # the shell writes the connection
out.append(os.system(f"dd bs=1 count=9 <&{fd} 2>/dev/null"))       # and reads it: the echo
s.sendall(b"hello")
out.append(os.system(f"dd bs=1 count=3 <&{fd} 2>/dev/null"))       # 'hel', and 'lo' for recv
out.append(signal.getsignal(signal.SIGINT) is signal.default_int_handler)
print(out, s.recv(100), flush=True)
"""


def test_system_with_an_accelerated_connection(fabric, tmp_path):
    """system() in a process whose accelerated connection survives exec: the shell and its
    programs use the connection (before, they had an idle kernel socket and waited for ever), and
    system()'s answers (exit status, a signal's, 127 for no program) and SIGINT's disposition
    afterwards are glibc's, as over kernel TCP."""
    need("socat")
    port = next_port()
    (tmp_path / "client.py").write_text(SYSTEM_CLIENT)
    slog, clog = tmp_path / "server.log", tmp_path / "client.log"
    srv = subprocess.Popen(wrap(["socat", f"TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork",
                                 "EXEC:cat"], slog), stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE)
    try:
        wait_port(port, srv)
        outs = []
        for on in (False, True):
            try:
                p = subprocess.run(wrap([sys.executable, str(tmp_path / "client.py"), str(port)],
                                        clog, on), capture_output=True, text=True, timeout=20)
                outs.append((p.returncode, p.stdout))
            except subprocess.TimeoutExpired:
                outs.append(("timeout", ""))
        assert outs[0] == (0, "via-shellhel[768, 15, 32512, 0, 0, 0, True] b'lo'\n"), outs
        assert outs[1] == outs[0], (outs, clog.read_text()[-2000:])
        assert accelerated(clog) == 1, clog.read_text()
    finally:
        stop(srv)
    settle()


# ---- stunnel -----------------------------------------------------------------------------------

STUNNEL_CONF = """
foreground = yes
pid =
output = {d}/stunnel.out
[tls]
accept = 127.0.0.1:{tls}
connect = 127.0.0.1:{back}
cert = {d}/st.pem
[wrap]
client = yes
accept = 127.0.0.1:{wrap}
connect = 127.0.0.1:{tls}
[exec]
accept = 127.0.0.1:{ex}
cert = {d}/st.pem
exec = /bin/cat
execArgs = cat
"""

TLS_ECHO_CLIENT = r"""
import hashlib, socket, ssl, sys, threading
port, n, size, tls = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "tls"
data = bytes(range(256)) * (size // 256)
res = []
def one(k):
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    if tls:
        ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
        s = ctx.wrap_socket(s)
    got = bytearray()
    for off in range(0, len(data), 65536):  # a chunk out, its echo back: no deadlock on buffers
        chunk = data[off:off + 65536]; s.sendall(chunk); k = 0
        while k < len(chunk):
            b = s.recv(65536)
            assert b, "end of stream"
            got += b; k += len(b)
    s.close()
    res.append(bytes(got) == data)
th = [threading.Thread(target=one, args=(k,)) for k in range(n)]
[t.start() for t in th]; [t.join(60) for t in th]
print(res.count(True), "of", n)
"""


def test_stunnel(fabric, tmp_path):
    """stunnel4 (threads, as Debian builds it) in front of a socat echo server: TLS clients, a
    plain client through stunnel's own client mode, and stunnel's exec mode (cat on a
    socketpair); every connection's bytes are the echo, as over kernel TCP, every one accelerated."""
    need("stunnel4", "socat", "openssl")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=localhost", "-keyout", str(tmp_path / "key.pem"), "-out",
                    str(tmp_path / "cert.pem")], check=True, capture_output=True, timeout=60)
    (tmp_path / "st.pem").write_bytes((tmp_path / "key.pem").read_bytes() +
                                      (tmp_path / "cert.pem").read_bytes())
    os.chmod(tmp_path / "st.pem", 0o600)
    back, tls, wrp, ex = next_port(), next_port(), next_port(), next_port()
    conf = tmp_path / "st.conf"
    conf.write_text(STUNNEL_CONF.format(d=tmp_path, tls=tls, back=back, wrap=wrp, ex=ex))
    (tmp_path / "client.py").write_text(TLS_ECHO_CLIENT)
    runs = [(tls, 6, 1 << 20, "tls"), (wrp, 6, 1 << 20, "plain"), (ex, 3, 1 << 20, "tls")]
    want = ["6 of 6", "6 of 6", "3 of 3"]
    for on in (False, True):
        slog, clog = tmp_path / f"server{on}.log", tmp_path / f"client{on}.log"
        echo = subprocess.Popen(wrap(["socat", f"TCP-LISTEN:{back},bind=127.0.0.1,reuseaddr,fork",
                                      "EXEC:cat"], slog, on), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        st = subprocess.Popen(wrap(["stunnel4", str(conf)], slog, on), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
        try:
            for p in (back, tls, wrp, ex):
                wait_port(p, st)
            got = []
            for port, n, size, kind in runs:
                p = subprocess.run(wrap([sys.executable, str(tmp_path / "client.py"), str(port),
                                         str(n), str(size), kind], clog, on),
                                   capture_output=True, text=True, timeout=60)
                got.append(p.stdout.strip() or p.stderr[-500:])
            assert got == want, (on, got)
            assert st.poll() is None and echo.poll() is None
        finally:
            stop(st)
            stop(echo)
    # Under memlan every connection is accelerated, at both ends: the clients' 15; stunnel's 21
    # accepted and 18 made (wrap to tls, tls to the echo server); the echo server's 12; and the
    # exec service's 3 socketpairs, which stunnel makes as loopback TCP pairs (6 ends).
    assert accelerated(clog) == 15 and tcp_reasons(clog) == [], clog.read_text()[-2000:]
    assert accelerated(slog) == 21 + 18 + 12 + 6 and tcp_reasons(slog) == [], slog.read_text()[-2000:]


# ---- exim4 -------------------------------------------------------------------------------------

EXIM_CONF = """
primary_hostname = test.example
domainlist local_domains = @ : localhost : test.example
exim_user = Debian-exim
exim_group = {group}
spool_directory = {d}/spool
log_file_path = {d}/log/%slog
pid_file_path = {d}/exim.pid
daemon_smtp_ports = {port}
local_interfaces = 127.0.0.1
keep_environment =
host_lookup =
tls_advertise_hosts =
message_size_limit = 100M
acl_smtp_rcpt = acl_check_rcpt
begin acl
acl_check_rcpt:
  accept
begin routers
local:
  driver = accept
  domains = +local_domains
  local_parts = u0 : u1 : u2
  transport = mdir
begin transports
mdir:
  driver = appendfile
  directory = {d}/{sub}/${{local_part_data}}
  maildir_format
  create_directory
  mode = 0644
begin retry
* * F,1h,1m
"""

SMTP_CLIENT = r"""
import hashlib, smtplib, sys, threading
port, n = int(sys.argv[1]), 3
def body(i, size):
    line = (b"%06d " % i) + bytes(range(48, 48 + 64))
    lines = [(b"." if k % 50 == 0 else b"") + line + (b"%08d" % k) for k in range(size // 80 + 1)]
    return b"\r\n".join(lines) + b"\r\n"  # dot-stuffed on the wire by smtplib, undone by exim
res = []
def one(k):
    s = smtplib.SMTP("127.0.0.1", port, timeout=60)
    for j, size in enumerate((100, 30000, 4000000)):
        m = b"From: a@x.org\r\nTo: u%d@test.example\r\nX-Id: %d\r\n\r\n" % (k, j) + body(k * 10 + j, size)
        s.sendmail("a@x.org", ["u%d@test.example" % k], m)
    s.quit(); res.append(k)
th = [threading.Thread(target=one, args=(k,)) for k in range(n)]
[t.start() for t in th]; [t.join(120) for t in th]
print(sorted(res))
for k in range(n):
    for j, size in enumerate((100, 30000, 4000000)):
        print(k, j, hashlib.sha256(body(k * 10 + j, size).replace(b"\r\n", b"\n")).hexdigest())
"""


def exim_delivered(d, n=3):
    """{(k, j): sha256 of the body} of the messages exim delivered into d's maildirs."""
    got = {}
    for k in range(n):
        new = d / f"u{k}" / "new"
        for f in new.iterdir() if new.exists() else ():
            hdr, _, body = f.read_bytes().partition(b"\n\n")
            j = [l.split(b":")[1].strip() for l in hdr.split(b"\n") if l.startswith(b"X-Id:")][0]
            got[(k, int(j))] = hashlib.sha256(body).hexdigest()
    return got


def test_exim4_daemon(gfabric, group, pubdir):
    """exim4 as a daemon (-bd -q30m) with a private configuration, so dropping from root to
    Debian-exim (in the fabric's group), forking per connection and re-executing itself (set-user-ID,
    so without memlan) to deliver: three smtplib clients, of another member of the group, send
    three messages each (one of 4 MB, dot-stuffed); the maildirs hold the same bodies as over
    kernel TCP, and every SMTP connection is accelerated."""
    if os.geteuid() != 0:
        pytest.skip("exim4 starts as root and drops to Debian-exim")
    need("exim4")
    fab, gid = gfabric
    ex = pwd.getpwnam("Debian-exim")
    (pubdir / "client.py").write_text(SMTP_CLIENT)
    for sub in ("spool", "log", "plain", "memlan"):
        (pubdir / sub).mkdir()
        os.chown(pubdir / sub, ex.pw_uid, gid)
    results = {}
    for on in (False, True):
        port = next_port()
        sub = "memlan" if on else "plain"
        conf = pubdir / f"exim-{sub}.conf"
        conf.write_text(EXIM_CONF.format(d=pubdir, group=group[0], port=port, sub=sub))
        slog, clog = pubdir / "server.log", pubdir / "client.log"
        for f in (slog, clog):
            f.write_text("")
            os.chmod(f, 0o666)
        srv = subprocess.Popen(wrap(["exim4", "-C", str(conf), "-bdf", "-q30m"], slog, on),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            wait_port(port, srv)
            p = subprocess.run(member(gid, wrap(["/usr/bin/python3", str(pubdir / "client.py"),
                                                 str(port)], clog, on)),
                               capture_output=True, text=True, timeout=120)
            assert p.returncode == 0, p.stderr[-2000:]
            lines = p.stdout.splitlines()
            assert lines[0] == "[0, 1, 2]", p.stdout
            want = {(int(k), int(j)): h for k, j, h in (l.split() for l in lines[1:])}
            end = time.monotonic() + 30
            while exim_delivered(pubdir / sub) != want and time.monotonic() < end:
                time.sleep(0.2)
            results[on] = exim_delivered(pubdir / sub)
            assert results[on] == want, (on, sorted(results[on]), (pubdir / "log" / "mainlog").read_text()[-3000:])
        finally:
            stop(srv)
    c, s = clog.read_text(), slog.read_text()
    assert c.count("accelerated (client)") == 3 and tcp_reasons(clog) == [], c[-3000:]
    assert s.count("accelerated (accepted") == 3 and tcp_reasons(slog) == [], s[-3000:]
    assert "exec of /usr/sbin/exim4, a set-user-ID program" in s, s[-3000:]  # the delivery, said
    panic = pubdir / "log" / "paniclog"  # -C's drop to Debian-exim is said there, each time
    bad = [l for l in (panic.read_text().splitlines() if panic.exists() else [])
           if "lost privilege for using -C option" not in l]
    assert bad == [], bad[-20:]
