# SPDX-License-Identifier: Apache-2.0 OR MIT
"""Across network namespaces: what two containers on one bridge network look like.

Each test builds its own network namespaces (unique names, deleted at teardown) joined by veth
pairs with private addresses (10.231.X.0/24) that exist only inside them, shares one fabric
directory between a server and a client started under `memlan run` in different namespaces,
and checks from memlan's log which path the connection took, and that every byte came back.
Needs root and `ip` (iproute2; scripts/install-apps.sh installs it); the NAT test needs `nft`.
"""
import os
import random
import shutil
import subprocess
import sys
import time

import pytest

from conftest import MEMLAN, memlan

PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create network namespaces"),
    pytest.mark.skipif(shutil.which("ip") is None, reason="needs ip (iproute2)"),
]

# One connection: the server echoes what it reads until EOF; the client sends random bytes
# (seeded) and checks that the same come back.  Every wait is bounded by a socket timeout.
SERVER = r"""
import socket, sys
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind((sys.argv[1], int(sys.argv[2])))
l.listen(4)
l.settimeout(30)
print("ready", flush=True)
a, peer = l.accept()
a.settimeout(30)
n = 0
while True:
    b = a.recv(65536)
    if not b:
        break
    a.sendall(b)
    n += len(b)
a.close()
print("echoed", n, "from", peer[0], flush=True)
"""

CLIENT = r"""
import random, socket, sys, threading
data = random.Random(int(sys.argv[3])).randbytes(1 << 20)
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
def send():
    for i in range(0, len(data), 4096):
        c.sendall(data[i:i + 4096])
    c.shutdown(socket.SHUT_WR)
t = threading.Thread(target=send)
t.start()
got = bytearray()
while len(got) < len(data):
    b = c.recv(65536)
    if not b:
        break
    got += b
t.join(30)
print("ok" if bytes(got) == data else "MISMATCH %d of %d" % (len(got), len(data)), flush=True)
"""


def sh(*args):
    subprocess.run(args, check=True, capture_output=True, timeout=30)


@pytest.fixture
def netns():
    """Makes namespaces and veth pairs for one test; deletes the namespaces (and with them the
    veths) at teardown."""
    made = []
    tag = "%x%x" % (os.getpid() & 0xfff, random.randrange(1 << 16))

    def ns(name):
        full = "mlt-%s-%s" % (tag, name)
        sh("ip", "netns", "add", full)
        made.append(full)
        sh("ip", "-n", full, "link", "set", "lo", "up")
        return full

    def link(a, a_addr, b, b_addr):
        """A veth pair between namespaces a and b, addressed a_addr and b_addr (with prefix)."""
        n = len(made)
        va, vb = "mv%s%da" % (tag[-4:], n), "mv%s%db" % (tag[-4:], n)
        sh("ip", "link", "add", va, "netns", a, "type", "veth", "peer", "name", vb, "netns", b)
        for ns_, dev, addr in ((a, va, a_addr), (b, vb, b_addr)):
            sh("ip", "-n", ns_, "addr", "add", addr, "dev", dev)
            sh("ip", "-n", ns_, "link", "set", dev, "up")
        return va, vb

    yield ns, link
    for full in made:
        subprocess.run(["ip", "netns", "del", full], capture_output=True, timeout=30)


def in_ns(ns, log, *cmd):
    return ["ip", "netns", "exec", ns, str(MEMLAN), "run", "--log", str(log), "--", *cmd]


def echo_pair(srv_ns, cli_ns, addr, port, tmp_path, seed):
    """Echo server in srv_ns on addr:port, client in cli_ns; returns (server out, its log,
    client log)."""
    slog, clog = tmp_path / "server.log", tmp_path / "client.log"
    srv = subprocess.Popen(in_ns(srv_ns, slog, PY, "-c", SERVER, addr, str(port)),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert srv.stdout.readline().strip() == "ready", srv.stderr.read()
        cli = subprocess.run(in_ns(cli_ns, clog, PY, "-c", CLIENT, addr, str(port), str(seed)),
                             capture_output=True, text=True, timeout=90)
        assert cli.returncode == 0 and cli.stdout.strip() == "ok", cli.stdout + cli.stderr
        out, err = srv.communicate(timeout=60)
        assert srv.returncode == 0, err
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()
    return out, slog.read_text(), clog.read_text()


def test_two_namespaces_on_a_veth_are_accelerated(fabric, netns, tmp_path):
    ns, link = netns
    x = random.randrange(1, 250)
    s, c = ns("srv"), ns("cli")
    link(s, "10.231.%d.2/24" % x, c, "10.231.%d.1/24" % x)
    out, slog, clog = echo_pair(s, c, "10.231.%d.2" % x, 47950, tmp_path, x)
    assert "echoed %d from 10.231.%d.1" % (1 << 20, x) in out, out
    assert "accelerated (client)" in clog, clog
    assert "accelerated (accepted from 10.231.%d.1" % x in slog, slog
    memlan("clean")


def test_wildcard_listener_found_by_its_veth_address(fabric, netns, tmp_path):
    ns, link = netns
    x = random.randrange(1, 250)
    s, c = ns("srv"), ns("cli")
    link(s, "10.231.%d.2/24" % x, c, "10.231.%d.1/24" % x)
    slog, clog = tmp_path / "server.log", tmp_path / "client.log"
    srv = subprocess.Popen(in_ns(s, slog, PY, "-c", SERVER, "0.0.0.0", "47951"),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert srv.stdout.readline().strip() == "ready"
        cli = subprocess.run(in_ns(c, clog, PY, "-c", CLIENT, "10.231.%d.2" % x, "47951", "7"),
                             capture_output=True, text=True, timeout=90)
        assert cli.stdout.strip() == "ok", cli.stdout + cli.stderr
        srv.communicate(timeout=60)
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()
    assert "accelerated (client)" in clog.read_text(), clog.read_text()
    memlan("clean")


@pytest.mark.skipif(shutil.which("nft") is None, reason="needs nft (nftables)")
def test_namespace_behind_nat_stays_on_tcp(fabric, netns, tmp_path):
    """Client in a third namespace, reached through a router namespace that masquerades: the
    server sees the router's address, not the client's.  TCP with the reason, every byte right."""
    ns, link = netns
    x = random.randrange(1, 250)
    y = (x + 1) % 250 + 1
    s, r, c = ns("srv"), ns("nat"), ns("cli")
    link(s, "10.231.%d.2/24" % x, r, "10.231.%d.1/24" % x)
    _, rc_dev = link(r, "10.232.%d.1/24" % y, c, "10.232.%d.2/24" % y)
    sh("ip", "netns", "exec", r, "sysctl", "-qw", "net.ipv4.ip_forward=1")
    sh("ip", "-n", c, "route", "add", "default", "via", "10.232.%d.1" % y)
    sh("ip", "netns", "exec", r, "nft",
       "add table ip mlt; add chain ip mlt post { type nat hook postrouting priority 100; }; "
       "add rule ip mlt post ip saddr 10.232.%d.0/24 masquerade" % y)
    out, slog, clog = echo_pair(s, c, "10.231.%d.2" % x, 47952, tmp_path, y)
    assert "from 10.231.%d.1" % x in out, out  # the router's address: NAT took place
    assert "accelerated (" not in clog + slog, clog + slog
    assert "TCP (the peer's namespace is reached through a router (NAT possible)" in clog, clog
    assert "TCP (" in slog, slog
    memlan("clean")


@pytest.mark.skipif(shutil.which("nft") is None, reason="needs nft (nftables)")
def test_source_nat_on_a_direct_link_stays_on_tcp(fabric, netns, tmp_path):
    """A direct link, but the client's namespace rewrites its source address (SNAT to a second
    address of its own): the offer names the address the client sees, the acceptor looks for the
    one it sees.  Nobody takes the offer, the bytes written into it go over TCP, nothing is
    misdelivered."""
    ns, link = netns
    x = random.randrange(1, 250)
    s, c = ns("srv"), ns("cli")
    _, vc = link(s, "10.231.%d.2/24" % x, c, "10.231.%d.1/24" % x)
    sh("ip", "-n", c, "addr", "add", "10.231.%d.3/24" % x, "dev", vc)
    sh("ip", "netns", "exec", c, "nft",
       "add table ip mlt; add chain ip mlt post { type nat hook postrouting priority 100; }; "
       "add rule ip mlt post ip daddr 10.231.%d.2 snat to 10.231.%d.3" % (x, x))
    out, slog, clog = echo_pair(s, c, "10.231.%d.2" % x, 47953, tmp_path, x)
    assert "from 10.231.%d.3" % x in out, out  # the rewritten address: NAT took place
    assert "accelerated (" not in clog + slog, clog + slog
    assert "a NAT between the namespaces" in clog, clog
    assert "a NAT between the namespaces" in slog, slog
    memlan("clean")


# A client that lives through many namespaces' servers: one connection per line on stdin, then
# its own mappings and descriptors of listener records.
ROUNDS_CLIENT = r"""
import os, socket, sys
addr, port = sys.argv[1], int(sys.argv[2])
for line in sys.stdin:
    c = socket.create_connection((addr, port), timeout=30)
    c.sendall(b"x" * 1000)
    c.shutdown(socket.SHUT_WR)
    got = b""
    while True:
        b = c.recv(65536)
        if not b:
            break
        got += b
    c.close()
    print("ok" if got == b"x" * 1000 else "MISMATCH", flush=True)
maps = sum(1 for l in open("/proc/self/maps") if "/ls-" in l)
fds = sum(1 for f in os.listdir("/proc/self/fd")
          if "/ls-" in (os.readlink("/proc/self/fd/" + f) if os.path.exists("/proc/self/fd/" + f) else ""))
print("records", maps, fds, flush=True)
"""


def test_dead_namespaces_records_are_let_go(fabric, netns, tmp_path):
    """A client in one namespace connects, round after round, to a server in a new namespace
    each time (the last one deleted): it must not keep one listener record (a mapping and a
    descriptor) per dead namespace for ever, as it did."""
    ns, link = netns
    x = random.randrange(1, 250)
    c = ns("cli")
    clog = tmp_path / "client.log"
    addr, port = "10.231.%d.2" % x, 47956
    cli = subprocess.Popen(in_ns(c, clog, PY, "-c", ROUNDS_CLIENT, addr, str(port)),
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    rounds = 5
    srv = None
    try:
        prev = prev_veth = None
        for i in range(rounds):
            if prev:
                subprocess.run(["ip", "netns", "del", prev], capture_output=True, timeout=30)
                # The kernel tears a deleted namespace down later, in a work queue: until then
                # the client's end of the old link, with the same address and route, is still
                # there, and a connection may go out through it (reset: the round failed so on a
                # loaded machine, before any memlan code ran).  Wait for it to go, 10 s at most.
                gone_by = time.time() + 10
                while time.time() < gone_by and subprocess.run(
                        ["ip", "-n", c, "link", "show", prev_veth],
                        capture_output=True, timeout=30).returncode == 0:
                    time.sleep(0.02)
            s = ns("srv%d" % i)
            _, prev_veth = link(s, addr + "/24", c, "10.231.%d.1/24" % x)
            slog = tmp_path / ("server%d.log" % i)
            srv = subprocess.Popen(in_ns(s, slog, PY, "-c", SERVER, addr, str(port)),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            assert srv.stdout.readline().strip() == "ready", srv.stderr.read()
            cli.stdin.write("go\n")
            cli.stdin.flush()
            assert cli.stdout.readline().strip() == "ok"
            srv.communicate(timeout=60)
            prev = s
        cli.stdin.close()
        out = cli.stdout.read()
        cli.wait(timeout=30)
    finally:
        for p in (cli, srv):  # a failed round leaves its server waiting in accept
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    text = clog.read_text()
    assert text.count("accelerated (client)") == rounds, text
    maps, fds = (int(v) for v in out.split()[1:3])
    assert maps <= 2 and fds <= 2, "records kept after %d dead namespaces: %d mappings, %d fds" % (
        rounds, maps, fds)
    memlan("clean")


# Moves itself into a new network namespace after memlan started, then listens on loopback.
UNSHARE_SERVER = r"""
import ctypes, os, socket, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
assert libc.unshare(0x40000000) == 0, ctypes.get_errno()      # CLONE_NEWNET
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
l = socket.socket()
l.bind(("127.0.0.1", int(sys.argv[1])))
l.listen(4)
print("%x" % os.stat("/proc/self/ns/net").st_ino, flush=True)
sys.stdin.readline()
"""


def test_a_namespace_entered_after_start_names_the_records(fabric, tmp_path):
    """unshare(CLONE_NEWNET) after memlan started: the listener's record carries the new
    namespace (it carried the one read at start-up, so a client in the old namespace connecting
    to its own 127.0.0.1 at that port would have found it)."""
    log = tmp_path / "memlan.log"
    port = 47957
    srv = subprocess.Popen([str(MEMLAN), "run", "--log", str(log), "--", PY, "-c", UNSHARE_SERVER,
                            str(port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        ino = srv.stdout.readline().strip()
        assert ino, srv.stderr.read()
        recs = [f for f in os.listdir(fabric) if f.startswith("ls-")]
        old = "%x" % os.stat("/proc/self/ns/net").st_ino
        assert recs == ["ls-%s-%d" % (ino, port)], (recs, ino, old)
        srv.stdin.write("\n")
        srv.stdin.flush()
        srv.wait(timeout=30)
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()
    memlan("clean")


NL_SERVER = r"""
import socket, sys
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind((sys.argv[1], int(sys.argv[2])))
l.listen(16)
print("ready", flush=True)
for i in range(int(sys.argv[3])):
    a, _ = l.accept()
    a.sendall(a.recv(16))
    a.close()
print("served", flush=True)
"""


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_remote_clients_cost_the_acceptor_no_netlink(fabric, netns, tmp_path):
    """Plain-TCP clients from another namespace (no memlan: to the server, remote peers): the
    acceptor used to open two rtnetlink sockets per connection to look their link-layer
    address up.  Now only a record that a memlan client of another namespace has used does."""
    ns, link = netns
    x = random.randrange(1, 250)
    s, c = ns("srv"), ns("cli")
    link(s, "10.231.%d.2/24" % x, c, "10.231.%d.1/24" % x)
    n, port = 10, 47958
    trace = tmp_path / "strace.out"
    slog = tmp_path / "server.log"
    srv = subprocess.Popen(["ip", "netns", "exec", s, "strace", "-f", "-qq", "-e",
                            "trace=socket", "-o", str(trace), str(MEMLAN), "run", "--log",
                            str(slog), "--", PY, "-c", NL_SERVER, "10.231.%d.2" % x, str(port),
                            str(n)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert srv.stdout.readline().strip() == "ready", srv.stderr.read()
        client = ("import socket\nfor i in range(%d):\n c = socket.create_connection(('%s', %d),"
                  " timeout=10)\n c.sendall(b'hi')\n assert c.recv(16) == b'hi'\n c.close()\n"
                  % (n, "10.231.%d.2" % x, port))
        subprocess.run(["ip", "netns", "exec", c, PY, "-c", client], check=True, timeout=60,
                       capture_output=True)
        assert srv.stdout.readline().strip() == "served"
        srv.wait(timeout=30)
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()
    calls = trace.read_text()
    assert "TCP (" in slog.read_text(), slog.read_text()
    assert calls.count("AF_NETLINK") == 0, calls
    memlan("clean")
