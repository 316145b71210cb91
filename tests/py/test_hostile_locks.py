# SPDX-License-Identifier: Apache-2.0 OR MIT
"""A peer that writes garbage into our socket block never decides whether or how long we block.

The vandal is an ordinary memlan client that, once its connection is accelerated, maps every
channel file in the fabric and keeps writing into the accepting side's socket block (the first
16 bytes, where lock words and owner pids lived up to issue 20): 0, -1, its own pid (alive), the
victim's pid, random bytes.  The victim (the acceptor, a memlan process too) meanwhile does
blocking and nonblocking send, recv and poll on that connection, timing each call; then it
serves a plain-TCP client on another port.  Before the locks left the channel, the victim's first
call waited for ever in mlp_lock (a held word whose owner is a live pid), and the plain client
got no answer.
"""
import json
import os
import socket
import subprocess
import sys
import time

from conftest import MEMLAN, port_free
from test_preload import next_port, settle

PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable

VICTIM = r"""
import json, select, socket, sys, time
P, Q, secs = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", P)); ls.listen(4)
lq = socket.socket(); lq.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
lq.bind(("127.0.0.1", Q)); lq.listen(4)
print("ready", flush=True)
c, _ = ls.accept()
worst = {}
def timed(name, f):
    t = time.monotonic()
    try:
        f()
    except (BlockingIOError, InterruptedError, ConnectionError, OSError):
        pass
    d = time.monotonic() - t
    worst[name] = max(worst.get(name, 0.0), d)
p = select.poll()
p.register(c, select.POLLIN | select.POLLOUT)
end = time.monotonic() + secs
n = 0
while time.monotonic() < end:
    n += 1
    c.setblocking(False)
    timed("recv_nb", lambda: c.recv(64))
    timed("send_nb", lambda: c.send(b"v"))
    timed("poll", lambda: p.poll(20))
    c.setblocking(True)
    timed("recv_block", lambda: c.recv(64))   # the vandal sends a byte every few ms
    timed("send_block", lambda: c.sendall(b"w"))
print(json.dumps({"rounds": n, "worst": worst}), flush=True)
# A plain-TCP client of the same process is served.
q, _ = lq.accept()
q.settimeout(10)
if q.recv(4) == b"ping":
    q.sendall(b"pong")
q.close()
print("served", flush=True)
"""

# A vandal's first lines: it connects to port P (accelerated), then maps every channel file of
# the fabric fab writable (maps) and says how many.  test_hostile_flags.py's vandal starts so too.
VANDAL_MAPS = r"""
import mmap, os, random, select, socket, struct, sys, time
fab, P = sys.argv[1], int(sys.argv[2])
c = socket.create_connection(("127.0.0.1", P))
c.sendall(b"h")                                   # settles the connection (accelerated)
time.sleep(0.2)
SOCK_OFF, SIDE = 1024, 1                          # ML_CHAN_SOCK_OFF; the acceptor is side 1
maps = []
for name in os.listdir(fab):
    if not name.startswith("seg-"):
        continue
    try:
        fd = os.open(os.path.join(fab, name), os.O_RDWR)
        m = mmap.mmap(fd, 4096)
        os.close(fd)
    except OSError:
        continue
    if struct.unpack_from("<I", m, 24)[0] == 2:   # ML_KIND_CHANNEL
        maps.append(m)
print("maps", len(maps), flush=True)
"""

VANDAL = VANDAL_MAPS + r"""
secs, victim = float(sys.argv[3]), int(sys.argv[4])
rng = random.Random(20)
vals = [(2, 0), (2, -1), (2, os.getpid()), (2, victim), (1, os.getpid()), (1, 0)]
c.setblocking(False)
end = time.monotonic() + secs
i = 0
while time.monotonic() < end:
    i += 1
    for m in maps:
        off = SOCK_OFF + 64 * SIDE
        if i % 4 == 3:
            m[off:off + 16] = rng.randbytes(16)
        else:
            w, o = vals[i % len(vals)]
            struct.pack_into("<IiIi", m, off, w, o, w, o)
    try:
        c.send(b"x")
        c.recv(4096)
    except (BlockingIOError, OSError):
        pass
    time.sleep(0.003)
print("vandal done", i, flush=True)
c.close()
"""


def test_garbage_lock_words_never_block_the_victim(fabric, tmp_path):
    (tmp_path / "victim.py").write_text(VICTIM)
    (tmp_path / "vandal.py").write_text(VANDAL)
    p, q = next_port(), next_port()
    while not port_free(q) or q == p:
        q = next_port()
    secs = 3.0
    log = tmp_path / "memlan.log"
    victim = subprocess.Popen([str(MEMLAN), "run", "--log", str(log), "--", PY,
                               str(tmp_path / "victim.py"), str(p), str(q), str(secs)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    vandal = None
    try:
        assert victim.stdout.readline() == "ready\n"
        vandal = subprocess.Popen([str(MEMLAN), "run", "--log", str(log), "--", PY,
                                   str(tmp_path / "vandal.py"), str(fabric), str(p),
                                   str(secs + 1), str(victim.pid)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # The victim's calls end on time, and then it answers a plain-TCP client at once.
        deadline = time.monotonic() + secs + 20
        plain = socket.create_connection(("127.0.0.1", q), timeout=5)
        plain.settimeout(max(1.0, deadline - time.monotonic()))
        plain.sendall(b"ping")
        try:
            got = plain.recv(4)
        except socket.timeout:
            got = b"(no answer)"
        plain.close()
        assert got == b"pong", "the victim froze: a plain-TCP client got no answer"
        out, err = victim.communicate(timeout=10)
        vout, verr = vandal.communicate(timeout=20)
        assert vandal.returncode == 0, verr
        assert "maps 0" not in vout, vout
        lines = out.splitlines()
        assert lines[-1] == "served", out + err
        rep = json.loads(lines[0])
        assert rep["rounds"] > 10, rep
        # No call waited for more than a bound: the peer's bytes decide nothing.  (The
        # blocking recv waits for the vandal's next byte, a few ms.)
        assert max(rep["worst"].values()) < 1.5, rep
        assert victim.returncode == 0, err
        text = log.read_text()
        assert "accelerated (client)" in text and "accelerated (accepted" in text, text
    finally:
        for pr in (victim, vandal):
            if pr and pr.poll() is None:
                pr.kill()
                pr.wait()
    settle(fabric)
