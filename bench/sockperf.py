#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 OR MIT
"""bench/sockperf.py - sockperf (the Debian package) over kernel TCP and under `memlan run`,
in one run, as ratios.

    python3 bench/sockperf.py [--time S] [--json FILE]

For each placement (split: server on cpu 0, client on cpu 1; same: both on cpu 0; unpinned) it
measures the TCP ping-pong round trip with 64-byte messages (sockperf prints half a round trip;
we report the full round trip), over kernel TCP, under memlan with the default spin policy and
under memlan with MEMLAN_SPIN_US=0; then throughput with 64 B and 64 KB messages.  Installs
sockperf with apt-get when it is missing.

sockperf pre-sizes its table of sequence numbers for the rates of kernel networking; at memlan's
rate (millions of round trips a second) it overflows it and stops with "_seqN >
m_maxSequenceNo".  Every ping-pong here, kernel TCP included, therefore runs with
--mps=500000: a pace kernel TCP never reaches, so only memlan is held back by it.
"""
import argparse
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
MEMLAN = ROOT / "build" / "bin" / "memlan"
CPUS = os.cpu_count() or 1
PLACE = {
    "split": (["taskset", "-c", "0"], ["taskset", "-c", "1" if CPUS > 1 else "0"]),
    "same": (["taskset", "-c", "0"], ["taskset", "-c", "0"]),
    "unpinned": ([], []),
}
# Each run starts at another port: sockperf's server binds without SO_REUSEADDR, so the ports of
# the run before, in TIME_WAIT, refused it, and the client's connect was refused.
PORT = [12200 + (os.getpid() % 400) * 20]


def ensure_sockperf():
    if shutil.which("sockperf"):
        return
    print("installing sockperf...", file=sys.stderr)
    subprocess.run(["apt-get", "install", "-y", "-qq", "sockperf"], check=False,
                   stdout=subprocess.DEVNULL)
    if not shutil.which("sockperf"):
        subprocess.run(["apt-get", "update", "-qq"], check=False, stdout=subprocess.DEVNULL)
        subprocess.run(["apt-get", "install", "-y", "-qq", "sockperf"], check=True,
                       stdout=subprocess.DEVNULL)


def wrap(mode):
    if mode == "tcp":
        return [], {}
    env = {"MEMLAN_SPIN_US": "0"} if mode == "memlan-nospin" else {}
    return [str(MEMLAN), "run", "--"], env


def listening(port, srv, limit=10.0):
    """Wait until a socket listens on 127.0.0.1:port (the kernel's table, so that no probe
    connects to the server), at most limit seconds.  False: the server ended first."""
    want = ":%04X" % port
    end = time.monotonic() + limit
    while time.monotonic() < end and srv.poll() is None:
        with open("/proc/net/tcp") as f:
            if any(l.split()[1].endswith(want) and l.split()[3] == "0A" for l in f.readlines()[1:]):
                return True
        time.sleep(0.02)
    return srv.poll() is None


def one(mode, place, client_args, secs):
    pre, env_extra = wrap(mode)
    env = dict(os.environ, **env_extra)
    s_pin, c_pin = PLACE[place]
    for _ in range(5):  # a port another program holds: the next one
        PORT[0] += 1
        port = str(PORT[0])
        srv = subprocess.Popen(s_pin + pre + ["sockperf", "sr", "--tcp", "-i", "127.0.0.1", "-p",
                                              port],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        try:
            if not listening(int(port), srv):
                continue
            out = subprocess.run(c_pin + pre + ["sockperf"] + client_args +
                                 ["--tcp", "-i", "127.0.0.1", "-p", port, "-t", str(secs)],
                                 capture_output=True, text=True, timeout=secs + 30, env=env)
            return out.stdout + out.stderr
        finally:
            srv.kill()
            srv.wait()
    raise RuntimeError("sockperf's server did not start on 5 ports in a row")


def rtt_us(text):
    m = re.search(r"avg-latency=([0-9.]+)", text)
    if not m:
        raise RuntimeError("no latency in sockperf output:\n" + text[-800:])
    p50 = re.search(r"percentile 50\.000 =\s+([0-9.]+)", text)
    return 2 * float(m.group(1)), 2 * float(p50.group(1)) if p50 else None


def tput(text):
    r = re.search(r"Message Rate is ([0-9.]+) \[msg/sec\]", text)
    b = re.search(r"BandWidth is ([0-9.]+) MBps", text)
    if not r:
        raise RuntimeError("no rate in sockperf output:\n" + text[-800:])
    return float(r.group(1)), float(b.group(1)) if b else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--time", type=float, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    ensure_sockperf()
    fab = tempfile.mkdtemp(prefix="memlan-bench-", dir="/dev/shm")
    os.environ["MEMLAN_FABRIC"] = fab
    res = {"rtt_us": {}, "throughput": {}}
    try:
        for place in PLACE:
            for mode in ("tcp", "memlan", "memlan-nospin"):
                avg, p50 = rtt_us(one(mode, place, ["pp", "-m", "64", "--mps=500000"], a.time))
                res["rtt_us"].setdefault(place, {})[mode] = {"avg": avg, "p50": p50}
                print(f"pp {place:9s} {mode:14s} RTT avg {avg:8.3f} us  p50 {p50:8.3f} us",
                      flush=True)
        for size in (64, 65000):
            for mode in ("tcp", "memlan"):
                rate, mbps = tput(one(mode, "split", ["tp", "-m", str(size)], a.time))
                res["throughput"].setdefault(str(size), {})[mode] = {"msg_s": rate, "MBps": mbps}
                print(f"tp split {size:6d} B {mode:8s} {rate:12.0f} msg/s {mbps or 0:10.1f} MB/s",
                      flush=True)
    finally:
        subprocess.run([str(MEMLAN), "clean"], stdout=subprocess.DEVNULL)
        shutil.rmtree(fab, ignore_errors=True)
    print("\nratios (memlan / kernel TCP, both measured in this run; RTT: below 1 is faster, "
          "throughput: above 1 is faster):")
    for place, r in res["rtt_us"].items():
        t = r["tcp"]["avg"]
        print(f"  RTT {place:9s} default spin {r['memlan']['avg'] / t:6.3f}   "
              f"MEMLAN_SPIN_US=0 {r['memlan-nospin']['avg'] / t:6.3f}")
    for size, r in res["throughput"].items():
        print(f"  throughput {size:>5s} B  msg/s {r['memlan']['msg_s'] / r['tcp']['msg_s']:6.2f}x")
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
