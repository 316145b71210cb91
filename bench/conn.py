#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 OR MIT
"""bench/conn.py - short connections and idle connections, over kernel TCP and under
`memlan run`, in one run, as ratios (issue 3's last two targets).

    python3 bench/conn.py [--time S] [--place split,same,unpinned] [--no-write] [--json FILE]

Short connections: `build/bench/shortconn client` connects, sends 64 B, reads the 64-byte
answer and closes, as many times as it can in S seconds, against `shortconn server` (one
thread, blocking accept); connections per second over kernel TCP and with both ends under
memlan, in three placements (split: server on cpu 0, client on cpu 1; same: both on cpu 0;
unpinned).  Every answer is checked.  The rate is measured without memlan's log (a log line per
decision costs system calls on every connection); a half-second run of the same with the log
follows, and the memlan figure counts only if that log shows its connections accelerated.
Target: >= 0.7 x kernel TCP.

Idle: one connection, one exchange, then the server waits in epoll_wait and the client in
read for ever.  From 300 ms after the client said "ready", the CPU time both processes use over
S seconds (/proc/PID/task/*/schedstat, nanoseconds), as a percentage of one cpu.  Target: none
past the spin budget (reported as the absolute figure, beside kernel TCP's).

Writes the bench/conn section of docs/results.md unless --no-write.
"""
import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
MEMLAN = ROOT / "build" / "bin" / "memlan"
PROG = ROOT / "build" / "bench" / "shortconn"
CPUS = os.cpu_count() or 1
PLACE = {
    "split": (["taskset", "-c", "0"], ["taskset", "-c", "1" if CPUS > 1 else "0"]),
    "same": (["taskset", "-c", "0"], ["taskset", "-c", "0"]),
    "unpinned": ([], []),
}
PORT = [12600]
BEGIN, END = "<!-- bench/conn begin -->", "<!-- bench/conn end -->"


def next_port():
    PORT[0] += 1
    return PORT[0]


def wrap(mode, log):
    if mode == "tcp":
        return []
    return [str(MEMLAN), "run"] + (["--log", str(log)] if log else []) + ["--"]


def wait_listening(port, proc, limit=10.0):
    t0 = time.time()
    while time.time() - t0 < limit:
        if proc.poll() is not None:
            raise RuntimeError(f"server on port {port} exited early")
        out = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True)
        if out.stdout.strip():
            return
        time.sleep(0.02)
    raise RuntimeError(f"server on port {port} never listened")


def stop(proc):
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def start(kind, mode, place, tmp, logged=True):
    """A server of this kind, listening: (process, port, log, client's taskset prefix)."""
    port = next_port()
    log = tmp / f"{kind}-{mode}-{place}.log" if logged else None
    sp, cp = PLACE[place]
    srv = subprocess.Popen(sp + wrap(mode, log) + [str(PROG), kind, str(port)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_listening(port, srv)
    except RuntimeError:
        stop(srv)
        raise
    return srv, port, log, cp


def short_run(mode, place, secs, tmp, logged):
    srv, port, log, cp = start("server", mode, place, tmp, logged)
    try:
        out = subprocess.run(cp + wrap(mode, log) + [str(PROG), "client", str(port), str(secs)],
                             capture_output=True, text=True, timeout=secs + 60)
    finally:
        stop(srv)
    m = re.search(r"conns (\d+) seconds ([0-9.]+) bad (\d+)", out.stdout)
    if out.returncode != 0 or not m or int(m.group(3)):
        raise RuntimeError(f"shortconn client failed: {out.stdout} {out.stderr}")
    return m, log


def short(mode, place, secs, tmp):
    """The rate over secs with no log (writing one costs system calls on every connection),
    then a short run of the same with memlan's log, to show that the connections were
    accelerated."""
    m, _ = short_run(mode, place, secs, tmp, False)
    rate = int(m.group(1)) / float(m.group(2))
    note = ""
    if mode == "memlan":
        m, log = short_run(mode, place, min(secs, 0.5), tmp, True)
        text = log.read_text() if log.exists() else ""
        acc = text.count("accelerated (client)")
        tcp = len(re.findall(r": TCP \(", text))
        note = f"{acc} accelerated, {tcp} TCP"
        if acc < int(m.group(1)) * 0.99:
            note += " (not all accelerated)"
    return rate, note


def cpu_ns(pid):
    total = 0
    for t in pathlib.Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((t / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


def idle(mode, place, secs, tmp):
    srv, port, log, cp = start("idle-server", mode, place, tmp)
    cli = None
    try:
        cli = subprocess.Popen(cp + wrap(mode, log) + [str(PROG), "idle-client", str(port)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if cli.stdout.readline().strip() != "ready":
            raise RuntimeError("idle client did not get ready: " + cli.stderr.read())
        time.sleep(0.3)  # past any spin budget
        pids = [srv.pid, cli.pid]
        a = [cpu_ns(p) for p in pids]
        t0 = time.monotonic()
        time.sleep(secs)
        b = [cpu_ns(p) for p in pids]
        dt = time.monotonic() - t0
        if srv.poll() is not None or cli.poll() is not None:
            raise RuntimeError("an idle side exited")
    finally:
        if cli:
            stop(cli)
        stop(srv)
    note = ""
    if mode == "memlan":
        text = log.read_text() if log.exists() else ""
        note = "accelerated" if "accelerated (client)" in text else "NOT accelerated"
    return [100.0 * (y - x) / 1e9 / dt for x, y in zip(a, b)], note


def section(res, secs):
    lines = [BEGIN, "",
             f"`python3 bench/conn.py --time {secs}`: short connections (connect, 64 B each way, "
             "close; one client, one server thread) and the CPU an idle connection's two "
             "processes use, 300 ms after their last exchange.", "",
             "| placement | kernel TCP conn/s | memlan conn/s | ratio | target | memlan log (0.5 s run) |",
             "|---|---|---|---|---|---|"]
    for place, r in res["short"].items():
        ratio = r["memlan"] / r["tcp"]
        ok = "met" if ratio >= 0.7 else "**missed**"
        lines.append(f"| {place} | {r['tcp']:.0f} | {r['memlan']:.0f} | {ratio:.2f}× | "
                     f"≥ 0.7× {ok} | {r['note']} |")
    lines += ["", "| placement | idle CPU, kernel TCP (server, client) | idle CPU, memlan "
              "(server, client) | target |", "|---|---|---|---|"]
    for place, r in res["idle"].items():
        mx = max(r["memlan"])
        ok = "met" if mx < 0.5 else "**missed**"
        lines.append(f"| {place} | {r['tcp'][0]:.3f} %, {r['tcp'][1]:.3f} % | "
                     f"{r['memlan'][0]:.3f} %, {r['memlan'][1]:.3f} % | ~0 (< 0.5 %) {ok} |")
    lines += ["", END]
    return "\n".join(lines)


def write_results(text):
    path = ROOT / "docs" / "results.md"
    doc = path.read_text() if path.exists() else "# Results\n"
    if BEGIN in doc and END in doc:
        doc = doc[:doc.index(BEGIN)] + text + doc[doc.index(END) + len(END):]
    else:
        doc = doc.rstrip("\n") + "\n\n## bench/conn: short and idle connections\n\n" + text + "\n"
    path.write_text(doc)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--time", type=float, default=3.0)
    ap.add_argument("--place", default="split,same,unpinned")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    if not PROG.exists() or not MEMLAN.exists():
        sys.exit("build first: make")
    places = [p for p in a.place.split(",") if p]
    res = {"short": {}, "idle": {}}
    with tempfile.TemporaryDirectory(prefix="memlan-conn-") as d:
        tmp = pathlib.Path(d)
        for place in places:
            t, _ = short("tcp", place, a.time, tmp)
            m, note = short("memlan", place, a.time, tmp)
            res["short"][place] = {"tcp": t, "memlan": m, "note": note}
            print(f"short {place:9} kernel {t:9.0f}/s  memlan {m:9.0f}/s  {m / t:.2f}x  {note}",
                  flush=True)
        for place in places:
            t, _ = idle("tcp", place, a.time, tmp)
            m, note = idle("memlan", place, a.time, tmp)
            res["idle"][place] = {"tcp": t, "memlan": m, "note": note}
            print(f"idle  {place:9} kernel {t[0]:.3f}% {t[1]:.3f}%  memlan {m[0]:.3f}% "
                  f"{m[1]:.3f}%  {note}", flush=True)
    text = section(res, a.time)
    print(text)
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(res, indent=1))
    if not a.no_write:
        write_results(text)


if __name__ == "__main__":
    main()
