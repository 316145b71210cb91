#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR MIT
# bench/epoll.sh [ROUNDS]: the round trip of one busy connection served from an epoll set that
# also holds 10 or 10,000 idle connections, over kernel TCP and under `memlan run`, split
# (server cpu 0, clients cpu 1) and same (all on cpu 0); and what each idle connection costs.
# Uses tests/preload/manyconn (built by `make`).  Needs RLIMIT_NOFILE >= 2 x 10,000 + 64 (root
# raises it itself).
set -u
cd "$(dirname "$0")/.."
R=${1:-20000}
M=$PWD/build/bin/memlan
P=$PWD/build/tests-preload/manyconn
[ -x "$P" ] || make -s "$P" >/dev/null
export MEMLAN_FABRIC=$(mktemp -d /dev/shm/memlan-bench-XXXXXX)
trap '"$M" clean >/dev/null 2>&1; rm -rf "$MEMLAN_FABRIC"' EXIT
printf '%-6s %-7s %6s %10s %10s %14s %14s %10s\n' place mode idle p50_us p99_us \
    rss_B_per_conn shm_B_per_conn fds/conn
for place in "split 0 1" "same 0 0"; do
    set -- $place
    for mode in kernel memlan; do
        W=(); [ $mode = memlan ] && W=("$M" run --)
        for n in 10 10000; do
            out=$(timeout 300 "${W[@]}" "$P" $n "$R" 4 "$2" "$3") || { echo "$1 $mode $n FAILED"; continue; }
            python3 -c '
import json, sys
r = json.loads(sys.argv[1]); n = r["n"]
rss = (r["rss_kb_after"] - r["rss_kb_before"]) * 1024 / n
shm = (r["fabric_kb_after"] - r["fabric_kb_before"]) * 1024 / n
print("%-6s %-7s %6d %10.3f %10.3f %14.0f %14.0f %10.2f" % (sys.argv[2], sys.argv[3], n,
      r["rtt_p50_us"], r["rtt_p99_us"], rss, shm, r["fds_per_conn"]))' "$out" "$1" "$mode"
        done
    done
done
