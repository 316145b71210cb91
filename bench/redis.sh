#!/usr/bin/env bash
# bench/redis.sh SERVER_CPUS CLIENT_CPUS: redis-benchmark GET and SET requests/s with 1 and 50
# clients, over kernel TCP and then with both ends under `memlan run`, in the same run.
# Examples: split = "0 1", same = "0 0", unpinned = "0,1 0,1".  (Interim: bench/apps is to come.)
set -u
cd "$(dirname "$0")/.."
scripts/install-apps.sh >/dev/null
M=$PWD/build/bin/memlan
export MEMLAN_FABRIC=$(mktemp -d /dev/shm/memlan-bench-XXXXXX)
PORT=${PORT:-47390}
for mode in kernel memlan; do
    W=(); [ $mode = memlan ] && W=("$M" run --)
    taskset -c "$1" "${W[@]}" redis-server --port $PORT --bind 127.0.0.1 --save '' --appendonly no \
        >/dev/null 2>&1 &
    P=$!
    sleep 0.5
    for c in 1 50; do
        out=$(timeout 120 taskset -c "$2" "${W[@]}" redis-benchmark -p $PORT -t get,set -n 60000 \
              -c $c --csv 2>/dev/null | grep -E '"(GET|SET)"' | cut -d, -f1,2 | tr '\n' ' ')
        echo "$mode clients=$c $out"
    done
    kill $P; wait $P 2>/dev/null
done
"$M" clean >/dev/null 2>&1; rm -rf "$MEMLAN_FABRIC"
