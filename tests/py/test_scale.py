# SPDX-License-Identifier: Apache-2.0 OR MIT
"""Many connections: one epoll server process holding 10,000 accelerated connections and one busy
one (tests/preload/manyconn.c), checked for bytes and clean closes, not for speed."""
import json
import os
import re
import subprocess

from conftest import BUILD, MEMLAN

MANYCONN = BUILD / "tests-preload" / "manyconn"


def run_manyconn(args, log=None, timeout=240):
    cmd = [str(MANYCONN)] + [str(a) for a in args]
    if log:
        cmd = [str(MEMLAN), "run", "--log", str(log), "--"] + cmd
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"manyconn exited {p.returncode}\n{p.stdout}\n{p.stderr[-3000:]}"
    return json.loads(p.stdout)


def test_ten_thousand_accelerated_connections(fabric, tmp_path):
    n = 10000
    log = tmp_path / "many.log"
    r = run_manyconn([n, 2000, 4], log)
    assert r["accepted"] == n + 1 and r["closed"] == n + 1 and r["failed_children"] == 0, r
    text = log.read_text()
    # Every connection took a channel, on both sides; none fell back to TCP.
    assert text.count("accelerated (accepted") == n + 1, text[-2000:]
    assert text.count("accelerated (client)") == n + 1, text[-2000:]
    assert not re.search(r": TCP \(", text), re.findall(r".*: TCP \(.*", text)[:5]
    # The server's fabric files (its ends of the channels) hold pages while the connections live.
    assert r["fabric_kb_after"] > r["fabric_kb_before"], r
    assert r["rtt_p50_us"] > 0, r
    # Nothing of the 10,001 channels is left in the fabric (the fixture checks the directory).
    assert subprocess.run([str(MEMLAN), "clean"], capture_output=True, timeout=60).returncode == 0


def test_many_connections_same_over_kernel_tcp(tmp_path):
    """The harness itself over kernel TCP: the same checks pass without memlan."""
    r = run_manyconn([500, 200, 2])
    assert r["accepted"] == 501 and r["closed"] == 501, r
