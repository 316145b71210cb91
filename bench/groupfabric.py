#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 OR MIT
"""bench/groupfabric.py - nginx with workers as an unprivileged user: kernel TCP, the default
fabric, and a fabric shared by a group (issue 19's targets), in one run, as ratios.

    sudo bench/groupfabric.py [--time S] [--rounds N] [--workers N]

nginx as Debian ships it: a root master and N workers (default 2) that drop to `nobody`; wrk
(1 thread, 50 keep-alive connections, a 1 KB file) as another user (daemon), unpinned:
  tcp      neither end under memlan
  default  both under `memlan run` with their default (per-user) fabrics: the workers drop out of
           root's fabric and the client is another user: plain TCP, decided at once
  group    both under `memlan run --fabric DIR`, DIR made by `memlan fabric create --group G`;
           the workers run as `nobody` in group G, the client as daemon in G: accelerated,
           each channel private to its two ends
Each round runs the three modes back to back (S seconds each, default 3); the report is each
mode's median and the median of the rounds' ratios to kernel TCP.  Needs root (a temporary group
is made and removed).  Bounded: every wrk run has a fixed duration, every process is stopped by
its PID.
"""
import argparse
import grp
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
MEMLAN = ROOT / "build" / "bin" / "memlan"
CLIENT_UID = 1  # daemon

CONF = """{user}
daemon off;
master_process on;
worker_processes {workers};
pid {d}/nginx.pid;
error_log {d}/error.log;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    keepalive_requests 1000000;
    server {{ listen 127.0.0.1:{port}; root {d}/www; sendfile on; }}
}}
"""


def listening(port):
    h = ":%04X" % port
    for f in ("/proc/net/tcp", "/proc/net/tcp6"):
        for l in open(f).read().splitlines()[1:]:
            p = l.split()
            if p[1].endswith(h) and p[3] == "0A":
                return True
    return False


def one(mode, d, port, gname, gid, fab, secs, workers):
    user = f"user nobody {gname};" if mode == "group" else "user nobody nogroup;"
    (d / "nginx.conf").write_text(CONF.format(user=user, workers=workers, d=d, port=port))
    env = dict(os.environ)
    env.pop("MEMLAN_FABRIC", None)
    env["MEMLAN_QUIET"] = "1"
    wrap = []
    if mode != "tcp":
        log = d / f"{mode}.log"
        if not log.exists():
            log.write_text("")
            os.chmod(log, 0o666)  # the client is another user
        wrap = [str(MEMLAN), "run", "--log", str(log)]
        if mode == "group":
            wrap += ["--fabric", str(fab)]
        wrap += ["--"]
    srv = subprocess.Popen(wrap + ["nginx", "-c", str(d / "nginx.conf"), "-p", str(d)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        end = time.time() + 20
        while not listening(port):
            if srv.poll() is not None or time.time() > end:
                raise RuntimeError(f"nginx did not start ({mode})")
            time.sleep(0.05)
        time.sleep(0.3)  # the workers drop to nobody
        cgid = gid if mode == "group" else 1
        cmd = ["setpriv", f"--reuid={CLIENT_UID}", f"--regid={cgid}", f"--groups={cgid}", "--"]
        cmd += wrap + ["wrk", "-t", "1", "-c", "50", "-d", f"{secs}s", "--timeout", "2s",
                       f"http://127.0.0.1:{port}/1k.bin"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=secs + 60, env=env)
        out = p.stdout
        if p.returncode != 0 or "Non-2xx" in out:
            raise RuntimeError(f"wrk ({mode}): {out[-400:]} {p.stderr[-400:]}")
        rps = float(re.search(r"Requests/sec:\s+([0-9.]+)", out).group(1))
        tmo = re.search(r"timeout (\d+)", out)
        return rps, int(tmo.group(1)) if tmo else 0
    finally:
        srv.terminate()
        try:
            srv.wait(10)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--time", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/groupfabric.py: needs root (nginx's master, a temporary group)")
    gname = f"mlb{os.getpid() % 100000}"
    subprocess.run(["groupadd", gname], check=True)
    d = pathlib.Path(tempfile.mkdtemp(prefix="memlan-gbench-"))
    os.chmod(d, 0o755)
    fab = pathlib.Path(tempfile.mkdtemp(prefix="memlan-gbench-", dir="/dev/shm"))
    fab.rmdir()
    try:
        gid = grp.getgrnam(gname).gr_gid
        subprocess.run([str(MEMLAN), "fabric", "create", "--group", gname, str(fab)], check=True,
                       stdout=subprocess.DEVNULL)
        (d / "www").mkdir()
        (d / "www" / "1k.bin").write_bytes(os.urandom(1024))
        os.chmod(d / "www", 0o755)
        os.chmod(d / "www" / "1k.bin", 0o644)
        res = {m: [] for m in ("tcp", "default", "group")}
        tmo = {m: 0 for m in res}
        port = 30500
        for r in range(a.rounds):
            for m in res:
                port += 1
                rps, t = one(m, d, port, gname, gid, fab, a.time, a.workers)
                res[m].append(rps)
                tmo[m] += t
                print(f"round {r + 1} {m:8s} {rps:10.0f} req/s  wrk timeouts {t}", flush=True)
        acc = {m: (d / f"{m}.log").read_text().count("accelerated (client)")
               for m in ("default", "group") if (d / f"{m}.log").exists()}
        print(f"\nnginx, {a.workers} workers as nobody, wrk -c 50 as another user, "
              f"{a.rounds} rounds of {a.time} s")
        for m in res:
            med = statistics.median(res[m])
            ratios = [x / y for x, y in zip(res[m], res["tcp"])]
            print(f"{m:8s} median {med:10.0f} req/s  x kernel TCP {statistics.median(ratios):.2f} "
                  f"({min(ratios):.2f}-{max(ratios):.2f})  wrk timeouts {tmo[m]}  "
                  f"accelerated connections {acc.get(m, 0)}")
    finally:
        shutil.rmtree(d, ignore_errors=True)
        subprocess.run([str(MEMLAN), "clean"], env=dict(os.environ, MEMLAN_FABRIC=str(fab)),
                       capture_output=True)
        shutil.rmtree(fab, ignore_errors=True)
        subprocess.run(["groupdel", gname])


if __name__ == "__main__":
    main()
