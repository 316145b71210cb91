# SPDX-License-Identifier: Apache-2.0 OR MIT
"""A peer that rewrites our socket block's flags never decides whether our calls block.

O_NONBLOCK was kept in the accepting side's socket block of the channel (its flags word), which
the peer maps writable.  A vandal, an ordinary memlan client, clears that bit while the victim
makes nonblocking receives on an empty ring: each of those then waited for the vandal's next
byte (for ever, since it sends none).  Then it sets the bit while the victim makes blocking
receives: those failed with EAGAIN on a blocking socket.  O_NONBLOCK now lives in the victim's
own lock page (src/preload/sock.c, mlp_nonblock), which the peer cannot map.
"""
import json
import os
import select
import subprocess
import sys
import time

from conftest import MEMLAN
from test_hostile_locks import VANDAL_MAPS
from test_preload import next_port, settle

PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable

VICTIM = r"""
import json, socket, sys, time
P, secs = int(sys.argv[1]), float(sys.argv[2])
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", P)); ls.listen(4)
print("ready", flush=True)
c, _ = ls.accept()
assert c.recv(1) == b"h"
print("accepted", flush=True)
sys.stdin.readline()                     # the vandal clears the bit from now on
c.setblocking(False)
n = wrong = 0
worst = 0.0
end = time.monotonic() + secs
while time.monotonic() < end:
    t = time.monotonic()
    try:
        c.recv(64)
        wrong += 1                       # the vandal sends nothing in this phase
    except BlockingIOError:
        pass
    worst = max(worst, time.monotonic() - t)
    n += 1
print(json.dumps({"n": n, "worst": worst, "wrong": wrong}), flush=True)
sys.stdin.readline()                     # the vandal sets the bit, and sends a byte every 10 ms
c.setblocking(True)
got = eagain = 0
end = time.monotonic() + secs
while time.monotonic() < end:
    try:
        got += len(c.recv(64))
    except BlockingIOError:
        eagain += 1
print(json.dumps({"got": got, "eagain": eagain}), flush=True)
sys.stdin.readline()
"""

VANDAL = VANDAL_MAPS + r"""
FLAGS = 20                                         # the flags word in the block
mode, sent, last = None, 0, 0.0
while True:
    if select.select([sys.stdin], [], [], 0.001)[0]:
        mode = sys.stdin.readline().strip()
        if mode in ("stop", ""):
            break
    if mode is None:
        continue
    for m in maps:
        struct.pack_into("<I", m, SOCK_OFF + 64 * SIDE + FLAGS, 0 if mode == "clear" else 1)
    if mode == "set" and time.monotonic() - last > 0.01:
        c.send(b"y")
        sent += 1
        last = time.monotonic()
print("sent", sent, flush=True)
c.close()
"""


def _line(p, timeout):
    """The process's next stdout line, or None when it prints none in time."""
    r, _, _ = select.select([p.stdout], [], [], timeout)
    return p.stdout.readline() if r else None


def test_peer_written_flags_never_decide_blocking(fabric, tmp_path):
    (tmp_path / "victim.py").write_text(VICTIM)
    (tmp_path / "vandal.py").write_text(VANDAL)
    p = next_port()
    secs = 1.0
    log = tmp_path / "memlan.log"
    victim = subprocess.Popen([str(MEMLAN), "run", "--log", str(log), "--", PY,
                               str(tmp_path / "victim.py"), str(p), str(secs)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, bufsize=1)
    vandal = None
    try:
        assert _line(victim, 20) == "ready\n"
        vandal = subprocess.Popen([str(MEMLAN), "run", "--log", str(log), "--", PY,
                                   str(tmp_path / "vandal.py"), str(fabric), str(p)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, bufsize=1)
        assert _line(victim, 20) == "accepted\n"
        maps = _line(vandal, 20)
        assert maps and maps.startswith("maps ") and maps != "maps 0\n", maps
        text = log.read_text()
        assert "accelerated (accepted" in text, text

        vandal.stdin.write("clear\n")
        time.sleep(0.05)
        victim.stdin.write("go\n")
        line = _line(victim, secs + 10)
        assert line is not None, \
            "a nonblocking recv waited: the peer's write to our flags made it block"
        nb = json.loads(line)
        assert nb["n"] > 100 and nb["wrong"] == 0, nb
        assert nb["worst"] < 0.5, nb

        vandal.stdin.write("set\n")
        time.sleep(0.05)
        victim.stdin.write("go\n")
        line = _line(victim, secs + 10)
        assert line is not None, "the blocking phase did not end"
        bl = json.loads(line)
        assert bl["eagain"] == 0, \
            f"a blocking recv failed with EAGAIN {bl['eagain']} times: the peer set our O_NONBLOCK"
        assert bl["got"] > 10, bl

        vandal.stdin.write("stop\n")
        vout, verr = vandal.communicate(timeout=20)
        assert vandal.returncode == 0, verr
        victim.stdin.write("end\n")
        out, err = victim.communicate(timeout=20)
        assert victim.returncode == 0, err
    finally:
        for pr in (victim, vandal):
            if pr and pr.poll() is None:
                pr.kill()
                pr.wait()
    settle(fabric)
