# SPDX-License-Identifier: Apache-2.0 OR MIT
"""Log and name daemons under `memlan run`, as Debian ships them: rsyslog (imtcp's worker
threads, dropping privileges with $PrivDropToUser; a second rsyslog forwarding with omfwd through
a disk-assisted queue, across a restart of the receiver), syslog-ng (network() source and
destination), bind9's named (-u bind, its worker threads; queries over TCP, several on one
connection, and a zone transfer between a primary and a secondary) and ngircd with several
clients in one channel.  Every workload's records and status are compared with the same run over
kernel TCP; both ends run under memlan.  Every process is stopped by its PID; every wait is
bounded.
"""
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

from conftest import MEMLAN, port_range, stop_proc, pubdir  # noqa: F401 (fixture)
from test_apps import accelerated, settle, tcp_reasons, wait_port, wrap  # noqa: F401

next_port = port_range(27401, 27599, "test_apps_logs")  # no other test's range, below the ephemeral range

stop = stop_proc


def logfile(path):
    path.write_text("")
    os.chmod(path, 0o666)
    return path


@pytest.fixture
def group_fabric(monkeypatch):
    """A group fabric for the group the caller names (made by the documented command), in
    MEMLAN_FABRIC; afterwards no channel or segment file may be left."""
    made = []

    def make(group):
        d = pathlib.Path(tempfile.mkdtemp(prefix="memlan-logs-", dir="/dev/shm"))
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


def wait_for(pred, timeout, what):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def lines_of(path):
    try:
        return path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return []


def records(path, tags):
    """{tag: [message, ...]} of the lines "TAG|MESSAGE" in path whose tag is one of tags."""
    got = {t: [] for t in tags}
    for l in lines_of(path):
        tag, _, msg = l.partition("|")
        if tag in got:
            got[tag].append(msg.lstrip(" "))
    return got


def spawn(cmd, log, on, **kw):
    return subprocess.Popen(wrap(cmd, log, on), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, **kw)


# ---- rsyslog -----------------------------------------------------------------------------------
# /etc/rsyslog.conf's globals as Debian ships them; the receiver drops to the daemon user (Debian
# has no syslog user; Ubuntu's rsyslog.conf drops to its own), imtcp with its default worker
# pool; the forwarder's omfwd over TCP through a disk-assisted LinkedList queue.

RS_COMMON = """
$FileOwner root
$FileGroup adm
$FileCreateMode 0640
$DirCreateMode 0755
$Umask 0022
global(workDirectory="{d}/work")
module(load="imtcp")
input(type="imtcp" address="127.0.0.1" port="{port}")
template(name="line" type="string" string="%programname%|%msg:::drop-last-lf%\\n")
"""

RS_RECEIVER = RS_COMMON + """
$PrivDropToUser daemon
$PrivDropToGroup daemon
*.* action(type="omfile" file="{d}/out.log" template="line")
"""

RS_FORWARDER = RS_COMMON + """
*.* action(type="omfile" file="{d}/out.log" template="line")
*.* action(type="omfwd" target="127.0.0.1" port="{to}" protocol="tcp"
           template="RSYSLOG_ForwardFormat"
           queue.type="LinkedList" queue.filename="fwdq" queue.saveOnShutdown="on"
           queue.size="100000" action.resumeRetryCount="-1" action.resumeInterval="1")
"""


def rsyslog_dir(base, name, conf, **kw):
    d = base / name
    (d / "work").mkdir(parents=True)
    daemon = pwd.getpwnam("daemon")
    for p in (d, d / "work"):
        os.chown(p, daemon.pw_uid, daemon.pw_gid)
    (d / "rsyslog.conf").write_text(conf.format(d=d, **kw))
    return d


def rsyslogd(d, log, on):
    return spawn(["rsyslogd", "-n", "-f", str(d / "rsyslog.conf"), "-i", str(d / "pid")], log, on)


def send_lines(port, tag, lines, log, on, timeout=60):
    """logger --tcp with one message a line of its standard input: its status."""
    p = subprocess.run(wrap(["logger", "--tcp", "-n", "127.0.0.1", "-P", str(port), "-t", tag],
                            log, on), input="".join(l + "\n" for l in lines), text=True,
                       capture_output=True, timeout=timeout)
    return p.returncode, p.stderr[-500:]


def batch(tag, first, n):
    return [f"{tag} line {i:06d} {'x' * (i % 97)}" for i in range(first, first + n)]


def test_rsyslog_as_debian_ships_it(group_fabric, pubdir):
    """A receiving rsyslogd (imtcp, dropping to the daemon user) and a forwarding one (omfwd over
    TCP through a disk-assisted queue), both under memlan, fed by logger --tcp clients: 4
    senders of 1500 lines straight to the receiver and 3 through the forwarder; then the receiver
    is stopped, 3 more batches go to the forwarder while it is down, and a new receiver on the
    same port gets them.  Every line arrives once, in its sender's order, as over kernel TCP."""
    if os.geteuid() != 0:
        pytest.skip("rsyslogd starts as root and drops to the daemon user")
    if not shutil.which("rsyslogd"):
        pytest.skip("rsyslog is not installed (scripts/install-apps.sh installs it)")
    group_fabric("daemon")
    res = {}
    for on in (False, True):
        base = pubdir / ("on" if on else "off")
        base.mkdir()
        os.chmod(base, 0o755)
        rlog, flog, clog = (logfile(base / n) for n in ("recv.log", "fwd.log", "client.log"))
        pr, pf = next_port(), next_port()
        rd = rsyslog_dir(base, "recv", RS_RECEIVER, port=pr)
        fd = rsyslog_dir(base, "fwd", RS_FORWARDER, port=pf, to=pr)
        recv = rsyslogd(rd, rlog, on)
        fwd = rsyslogd(fd, flog, on)
        recv2 = None
        direct = {f"d{k}": batch(f"d{k}", 0, 1500) for k in range(4)}
        via = {f"f{k}": batch(f"f{k}", 0, 1500) for k in range(3)}
        later = {f"f{k}": batch(f"f{k}", 1500, 500) for k in range(3)}
        tags = list(direct) + list(via)
        status = []
        try:
            wait_port(pr, recv)
            wait_port(pf, fwd)
            for tag, lines in list(direct.items()) + list(via.items()):
                status.append(send_lines(pr if tag in direct else pf, tag, lines, clog, on))
            want1 = sum(map(len, direct.values())) + sum(map(len, via.values()))
            wait_for(lambda: sum(map(len, records(rd / "out.log", tags).values())) >= want1, 40,
                     "the first batches at the receiver")
            stop(recv)
            status.append(("receiver", recv.returncode))
            for tag, lines in later.items():
                status.append(send_lines(pf, tag, lines, clog, on))
            time.sleep(1.5)  # the forwarder meets the closed connection while the receiver is down
            recv2 = rsyslogd(rd, rlog, on)
            wait_port(pr, recv2)
            want2 = want1 + sum(map(len, later.values()))
            try:
                wait_for(lambda: sum(map(len, records(rd / "out.log", tags).values())) >= want2, 40,
                         "the later batches at the receiver")
            except AssertionError:
                pass
            time.sleep(1.0)  # nothing more may come
            assert fwd.poll() is None and recv2.poll() is None
        finally:
            stop(fwd)
            stop(recv2)
            stop(recv)
        status += [("forwarder", fwd.returncode), ("receiver2", recv2.returncode)]
        got = records(rd / "out.log", tags)
        at_fwd = records(fd / "out.log", list(via))
        res[on] = (status, got, at_fwd)
        for tag in direct:
            assert got[tag] == direct[tag], (on, tag, len(got[tag]))
        for tag in via:
            assert at_fwd[tag] == via[tag] + later[tag], (on, tag, len(at_fwd[tag]))
    assert res[True][0] == res[False][0], (res[True][0], res[False][0])
    for tag in res[False][1]:
        assert res[True][1][tag] == res[False][1][tag], (tag, len(res[True][1][tag]), len(res[False][1][tag]))
    r, f, c = rlog.read_text(), flog.read_text(), clog.read_text()
    assert c.count("accelerated (client)") == 10 and tcp_reasons(clog) == [], c[-2000:]
    assert tcp_reasons(rlog) == [] and tcp_reasons(flog) == [], r[-2000:] + f[-2000:]
    assert f.count("accelerated (client)") >= 2, f[-3000:]
    assert r.count("accelerated (accepted") == 4 + f.count("accelerated (client)"), r[-3000:]


# ---- a client that only writes -----------------------------------------------------------------

WRITE_ONLY_SERVER = r"""
import socket, sys, time
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", int(sys.argv[1]))); l.listen(8)
print("ready", flush=True)
time.sleep(0.5)  # the client's bytes are in the ring before the offer is taken
c, _ = l.accept()
n = 0
while True:
    b = c.recv(65536)
    if not b: break
    n += len(b)
print("got", n, flush=True)
"""

WRITE_ONLY_CLIENT = r"""
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"<13>1 - h t - - - m\n" * 500)
print("sent", flush=True)
sys.stdin.readline()  # idle, as a forwarder between messages
s.close()
"""


def test_write_only_client_is_told_accelerated(fabric, tmp_path):
    """A client that writes its records into the ring before the server accepts, then only idles
    and closes (logger, omfwd's connection while the receiver restarts): its log never said
    "accelerated (client)" (nor anything but "offer posted"), and memlan stat showed it "waiting:
    offer posted, not yet taken" while the server had taken the channel and read every byte."""
    port = next_port()
    slog, clog = logfile(tmp_path / "s.log"), logfile(tmp_path / "c.log")
    srv = subprocess.Popen(wrap([shutil.which("python3"), "-c", WRITE_ONLY_SERVER, str(port)], slog),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cli = None
    try:
        assert srv.stdout.readline().strip() == "ready"
        cli = subprocess.Popen(wrap([shutil.which("python3"), "-c", WRITE_ONLY_CLIENT, str(port)], clog),
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
        assert cli.stdout.readline().strip() == "sent"
        wait_for(lambda: "accelerated (accepted" in slog.read_text(), 10, "the server's accept")
        time.sleep(0.3)
        st = subprocess.run([str(MEMLAN), "stat"], capture_output=True, text=True, timeout=30).stdout
        cli.stdin.write("\n")
        cli.stdin.close()
        assert cli.wait(15) == 0
        out, err = srv.communicate(timeout=15)
        assert srv.returncode == 0 and out.split() == ["got", str(20 * 500)], (out, err)
    finally:
        stop(cli)
        stop(srv)
    mine = [l for l in st.splitlines() if f"-> 127.0.0.1:{port} " in l]
    assert len(mine) == 1 and " accelerated: bytes out/in 10000/0" in mine[0], st
    c = clog.read_text()
    assert c.count("accelerated (client)") == 1 and tcp_reasons(clog) == [], c
    settle()
