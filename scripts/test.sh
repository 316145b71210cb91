#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR MIT
# scripts/test.sh - what `make test` runs: every C test, every example, the pytest integration
# tests, then the C tests and examples again built with ASan+UBSan.  Installs what it needs.
# Ends with the line "N passed, N failed".
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
pass=0; fail=0; skip=0; failed=()

run() { # name, command...
    local name=$1; shift
    local t0=$SECONDS out rc
    out=$(timeout 600 "$@" 2>&1); rc=$?
    if [ $rc -eq 0 ]; then
        pass=$((pass + 1)); printf 'PASS %-40s %3ds  %s\n' "$name" $((SECONDS - t0)) "$(tail -n1 <<<"$out")"
    elif [ $rc -eq 77 ]; then
        skip=$((skip + 1)); printf 'SKIP %s\n' "$name"
    else
        fail=$((fail + 1)); failed+=("$name"); printf 'FAIL %s (exit %d)\n%s\n' "$name" $rc "$out"
    fi
}

# Dependencies: pytest for the integration tests.
if ! python3 -c 'import pytest' 2>/dev/null; then
    echo "installing pytest..."
    python3 -m pip install --quiet pytest 2>/dev/null || {
        apt-get update -qq && apt-get install -y -qq python3-pytest >/dev/null; }
fi

# setuptools and wheel for the test that pip-installs the Python package (pip builds a wheel).
if ! python3 -c 'import setuptools, wheel' 2>/dev/null; then
    python3 -m pip install --quiet setuptools wheel 2>/dev/null || {
        apt-get update -qq && apt-get install -y -qq python3-setuptools python3-wheel >/dev/null; } ||
        echo "setuptools/wheel could not be installed: the pip test will be skipped"
fi

# The real programs the integration tests run (redis, memcached, nginx, PostgreSQL, iperf3,
# sockperf, wrk, curl, lighttpd, mosquitto, haproxy, python3-zmq, python3-grpcio, MariaDB), from
# Debian's packages, and PyPI's grpcio for the suite's python.
scripts/install-apps.sh || echo "install-apps failed: the tests of real programs will fail"
# The papers' systems (nfs-ganesha, libnfs, omniORB, Open MPI, MPICH) for tests/py/test_seeds.py;
# a test whose system could not be installed skips, saying why.
scripts/install-seeds.sh || echo "install-seeds failed: tests/py/test_seeds.py will skip what is missing"

suite() { # build dir, label, stress count
    local b=$1 label=$2 n=$3
    for t in "$b"/tests/*; do
        [ -x "$t" ] || continue
        case $(basename "$t") in
        ring-stress-multiproc) run "$label$(basename "$t")" env MEMLAN_STRESS_N="$n" "$t" ;;
        *) run "$label$(basename "$t")" "$t" ;;
        esac
    done
    # The native API's full-barrier path too (the asymmetric barrier is its default where the
    # kernel offers membarrier; the preload always keeps the full barrier).
    run "${label}tripwire-lost-wakeup MEMLAN_FENCE=1" env MEMLAN_FENCE=1 "$b/tests/tripwire-lost-wakeup"
    run "${label}example pingpong" "$b/examples/pingpong" 20000
    run "${label}example stream" "$b/examples/stream" 128
    run "${label}example zerocopy" "$b/examples/zerocopy"
    run "${label}example evq-server" "$b/examples/evq-server" 64 500
}

# Each run gets a fabric directory of its own, checked for leaks at the end.
export MEMLAN_FABRIC=$(mktemp -d /dev/shm/memlan-test-XXXXXX)
suite "$BUILD" "" 2000000

if python3 -c 'import pytest' 2>/dev/null; then
    t0=$SECONDS
    if python3 -m pytest -q tests/py; then
        pass=$((pass + 1)); echo "PASS pytest tests/py $((SECONDS - t0))s"
    else
        fail=$((fail + 1)); failed+=("pytest tests/py")
    fi
else
    fail=$((fail + 1)); failed+=("pytest could not be installed")
fi

if [ "${MEMLAN_SKIP_ASAN:-0}" != 1 ]; then
    echo "building with ASan+UBSan..."
    if make -s SAN=1 BUILD=build-asan all >/dev/null; then
        export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
        suite build-asan "asan: " 200000
    else
        fail=$((fail + 1)); failed+=("asan build")
    fi
fi

# The chaos suite's short version (kill storms, the vandal, a full fabric, a cross-user vandal
# when root: about 55 s); it uses fabrics of its own, and build-asan's examples when built.
run "chaos (short)" env BUILD="$PWD/$BUILD" python3 tests/chaos/chaos.py

left=$(find "$MEMLAN_FABRIC" -mindepth 1 | wc -l)
if [ "$left" -ne 0 ]; then
    fail=$((fail + 1)); failed+=("fabric files left behind: $left"); ls -l "$MEMLAN_FABRIC"
fi
rm -rf "$MEMLAN_FABRIC"

[ ${#failed[@]} -gt 0 ] && printf 'failed: %s\n' "${failed[@]}"
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
