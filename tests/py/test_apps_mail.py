# SPDX-License-Identifier: Apache-2.0 OR MIT
"""Mail and relay programs under `memlan run`, as Debian ships them (scripts/install-apps.sh
installs them): dovecot (master, login and mail processes), with both ends under memlan, each
workload's bytes and status compared with the same run over kernel TCP.
"""
import hashlib
import os
import pwd
import subprocess
import sys
import time

import pytest

from conftest import MEMLAN, port_free, pubdir  # noqa: F401 (fixtures)
from test_apps import accelerated, need, settle, tcp_reasons, wait_port, wrap

PORT = [18800]  # 18801-18999: no other test's range, below the ephemeral range (32768-60999)


def next_port():
    PORT[0] += 1
    while not port_free(PORT[0], strict=True):
        PORT[0] += 1
    assert PORT[0] < 19000, "test_apps_mail ran out of its ports"
    return PORT[0]


def stop(proc):
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


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
if sys.argv[3] == "append":
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
p = poplib.POP3("127.0.0.1", pop3); p.user("tuser"); p.pass_("secret")
for i in range(1, p.stat()[0] + 1):
    got.append(hashlib.sha256(b"\r\n".join(p.retr(i)[1]) + b"\r\n").hexdigest())
p.quit()
want = [hashlib.sha256(m).hexdigest() for m in msgs]
print("ok" if got == want * 2 else "BAD %r" % got)
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
                                  "SYSTEM:cat,nofork", "SYSTEM:sha256sum,nofork"])
def test_socat_exec_and_system(fabric, tmp_path, addr):
    """socat's forking server hands each connection to a program: EXEC through a socketpair, or
    with nofork the accelerated socket itself as its stdin and stdout, across fork and exec;
    SYSTEM through system(), whose shell glibc spawns inside libc, past the exec interposers: it
    got an idle kernel socket, read nothing, and the client waited for ever.  Each client sends
    2 MB and half-closes; what it reads back and its status are kernel TCP's (before, SYSTEM with
    nofork timed out).  A shell (dash) leaves by _exit, so its files wait for the lazy reclaim."""
    need("socat", "sha256sum")
    data = os.urandom(2 << 20)
    port = next_port()
    plain = socat_pair(port, addr, data, tmp_path / "ps.log", tmp_path / "pc.log", False)
    assert plain[0] == 0 and len(plain[1]) in (len(data), 68), plain[0]
    slog, clog = tmp_path / "server.log", tmp_path / "client.log"
    got = socat_pair(port, addr, data, slog, clog, True)
    assert got[0] == plain[0] and got[1] == plain[1], (got[0], len(got[1]), clog.read_text()[-2000:],
                                                        slog.read_text()[-2000:])
    assert accelerated(clog) == 1 and accelerated(slog) == 1, (clog.read_text(), slog.read_text())
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
