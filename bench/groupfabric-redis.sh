#!/bin/bash
# SPDX-License-Identifier: Apache-2.0 OR MIT
# bench/groupfabric-redis.sh [ROUNDS]: root's redis-server, redis-benchmark GET (1 and 50 clients,
# 40000 requests) run as another user (daemon) in a group fabric made by `memlan fabric create`,
# against kernel TCP, back to back per round (issue 20's target: faster than kernel TCP).  Needs
# root; a temporary group and fabric are made and removed; every server stopped by its PID.
set -e
M=$(cd "$(dirname "$0")/.." && pwd)/build/bin/memlan
G=mlr$$; groupadd $G; GID=$(getent group $G | cut -d: -f3)
F=/dev/shm/memlan-rb-$$; $M fabric create --group $G $F >/dev/null
P=30700
for round in $(seq ${1:-3}); do
 for mode in tcp group; do
  P=$((P+1))
  if [ $mode = tcp ]; then W=""; else W="$M run -q --fabric $F --"; fi
  $W redis-server --port $P --bind 127.0.0.1 --save "" --appendonly no --daemonize no >/dev/null 2>&1 &
  S=$!
  for i in $(seq 50); do (echo > /dev/tcp/127.0.0.1/$P) 2>/dev/null && break; sleep 0.1; done
  for c in 1 50; do
   r=$(setpriv --reuid=1 --regid=$GID --groups=$GID -- $W redis-benchmark -p $P -c $c -n 40000 -t get -q 2>/dev/null | grep -o "[0-9.]* requests per second" | cut -d' ' -f1)
   echo "round $round $mode clients=$c GET $r"
  done
  kill $S; wait $S 2>/dev/null || true
 done
done
MEMLAN_FABRIC=$F $M clean >/dev/null; rm -rf $F; groupdel $G
