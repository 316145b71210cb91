# SPDX-License-Identifier: Apache-2.0 OR MIT
"""The native API in a fabric shared by a group: a named endpoint's connection is its two ends'
alone, as the socket layer's are (issue 20).

A serves a name (memlan_listen) as one member, B connects (memlan_connect) as another, and the
third member C, told the channel's token, tries every way in: memlan_channel_attach, a raw
memlan_segment_import, and a plain open of the file.  Each is refused (EACCES) and C reads
nothing, while A and B exchange their bytes through the channel (with A waiting on an event
queue, which takes B's posts in a part of B's alone).  Before, the channel file was 0666 and C
read the connection's bytes.

Needs root (users and a group are made and removed): skipped otherwise.
"""
import os
import pathlib
import struct
import subprocess

import pytest

from conftest import MEMLAN
from test_groupfabric import A, B, C, as_user, gfabric, group, pubdir  # noqa: F401 (fixtures)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="makes a group and runs other users")

EP_C = r"""
#include <errno.h>
#include <fcntl.h>
#include <memlan.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

static int serve(memlan_fabric_t *fab, const char *name)
{
    memlan_listener_t *l;
    memlan_channel_t *ch;
    memlan_evq_t *q;
    struct memlan_event ev[4];
    if (memlan_listen(fab, name, 0, &l) < 0)
        return 2;
    printf("ready\n");
    fflush(stdout);
    int r = memlan_accept(l, 20000, &ch);
    if (r < 0) {
        printf("accept %d\n", r);
        return 3;
    }
    if ((r = memlan_evq_create(fab, 64, &q)) < 0 ||
        (r = memlan_evq_add(q, ch, MEMLAN_EV_READ, ch)) < 0) {
        printf("evq %d\n", r);
        return 4;
    }
    char buf[256];
    long total = 0;
    for (int rounds = 0; rounds < 1000; rounds++) {
        ssize_t n = memlan_recv(ch, buf, sizeof buf, MEMLAN_DONTWAIT);
        if (n == -EAGAIN) {
            if (memlan_evq_wait(q, ev, 4, 20000) <= 0)
                break;
            continue;
        }
        if (n <= 0)
            break;
        total += n;
        if (memlan_send(ch, buf, (size_t)n, 0) != n)
            break;
    }
    printf("served %ld\n", total);
    memlan_evq_close(q);
    memlan_channel_close(ch);
    memlan_listener_close(l);
    return 0;
}

static int connect_to(memlan_fabric_t *fab, const char *name, const char *secret)
{
    memlan_channel_t *ch;
    int r = memlan_connect(fab, name, NULL, 5000, &ch);
    if (r < 0) {
        printf("connect %d\n", r);
        return 2;
    }
    printf("token %s\n", memlan_channel_token(ch));
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) /* C has looked */
        return 3;
    size_t len = strlen(secret), got = 0;
    char buf[256];
    if (memlan_send(ch, secret, len, 0) != (ssize_t)len)
        return 4;
    while (got < len) {
        ssize_t n = memlan_recv(ch, buf + got, sizeof buf - got, 0);
        if (n <= 0)
            return 5;
        got += (size_t)n;
    }
    printf("echo %s\n", got == len && memcmp(buf, secret, len) == 0 ? "ok" : "wrong");
    memlan_channel_close(ch);
    return 0;
}

/* A client that hands over a channel the whole group may write (an older libmemlan's 0666
 * file, or a member's on purpose), speaking the endpoint's hello itself: the server's answer. */
static int wide(memlan_fabric_t *fab, const char *dir, const char *name)
{
    memlan_channel_t *ch;
    if (memlan_channel_create(fab, NULL, &ch) < 0)
        return 2;
    char path[600];
    snprintf(path, sizeof path, "%s/seg-%s", dir, memlan_channel_token(ch));
    if (chmod(path, 0666) < 0)
        return 3;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s/ep-%s.sock", dir, name);
    int s = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    if (s < 0 || connect(s, (struct sockaddr *)&sa, sizeof sa) < 0)
        return 4;
    struct {
        uint32_t magic, version;
        char token[33];
        char pad[7];
    } h = {0x6d6c6570u, 1u, {0}, {0}};
    memcpy(h.token, memlan_channel_token(ch), 32);
    int32_t answer = 1;
    if (send(s, &h, sizeof h, 0) != (ssize_t)sizeof h ||
        recv(s, &answer, sizeof answer, 0) != (ssize_t)sizeof answer)
        return 5;
    printf("answer %d\n", answer);
    memlan_channel_close(ch);
    return 0;
}

static int probe(memlan_fabric_t *fab, const char *dir, const char *token)
{
    memlan_channel_t *ch;
    memlan_segment_t *seg;
    int a = memlan_channel_attach(fab, token, &ch);
    int i = memlan_segment_import(fab, token, MEMLAN_MODE_RO, &seg);
    char path[600];
    snprintf(path, sizeof path, "%s/seg-%s", dir, token);
    int fd = open(path, O_RDONLY);
    int o = fd < 0 ? -errno : 0;
    long n = 0;
    if (fd >= 0) {
        char buf[65536];
        ssize_t k;
        while ((k = read(fd, buf, sizeof buf)) > 0)
            n += k;
        close(fd);
    }
    printf("attach %d import %d open %d read %ld\n", a, i, o, n);
    return 0;
}

int main(int argc, char **argv)
{
    memlan_fabric_t *fab;
    if (argc < 4 || memlan_fabric_open(argv[2], &fab) < 0)
        return 9;
    if (!strcmp(argv[1], "serve"))
        return serve(fab, argv[3]);
    if (!strcmp(argv[1], "connect") && argc > 4)
        return connect_to(fab, argv[3], argv[4]);
    if (!strcmp(argv[1], "wide"))
        return wide(fab, argv[2], argv[3]);
    if (!strcmp(argv[1], "probe"))
        return probe(fab, argv[2], argv[3]);
    return 9;
}
"""


TAGS = {1: "user_obj", 2: "user", 4: "group_obj", 8: "group", 0x10: "mask", 0x20: "other"}


def acl(path):
    """{(tag, id or None): perm} of path's POSIX access ACL (the kernel's xattr format)."""
    raw = os.getxattr(path, "system.posix_acl_access")
    out = {}
    for k in range(4, len(raw), 8):
        tag, perm, uid = struct.unpack_from("<HHI", raw, k)
        out[(TAGS[tag], uid if tag in (2, 8) else None)] = perm
    return out


def build_ep(pubdir):
    root = pathlib.Path(__file__).resolve().parents[2]
    build = MEMLAN.parent.parent
    src, exe = pubdir / "ep.c", pubdir / "ep"
    src.write_text(EP_C)
    cc = subprocess.run(["cc", "-std=c11", "-D_GNU_SOURCE", "-I", str(root / "include"), "-o",
                         str(exe), str(src), str(build / "lib" / "libmemlan.a"), "-lpthread"],
                        capture_output=True, text=True, timeout=120)
    assert cc.returncode == 0, cc.stderr
    return exe


def test_group_fabric_native_endpoint_is_private_to_its_two_ends(gfabric, pubdir):
    fab, gid = gfabric
    exe = build_ep(pubdir)
    name = "ep%d" % os.getpid()
    secret = "native-secret-%d" % os.getpid()
    srv = cli = None
    try:
        srv = subprocess.Popen(as_user(A, gid, [str(exe), "serve", str(fab), name]),
                               stdout=subprocess.PIPE, text=True)
        assert srv.stdout.readline().strip() == "ready"
        cli = subprocess.Popen(as_user(B, gid, [str(exe), "connect", str(fab), name, secret]),
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        said = cli.stdout.readline().split()
        assert len(said) == 2 and said[0] == "token", said
        token = said[1]
        st = os.stat(fab / ("seg-" + token))
        assert st.st_uid == B and (st.st_mode & 0o007) == 0, oct(st.st_mode)
        # its ACL: the owner (B) and A read-write, the group class and others nothing
        assert acl(fab / ("seg-" + token)) == {("user_obj", None): 6, ("user", A): 6,
                                                 ("group_obj", None): 0, ("mask", None): 6,
                                                 ("other", None): 0}
        p = subprocess.run(as_user(C, gid, [str(exe), "probe", str(fab), token]),
                           capture_output=True, text=True, timeout=30)
        assert p.returncode == 0, p.stderr
        # EACCES (-13) every way, and not one byte read
        assert p.stdout.split() == ["attach", "-13", "import", "-13", "open", "-13", "read",
                                    "0"], p.stdout
        # a member of B's own user could (the two ends are users, not processes)
        out, _ = cli.communicate("go\n", timeout=30)
        assert cli.returncode == 0 and "echo ok" in out, out
        assert srv.stdout.readline().split() == ["served", str(len(secret))]
        srv.wait(timeout=30)
        assert srv.returncode == 0
    finally:
        for x in (cli, srv):
            if x and x.poll() is None:
                x.kill()
                x.wait()


def test_group_fabric_native_server_refuses_a_channel_others_may_write(gfabric, pubdir):
    """B hands A's endpoint a channel of its own that the whole group may write (chmod 0666: an
    older libmemlan's file, or B on purpose): A refuses it (-EACCES), since every member could
    read what A sends there, and goes on to serve B's proper connection.  Before, A attached
    it (answer 0)."""
    fab, gid = gfabric
    exe = build_ep(pubdir)
    name = "epw%d" % os.getpid()
    srv = None
    try:
        srv = subprocess.Popen(as_user(A, gid, [str(exe), "serve", str(fab), name]),
                               stdout=subprocess.PIPE, text=True)
        assert srv.stdout.readline().strip() == "ready"
        w = subprocess.run(as_user(B, gid, [str(exe), "wide", str(fab), name]),
                           capture_output=True, text=True, timeout=30)
        assert w.returncode == 0 and w.stdout.split() == ["answer", "-13"], (w.stdout, w.stderr)
        cli = subprocess.run(as_user(B, gid, [str(exe), "connect", str(fab), name, "fine"]),
                             input="go\n", capture_output=True, text=True, timeout=30)
        assert cli.returncode == 0 and "echo ok" in cli.stdout, cli
        assert srv.stdout.readline().split() == ["served", "4"]
        srv.wait(timeout=30)
    finally:
        if srv and srv.poll() is None:
            srv.kill()
            srv.wait()


HOLD_SERVER = r"""
import socket, sys, time
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", int(sys.argv[1])))
ls.listen(8)
print("ready", flush=True)
c, _ = ls.accept()
c.sendall(c.recv(16))
print("echoed", flush=True)
time.sleep(60)
"""

HOLD_CLIENT = r"""
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"ping")
print("got", s.recv(16).decode(), flush=True)
time.sleep(60)
"""


@pytest.fixture
def owned_fabric(group):
    """A private group fabric made by a member that is not root (sys, uid 3) with its
    documented command: the fabric's owner."""
    name, gid = group
    d = pathlib.Path("/dev/shm/memlan-grp-own-%d" % os.getpid())
    subprocess.run(["rm", "-rf", str(d)])
    p = subprocess.run(as_user(OWNER, gid, [str(MEMLAN), "fabric", "create", "--group", name,
                                            str(d)]), capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stdout + p.stderr
    assert d.stat().st_uid == OWNER
    yield d, gid
    subprocess.run(["rm", "-rf", str(d)])


OWNER = 3  # sys


def test_group_fabric_owner_cleans_other_members_dead_files(owned_fabric, pubdir):
    """A (daemon) serves and B (nobody) connects under memlan run in a fabric whose owner is a
    member (sys), not root; both are SIGKILLed, leaving their channel (0600 with an ACL naming
    A and B) and their stat records (0644), none of which the owner may open.
    The owner's `memlan clean` removes them all (the kernel's /proc/locks says no lock is held
    on them) once they are 10 s old, and says which it left and why while they are younger; a
    member's says that it may not list the fabric.  Before: the owner's clean removed what it
    could open (the listener record), said "removed 1 file(s)" and left the rest silently."""
    from test_apps import next_port
    fab, gid = owned_fabric
    (pubdir / "srv.py").write_text(HOLD_SERVER)
    (pubdir / "cli.py").write_text(HOLD_CLIENT)
    env = dict(os.environ, MEMLAN_FABRIC=str(fab))
    port = next_port()
    srv = cli = None
    try:
        srv = subprocess.Popen(as_user(A, gid, [str(MEMLAN), "run", "--", "python3",
                                                str(pubdir / "srv.py"), str(port)]),
                               stdout=subprocess.PIPE, text=True, env=env)
        assert srv.stdout.readline().strip() == "ready"
        cli = subprocess.Popen(as_user(B, gid, [str(MEMLAN), "run", "--", "python3",
                                                str(pubdir / "cli.py"), str(port)]),
                               stdout=subprocess.PIPE, text=True, env=env)
        assert cli.stdout.readline().split() == ["got", "ping"]
        assert srv.stdout.readline().strip() == "echoed"
    finally:
        for x in (cli, srv):
            if x and x.poll() is None:
                x.kill()
                x.wait()
    left = sorted(os.listdir(fab))
    others = [f for f in left if f.startswith(("seg-", "cx-"))]
    assert others and all(os.stat(fab / f).st_uid in (A, B) for f in others), left
    # the connection was accelerated: B's channel, private to A and B
    assert any(os.stat(fab / f).st_uid == B and ("user", A) in acl(fab / f) for f in others
               if "system.posix_acl_access" in os.listxattr(fab / f)), left

    def clean(uid):
        return subprocess.run(as_user(uid, gid, [str(MEMLAN), "clean"]), capture_output=True,
                              text=True, timeout=30, env=env)

    # a member may not list a private fabric: it is told whose job it is
    p = clean(C)
    assert p.returncode == 1 and "listed only by its owner (uid 3) and root" in p.stderr, p
    # while they are new the owner leaves them, and says so
    p = clean(OWNER)
    assert p.returncode == 0, p
    assert "made less than 10 s ago left" in p.stderr, p
    assert [f for f in os.listdir(fab) if f.startswith(("seg-", "cx-"))], os.listdir(fab)
    # 10 s later (their times set back, as root) they go, every one
    for f in os.listdir(fab):
        if f.startswith(("seg-", "cx-")):
            st = os.stat(fab / f)
            os.utime(fab / f, (st.st_atime - 60, st.st_mtime - 60))
    p = clean(OWNER)
    assert p.returncode == 0 and p.stderr == "", p
    assert sorted(os.listdir(fab)) == [], os.listdir(fab)
