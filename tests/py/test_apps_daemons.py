# SPDX-License-Identifier: Apache-2.0 OR MIT
"""Network daemons under `memlan run`, as Debian ships them: postfix (master, smtpd in its chroot,
qmgr, local delivery, its SMTP client relaying to a second listener; reload, stop and start),
unbound (DNS over TCP, pipelined queries on one connection, forwarding over TCP to a second
resolver), slapd (dropping to the openldap user), beanstalkd and an Erlang gen_tcp echo, with
both ends under memlan; and Go programs, which memlan cannot reach, beside memlan peers.  Each
workload's bytes and status are compared with the same run over kernel TCP.  Every process is
stopped by its PID; every wait is bounded.
"""
import collections
import grp
import hashlib
import mailbox
import os
import pathlib
import pwd
import re
import shutil
import subprocess
import sys
import time

import pytest

from conftest import MEMLAN, port_range, stop_proc, port_free, pubdir  # noqa: F401 (fixture)
from test_apps import accelerated, settle, tcp_reasons, wait_port, wrap

next_port = port_range(26601, 26799, "test_apps_daemons")  # no other test's range, below the ephemeral range


stop = stop_proc


def as_member(gid, cmd):
    """cmd run as daemon (uid 1) with gid as its only group: a client of another user."""
    return ["setpriv", "--reuid=1", f"--regid={gid}", f"--groups={gid}", "--"] + cmd


def logfile(path):
    path.write_text("")
    os.chmod(path, 0o666)
    return path


def procs_with_env(key, value):
    """PIDs of the processes whose environment holds key=value (a postfix instance's daemons
    carry MAIL_CONFIG=its directory)."""
    want, found = f"{key}={value}".encode(), []
    for q in filter(str.isdigit, os.listdir("/proc")):
        try:
            if want in open(f"/proc/{q}/environ", "rb").read().split(b"\0"):
                found.append(int(q))
        except OSError:
            pass
    return found


# ---- postfix -----------------------------------------------------------------------------------
# Debian's postfix conflicts with exim4-daemon-light (both are the mail-transport-agent), which
# test_apps_mail needs: scripts/install-apps.sh unpacks postfix's package under
# /opt/memlan-apps/postfix instead (its binaries, daemons, master.cf and postfix-script, unchanged)
# and the instances here name its directories; an installed postfix serves as well.

PF_OPT = pathlib.Path("/opt/memlan-apps/postfix")


def postfix_root():
    """The root postfix's files are under: / when the package is installed, else its unpacked
    copy; None when neither is there."""
    for root in (pathlib.Path("/"), PF_OPT):
        if (root / "usr/sbin/postfix").exists() and (root / "usr/lib/postfix/sbin/master").exists():
            return root
    return None


PF_MAIN = """
# /etc/postfix/main.cf as Debian's postinst writes it ("Local only"), with the instance's paths,
# address and port made the test's, TLS off (no snakeoil certificate) and no DNS.
smtpd_banner = $myhostname ESMTP $mail_name (Debian/GNU)
biff = no
append_dot_mydomain = no
readme_directory = no
compatibility_level = 3.6
smtpd_tls_security_level = none
smtp_tls_security_level = none
smtpd_relay_restrictions = permit_mynetworks permit_sasl_authenticated defer_unauth_destination
myhostname = test.example
alias_maps =
alias_database =
mynetworks = 127.0.0.0/8
mailbox_size_limit = 0
message_size_limit = 0
recipient_delimiter = +
inet_interfaces = 127.0.0.1
inet_protocols = ipv4
queue_directory = {d}/spool
data_directory = {d}/data
mail_spool_directory = {d}/mail
maillog_file = {d}/maillog
maillog_file_prefixes = {d}
disable_dns_lookups = yes
smtp_host_lookup = native
local_recipient_maps =
luser_relay = nobody
daemon_directory = {root}/usr/lib/postfix/sbin
command_directory = {root}/usr/sbin
shlib_directory = {root}/usr/lib/postfix
meta_directory = {d}/etc
import_environment = MAIL_CONFIG MAIL_DEBUG MAIL_LOGTAG TZ XAUTHORITY DISPLAY LANG=C POSTLOG_SERVICE POSTLOG_HOSTNAME LD_LIBRARY_PATH={root}/usr/lib/postfix
"""

PF_LOCAL = "mydestination = test.example, localhost\n"
PF_RELAY = "mydestination =\nrelayhost = [127.0.0.1]:{relay}\n"


def postfix_instance(root, d, port, extra):
    """A private instance in d: Debian's master.cf with its smtp service on 127.0.0.1:port
    (chrooted, as shipped), main.cf above plus extra."""
    etc = d / "etc"
    for sub in ("etc", "mail", "spool", "data"):
        (d / sub).mkdir(parents=True)
    os.chmod(d, 0o755)
    os.chmod(d / "mail", 0o1777)
    pf = pwd.getpwnam("postfix")
    os.chown(d / "data", pf.pw_uid, pf.pw_gid)
    share, meta = root / "usr/share/postfix", root / "etc/postfix"
    master = (share / "master.cf.dist").read_text()
    svc = "smtp      inet  n       -       y       -       -       smtpd"
    assert svc in master, "Debian's master.cf changed"
    (etc / "master.cf").write_text(master.replace(svc, svc.replace("smtp     ", f"127.0.0.1:{port}"), 1))
    shutil.copy(share / "dynamicmaps.cf", etc)
    for f in ("postfix-files", "post-install", "postfix-script"):
        shutil.copy(meta / f, etc)
    for sub in ("postfix-files.d", "dynamicmaps.cf.d"):
        shutil.copytree(meta / sub, etc / sub)
    (etc / "main.cf").write_text(PF_MAIN.format(d=d, root=root) + extra)
    return etc


def postfix_cmd(root, etc, *verb):
    return ["env", f"LD_LIBRARY_PATH={root}/usr/lib/postfix", str(root / "usr/sbin/postfix"),
            "-c", str(etc), *verb]


SMTP_CLIENT = r"""
import hashlib, smtplib, sys, threading
port, k, m, dom, base = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
def body(i):
    size = (100, 3000, 70000, 1500000)[i % 4]
    line = (b"%06d " % i) + bytes(range(48, 48 + 64))
    lines = [(b"." if n % 50 == 0 else b"") + line + (b"%08d" % n) for n in range(size // 80 + 1)]
    return b"\r\n".join(lines) + b"\r\n"  # dot-stuffed on the wire by smtplib
res, bad = [], []
def one(t):
    try:
        s = smtplib.SMTP("127.0.0.1", port, timeout=60)
        for j in range(m):
            i = base + t * 100 + j
            msg = b"From: a@x.org\r\nTo: nobody@%s\r\nX-Id: %d\r\n\r\n" % (dom.encode(), i) + body(i)
            s.sendmail("a@x.org", ["nobody@" + dom], msg)
        s.quit(); res.append(t)
    except Exception as e:
        bad.append(repr(e))
th = [threading.Thread(target=one, args=(t,)) for t in range(k)]
[x.start() for x in th]; [x.join(120) for x in th]
print(sorted(res), bad)
for t in range(k):
    for j in range(m):
        i = base + t * 100 + j
        print(i, hashlib.sha256(body(i).replace(b"\r\n", b"\n")).hexdigest())
"""

SMTP_SINK = r"""
import hashlib, os, socket, sys, threading
port, out = int(sys.argv[1]), sys.argv[2]
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", port)); ls.listen(64)
def serve(c):
    f = c.makefile("rb"); w = lambda s: c.sendall(s.encode() + b"\r\n")
    w("220 sink ESMTP")
    while True:
        l = f.readline()
        if not l: break
        cmd = l[:4].upper()
        if cmd == b"EHLO": c.sendall(b"250-sink\r\n250-PIPELINING\r\n250 8BITMIME\r\n")
        elif cmd == b"HELO": w("250 sink")
        elif cmd in (b"MAIL", b"RCPT", b"RSET", b"NOOP"): w("250 ok")
        elif cmd == b"DATA":
            w("354 go"); data = []
            while True:
                d = f.readline()
                if d == b".\r\n" or not d: break
                data.append(d[1:] if d.startswith(b".") else d)
            hdr, _, body = b"".join(data).replace(b"\r\n", b"\n").partition(b"\n\n")
            xid = [h.split(b":")[1].strip().decode() for h in hdr.split(b"\n")
                   if h.lower().startswith(b"x-id:")][0]
            with open(os.path.join(out, xid + ".tmp"), "w") as o:
                o.write(hashlib.sha256(body).hexdigest())
            os.rename(os.path.join(out, xid + ".tmp"), os.path.join(out, xid))
            w("250 queued")
        elif cmd == b"QUIT": w("221 bye"); break
        else: w("502 no")
    c.close()
while True:
    c, _ = ls.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""


def mbox_got(path):
    """{X-Id: sha256 of the body} of the messages local delivered into the mbox at path."""
    got = {}
    if path.exists():
        for msg in mailbox.mbox(str(path)):
            got[int(msg["X-Id"])] = hashlib.sha256(
                msg.get_payload(decode=False).encode("latin-1")).hexdigest()
    return got


def sink_got(d):
    return {int(f.name): f.read_text() for f in d.iterdir() if f.name.isdigit()}


def test_postfix_as_debian_ships_it(group_fabric, pubdir):
    """postfix as Debian ships it, in two private instances started with `postfix start-fg`
    under memlan (master as root; smtpd chrooted and as postfix; qmgr, cleanup, local): smtplib
    clients (another user, in postfix's group: postfix drops every supplementary group) send 4
    rounds of 3 connections x 6 messages (100 B to 1.5 MB, dot-stuffed) to one instance, which
    delivers them locally, with `postfix reload` between two rounds; and to the other, whose
    SMTP client relays them to a python SMTP sink under memlan, with `postfix stop` and a new
    start-fg between two rounds.  The mailbox and the sink hold the same bodies as over kernel
    TCP, every client connection and every relay connection (postfix's smtp client, chrooted,
    caching its connections in scache) is accelerated, and no daemon is left after the stop.
    Before, postfix's clean_env() (environ[0] = 0) dropped LD_PRELOAD: master and its daemons
    ran without memlan and no connection was accelerated."""
    if os.geteuid() != 0:
        pytest.skip("postfix's master runs as root, as Debian starts it")
    root = postfix_root()
    if root is None:
        pytest.skip("postfix is not installed (scripts/install-apps.sh unpacks it)")
    try:
        pf = pwd.getpwnam("postfix")
        grp.getgrnam("postdrop")
    except KeyError:
        pytest.skip("no postfix user or postdrop group (scripts/install-apps.sh makes them)")
    fab = group_fabric("postfix")
    gid = pf.pw_gid
    work = pubdir
    (work / "client.py").write_text(SMTP_CLIENT)
    (work / "sink.py").write_text(SMTP_SINK)
    py = "/usr/bin/python3"
    results = {}
    for on in (False, True):
        base = work / ("on" if on else "off")
        base.mkdir()
        os.chmod(base, 0o755)
        slog, clog, klog = (logfile(base / n) for n in ("server.log", "client.log", "sink.log"))
        pa, pb, ps = next_port(), next_port(), next_port()
        a = postfix_instance(root, base / "a", pa, PF_LOCAL)
        b = postfix_instance(root, base / "b", pb, PF_RELAY.format(relay=ps))
        out = base / "sink"
        out.mkdir()
        os.chmod(out, 0o777)
        procs = {}

        def start(name, etc):
            procs[name] = subprocess.Popen(wrap(postfix_cmd(root, etc, "start-fg"), slog, on),
                                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                           text=True)

        def send(port, dom, first):
            p = subprocess.run(as_member(gid, wrap([py, str(work / "client.py"), str(port), "3",
                                                    "6", dom, str(first)], clog, on)),
                               capture_output=True, text=True, timeout=120)
            assert p.returncode == 0, (on, p.stderr[-2000:])
            lines = p.stdout.splitlines()
            mlog = base / ("a" if port == pa else "b") / "maillog"
            assert lines[0] == "[0, 1, 2] []", (on, p.stdout[:2000], clog.read_text()[-2000:],
                                                mlog.read_text()[-3000:] if mlog.exists() else "")
            return {int(i): h for i, h in (l.split() for l in lines[1:])}

        sink = subprocess.Popen(as_member(gid, wrap([py, str(work / "sink.py"), str(ps), str(out)],
                                                    klog, on)),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            start("a", a)
            start("b", b)
            wait_port(ps, sink)
            wait_port(pa, procs["a"])
            wait_port(pb, procs["b"])
            want_a, want_b = send(pa, "test.example", 1000), send(pb, "remote.example", 3000)
            r = subprocess.run(wrap(postfix_cmd(root, a, "reload"), slog, on),
                               capture_output=True, text=True, timeout=30)
            assert r.returncode == 0, r.stderr
            want_a.update(send(pa, "test.example", 2000))
            r = subprocess.run(postfix_cmd(root, b, "stop"), capture_output=True, text=True,
                               timeout=30)
            assert r.returncode == 0, r.stderr
            stopped = procs["b"].wait(30)  # start-fg's status: 143 (master's SIGTERM) over TCP
            end = time.monotonic() + 15  # the daemons see their master gone and leave
            while procs_with_env("MAIL_CONFIG", b) and time.monotonic() < end:
                time.sleep(0.1)
            assert procs_with_env("MAIL_CONFIG", b) == [], "postfix daemons left after stop"
            start("b", b)
            wait_port(pb, procs["b"])
            want_b.update(send(pb, "remote.example", 4000))
            end = time.monotonic() + 45
            while time.monotonic() < end and (mbox_got(base / "a/mail/nobody") != want_a or
                                              sink_got(out) != want_b):
                time.sleep(0.2)
            results[on] = (mbox_got(base / "a/mail/nobody"), sink_got(out), stopped)
            assert results[on][:2] == (want_a, want_b), (
                on, len(results[on][0]), len(results[on][1]),
                (base / "a/maillog").read_text()[-2000:], (base / "b/maillog").read_text()[-2000:])
            assert sink.poll() is None
        finally:
            for etc, name in ((a, "a"), (b, "b")):
                subprocess.run(postfix_cmd(root, etc, "stop"), capture_output=True, timeout=30)
                stop(procs.get(name))
                end = time.monotonic() + 15
                while procs_with_env("MAIL_CONFIG", etc) and time.monotonic() < end:
                    time.sleep(0.1)
                for q in procs_with_env("MAIL_CONFIG", etc):  # none, unless the stop failed
                    try:
                        os.kill(q, 9)
                    except OSError:
                        pass
            stop(sink)
        for name in ("a", "b"):
            log = (base / name / "maillog").read_text()
            bad = [l for l in log.splitlines() if any(w in l for w in (
                "fatal:", "panic:", "killed by signal", "status 1", "warning: process"))]
            assert bad == [], (on, bad[-10:])
    assert results[True] == results[False]
    c, s, k = clog.read_text(), slog.read_text(), klog.read_text()
    # 12 connections to smtpd, each accelerated at both ends (smtpd chrooted, as postfix)
    assert c.count("accelerated (client)") == 12 and tcp_reasons(clog) == [], c[-3000:]
    assert s.count("accelerated (accepted") == 12, s[-3000:]
    # postfix's smtp client, chrooted before its first connect, relays over accelerated
    # connections too, which it hands to scache and takes back over SCM_RIGHTS (before, it found
    # no fabric in its chroot: "fabric unavailable: no such directory"; then, with the fabric
    # opened before the chroot, each pass was "lost" as if from a seccomp sandbox, and a later
    # smtp process's RSET on the kernel socket split the stream)
    assert k.count("accelerated (accepted") >= 2 and tcp_reasons(klog) == [], k[-3000:]
    assert tcp_reasons(slog) == [] and "fabric unavailable" not in s, s[-3000:]
    assert "accelerated (passed over SCM_RIGHTS)" in s, s[-3000:]
    for t in (s, c, k):
        assert "lost" not in t and "split" not in t, t[-3000:]
    # master names postfix's euid in its port's record once: it toggles its euid some thirty
    # times as it starts, and each rewrote the record's ACL and logged the line again
    per = collections.Counter(re.findall(r"memlan\[(\d+)\]: port (\d+): euid \d+ may accept", s))
    assert per and max(per.values()) == 1, per


# ---- unbound -----------------------------------------------------------------------------------

DNS_CLIENT = r"""
import hashlib, socket, struct, sys
port, n, conns = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
def q(qid, name, qtype):
    b = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    return struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0) + b + struct.pack(">HH", qtype, 1)
def readn(s, k):
    b = b""
    while len(b) < k:
        c = s.recv(k - len(b))
        if not c: raise EOFError("closed after %d of %d" % (len(b), k))
        b += c
    return b
out = []
for c in range(conns):
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    qs, buf = {}, b""
    for i in range(n):  # every query written at once, before the first answer is read
        qid = (c * n + i) & 0xffff
        name, t = ("h%d.test.example" % (i % 300), (1, 28)[i % 2]) if i % 7 else ("txt%d.test.example" % (i % 5), 16)
        m = q(qid, name, t); qs[qid] = name; buf += struct.pack(">H", len(m)) + m
    s.sendall(buf)
    got = {}
    for i in range(n):  # answers in any order: matched by id
        r = readn(s, struct.unpack(">H", readn(s, 2))[0]); got[struct.unpack(">H", r[:2])[0]] = r[2:]
    s.close()
    out += ["%d %s %s" % (k, qs[k], got[k].hex()) for k in sorted(got)]
print(len(out), hashlib.sha256("\n".join(out).encode()).hexdigest())
"""


def unbound_conf(d, port, forward=None):
    """An unbound.conf as Debian's defaults leave it (no chroot, username unbound), listening on
    127.0.0.1:port over TCP: a static zone of 600 A/AAAA and 5 TXT records, or forwarding that
    zone over TCP (tcp-upstream, with no cache) to 127.0.0.1:forward."""
    d.mkdir()
    lines = ["server:", f"  interface: 127.0.0.1@{port}", f"  port: {port}", "  do-ip6: no",
             f'  directory: "{d}"', f'  pidfile: "{d}/pid"', "  use-syslog: no",
             f'  logfile: "{d}/log"', "  access-control: 127.0.0.0/8 allow",
             "  incoming-num-tcp: 64", "  do-not-query-localhost: no", "  tcp-idle-timeout: 30000"]
    if forward is None:
        lines.append('  local-zone: "test.example." static')
        for i in range(300):
            lines.append(f'  local-data: "h{i}.test.example. 300 IN A 10.{i // 256}.{i % 256}.7"')
            lines.append(f'  local-data: "h{i}.test.example. 300 IN AAAA fd00::{i:x}"')
        for i in range(5):
            lines.append(f"  local-data: 'txt{i}.test.example. 300 IN TXT \"{f'x{i}' * 60}\"'")
    else:
        lines += ["  tcp-upstream: yes", "  cache-max-ttl: 0", "  cache-max-negative-ttl: 0",
                  '  domain-insecure: "test.example."', "forward-zone:", '  name: "test.example."',
                  f"  forward-addr: 127.0.0.1@{forward}"]
    (d / "unbound.conf").write_text("\n".join(lines) + "\n")
    ub = pwd.getpwnam("unbound")
    os.chown(d, ub.pw_uid, ub.pw_gid)
    return d / "unbound.conf"


def test_unbound_dns_over_tcp(group_fabric, pubdir):
    """unbound as Debian ships it (dropping to the unbound user), DNS over TCP: 3 connections
    to each of two instances, each with 1000 queries written before the first answer is read;
    the second instance forwards them over TCP (tcp-upstream) to the first, with TCP Fast Open's
    sendmsg(MSG_FASTOPEN), which was plain TCP and said nowhere.  The answers are kernel TCP's,
    every client connection and the forwarder's upstream ones accelerated."""
    if os.geteuid() != 0:
        pytest.skip("unbound starts as root and drops to the unbound user")
    if not shutil.which("unbound"):
        pytest.skip("unbound is not installed (scripts/install-apps.sh installs it)")
    group_fabric("unbound")
    gid = pwd.getpwnam("unbound").pw_gid
    (pubdir / "client.py").write_text(DNS_CLIENT)
    res = {}
    for on in (False, True):
        base = pubdir / ("on" if on else "off")
        base.mkdir()
        alog, blog, clog = (logfile(base / n) for n in ("a.log", "b.log", "client.log"))
        pa, pb = next_port(), next_port()
        ca, cb = unbound_conf(base / "a", pa), unbound_conf(base / "b", pb, forward=pa)
        a = subprocess.Popen(wrap(["unbound", "-d", "-c", str(ca)], alog, on),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        b = subprocess.Popen(wrap(["unbound", "-d", "-c", str(cb)], blog, on),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            wait_port(pa, a)
            wait_port(pb, b)
            res[on] = []
            for port in (pa, pb):
                p = subprocess.run(as_member(gid, wrap(["/usr/bin/python3", str(pubdir / "client.py"),
                                                        str(port), "1000", "3"], clog, on)),
                                   capture_output=True, text=True, timeout=60)
                res[on].append((p.returncode, p.stdout.strip(), p.stderr[-1000:]))
            assert a.poll() is None and b.poll() is None
        finally:
            stop(a)
            stop(b)
        assert res[on][0][:2] == (0, res[on][0][1]) and res[on][0][1].startswith("3000 "), res[on]
        for n in ("a", "b"):
            log = (base / n / "log").read_text()
            assert "error:" not in log and "fatal" not in log, log[-2000:]
    assert res[True] == res[False], res
    c, a, b = clog.read_text(), alog.read_text(), blog.read_text()
    assert c.count("accelerated (client)") == 6 and tcp_reasons(clog) == [], c[-2000:]
    assert b.count("accelerated (client)") >= 1 and tcp_reasons(blog) == [], b[-2000:]
    assert a.count("accelerated (accepted") == 3 + b.count("accelerated (client)"), a[-2000:]
    assert tcp_reasons(alog) == [], a[-2000:]


# ---- slapd -------------------------------------------------------------------------------------

SLAPD_CONF = """
include /etc/ldap/schema/core.schema
include /etc/ldap/schema/cosine.schema
include /etc/ldap/schema/inetorgperson.schema
pidfile {d}/pid
modulepath /usr/lib/ldap
moduleload back_mdb
database mdb
suffix "dc=test,dc=example"
rootdn "cn=admin,dc=test,dc=example"
rootpw secret
directory {d}/db
maxsize 104857600
"""


def ldif_add(n):
    out = ["dn: dc=test,dc=example\nobjectClass: dcObject\nobjectClass: organization\no: t\ndc: test\n"]
    for i in range(n):
        out.append(f"dn: cn=u{i},dc=test,dc=example\nobjectClass: inetOrgPerson\ncn: u{i}\n"
                   f"sn: s{i}\ndescription: {f'd{i}' * (1 + i % 400)}\n")
    return "\n".join(out)


def ldif_modify(n):
    return "\n".join(f"dn: cn=u{i},dc=test,dc=example\nchangetype: modify\nreplace: sn\n"
                     f"sn: m{i}\n-\nadd: mail\nmail: u{i}@test.example\n" for i in range(0, n, 3))


def test_slapd_as_debian_ships_it(group_fabric, pubdir):
    """slapd (OpenLDAP) as Debian starts it, dropping to the openldap user (-u/-g), with an mdb
    database: ldapadd of 401 entries (up to 2 KB) and ldapmodify of 134 on one connection each,
    ldapsearch with filters, ldapdelete, and ldapsearch again, each as a client of another user
    in openldap's group; every output and status is kernel TCP's, every connection accelerated."""
    if os.geteuid() != 0:
        pytest.skip("slapd starts as root and drops to openldap")
    if not shutil.which("slapd") or not shutil.which("ldapsearch"):
        pytest.skip("slapd or ldap-utils is not installed (scripts/install-apps.sh installs them)")
    group_fabric("openldap")
    ol = pwd.getpwnam("openldap")
    (pubdir / "add.ldif").write_text(ldif_add(400))
    (pubdir / "mod.ldif").write_text(ldif_modify(400))
    auth = ["-x", "-D", "cn=admin,dc=test,dc=example", "-w", "secret"]
    res = {}
    for on in (False, True):
        base = pubdir / ("on" if on else "off")
        (base / "db").mkdir(parents=True)
        for p in (base, base / "db"):
            os.chown(p, ol.pw_uid, ol.pw_gid)
        (base / "slapd.conf").write_text(SLAPD_CONF.format(d=base))
        slog, clog = logfile(base / "server.log"), logfile(base / "client.log")
        port = next_port()
        url = ["-H", f"ldap://127.0.0.1:{port}"]
        srv = subprocess.Popen(wrap(["slapd", "-d", "0", "-h", f"ldap://127.0.0.1:{port}/", "-u",
                                     "openldap", "-g", "openldap", "-f",
                                     str(base / "slapd.conf")], slog, on),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        steps = [["ldapadd", *url, *auth, "-f", str(pubdir / "add.ldif")],
                 ["ldapmodify", *url, *auth, "-f", str(pubdir / "mod.ldif")],
                 ["ldapsearch", *url, "-x", "-LLL", "-b", "dc=test,dc=example", "(objectClass=*)"],
                 ["ldapsearch", *url, "-x", "-LLL", "-b", "dc=test,dc=example", "(mail=u1*)", "sn"],
                 ["ldapsearch", *url, "-x", "-LLL", "-b", "dc=test,dc=example", "(cn=nobody)"],
                 ["ldapdelete", *url, *auth] + [f"cn=u{i},dc=test,dc=example" for i in range(0, 400, 2)],
                 ["ldapdelete", *url, *auth, "cn=u0,dc=test,dc=example"],  # gone: status 32
                 ["ldapsearch", *url, "-x", "-LLL", "-b", "dc=test,dc=example", "(sn=*)", "cn"]]
        try:
            wait_port(port, srv)
            res[on] = []
            for cmd in steps:
                p = subprocess.run(as_member(ol.pw_gid, wrap(cmd, clog, on)), capture_output=True,
                                   text=True, timeout=60)
                res[on].append((cmd[0], p.returncode, hashlib.sha256(p.stdout.encode()).hexdigest(),
                                len(p.stdout), p.stderr))
            assert srv.poll() is None, "slapd exited"
        finally:
            stop(srv)
        assert srv.returncode == 0, (on, srv.returncode, srv.stderr.read()[-2000:])
    assert [r[1] for r in res[False]] == [0, 0, 0, 0, 0, 0, 32, 0], res[False]
    assert res[True] == res[False], res
    c, s = clog.read_text(), slog.read_text()
    assert c.count("accelerated (client)") == len(steps) and tcp_reasons(clog) == [], c[-2000:]
    assert s.count("accelerated (accepted") == len(steps) and tcp_reasons(slog) == [], s[-2000:]


# ---- beanstalkd --------------------------------------------------------------------------------

BEANSTALK_CLIENT = r"""
import hashlib, socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=30); f = s.makefile("rb")
n, h, buf = 2000, hashlib.sha256(), b""
for i in range(n):  # every put written before the first answer is read
    body = (b"%d-" % i) * (1 + i % 500)
    buf += b"put %d 0 60 %d\r\n%s\r\n" % (i % 7, len(body), body)
s.sendall(buf)
ids = [int(f.readline().split()[1]) for _ in range(n)]
for _ in range(n):  # by priority, then in order
    s.sendall(b"reserve-with-timeout 5\r\n"); l = f.readline().split()
    body = f.read(int(l[2]) + 2)[:-2]; h.update(body)
    s.sendall(b"delete %s\r\n" % l[1]); assert f.readline() == b"DELETED\r\n"
s.sendall(b"reserve-with-timeout 0\r\n"); last = f.readline()
print(len(set(ids)), h.hexdigest(), last.strip().decode())
"""


def test_beanstalkd(fabric, tmp_path):
    """beanstalkd (one process, epoll): 2000 pipelined puts of up to 3 KB at 7 priorities, then
    reserve and delete of each on one connection, by three clients in turn; what they read and
    the final TIMED_OUT are kernel TCP's, every connection accelerated."""
    if not shutil.which("beanstalkd"):
        pytest.skip("beanstalkd is not installed")
    (tmp_path / "c.py").write_text(BEANSTALK_CLIENT)
    res = {}
    for on in (False, True):
        slog, clog = tmp_path / f"s{on}.log", tmp_path / f"c{on}.log"
        port = next_port()
        srv = subprocess.Popen(wrap(["beanstalkd", "-l", "127.0.0.1", "-p", str(port)], slog, on),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            wait_port(port, srv)
            res[on] = []
            for _ in range(3):
                p = subprocess.run(wrap(["/usr/bin/python3", str(tmp_path / "c.py"), str(port)],
                                        clog, on), capture_output=True, text=True, timeout=60)
                res[on].append((p.returncode, p.stdout.strip(), p.stderr[-1000:]))
            assert srv.poll() is None
        finally:
            stop(srv)
    assert res[False][0][0] == 0 and res[False][0][1].endswith(" TIMED_OUT"), res[False]
    assert res[True] == res[False], res
    assert accelerated(clog) == 3 and accelerated(slog) == 3, (clog.read_text(), slog.read_text())
    assert tcp_reasons(clog) == [] and tcp_reasons(slog) == []
    settle()  # beanstalkd ends on SIGTERM without its exit handlers: its files wait for a sweep


# ---- Erlang ------------------------------------------------------------------------------------

ERL_ECHO = r"""
-module(echo).
-export([server/2, client/2]).

server(Port, N) ->
    {ok, L} = gen_tcp:listen(Port, [binary, {active, false}, {reuseaddr, true},
                                    {ip, {127,0,0,1}}]),
    io:format("ready~n"),
    loop(L, N),
    wait(N).

loop(_, 0) -> ok;
loop(L, N) ->
    {ok, S} = gen_tcp:accept(L),
    Self = self(),
    Pid = spawn(fun() -> receive go -> echo(S), Self ! done end end),
    ok = gen_tcp:controlling_process(S, Pid), Pid ! go,
    loop(L, N - 1).

%% Every echo ends before the server does (init:stop closes the sockets of those still
%% running: a wait of 500 ms instead cut the last connection's echo on a loaded machine, over
%% kernel TCP as under memlan).
wait(0) -> ok;
wait(N) -> receive done -> wait(N - 1) after 30000 -> exit(echo_timeout) end.

echo(S) ->
    case gen_tcp:recv(S, 0) of
        {ok, B} -> ok = gen_tcp:send(S, B), echo(S);
        {error, closed} -> gen_tcp:close(S)
    end.

client(Port, Size) ->
    {ok, S} = gen_tcp:connect({127,0,0,1}, Port, [binary, {active, false}]),
    Data = list_to_binary([I rem 251 || I <- lists:seq(1, Size)]),
    Self = self(),
    spawn(fun() -> ok = gen_tcp:send(S, Data), ok = gen_tcp:shutdown(S, write), Self ! sent end),
    Got = recv_all(S, <<>>),
    receive sent -> ok end,
    io:format("~p ~p~n", [byte_size(Got), crypto:hash(sha256, Got) =:= crypto:hash(sha256, Data)]).

recv_all(S, Acc) ->
    case gen_tcp:recv(S, 0) of
        {ok, B} -> recv_all(S, <<Acc/binary, B/binary>>);
        {error, closed} -> Acc
    end.
"""


def test_erlang_gen_tcp(fabric, tmp_path):
    """An Erlang gen_tcp echo server (one process per connection, handed over with
    controlling_process) and three gen_tcp clients, each sending 3 MB from one process while
    another reads the echo, then half-closing: the echo and the statuses are kernel TCP's, every
    connection accelerated at both ends (BEAM's sockets go through libc)."""
    if not shutil.which("erl") or not shutil.which("erlc"):
        pytest.skip("Erlang is not installed")
    (tmp_path / "echo.erl").write_text(ERL_ECHO)
    subprocess.run(["erlc", "-o", str(tmp_path), str(tmp_path / "echo.erl")], check=True,
                   timeout=120, capture_output=True)
    erl = ["erl", "-noshell", "-pa", str(tmp_path), "-eval"]
    res = {}
    for on in (False, True):
        slog, clog = tmp_path / f"s{on}.log", tmp_path / f"c{on}.log"
        port = next_port()
        srv = subprocess.Popen(wrap(erl + [f"echo:server({port}, 3), init:stop()."], slog, on),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert srv.stdout.readline() == "ready\n"
            res[on] = []
            for _ in range(3):
                p = subprocess.run(wrap(erl + [f"echo:client({port}, 3000000), init:stop()."], clog,
                                        on), capture_output=True, text=True, timeout=60)
                res[on].append((p.returncode, p.stdout, p.stderr[-1000:]))
            assert srv.wait(30) == 0, srv.stderr.read()[-2000:]
        finally:
            stop(srv)
    assert res[False] == [(0, "3000000 true\n", "")] * 3, res[False]
    assert res[True] == res[False], res
    assert accelerated(clog) == 3 and accelerated(slog) == 3, (clog.read_text(), slog.read_text())


# ---- Go ----------------------------------------------------------------------------------------

GO_ECHO = """package main

import (
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"os"
)

// Echo n connections, one at a time.
func serve(l net.Listener, err error, n int) {
	if err != nil {
		panic(err)
	}
	fmt.Println("ready")
	for i := 0; i < n; i++ {
		c, err := l.Accept()
		if err != nil {
			panic(err)
		}
		io.Copy(c, c)
		c.Close()
	}
}

func main() {
	if os.Args[1] == "inherited" { // a listener on fd 3
		l, err := net.FileListener(os.NewFile(3, "listener"))
		serve(l, err, 3)
		return
	}
	if os.Args[1] == "server" {
		l, err := net.Listen("tcp", "127.0.0.1:"+os.Args[2])
		serve(l, err, 1)
		return
	}
	c, err := net.Dial("tcp", "127.0.0.1:"+os.Args[2])
	if err != nil {
		panic(err)
	}
	data := make([]byte, 3<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	go func() { c.Write(data); c.(*net.TCPConn).CloseWrite() }()
	got, _ := io.ReadAll(c)
	fmt.Println(len(got), sha256.Sum256(got) == sha256.Sum256(data))
}
"""

PY_ECHO = r"""
import socket, sys
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", int(sys.argv[1]))); ls.listen(1); print("ready", flush=True)
c, _ = ls.accept()
while True:
    b = c.recv(65536)
    if not b: break
    c.sendall(b)
c.close()
"""

PY_CLIENT = r"""
import socket, sys, threading
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=30)
data = bytes((i * 7) & 255 for i in range(3 << 20))
def w(): s.sendall(data); s.shutdown(socket.SHUT_WR)
t = threading.Thread(target=w); t.start(); got = []
while True:
    b = s.recv(65536)
    if not b: break
    got.append(b)
t.join(); got = b"".join(got)
print(len(got), "true" if got == data else "false")
"""

GO = "/usr/local/go/bin/go"


# Binds and listens, puts the listener on fd 3 and execs the program after the port.
EXEC_WITH_LISTENER = r"""
import os, socket, sys
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", int(sys.argv[1])))
l.listen(8)
if l.fileno() != 3:
    os.dup2(l.fileno(), 3)
os.set_inheritable(3, True)
os.execv(sys.argv[2], sys.argv[2:])
"""
THREE_ECHOES = r"""
import socket, sys
for i in range(3):
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=30)
    s.sendall(b"hello %d" % i)
    s.shutdown(socket.SHUT_WR)
    print(s.recv(100).decode(), flush=True)
    s.close()
"""


def test_a_listener_handed_to_a_dynamically_linked_go_program(fabric, tmp_path):
    """A process under memlan run that execs a Go server (built with cgo: dynamically linked,
    so our library is loaded there, though Go accepts through its own system calls) with its
    listener on fd 3.  Three memlan clients are echoed, over TCP, and none offers to the Go
    server: before, our constructor in the Go image published the listener again, every client
    offered, and each waited out MEMLAN_ACCEPT_WAIT_MS (2 s) for a claim that never came ("no
    memlan acceptor took the offer"; an explorer).  Now exec writes no listener line for an
    image that runs without memlan."""
    go = GO if os.path.exists(GO) else shutil.which("go")
    if not go:
        pytest.skip("Go is not installed")
    (tmp_path / "main.go").write_text(GO_ECHO)
    (tmp_path / "go.mod").write_text("module gox\ngo 1.20\n")
    b = subprocess.run([go, "build", "-o", str(tmp_path / "gox"), "."], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, GOFLAGS="-mod=mod", CGO_ENABLED="1"))
    assert b.returncode == 0, b.stderr
    assert b"/lib64/ld-linux" in (tmp_path / "gox").read_bytes()[:4096], "not dynamic"
    port = str(next_port())
    slog, clog = tmp_path / "s.log", tmp_path / "c.log"
    srv = subprocess.Popen(wrap(["/usr/bin/python3", "-c", EXEC_WITH_LISTENER, port,
                                 str(tmp_path / "gox"), "inherited"], slog, True),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert srv.stdout.readline() == "ready\n", srv.stderr.read()
        p = subprocess.run(wrap(["/usr/bin/python3", "-c", THREE_ECHOES, port], clog, True),
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        assert p.stdout.split("\n")[:3] == ["hello 0", "hello 1", "hello 2"], p.stdout
        assert srv.wait(30) == 0
    finally:
        stop(srv)
    c = clog.read_text()
    assert "offer posted" not in c and "took the offer" not in c, c
    assert tcp_reasons(clog) == ["no memlan listener on this port in the fabric"] * 3, c
    # the record the launcher made is dead since its exec (its lock went): the sweep's
    subprocess.run([str(MEMLAN), "clean"], check=True, capture_output=True, timeout=60)


def test_go_programs_stay_on_tcp_whole(fabric, tmp_path):
    """Go makes its socket calls itself, so LD_PRELOAD never sees them: a memlan client (python)
    of a Go server under memlan run, and a Go client under memlan run of a memlan server, stay
    on TCP with nothing lost (3 MB echoed, half-closed); memlan run says why on stderr and in the
    log file, and the memlan ends' log lines give their reasons."""
    go = GO if os.path.exists(GO) else shutil.which("go")
    if not go:
        pytest.skip("Go is not installed")
    (tmp_path / "main.go").write_text(GO_ECHO)
    (tmp_path / "go.mod").write_text("module gox\ngo 1.20\n")
    (tmp_path / "echo.py").write_text(PY_ECHO)
    (tmp_path / "client.py").write_text(PY_CLIENT)
    b = subprocess.run([go, "build", "-o", str(tmp_path / "gox"), "."], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, GOFLAGS="-mod=mod", CGO_ENABLED="0"))
    assert b.returncode == 0, b.stderr
    gox, py = str(tmp_path / "gox"), "/usr/bin/python3"
    out = {}
    for on in (False, True):
        log = tmp_path / f"m{on}.log"
        got = []
        for server, client in (([gox, "server"], [py, str(tmp_path / "client.py")]),
                               ([py, str(tmp_path / "echo.py")], [gox, "client"])):
            port = str(next_port())
            srv = subprocess.Popen(wrap(server + [port], log, on), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
            try:
                assert srv.stdout.readline() == "ready\n", srv.stderr.read()
                p = subprocess.run(wrap(client + [port], log, on), capture_output=True, text=True,
                                   timeout=60)
                got.append((p.returncode, p.stdout))
                if on and client[0] == gox:
                    assert "is a Go program" in p.stderr, p.stderr
                assert srv.wait(30) == 0
                if on and server[0] == gox:
                    assert "is a Go program" in srv.stderr.read()
            finally:
                stop(srv)
        out[on] = got
    assert out[False] == [(0, "3145728 true\n")] * 2, out
    assert out[True] == out[False], out
    text = log.read_text()
    assert text.count("is a Go program") == 2, text
    assert accelerated(log) == 0, text
    assert tcp_reasons(log) == ["no memlan listener on this port in the fabric",
                                "the client is not memlan (no offer)"], text
