# SPDX-License-Identifier: Apache-2.0 OR MIT
"""A mutation fuzzer for memlan-rpcgen: mutated .x files (bit flips, cut and duplicated spans,
spliced lines, preprocessor and RPC-language tokens) must never crash it, hang it or exhaust its
memory; it exits 0, or 1 with an error that names file, line and column.

Usage: fuzz_rpcgen.py RPCGEN SEED RUNS SECONDS SEEDFILE.x...  (bounded by RUNS and SECONDS)
Prints "N runs: A accepted, E errors, F failures" and exits 1 if F > 0."""
import os
import random
import re
import resource
import subprocess
import sys
import tempfile
import time

TOKENS = [b"#include \"/dev/zero\"\n", b"#include \"self.x\"\n", b"#if 1\n", b"#ifdef X\n",
          b"#endif\n", b"#else\n", b"#elif\n", b"#define X\n", b"%", b"{", b"}", b"<", b">",
          b"[", b"]", b";", b"=", b"*", b"(", b")", b",", b"opaque", b"string", b"void",
          b"struct", b"union", b"switch", b"case", b"default:", b"enum", b"typedef",
          b"program", b"version", b"const", b"unsigned", b"hyper", b"4294967296",
          b"-2147483649", b"0x", b"99999999999999999999", b"'", b"\"", b"/*", b"*/", b"\\",
          b"\x00", b"\xff", b"(" * 200, b"{" * 200, b"#if " + b"(" * 300 + b"1"]
ERR = re.compile(rb"^[^:\n]+:\d+:\d+: error: ", re.M)


def mutate(rng, data, others):
    data = bytearray(data)
    for _ in range(rng.randint(1, 6)):
        op = rng.randrange(6)
        if op == 0 and data:
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
        elif op == 1 and data:
            i = rng.randrange(len(data))
            del data[i:i + rng.randint(1, 40)]
        elif op == 2 and data:
            i = rng.randrange(len(data))
            j = min(len(data), i + rng.randint(1, 80))
            data[i:i] = data[i:j] * rng.randint(1, 3)
        elif op == 3:
            i = rng.randrange(len(data) + 1)
            data[i:i] = rng.choice(TOKENS)
        elif op == 4:
            lines = rng.choice(others).splitlines(keepends=True)
            if lines:
                i = rng.randrange(len(data) + 1)
                data[i:i] = rng.choice(lines)
        elif op == 5 and data:
            i = rng.randrange(len(data))
            data[i] = rng.choice(b"{}<>[]();=*,0123456789abcXYZ \n\t#%\"")
    return bytes(data)


def limit():
    resource.setrlimit(resource.RLIMIT_CPU, (10, 10))


def main():
    rpcgen, seed, runs, secs, seeds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
        float(sys.argv[4]), sys.argv[5:]
    rng = random.Random(seed)
    texts = [open(s, "rb").read() for s in seeds]
    env = dict(os.environ)
    # memory: ASan reserves terabytes of address space, so RLIMIT_AS cannot bound it; its own
    # RSS limit does (and a plain build gets RLIMIT_AS from the caller if wanted)
    env["ASAN_OPTIONS"] = "detect_leaks=0:hard_rss_limit_mb=1024:abort_on_error=0"
    env["UBSAN_OPTIONS"] = "halt_on_error=1:print_stacktrace=1"
    end = time.monotonic() + secs
    n = ok = errs = 0
    failures = []
    with tempfile.TemporaryDirectory() as d:
        while n < runs and time.monotonic() < end:
            text = mutate(rng, rng.choice(texts), texts)
            with open(os.path.join(d, "f.x"), "wb") as f:
                f.write(text)
            with open(os.path.join(d, "self.x"), "wb") as f:
                f.write(text)
            mode = rng.choice(["-h", "-c", "-l", "-m", "-N", "-M"])
            args = [rpcgen, mode, "f.x"] if mode not in ("-N", "-M") else [rpcgen, mode, "f.x"]
            n += 1
            try:
                p = subprocess.run(args, cwd=d, capture_output=True, timeout=20, env=env,
                                   preexec_fn=limit)
            except subprocess.TimeoutExpired:
                failures.append(("hang", text))
                continue
            if p.returncode == 0 and not p.stderr.strip(b"\n") or \
               p.returncode == 0 and b"warning" in p.stderr and b"runtime error" not in p.stderr:
                ok += 1
            elif p.returncode == 1 and ERR.search(p.stderr) and b"Sanitizer" not in p.stderr \
                    and b"runtime error" not in p.stderr:
                errs += 1
            else:
                failures.append((f"exit {p.returncode}: {p.stderr[-2000:]!r}", text))
            for name in os.listdir(d):
                if name not in ("f.x", "self.x"):
                    os.unlink(os.path.join(d, name))
    for why, text in failures[:5]:
        print(f"FAILURE {why}\n--- input ---\n{text[:600]!r}\n", file=sys.stderr)
    print(f"{n} runs: {ok} accepted, {errs} errors, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
