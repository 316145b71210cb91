#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR MIT
# bench/netns.sh - Redis between two network namespaces that share one fabric directory, what two
# containers on one bridge network look like: redis-server in one namespace, redis-benchmark (GET
# and SET, 1 and 50 clients) in the other, joined by a veth pair with a private address pair
# (10.233.X.0/24) that exists only inside them.  Each round runs kernel TCP over the veth, then
# both sides under `memlan run`, ROUNDS rounds in turn; memlan's decision logs must show every
# connection accelerated, or the figure is marked.  Prints each side's median over the rounds
# and the ratio of the medians (memlan over kernel TCP).
#
# Usage: bench/netns.sh [seconds per test, default 2] [rounds, default 3]
# (redis-benchmark -n: 40000 x seconds requests with 1 client, 100000 x seconds with 50; each run
# is bounded by `timeout`.)  About 1 minute with the defaults.
# Needs root, ip (iproute2), redis-server and redis-benchmark, and `make` done.  A benchmark,
# not a test: it never fails on a figure.  Namespaces, veths, processes and the fabric directory
# it made are removed on exit, the processes by PID.
set -u
cd "$(dirname "$0")/.."
SECS=${1:-2}
ROUNDS=${2:-3}
MEMLAN=$PWD/${BUILD:-build}/bin/memlan
case $SECS$ROUNDS in *[!0-9]*) echo "usage: bench/netns.sh [seconds] [rounds]" >&2; exit 2 ;; esac
[ "$SECS" -ge 1 ] && [ "$ROUNDS" -ge 1 ] || { echo "bench/netns.sh: seconds and rounds must be >= 1" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "bench/netns.sh: needs root (network namespaces)" >&2; exit 2; }
for p in ip redis-server redis-benchmark "$MEMLAN"; do
    command -v "$p" >/dev/null || { echo "bench/netns.sh: $p not found" >&2; exit 2; }
done

tag=$(printf '%x' $(($$ & 0xffff)))
X=$((RANDOM % 250 + 1))
SNS=mlb-$tag-srv CNS=mlb-$tag-cli
SADDR=10.233.$X.2 CADDR=10.233.$X.1
PORT=6390
WORK=$(mktemp -d /tmp/memlan-netns-XXXXXX)
export MEMLAN_FABRIC=$(mktemp -d /dev/shm/memlan-netns-XXXXXX)
made=() srv=

cleanup() {
    if [ -n "$srv" ]; then kill "$srv" 2>/dev/null; wait "$srv" 2>/dev/null; fi
    for ns in "${made[@]}"; do ip netns del "$ns" 2>/dev/null; done  # takes the veth pair along
    "$MEMLAN" clean --fabric "$MEMLAN_FABRIC" >/dev/null 2>&1
    rm -rf "$MEMLAN_FABRIC" "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for ns in "$SNS" "$CNS"; do
    ip netns add "$ns" || exit 1
    made+=("$ns")
    ip -n "$ns" link set lo up
done
ip link add "mlb${tag}a" netns "$SNS" type veth peer name "mlb${tag}b" netns "$CNS" || exit 1
ip -n "$SNS" addr add "$SADDR/24" dev "mlb${tag}a" && ip -n "$SNS" link set "mlb${tag}a" up
ip -n "$CNS" addr add "$CADDR/24" dev "mlb${tag}b" && ip -n "$CNS" link set "mlb${tag}b" up

# mode (tcp|memlan), namespace, log, command...: the command line, under memlan run or not.
wrap() {
    local mode=$1 ns=$2 log=$3; shift 3
    if [ "$mode" = memlan ]; then
        echo ip netns exec "$ns" "$MEMLAN" run --log "$log" -- "$@"
    else
        echo ip netns exec "$ns" "$@"
    fi
}

# mode round: one redis-server, the four redis-benchmark figures into $WORK/fig.
one() {
    local mode=$1 r=$2
    local slog=$WORK/$mode-$r-server.log clog=$WORK/$mode-$r-client.log
    : >"$slog"; : >"$clog"; : >"$WORK/redis.log"
    # shellcheck disable=SC2046
    $(wrap "$mode" "$SNS" "$slog" redis-server --bind "$SADDR" --port "$PORT" --save "" \
        --appendonly no --protected-mode no --daemonize no --logfile "$WORK/redis.log") &
    srv=$!
    # Ready when redis says so in its own log: a probe connection would be one more (kernel TCP)
    # connection in memlan's log.
    local up=0
    for _ in $(seq 100); do  # up to 10 s
        grep -q 'Ready to accept connections' "$WORK/redis.log" 2>/dev/null && { up=1; break; }
        sleep 0.1
    done
    [ $up = 1 ] || { echo "redis-server did not start ($mode)" >&2; cat "$WORK/redis.log" >&2; exit 1; }
    local c n out
    for c in 1 50; do
        # redis-benchmark counts requests, not time: sized for about SECS seconds of kernel TCP
        # on a 2-vCPU VM (35k to 55k requests/s); memlan's runs are shorter.
        n=$(( c == 1 ? 40000 * SECS : 100000 * SECS ))
        # shellcheck disable=SC2046
        out=$(timeout $((60 + 30 * SECS)) $(wrap "$mode" "$CNS" "$clog" redis-benchmark \
            -h "$SADDR" -p "$PORT" -t get,set -n "$n" -c "$c" --csv)) ||
            { echo "redis-benchmark failed ($mode, $c clients)" >&2; exit 1; }
        for t in GET SET; do
            v=$(sed -n "s/^\"$t\",\"\([0-9.]*\)\".*/\1/p" <<<"$out")
            [ -n "$v" ] || { echo "no $t figure from redis-benchmark: $out" >&2; exit 1; }
            echo "$mode $t $c $v" >>"$WORK/fig"
            printf 'round %d %-6s %s %2d client(s): %10.0f requests/s\n' "$r" "$mode" "$t" "$c" "$v"
        done
    done
    kill "$srv"; wait "$srv" 2>/dev/null; srv=
    if [ "$mode" = memlan ]; then
        local acc tcp
        acc=$(grep -c 'accelerated (client)' "$clog")
        tcp=$(grep -c ' TCP (' "$clog" "$slog" | awk -F: '{s += $2} END {print s + 0}')
        echo "round $r: $acc client connections accelerated, $tcp on TCP"
        [ "$acc" -gt 0 ] && [ "$tcp" -eq 0 ] || echo "memlan $r" >>"$WORK/notall"
        grep -m1 ' TCP (' "$clog" "$slog"
    fi
    return 0
}

echo "redis-server in $SNS ($SADDR), redis-benchmark in $CNS ($CADDR), veth pair, fabric $MEMLAN_FABRIC"
echo "$(nproc) cpus; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$ROUNDS"); do
    one tcp "$r"
    one memlan "$r"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

median() { sort -g | awk '{a[NR] = $1} END {print NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
printf '\n%-22s %14s %14s %8s\n' "requests/s (median)" "kernel TCP" "memlan" "ratio"
for c in 1 50; do
    for t in GET SET; do
        k=$(awk -v t=$t -v c=$c '$1 == "tcp" && $2 == t && $3 == c {print $4}' "$WORK/fig" | median)
        m=$(awk -v t=$t -v c=$c '$1 == "memlan" && $2 == t && $3 == c {print $4}' "$WORK/fig" | median)
        printf '%-22s %14.0f %14.0f %7.2fx\n' "$t, $c client$([ $c -gt 1 ] && echo s)" "$k" "$m" \
            "$(awk -v k="$k" -v m="$m" 'BEGIN {print m / k}')"
    done
done
if [ -s "$WORK/notall" ]; then
    echo "NOT ALL ACCELERATED in rounds: $(cut -d' ' -f2 "$WORK/notall" | tr '\n' ' ')"
else
    echo "every memlan round: all connections accelerated"
fi
