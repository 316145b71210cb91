# SPDX-License-Identifier: Apache-2.0 OR MIT
"""Integration-test fixtures: each test gets a fabric directory of its own, and fails if it
leaves a file behind in it."""
import ctypes
import os
import pathlib
import shutil
import socket
import subprocess
import tempfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("BUILD", ROOT / "build"))
MEMLAN = BUILD / "bin" / "memlan"

# A test server's start (its source, to prepend): a listener on a free loopback port, printed.
PRINTING_LISTENER = r"""
import socket, sys
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", 0))
ls.listen(8)
print(ls.getsockname()[1], flush=True)
"""
LIB = BUILD / "lib" / "libmemlan.so"


def port_free(port, strict=False):
    """Can a listener bind this port now?  Test ports lie below the ephemeral range, but an
    earlier connection's socket (FIN_WAIT, CLOSE_WAIT, or TIME_WAIT after a benchmark) can hold
    one for a while.  strict: free even for a server that does not set SO_REUSEADDR."""
    for fam, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        s = socket.socket(fam, socket.SOCK_STREAM)
        try:
            if not strict:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
        except OSError:
            return False
        finally:
            s.close()
    return True



def port_range(first, last, name):
    """A suite's next_port over its own ports first..last (each free even for a server without
    SO_REUSEADDR)."""
    at = [first - 1]

    def next_port():
        at[0] += 1
        while not port_free(at[0], strict=True):
            at[0] += 1
        assert at[0] <= last, f"{name} ran out of its ports"
        return at[0]
    return next_port


def stop_proc(proc, timeout=15):
    """SIGTERM, then SIGKILL after timeout seconds; a process that ended already is left."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

@pytest.fixture
def fabric(monkeypatch):
    d = tempfile.mkdtemp(prefix="memlan-py-", dir="/dev/shm")
    monkeypatch.setenv("MEMLAN_FABRIC", d)
    yield pathlib.Path(d)
    left = sorted(os.listdir(d))
    shutil.rmtree(d, ignore_errors=True)
    assert left == [], f"fabric files left behind: {left}"


@pytest.fixture
def group():
    """A temporary group, removed afterwards."""
    name = f"mlg{os.getpid() % 100000}"
    subprocess.run(["groupdel", name], capture_output=True)
    subprocess.run(["groupadd", name], check=True, capture_output=True)
    import grp
    gid = grp.getgrnam(name).gr_gid
    yield name, gid
    subprocess.run(["groupdel", name], capture_output=True)


@pytest.fixture
def gfabric(group, monkeypatch):
    """A private group fabric made by the documented command (mode 3730, root's)."""
    name, gid = group
    d = pathlib.Path(tempfile.mkdtemp(prefix="memlan-grp-", dir="/dev/shm"))
    d.rmdir()
    p = subprocess.run([str(MEMLAN), "fabric", "create", "--group", name, str(d)],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stdout + p.stderr
    st = d.stat()
    assert st.st_gid == gid and (st.st_mode & 0o7777) == 0o3730, oct(st.st_mode)
    monkeypatch.setenv("MEMLAN_FABRIC", str(d))
    yield d, gid
    subprocess.run([str(MEMLAN), "clean"], capture_output=True, timeout=30)
    left = sorted(os.listdir(d))
    shutil.rmtree(d, ignore_errors=True)
    assert [f for f in left if f.startswith(("seg-", "cx-"))] == [], f"left behind: {left}"


@pytest.fixture
def group_fabric(monkeypatch):
    """A group fabric for the group the caller names (made by the documented command, so a
    Debian daemon's own group can be its members), in MEMLAN_FABRIC; afterwards `memlan clean`
    must leave no channel, segment or pass record in it."""
    made = []

    def make(group):
        d = pathlib.Path(tempfile.mkdtemp(prefix="memlan-app-", dir="/dev/shm"))
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
        assert [f for f in left if f.startswith(("seg-", "cx-", "px-"))] == [], f"left behind: {left}"


@pytest.fixture
def pubdir():
    """A directory that an unprivileged account can read (pytest's tmp_path is 0700)."""
    d = pathlib.Path(tempfile.mkdtemp(prefix="memlan-priv-"))
    os.chmod(d, 0o755)
    yield d
    if not os.environ.get("KEEP"): shutil.rmtree(d, ignore_errors=True)


def as_user(uid, gid, cmd):
    """cmd run as uid with gid as its only group (and primary)."""
    return ["setpriv", f"--reuid={uid}", f"--regid={gid}", f"--groups={gid}", "--"] + cmd


def logfile(d, name):
    p = d / name
    p.write_text("")
    os.chmod(p, 0o666)
    return p


def memlan(*args, timeout=120, check=True):
    """Run the memlan CLI and return the CompletedProcess."""
    p = subprocess.run([str(MEMLAN), *args], capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"memlan {' '.join(args)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p


# A child process that creates fabric objects through the real library (ctypes), prints their
# tokens, and then waits to be told to exit or killed.
HOLDER = r"""
import ctypes, os, sys
lib = ctypes.CDLL(sys.argv[1])
fab = ctypes.c_void_p()
assert lib.memlan_fabric_open(None, ctypes.byref(fab)) == 0
lib.memlan_segment_token.restype = ctypes.c_char_p
lib.memlan_channel_token.restype = ctypes.c_char_p
seg = ctypes.c_void_p()
assert lib.memlan_segment_export(fab, ctypes.c_size_t(4096), 3, ctypes.byref(seg)) == 0
ch = ctypes.c_void_p()
assert lib.memlan_channel_create(fab, None, ctypes.byref(ch)) == 0
print(lib.memlan_segment_token(seg).decode(), lib.memlan_channel_token(ch).decode(), flush=True)
if sys.stdin.readline().strip() == "close":
    lib.memlan_channel_close(ch)
    lib.memlan_segment_close(seg)
    lib.memlan_fabric_close(fab)
    print("closed", flush=True)
"""


@pytest.fixture
def holder(fabric):
    """Start a process that owns a segment and a channel; yields (proc, seg_token, chan_token)."""
    procs = []

    def start():
        p = subprocess.Popen(["python3", "-c", HOLDER, str(LIB)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        procs.append(p)
        seg, ch = p.stdout.readline().split()
        return p, seg, ch

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    memlan("clean")
