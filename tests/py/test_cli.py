# SPDX-License-Identifier: Apache-2.0 OR MIT
"""The memlan command line: stat, clean and bench, run as a user would run them."""
import json
import os
import re
import signal
import xml.etree.ElementTree as ET

from conftest import memlan

SPLIT_SAME_KEYS = ["rtt_spin_us", "rtt_sleep_us", "floor_spin_us", "floor_twolines_us",
                   "floor_futex_us", "tcp_rtt_us",
                   "bw_64k_MBps", "xmax_64k_MBps", "tcp_bw_64k_MBps", "rate_64_Mps",
                   "tcp_rate_64_Mps", "floor_ring_64_Mps", "bw_1m_MBps", "bw_1m_inplace_MBps"]


def test_version_and_help():
    assert memlan("version").stdout.startswith("memlan ")
    # the whole version, as memlan.pc, the libraries' real names and the man pages give it
    # (it said "memlan 0.1" beside pkg-config's 0.1.0)
    import pathlib
    h = (pathlib.Path(__file__).resolve().parents[2] / "include" / "memlan.h").read_text()
    ver = ".".join(re.search(rf"#define MEMLAN_VERSION_{p} (\d+)", h).group(1)
                   for p in ("MAJOR", "MINOR", "PATCH"))
    assert memlan("version").stdout == f"memlan {ver}\n"
    assert memlan("--version").stdout == f"memlan {ver}\n"
    assert "bench" in memlan("help").stdout
    p = memlan("frobnicate", check=False)
    assert p.returncode == 2 and "unknown command" in p.stderr


def test_stat_shows_live_objects_and_clean_leaves_them(fabric, holder):
    proc, seg, ch = holder()
    out = memlan("stat", "--tokens").stdout
    assert seg in out and ch in out
    st = json.loads(memlan("stat", "--json", "--tokens").stdout)
    kinds = {o["token"]: (o["kind"], o["live"], o["pid"]) for o in st["objects"]}
    assert kinds[seg] == ("segment", True, proc.pid)
    assert kinds[ch] == ("channel", True, proc.pid)
    # Live owners' files are never reclaimed.
    assert "removed 0 file" in memlan("clean").stdout
    assert sorted(os.listdir(fabric)) == sorted([f"seg-{seg}", f"seg-{ch}"])
    proc.stdin.write("close\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "closed"
    proc.wait(timeout=10)
    # A clean exit leaves nothing behind.
    assert os.listdir(fabric) == []


def test_stat_passes_over_planted_files(fabric, holder):
    """memlan stat lists a fabric in which a member planted a FIFO under a segment's name, and a
    process entry whose connection token names a path through the fabric ("x/../../FIFO"): it
    answers at once.  Before, its open of the FIFO waited for a writer for ever (a review's
    reproduction; a member of a shared fabric can plant both)."""
    proc, seg, ch = holder()
    os.mkfifo(fabric / "seg-planted")
    os.mkdir(fabric / "seg-x")
    os.mkfifo(fabric.parent / (fabric.name + "-fifo"))
    try:
        p = memlan("stat", "--json", timeout=10)
        assert json.loads(p.stdout)["objects"], p.stdout
    finally:
        os.unlink(fabric.parent / (fabric.name + "-fifo"))
        os.unlink(fabric / "seg-planted")
        os.rmdir(fabric / "seg-x")
        proc.stdin.write("close\n")
        proc.stdin.flush()
        proc.wait(timeout=10)


def test_sigkill_then_clean_reclaims(fabric, holder):
    proc, seg, ch = holder()
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    st = json.loads(memlan("stat", "--json", "--tokens").stdout)
    assert {o["token"]: o["live"] for o in st["objects"]} == {seg: False, ch: False}
    assert "DEAD" in memlan("stat").stdout
    assert "removed 2 file" in memlan("clean").stdout
    assert os.listdir(fabric) == []


def test_bench_json_has_every_figure(fabric, tmp_path):
    svg = tmp_path / "bw.svg"
    p = memlan("bench", "--quick", "--json", "--plot", str(svg), timeout=300, check=False)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert "idle_cpu_pct" in r and r["idle_cpu_pct"] >= 0
    for placement in ("split", "same"):
        for k in SPLIT_SAME_KEYS:
            assert k in r[placement], (placement, k)
            assert r[placement][k] > 0, (placement, k, r[placement][k])
        assert r[placement]["errors"] == 0
        # every figure against its floor from the same run (issue 21)
        vs = r[placement]["vs_floor"]
        assert abs(vs["rtt_spin_vs_cacheline"] * r[placement]["floor_spin_us"]
                   - r[placement]["rtt_spin_us"]) < 0.01 * r[placement]["rtt_spin_us"] + 0.002
        # and against two bare lines, one for each direction (a duplex channel's floor)
        assert abs(vs["rtt_spin_vs_twolines"] * r[placement]["floor_twolines_us"]
                   - r[placement]["rtt_spin_us"]) < 0.01 * r[placement]["rtt_spin_us"] + 0.002
        assert abs(vs["rate_64_vs_ring"] * r[placement]["floor_ring_64_Mps"]
                   - r[placement]["rate_64_Mps"]) < 0.01 * r[placement]["rate_64_Mps"] + 0.001
        assert vs["bw_64k_vs_xmax"] > 0 and vs["bw_1m_vs_xmax"] > 0
        # the 1 MiB floors: two copies through a minimal ring, always measured; one copy by
        # process_vm_readv, null only where the kernel refuses it
        assert r[placement]["floor_pipe_1m_MBps"] > 0
        assert abs(vs["bw_1m_vs_pipe"] * r[placement]["floor_pipe_1m_MBps"]
                   - r[placement]["bw_1m_MBps"]) < 0.01 * r[placement]["bw_1m_MBps"] + 0.1
        # the receiver reading in place (one copy), against the same X_max
        inplace = r[placement]["bw_1m_inplace_MBps"]
        assert abs(vs["inplace_1m_vs_xmax"] * r[placement]["xmax_64k_MBps"] - inplace) \
            < 0.01 * inplace + 0.1
        cma = r[placement]["floor_cma_1m_MBps"]
        assert cma is None or (cma > 0 and vs["cma_1m_vs_xmax"] > 0)
        # X_max is derived from Xt and Xr exactly as SCILAN defines it.
        xt, xr = r[placement]["xt_MBps"], r[placement]["xr_MBps"]
        assert abs(r[placement]["xmax_64k_MBps"] - xt * xr / (xt + xr)) < 0.2
    root = ET.parse(svg).getroot()
    assert root.tag.endswith("svg")
    lines = [e for e in root.iter() if e.tag.endswith("polyline")]
    assert len(lines) == 4
    # every point has a marker, so a one-point series (kernel TCP in --quick) is seen
    points = sum(len(e.get("points").split()) for e in lines)
    markers = [e for e in root.iter() if e.tag.endswith("circle") and e.get("class") == "marker"]
    assert points >= 10 and len(markers) == points
    # ticks for people, and the round trip of every transport beside bandwidth
    texts = [e.text for e in root.iter() if e.tag.endswith("text") and e.text]
    assert "1 MiB" in texts and "64 B" in texts and not any("e+" in s for s in texts)
    bars = [e for e in root.iter() if e.tag.endswith("rect") and e.get("class") == "bar"]
    assert len(bars) == 2 * 8 and "floor: two lines" in texts
    assert "kernel TCP loopback" in texts and "pipe" in texts


def test_bench_text_names_its_goals(fabric):
    p = memlan("bench", "--quick", "--placement", "same", timeout=300, check=False)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "MISSED" not in out and "issue" not in out and "target" not in out
    assert re.search(r"round trip, spinning off: [0-9.e-]+x the bare futex +\(goal <= 1\.3x\)", out)
    assert re.search(r"bandwidth, 64 KiB messages: [0-9.e-]+x X_max", out)
    assert re.search(r"message rate, 64 B: [0-9.e-]+x kernel TCP's +\(goal >= 10x\)", out)


def test_bench_pairs(fabric):
    """--pairs N: N pairs at once on 2N cpus, refused clearly without them (issue 21)."""
    ncpu = len(os.sched_getaffinity(0))
    p = memlan("bench", "--pairs", str(ncpu), check=False)  # needs 2 * ncpu
    assert p.returncode == 2 and "needs %d cpus" % (2 * ncpu) in p.stderr, p.stderr
    for bad in ("0", "1,x", "", "65"):
        assert memlan("bench", "--pairs", bad, check=False).returncode == 2
    if ncpu < 2:
        return
    p = memlan("bench", "--quick", "--json", "--pairs", "1", timeout=120, check=False)
    assert p.returncode == 0, p.stderr
    (one,) = json.loads(p.stdout)["pairs"]
    assert one["n"] == 1 and one["errors"] == 0
    for k in ("rate_64_Mps", "floor_ring_64_Mps", "bw_64k_MBps", "rate_64_vs_ring"):
        assert one[k] > 0, (k, one)
    assert one["rate_vs_one_pair"] == 1


def test_bench_rejects_bad_arguments(fabric):
    assert memlan("bench", "--placement", "moon", check=False).returncode == 2
    p = memlan("bench", "--plot", "x.png", check=False)
    assert p.returncode == 2 and "SVG" in p.stderr


# ---- an honest command line (issue 23) ----------------------------------------------------------

import ctypes
import errno
import shutil
import subprocess
import sys
import tempfile

import pytest

from conftest import LIB, MEMLAN

PY = sys.executable  # the interpreter itself, not a wrapper script that execs several programs
PRELOAD = LIB.parent / "libmemlan-preload.so"
COMMANDS = ["run", "stat", "clean", "bench", "version"]


def cli(*args, env=None, cwd=None, timeout=60):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([str(MEMLAN), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=e, cwd=cwd)


@pytest.mark.parametrize("cmd", COMMANDS)
def test_every_command_has_help(cmd):
    p = cli(cmd, "--help")
    assert p.returncode == 0 and p.stdout.startswith(f"usage: memlan {cmd}"), (p.stdout, p.stderr)
    assert "--fabric" in p.stdout or cmd == "version"
    assert cli("help", cmd).stdout == p.stdout


def test_clean_help_cleans_nothing(fabric, holder):
    proc, seg, ch = holder()
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    assert cli("clean", "--help").returncode == 0
    assert sorted(os.listdir(fabric)) == sorted([f"seg-{seg}", f"seg-{ch}"])
    assert "removed 2 file" in memlan("clean").stdout


@pytest.mark.parametrize("args,named", [
    (["stat", "--bogus"], "--bogus"),
    (["stat", "--json", "extra"], "extra"),
    (["clean", "--bogus"], "--bogus"),
    (["bench", "--bogus"], "--bogus"),
    (["version", "--bogus"], "--bogus"),
    (["stat", "--pid", "x"], "--pid"),
    (["stat", "--kind", "moon"], "--kind"),
    (["stat", "-i", "0"], "--interval"),
    (["stat", "-c", "3"], "--count"),
    (["run", "--bogus", "--"], "--bogus"),
    (["run", "--spin-us", "abc", "--"], "--spin-us"),
    (["run", "--ring-kb", "-5", "--"], "--ring-kb"),
    (["run", "--ring-grow-kb", "70000", "--"], "--ring-grow-kb"),
    (["run", "--ports", "foo", "--"], "--ports"),
    (["run", "--no-ports", "80-", "--"], "--no-ports"),
    (["run", "--log-level", "9", "--"], "--log-level"),
    (["run", "--accept-wait-ms", "0", "--"], "--accept-wait-ms"),
    (["run", "--accept-queue-ms", "600001", "--"], "--accept-queue-ms"),
    (["run", "--log", "/nonexistent-dir/x.log", "--"], "/nonexistent-dir/x.log"),
])
def test_bad_options_are_refused_before_anything_runs(fabric, tmp_path, args, named):
    mark = tmp_path / "ran"
    if args[0] == "run":
        args = args + ["touch", str(mark)]
    p = cli(*args, cwd=tmp_path)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert named in p.stderr and p.stdout == "", p.stderr
    assert not mark.exists()


def test_fabric_option_is_honoured(fabric, holder, tmp_path):
    proc, seg, ch = holder()
    other = tempfile.mkdtemp(prefix="memlan-py-other-", dir="/dev/shm")
    try:
        # --fabric beats MEMLAN_FABRIC, both ways.
        st = json.loads(cli("stat", "--json", "--fabric", other).stdout)
        assert st["fabric"] == other and st["objects"] == []
        st = json.loads(cli("stat", "--json", "--tokens", "--fabric", fabric,
                            env={"MEMLAN_FABRIC": other}).stdout)
        assert {o["token"] for o in st["objects"]} == {seg, ch}
        # A relative --fabric is taken against our working directory, and made absolute.
        st = json.loads(cli("stat", "--json", "--fabric", fabric.name, cwd=fabric.parent,
                            env={"MEMLAN_FABRIC": other}).stdout)
        assert st["fabric"] == str(fabric) and len(st["objects"]) == 2
        # A named fabric that does not exist is an error, not an empty fabric.
        p = cli("stat", "--fabric", tmp_path / "nope")
        assert p.returncode == 1 and "nope" in p.stderr
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert "removed 0 file" in cli("clean", "--fabric", other).stdout
        assert sorted(os.listdir(fabric)) == sorted([f"seg-{seg}", f"seg-{ch}"])
        p = cli("clean", "--fabric", fabric, env={"MEMLAN_FABRIC": other})
        assert "removed 2 file" in p.stdout and str(fabric) in p.stdout, p.stdout + p.stderr
        assert os.listdir(fabric) == []
        out = cli("run", "--fabric", fabric.name, "--", "sh", "-c", "echo $MEMLAN_FABRIC",
                  cwd=fabric.parent).stdout
        assert out.strip() == str(fabric)
    finally:
        shutil.rmtree(other, ignore_errors=True)


def test_run_log_is_absolute_and_opened_first(fabric, tmp_path):
    (tmp_path / "sub").mkdir()
    p = cli("run", "--log-level", "2", "--log", "rel.log", "--", "sh", "-c",
            "cd sub && echo $MEMLAN_LOG && exec env true", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == str(tmp_path / "rel.log")
    # every process logs into the one file, whatever its working directory
    assert not (tmp_path / "sub" / "rel.log").exists()
    assert (tmp_path / "rel.log").read_text().count("loaded") >= 2


def test_run_warns_about_static_programs(fabric, tmp_path):
    src = tmp_path / "s.c"
    src.write_text("int main(void) { return 0; }\n")
    static = tmp_path / "static"
    if subprocess.run(["cc", "-static", "-o", str(static), str(src)]).returncode != 0:
        pytest.skip("no static libc to link with")
    p = cli("run", "--", static)
    assert p.returncode == 0 and "statically linked" in p.stderr and str(static) in p.stderr
    assert "statically linked" not in cli("run", "--quiet", "--", static).stderr
    script = tmp_path / "script"
    script.write_text(f"#!{static}\n")
    script.chmod(0o755)
    assert "statically linked" in cli("run", "--", script).stderr
    dyn = cli("run", "--", PY, "-c", "pass")
    assert dyn.returncode == 0 and "statically linked" not in dyn.stderr
    assert "Go program" not in dyn.stderr


GO_NOTE = """
struct gonote { unsigned namesz, descsz, type; char name[4]; char desc[8]; };
__attribute__((section(".note.go.buildid"), used, aligned(4)))
static const struct gonote note = {4, 8, 4, "Go", "buildid"};
int main(void) { return 0; }
"""


def test_run_warns_about_go_programs(fabric, tmp_path):
    """A Go program makes its socket system calls itself, even when it is dynamically linked
    (cgo), so LD_PRELOAD never sees its connections; memlan run said nothing about one (seen with
    a cgo program: no warning, no log line, every connection on TCP).  Go programs carry a build
    id note (owner "Go", type 4): a dynamically linked C program given that note stands in for one
    here (building a real one takes the Go toolchain and most of a minute).  Being dynamically
    linked, it is said as cgo's: the connections its C code makes through libc are accelerated
    (it was said that none would be, an explorer), and its Go code must not use them."""
    src = tmp_path / "g.c"
    src.write_text(GO_NOTE)
    fake = tmp_path / "gofake"
    subprocess.run(["cc", "-o", str(fake), str(src)], check=True)
    p = cli("run", "--", fake)
    assert p.returncode == 0 and "is a Go program" in p.stderr and str(fake) in p.stderr, p.stderr
    assert "not be accelerated" in p.stderr and "statically linked" not in p.stderr
    assert "linked with libc (cgo)" in p.stderr, p.stderr
    assert "so its Go code's connections will not be accelerated" in p.stderr, p.stderr
    assert cli("run", "--quiet", "--", fake).stderr == ""
    # And in the log file, --quiet or not: the Go program's is the one process of a run whose
    # connections stay on TCP with no line there (before, said on stderr only).
    log = tmp_path / "m.log"
    for quiet in ([], ["--quiet"]):
        p = cli("run", *quiet, "--log", str(log), "--", fake)
        assert p.returncode == 0 and p.stderr.count("is a Go program") == (0 if quiet else 1)
    lines = log.read_text().splitlines()
    assert len(lines) == 2 and all("is a Go program" in l and str(fake) in l and
                                   "not be accelerated" in l for l in lines), lines


def test_exec_of_a_go_program_under_memlan_is_said(fabric, tmp_path):
    """A Go program started by a shell script or a launcher under memlan run (`memlan run -- sh -c
    ./server`), where memlan run's own warning cannot see it: the exec is said once, on stderr
    and in the log, and so is a statically linked one; a dynamic C program's is not.  Before,
    nothing was said anywhere: a Go server run so kept every client on TCP, and the clients'
    log read only "no memlan listener on this port in the fabric"."""
    src = tmp_path / "g.c"
    src.write_text(GO_NOTE)
    fake = tmp_path / "gofake"
    subprocess.run(["cc", "-o", str(fake), str(src)], check=True)
    log = tmp_path / "m.log"
    p = cli("run", "--log", str(log), "--", "sh", "-c", f"{fake}; {fake}; true")
    said = f"exec of {fake}, a Go program"
    assert p.returncode == 0 and p.stderr.count(said) == 1, p.stderr
    assert "its connections on TCP" in p.stderr and log.read_text().count(said) == 1
    assert "its Go code runs without memlan" in p.stderr, p.stderr  # (cgo: see above)
    # by name, as execvp finds it in PATH (Python's subprocess here)
    env = dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}")
    p = subprocess.run([str(MEMLAN), "run", "--", PY, "-c",
                        "import subprocess; subprocess.run(['gofake'], check=True)"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 0 and said in p.stderr, p.stderr
    assert cli("run", "--quiet", "--", "sh", "-c", f"{fake}; true").stderr == ""
    assert "exec of" not in cli("run", "--", "sh", "-c", "ls / >/dev/null; true").stderr
    static = tmp_path / "static"
    src.write_text("int main(void) { return 0; }\n")
    if subprocess.run(["cc", "-static", "-o", str(static), str(src)]).returncode == 0:
        p = cli("run", "--", "sh", "-c", f"{static}; true")
        assert f"exec of {static}, statically linked" in p.stderr, p.stderr


def test_stat_json_escapes_names(tmp_path):
    odd = tempfile.mkdtemp(prefix='memlan-py-q"\\\x01\t\u00e9-', dir="/dev/shm")
    try:
        # MEMLAN_FABRIC too, so that a stat that ignored --fabric would read the same directory
        p = cli("stat", "--json", "--fabric", odd, env={"MEMLAN_FABRIC": odd})
        assert json.loads(p.stdout)["fabric"] == odd
    finally:
        shutil.rmtree(odd, ignore_errors=True)


NAMED = r"""
import ctypes, socket, sys
ctypes.CDLL(None).prctl(15, b'q"\x01z', 0, 0, 0)  # PR_SET_NAME: a quote and a control char
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen(4)
c = socket.create_connection(l.getsockname()); a, _ = l.accept()
c.sendall(b"x" * 1000); assert len(a.recv(4096)) > 0
print("ready", flush=True)
sys.stdin.readline()
"""


def test_stat_json_is_structured(fabric):
    p = subprocess.Popen([str(MEMLAN), "run", "--", PY, "-c", NAMED], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        out = cli("stat", "--json").stdout
        st = json.loads(out)
        procs = [o for o in st["objects"] if o["kind"] == "process" and o["pid"] == p.pid]
        assert len(procs) == 1, st
        pr = procs[0]
        assert pr["command"] == 'q"\x01z'
        assert isinstance(pr["accelerated"], int) and isinstance(pr["on_tcp"], int)
        assert pr["accelerated"] + pr["on_tcp"] >= 1
        assert isinstance(pr["layout_version"], int) and pr["live"] is True
        conns = [c for c in st["connections"] if c["pid"] == p.pid]
        assert conns, st
        for c in conns:
            assert c["state"] in ("accelerated", "tcp", "waiting")
            if c["state"] == "accelerated":
                assert isinstance(c["bytes_out"], int) and isinstance(c["wakeups"], int)
            else:
                assert isinstance(c["reason"], str)
        assert sum(c.get("bytes_out", 0) + c.get("bytes_in", 0) for c in conns) in (0, 2000)
        for o in st["objects"]:
            if o["kind"] == "channel":
                assert isinstance(o["ring_bytes"], int) and len(o["side_pids"]) == 2
        # the text form says the same, without the control character
        text = cli("stat").stdout
        assert f"conn pid {p.pid}" in text and 'q"?z:' in text and "\x01" not in text
    finally:
        p.stdin.write("\n")
        p.stdin.close()
        p.wait(timeout=20)
    memlan("clean")


ASYM = r"""
import socket, sys
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen(4)
c = socket.create_connection(l.getsockname()); a, _ = l.accept()
c.sendall(b"x" * 1000); assert len(a.recv(4096)) == 1000
a.sendall(b"y" * 10); assert len(c.recv(4096)) == 10
print(l.getsockname()[1], flush=True)
sys.stdin.readline()
"""


def test_stat_bytes_are_each_ends_own(fabric):
    """The client sends 1000 bytes and its peer, accepted in the same process, 10: memlan stat
    says out 1000, in 10 for the client's end and out 10, in 1000 for the accepted end.  Before,
    an accepted end showed its peer's counters (ring 0 as its out whichever end it was): a
    server's replies were counted as its requests, in the text and in --json."""
    p = subprocess.Popen([str(MEMLAN), "run", "--", PY, "-c", ASYM], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        port = int(p.stdout.readline())
        st = json.loads(cli("stat", "--json").stdout)
        conns = {c["local"].endswith(":%d" % port): c for c in st["connections"]
                 if c["pid"] == p.pid and c["state"] == "accelerated"}
        assert len(conns) == 2, st["connections"]
        assert (conns[False]["bytes_out"], conns[False]["bytes_in"]) == (1000, 10), conns
        assert (conns[True]["bytes_out"], conns[True]["bytes_in"]) == (10, 1000), conns
        text = cli("stat").stdout
        assert "127.0.0.1:%d -> " % port in text and "bytes out/in 10/1000" in text, text
        assert "bytes out/in 1000/10" in text, text
    finally:
        p.stdin.write("\n")
        p.stdin.close()
        p.wait(timeout=20)
    memlan("clean")


ENDPOINT = """
import sys, memlan
fab = memlan.Fabric()
l = fab.listen(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()
"""


def test_stat_lists_named_endpoints(fabric):
    """A server on a named endpoint (memlan_listen) was invisible to memlan stat, which listed
    only segments: a user could not see which names are served, or left by a dead server."""
    name = 'orders"\\x'
    root = LIB.parent.parent.parent
    env = dict(os.environ, MEMLAN_LIB=str(LIB), PYTHONPATH=str(root / "python"))
    srv = subprocess.Popen([PY, "-c", ENDPOINT, name], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert srv.stdout.readline().strip() == "ready"
        st = json.loads(cli("stat", "--json").stdout)
        eps = [o for o in st["objects"] if o["kind"] == "endpoint"]
        assert eps == [{"kind": "endpoint", "name": name, "pid": None, "live": True}], st
        text = cli("stat", "--kind", "endpoint").stdout
        assert "endpoint" in text and name in text and "yes" in text, text
        assert "endpoint" not in cli("stat", "--pid", str(srv.pid)).stdout
        assert "endpoint" not in cli("stat", "--kind", "channel").stdout
    finally:
        srv.kill()
        srv.wait(timeout=10)
    st = json.loads(cli("stat", "--json", "--kind", "endpoint").stdout)
    assert [o["live"] for o in st["objects"]] == [False], st
    assert "DEAD" in cli("stat").stdout
    cli("clean")
    assert json.loads(cli("stat", "--json").stdout)["objects"] == []


def test_stat_filters_and_tokens(fabric, holder):
    proc, seg, ch = holder()
    for args in (["stat"], ["stat", "--json"]):
        out = cli(*args).stdout
        assert seg not in out and ch not in out, out
    st = json.loads(cli("stat", "--json").stdout)
    assert len(st["objects"]) == 2 and all("token" not in o for o in st["objects"])
    out = cli("stat", "--tokens").stdout
    assert seg in out and ch in out
    st = json.loads(cli("stat", "--json", "--tokens", "--kind", "channel").stdout)
    assert [(o["kind"], o["token"]) for o in st["objects"]] == [("channel", ch)]
    st = json.loads(cli("stat", "--json", "--tokens", "--kind", "segment").stdout)
    assert [(o["kind"], o["token"]) for o in st["objects"]] == [("segment", seg)]
    st = json.loads(cli("stat", "--json", "--pid", proc.pid).stdout)
    assert len(st["objects"]) == 2 and {o["pid"] for o in st["objects"]} == {proc.pid}
    st = json.loads(cli("stat", "--json", "--pid", proc.pid + 1).stdout)
    assert st["objects"] == []
    assert "(empty)" in cli("stat", "--kind", "evq").stdout


def test_stat_interval(fabric, holder):
    holder()
    p = cli("stat", "--json", "-i", "0.05", "-c", "3")
    assert p.returncode == 0, p.stderr
    docs = [json.loads(l) for l in p.stdout.splitlines()]
    assert len(docs) == 3 and all(len(d["objects"]) == 2 for d in docs)
    assert docs[0]["time"] < docs[1]["time"] < docs[2]["time"]
    assert cli("stat", "--interval", "0.05", "--count", "2").stdout.count("fabric ") == 2


CONNECT = ("import socket; l = socket.socket(); l.bind(('127.0.0.1', 0)); l.listen(4); "
           "c = socket.create_connection(l.getsockname()); a, _ = l.accept(); "
           "c.sendall(b'hi'); print(a.recv(2).decode())")


def test_preload_says_bad_settings_once(fabric):
    # sh, then two interpreters it runs: three images, one message for each bad setting
    cmd = ["run", "--", "sh", "-c", f"{PY} -c 'print(1)'; {PY} -c \"{CONNECT}\""]
    good = cli(*cmd)
    assert good.returncode == 0 and good.stdout == "1\nhi\n" and good.stderr == "", good.stderr
    bad = cli(*cmd, env={"MEMLAN_RING_KB": "-5", "MEMLAN_PORTS": "foo", "MEMLAN_SPIN_US": "abc"})
    assert bad.returncode == 0 and bad.stdout == good.stdout
    err = bad.stderr
    for var, val, default in (("MEMLAN_RING_KB", "-5", "256"), ("MEMLAN_PORTS", "foo", "no port"),
                              ("MEMLAN_SPIN_US", "abc", "adaptive")):
        lines = [l for l in err.splitlines() if var in l]
        assert len(lines) == 1, err
        assert f"'{val}'" in lines[0] and default in lines[0], lines[0]
    quiet = cli(*cmd, env={"MEMLAN_RING_KB": "-5", "MEMLAN_QUIET": "1"})
    assert quiet.stdout == good.stdout and quiet.stderr == ""
    # an unopenable log file, set without memlan run (which would refuse it)
    p = subprocess.run([PY, "-c", "print(7)"], capture_output=True, text=True, timeout=30,
                       env=dict(os.environ, LD_PRELOAD=str(PRELOAD),
                                MEMLAN_LOG="/nonexistent-dir/m.log"))
    assert p.stdout == "7\n" and "MEMLAN_LOG" in p.stderr and "/nonexistent-dir/m.log" in p.stderr


def test_native_library_says_a_bad_spin_setting_once(fabric):
    """Without the preload, libmemlan itself says a bad MEMLAN_SPIN_US once (the pingpong example
    forks an echo process after opening its fabric: still one line), uses the adaptive policy,
    and keeps quiet with MEMLAN_QUIET=1 or under memlan run, whose preload has said it."""
    pingpong = str(LIB.parent.parent / "examples" / "pingpong")
    run = lambda cmd, **env: subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                                            env=dict(os.environ, **env))
    for val in ("abc", "-1", "1000001", "5x"):
        p = run([pingpong, "100"], MEMLAN_SPIN_US=val)
        assert p.returncode == 0 and "100 round trips" in p.stdout, p.stderr
        lines = [l for l in p.stderr.splitlines() if "MEMLAN_SPIN_US" in l]
        assert len(lines) == 1, p.stderr
        assert f"bad MEMLAN_SPIN_US='{val}'" in lines[0] and "default, adaptive" in lines[0]
    for cmd, env in (([pingpong, "100"], {"MEMLAN_SPIN_US": "0"}),
                     ([pingpong, "100"], {"MEMLAN_SPIN_US": "abc", "MEMLAN_QUIET": "1"})):
        p = run(cmd, **env)
        assert p.returncode == 0 and p.stderr == "", p.stderr
    p = run([str(MEMLAN), "run", "--", pingpong, "100"], MEMLAN_SPIN_US="abc")
    assert p.returncode == 0 and p.stderr.count("MEMLAN_SPIN_US") == 1, p.stderr


def test_on_off_settings_other_than_0_or_1_are_said(fabric, tmp_path):
    """MEMLAN_FABRIC_CREATE=yes used to leave a missing fabric uncreated without a word (only 1
    creates), and MEMLAN_FABRIC_GROUPWIDE=yes, MEMLAN_OFF=false, MEMLAN_QUIET=yes passed unsaid.
    Each is said once, with what it is taken for; 0 and 1 are said nothing."""
    cmd = ["run", "--", "sh", "-c", f"{PY} -c 'print(1)'; {PY} -c \"{CONNECT}\""]
    for var, val, taken in (("MEMLAN_FABRIC_CREATE", "yes", "not created"),
                            ("MEMLAN_FABRIC_GROUPWIDE", "yes", "default, 0"),
                            ("MEMLAN_OFF", "false", "nothing is accelerated"),
                            ("MEMLAN_QUIET", "yes", "quiet from now on")):
        p = cli(*cmd, env={var: val})
        assert p.returncode == 0 and p.stdout == "1\nhi\n", p.stderr
        lines = [l for l in p.stderr.splitlines() if var in l]
        assert len(lines) == 1 and f"'{val}'" in lines[0] and taken in lines[0], p.stderr
        for good in ("0", "1"):
            q = cli(*cmd, env={var: good})
            assert q.stdout == "1\nhi\n" and var not in q.stderr, q.stderr
    # Without the preload, libmemlan says a bad MEMLAN_FABRIC_CREATE itself, once, and the
    # missing directory is not created.
    missing = tmp_path / "missing"
    pingpong = str(LIB.parent.parent / "examples" / "pingpong")
    p = subprocess.run([pingpong, "10"], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, MEMLAN_FABRIC=str(missing), MEMLAN_FABRIC_CREATE="yes"))
    assert p.returncode != 0 and not missing.exists()
    assert p.stderr.count("bad MEMLAN_FABRIC_CREATE='yes'") == 1, p.stderr


def test_pingpong_halves_meet_by_name_alone(fabric):
    """The C examples connect by name, but each forked its peer, so none showed two unrelated
    programs meeting: `pingpong serve NAME` and `pingpong echo NAME`, started separately (siblings,
    sharing nothing but the fabric and the name), do."""
    pingpong = str(LIB.parent.parent / "examples" / "pingpong")
    srv = subprocess.Popen([pingpong, "serve", "pp-by-name", "500"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        assert "serving pp-by-name" in srv.stdout.readline()
        echo = subprocess.run([pingpong, "echo", "pp-by-name"], capture_output=True, text=True,
                              timeout=60)
        assert echo.returncode == 0, echo.stderr
        out, err = srv.communicate(timeout=60)
    finally:
        srv.kill()
    assert srv.returncode == 0 and "500 round trips of 64 B" in out, err
    bad = subprocess.run([pingpong, "serve"], capture_output=True, text=True, timeout=10)
    assert bad.returncode == 2 and "usage" in bad.stderr


FD2_REUSED = ("import os, sys; os.close(2); f = open(sys.argv[1], 'w'); assert f.fileno() == 2; "
              + CONNECT)


def test_preload_says_when_it_cannot_accelerate(tmp_path):
    env = {"MEMLAN_FABRIC": str(tmp_path / "missing" / "fabric")}
    p = cli("run", "--", PY, "-c", CONNECT, env=env)
    assert p.returncode == 0 and p.stdout == "hi\n"
    lines = [l for l in p.stderr.splitlines() if "cannot accelerate" in l]
    assert len(lines) == 1 and env["MEMLAN_FABRIC"] in lines[0] and "TCP" in lines[0], p.stderr
    q = cli("run", "--quiet", "--", PY, "-c", CONNECT, env=env)
    assert q.stdout == "hi\n" and q.stderr == ""
    # A fabric we may not write into.
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    if os.geteuid() != 0:
        p = cli("run", "--", PY, "-c", CONNECT, env={"MEMLAN_FABRIC": str(ro)})
        assert p.stdout == "hi\n" and "not writable" in p.stderr, p.stderr
    # A host that closed its stderr and was given fd 2 for a file of its own: never written.
    own = tmp_path / "own"
    p = cli("run", "--", PY, "-c", FD2_REUSED, own, env=env)
    assert p.returncode == 0 and p.stdout == "hi\n"
    assert own.read_text() == ""


FULL = ("import socket; l = socket.socket(); l.bind(('127.0.0.1', 0)); l.listen(8); "
        "cs = [socket.create_connection(l.getsockname()) for _ in range(3)]; "
        "acc = [l.accept()[0] for _ in range(3)]; "
        "[c.sendall(b'hi') for c in cs]; print(''.join(a.recv(2).decode() for a in acc))")


def test_full_fabric_is_said_once(tmp_path):
    """A fabric with no room for a channel (a 64 KiB tmpfs; a container's /dev/shm fills the same
    way) left every new connection on TCP with the reason only in the log.  It is said once on
    stderr by a program whose three connections all find it full (once per program, like the
    note on an unusable fabric: siblings cannot tell each other), and the data still flows."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root to mount a small tmpfs in a private mount namespace")
    d = tmp_path / "full"
    d.mkdir()
    script = (f"mount -t tmpfs -o size=64k none {d} || exit 77; "
              f"{MEMLAN} run --fabric {d} -- {PY} -c \"{FULL}\"; rc=$?; umount {d}; exit $rc")
    p = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                       capture_output=True, text=True, timeout=60)
    if p.returncode == 77:
        pytest.skip("mount refused: " + p.stderr)
    assert p.returncode == 0 and p.stdout == "hihihi\n", p.stdout + p.stderr
    lines = [l for l in p.stderr.splitlines() if "is full" in l]
    assert len(lines) == 1 and str(d) in lines[0] and "stay on TCP" in lines[0], p.stderr
    q = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                        script.replace(" run --fabric", " run --quiet --fabric")],
                       capture_output=True, text=True, timeout=60)
    assert q.stdout == "hihihi\n" and "is full" not in q.stderr, q.stderr


NO_GROW = ("import socket, sys; l = socket.socket(); l.bind(('127.0.0.1', 0)); l.listen(1); "
           "c = socket.create_connection(l.getsockname()); a = l.accept()[0]; "
           "c.sendall(b'h'); a.recv(1); c.setblocking(False); n = 0\n"
           "while n < 3 << 20:\n"
           "    try: n += c.send(bytes([n % 251]) * 4096)\n"
           "    except BlockingIOError: break\n"
           "import os; v = os.statvfs(os.environ['MEMLAN_FABRIC'])\n"
           "print((v.f_blocks - v.f_bfree) * v.f_frsize // 1024)\n"
           "got = bytearray()\n"
           "while len(got) < n: got += a.recv(1 << 20)\n"
           "print(n, all(got[i] == (i // 4096 * 4096) % 251 for i in range(0, n, 4096)))")


def test_a_ring_that_cannot_grow_on_a_full_fabric_stays_as_it_was(tmp_path):
    """A 1.5 MiB fabric holds a connection's rings (516 KiB) but not the 4 MiB region a full
    ring grows into (docs/design.md, "Rings grow"): the region's pages are asked for before the
    first store and refused, so the sender is told EAGAIN at the ring's 256 KiB, as before
    growth, and no store meets a page the fabric cannot give (which would be a SIGBUS); every
    byte arrives; what the refused reservation took is given back at once."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root to mount a small tmpfs in a private mount namespace")
    d = tmp_path / "small"
    d.mkdir()
    script = (f"mount -t tmpfs -o size=1536k none {d} || exit 77; "
              f"{MEMLAN} run --fabric {d} --log {tmp_path}/g.log -- {PY} -c \"$0\"; rc=$?; "
              f"df -k {d} | tail -1; umount {d}; exit $rc")
    p = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script,
                        NO_GROW], capture_output=True, text=True, timeout=60)
    if p.returncode == 77:
        pytest.skip("mount refused: " + p.stderr)
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout.splitlines()
    # KiB used after the refused growth: the rings and the records, not what the refused
    # reservation had taken before it failed (the fabric stayed full for every other channel)
    assert int(out[0]) < 1024, out
    assert out[1] == "262144 True", p.stdout + p.stderr
    assert int(out[2].split()[2]) < 64, out  # KiB used once the program is gone
    assert "accelerated (client)" in (tmp_path / "g.log").read_text()


def test_default_fabric_of_another_owner_is_said(tmp_path):
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root to be another user")
    d = "/dev/shm/memlan-65534"
    if os.path.exists(d):
        pytest.skip(d + " exists")
    nobody = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
    if subprocess.run(nobody + [PY, "-c", "pass"], cwd="/", capture_output=True).returncode:
        pytest.skip("user 65534 cannot run " + PY)
    os.mkdir(d, 0o700)  # root's, where user 65534's default fabric should be
    try:
        env = {k: v for k, v in os.environ.items() if k != "MEMLAN_FABRIC"}
        env["LD_PRELOAD"] = str(PRELOAD)
        p = subprocess.run(nobody + [PY, "-c", CONNECT], capture_output=True, text=True, env=env,
                           timeout=30, cwd="/")
        assert p.stdout == "hi\n", p.stderr
        assert "cannot accelerate" in p.stderr and d in p.stderr and "another user" in p.stderr
    finally:
        os.rmdir(d)


def test_memlan_strerror():
    lib = ctypes.CDLL(str(LIB))
    lib.memlan_strerror.restype = ctypes.c_char_p
    lib.memlan_strerror.argtypes = [ctypes.c_int]
    s = lambda e: lib.memlan_strerror(e).decode()
    assert s(-errno.EPROTO) == s(errno.EPROTO)
    assert "peer broke the channel protocol" in s(-errno.EPROTO)
    assert "revoked" in s(-errno.ECONNABORTED)
    assert "layout version" in s(-errno.EPROTONOSUPPORT)
    assert "already" in s(-errno.EBUSY) and "fabric" in s(-errno.EACCES)
    assert "full" in s(-errno.ENOSPC) and "stale" in s(-errno.ESTALE).lower()
    # Named endpoints: -ECONNREFUSED fits both a closed creator and a name nobody serves.
    assert "no server listens on the name" in s(-errno.ECONNREFUSED)
    assert "creator closed it" in s(-errno.ECONNREFUSED)
    assert "live server" in s(-errno.EADDRINUSE)
    assert "MEMLAN_NAME_MAX" in s(-errno.ENAMETOOLONG)
    assert "kind" in s(-errno.EPROTOTYPE) and "name" in s(-errno.EINVAL)
    assert "did not accept" in s(-errno.ETIMEDOUT)
    for e in (errno.ENOTTY, errno.EIO, 4242):
        assert s(-e) == os.strerror(e)


def test_bench_checks_its_plot_path_first(fabric, tmp_path):
    p = cli("bench", "--quick", "--plot", tmp_path / "no" / "x.svg", timeout=20)
    assert p.returncode == 2 and str(tmp_path / "no" / "x.svg") in p.stderr
    assert not (tmp_path / "x.svg").exists()


def test_preload_note_never_raises_sigpipe_in_the_host():
    """A stderr pipe whose reader has gone: the note is dropped, the host neither dies of SIGPIPE
    (the preload speaks in its constructor, before a host could ignore the signal) nor blocks."""
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run(["/bin/sh", "-c", "echo 1"], stdout=subprocess.PIPE, stderr=w,
                           text=True, timeout=30,
                           env=dict(os.environ, LD_PRELOAD=str(PRELOAD), MEMLAN_RING_KB="-5"))
    finally:
        os.close(w)
    assert p.returncode == 0 and p.stdout == "1\n", p.returncode


def test_rpcgen_help_version_and_bad_options(tmp_path):
    """memlan-rpcgen --help printed the usage on stderr and exited 1, --version was an unknown
    option, and an unknown option or a missing value got the usage without a word of what was
    wrong."""
    rpcgen = MEMLAN.parent / "memlan-rpcgen"
    run = lambda *a: subprocess.run([str(rpcgen), *a], capture_output=True, text=True,
                                    timeout=30, cwd=tmp_path)
    p = run("--help")
    assert p.returncode == 0 and p.stdout.startswith("usage: memlan-rpcgen") and p.stderr == ""
    p = run("--version")
    assert p.returncode == 0 and re.fullmatch(r"memlan-rpcgen \d+\.\d+\.\d+\n", p.stdout)
    assert p.stdout.split()[1] == memlan("version").stdout.split()[1]
    for args, said in ((["--bogus", "x.x"], "unknown option '--bogus'"),
                       (["-z", "x.x"], "unknown option '-z'"),
                       (["x.x", "-o"], "option -o needs a value"),
                       (["-K", "soon", "x.x"], "bad value 'soon' for -K"),
                       (["a.x", "b.x"], "one input file only"),
                       ([], "no input file")):
        p = run(*args)
        assert p.returncode == 1 and p.stdout == "", (args, p.stdout)
        first = p.stderr.splitlines()[0]
        assert first == "memlan-rpcgen: " + said or first.startswith("memlan-rpcgen: " + said), (
            args, p.stderr)
        assert "usage: memlan-rpcgen" in p.stderr
