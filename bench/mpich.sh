#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR MIT
# bench/mpich.sh [ROUNDS [ITERS [SIZE]]]: MPICH over UCX-TCP (UCX_TLS=self,tcp,
# MPIR_CVAR_NOLOCAL=1: no shared memory of MPICH's own), two ranks on this machine, a SIZE-byte
# (64) ping-pong of ITERS (20000) round trips, over kernel TCP and with each rank under
# `memlan run`, in ROUNDS (5) alternating rounds; prints each round, the medians and their ratio,
# and the voluntary context switches per second of each rank's threads under memlan (sampled
# from /proc at the end of a longer run).  Needs Debian's mpich (mpicc.mpich, mpiexec.mpich:
# `apt-get install mpich`); bench/mpi/pingpong.c is built here, not by make.
set -u
cd "$(dirname "$0")/.."
R=${1:-5} N=${2:-20000} S=${3:-64}
M=$PWD/build/bin/memlan
command -v mpicc.mpich >/dev/null && command -v mpiexec.mpich >/dev/null ||
    { echo "mpich.sh: needs Debian's mpich (apt-get install mpich)" >&2; exit 2; }
[ -x "$M" ] || { echo "mpich.sh: run make first" >&2; exit 2; }
W=$(mktemp -d /tmp/memlan-mpich-XXXXXX)
export MEMLAN_FABRIC=$(mktemp -d /dev/shm/memlan-bench-XXXXXX)
trap '"$M" clean >/dev/null 2>&1; rm -rf "$MEMLAN_FABRIC" "$W"' EXIT
mpicc.mpich -O2 -o "$W/pingpong" bench/mpi/pingpong.c || exit 2
export UCX_TLS=self,tcp MPIR_CVAR_NOLOCAL=1
run() { # mode -> rtt_us
    local w=(); [ "$1" = memlan ] && w=("$M" run --log "$W/log" --)
    timeout 120 mpiexec.mpich -n 2 "${w[@]}" "$W/pingpong" "$N" "$S" |
        python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["rtt_us"])'
}
k=() m=()
for r in $(seq "$R"); do
    a=$(run kernel) || { echo "round $r: kernel run failed"; exit 1; }
    b=$(run memlan) || { echo "round $r: memlan run failed"; exit 1; }
    echo "round $r: kernel ${a} us, memlan ${b} us"
    k+=("$a") m+=("$b")
done
grep -q "accelerated" "$W/log" || { echo "mpich.sh: no connection was accelerated"; exit 1; }
python3 - "${#k[@]}" "${k[@]}" "${m[@]}" <<'PY'
import statistics, sys
n = int(sys.argv[1]); v = [float(x) for x in sys.argv[2:]]
k, m = statistics.median(v[:n]), statistics.median(v[n:])
print(f"median round trip: kernel TCP {k:.2f} us, memlan {m:.2f} us, memlan/kernel {m / k:.2f}x")
PY
# Wake-ups: voluntary context switches per second of every thread of each rank, over a run
# long enough to sample (10x ITERS), read from /proc just before the ranks exit.
cat > "$W/sw.sh" <<'SH'
#!/usr/bin/env bash
"$@" &
p=$!
sleep 1.5
t0=$(date +%s.%N)
s0=$(cat /proc/$p/task/*/status 2>/dev/null | awk '/^voluntary_ctxt/{s+=$2} END{print s+0}')
sleep 1
t1=$(date +%s.%N)
s1=$(cat /proc/$p/task/*/status 2>/dev/null | awk '/^voluntary_ctxt/{s+=$2} END{print s+0}')
echo "rank pid $p: $(python3 -c "print(round(($s1-$s0)/($t1-$t0)))") voluntary switches/s" >&2
wait $p
SH
chmod +x "$W/sw.sh"
for mode in kernel memlan; do
    w=(); [ $mode = memlan ] && w=("$M" run --)
    echo "$mode, wake-ups while ping-ponging:"
    timeout 120 mpiexec.mpich -n 2 "$W/sw.sh" "${w[@]}" "$W/pingpong" $((N * 20)) "$S" >/dev/null
done
