"""ONC RPC: memlan-rpcgen against the system rpcgen, the fast path against libtirpc over TCP,
interoperation with stock stubs both ways, libtirpc programs under `memlan run`, and the XDR
decoders under fuzzing.  The programs are tests/rpc/*.c; each scripted client session prints
every outcome (data, errors, timeouts, credentials) so runs can be compared line for line."""
import glob
import os
import pathlib
import re
import shutil
import subprocess
import time

import pytest

from conftest import BUILD, MEMLAN, ROOT

RPCGEN = BUILD / "bin" / "memlan-rpcgen"
SRC = ROOT / "tests" / "rpc"
CFLAGS = ["-std=gnu11", "-Wall", "-Wextra", "-Werror", "-O1", f"-I{ROOT / 'include'}",
          "-I/usr/include/tirpc"]
LIBS = [f"-L{BUILD / 'lib'}", f"-Wl,-rpath,{BUILD / 'lib'}", "-lmemlan", "-ltirpc"]


def sh(cmd, cwd, **kw):
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120, **kw)
    assert p.returncode == 0, f"{' '.join(map(str, cmd))} exited {p.returncode}:\n{p.stdout}\n{p.stderr}"
    return p


def build(tmp, kind):
    """Build echo.x's server and client in tmp/kind with memlan-rpcgen or the system rpcgen."""
    d = tmp / kind
    d.mkdir()
    for f in ("echo.x", "echo_impl.c", "echo_client.c", "xdrdiff.c"):
        shutil.copy(SRC / f, d / f)
    gen = [str(RPCGEN)] if kind == "memlan" else ["rpcgen"]
    for opt, out in (("-h", "echo.h"), ("-c", "echo_xdr.c"), ("-l", "echo_clnt.c"),
                     ("-m", "echo_svc.c")):
        sh(gen + [opt, "-o", out, "echo.x"], d)
    # the system rpcgen's own output does not pass -Wextra -Werror; ours must
    flags = CFLAGS if kind == "memlan" else ["-O1", "-I/usr/include/tirpc"]
    libs = LIBS if kind == "memlan" else ["-ltirpc"]
    sh(["cc", *flags, "-o", "srv", "echo_impl.c", "echo_svc.c", "echo_xdr.c", *libs], d)
    sh(["cc", *flags, "-o", "cli", "echo_client.c", "echo_clnt.c", "echo_xdr.c", *libs], d)
    return d


def free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Server:
    def __init__(self, cmd, env=None):
        self.port = free_port()
        self.p = subprocess.Popen([*cmd, str(self.port)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env)
        line = self.p.stdout.readline()
        assert line.strip() == "ready", line + self.p.stderr.read()

    def stop(self):
        self.p.terminate()
        self.p.wait(timeout=10)
        return self.p.stderr.read()


def session(cmd, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, f"{cmd} exited {p.returncode}:\n{p.stdout}\n{p.stderr}"
    return p.stdout, p.stderr


EXPECTED = [
    "null: ok", "echo 500000: same bytes", "mix: status 7",
    'mix: status 1 error "no triangles (a name)"', "whoami auth none: ok 4294967295",
    "fail: RPC: Remote system error", "unknown procedure: RPC: Procedure unavailable",
    "garbage arguments: RPC: Server can't decode arguments",
    "slow 1000 ms with a 300 ms timeout: RPC: Timed out", "slow 10 ms after it: ok 10",
    "2000 echoes: 0 wrong",
]


def check_session(out):
    for line in EXPECTED:
        assert line in out.splitlines(), f"missing {line!r} in:\n{out}"
    assert "DIFFERENT" not in out and out.count("same bytes") == 11, out


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rpc")
    return {"memlan": build(tmp, "memlan"), "stock": build(tmp, "stock")}


def test_fast_path_matches_libtirpc_over_tcp(fabric, builds):
    m = builds["memlan"]
    srv = Server([str(m / "srv")])
    try:
        fast, err = session([str(m / "cli"), "fast", str(srv.port)])
        tcp, _ = session([str(m / "cli"), "tcp", str(srv.port)])
    finally:
        srv.stop()
    check_session(fast)
    assert fast == tcp, f"fast path:\n{fast}\nlibtirpc over TCP:\n{tcp}"
    # the fast path's socket went with its server
    assert not list(fabric.glob("rpc-*.sock"))


@pytest.mark.parametrize("ring_kb", [16, 64])
def test_calls_larger_than_the_ring_are_spilled(fabric, builds, ring_kb):
    """Echoes up to 1 MiB through a 16 or 64 KiB ring: calls and replies that do not fit one
    message go through spill segments, and the session still matches libtirpc over TCP."""
    m = builds["memlan"]
    env = dict(os.environ, MEMLAN_RPC_RING_KB=str(ring_kb))
    srv = Server([str(m / "srv")], env=env)
    try:
        fast, _ = session([str(m / "cli"), "fast", str(srv.port)], env=env)
        tcp, _ = session([str(m / "cli"), "tcp", str(srv.port)], env=env)
        during = sorted(p.name for p in fabric.iterdir())
    finally:
        srv.stop()
    check_session(fast)
    assert fast == tcp, f"fast path:\n{fast}\nlibtirpc over TCP:\n{tcp}"
    # the client's spill segment went with it; the server's went with its connection
    time.sleep(0.05)
    left = sorted(p.name for p in fabric.iterdir())
    assert not left, f"left in the fabric: {left} (while the server ran: {during})"


def test_fast_path_reason_when_no_memlan_server(fabric, builds):
    srv = Server([str(builds["stock"] / "srv")])
    try:
        p = subprocess.run([str(builds["memlan"] / "cli"), "fast", str(srv.port)],
                           capture_output=True, text=True, timeout=60)
    finally:
        srv.stop()
    assert p.returncode == 3 and "no memlan server for it on this fabric" in p.stderr, p.stderr


def test_interop_with_stock_stubs_both_ways(fabric, builds):
    m, s = builds["memlan"], builds["stock"]
    outs = {}
    for name, server, client in (("stock-stock", s, s), ("memlan-client", s, m),
                                 ("memlan-server", m, s)):
        srv = Server([str(server / "srv")])
        try:
            outs[name], _ = session([str(client / "cli"), "tcp", str(srv.port)])
        finally:
            srv.stop()
    check_session(outs["stock-stock"])
    assert outs["memlan-client"] == outs["stock-stock"]
    assert outs["memlan-server"] == outs["stock-stock"]


def test_libtirpc_programs_under_memlan_run(fabric, builds, tmp_path):
    """vRPC: stock rpcgen + libtirpc, unchanged, over TCP accelerated by memlan run."""
    s = builds["stock"]
    log = tmp_path / "log"
    run = [str(MEMLAN), "run", "--log", str(log), "--"]
    srv = Server(run + [str(s / "srv")])
    try:
        out, _ = session(run + [str(s / "cli"), "tcp", str(srv.port)])
    finally:
        srv.stop()
    time.sleep(0.05)
    subprocess.run([str(MEMLAN), "clean"], capture_output=True, timeout=30)  # the dead's records
    check_session(out)
    text = log.read_text()
    assert "accelerated (client)" in text and "accelerated (accepted" in text, text


def test_xdr_encodings_identical_to_rpcgen(builds):
    outs = []
    for kind in ("memlan", "stock"):
        d = builds[kind]
        flags = CFLAGS if kind == "memlan" else ["-O1", "-I/usr/include/tirpc"]
        sh(["cc", *flags, "-o", "xd", "xdrdiff.c", "echo_xdr.c", "-ltirpc"], d)
        outs.append(sh([str(d / "xd"), "encode", "12345", "2000"], d).stdout)
    assert outs[0].count("\n") == 8000 and "failed" not in outs[0]
    assert outs[0] == outs[1]


def test_xdr_decoders_fuzzed_under_asan(builds, tmp_path):
    d = builds["memlan"]
    sh(["cc", *CFLAGS, "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
        "-o", str(tmp_path / "xd-asan"), "xdrdiff.c", "echo_xdr.c", "-ltirpc"], d)
    out = sh([str(tmp_path / "xd-asan"), "fuzz", "99", "3000"], d).stdout
    assert "no crash" in out, out


RPCSVC = sorted(glob.glob("/usr/include/rpcsvc/*.x"))


@pytest.mark.parametrize("x", RPCSVC, ids=[os.path.basename(x) for x in RPCSVC])
def test_rpcsvc_files_compile_without_warnings(x, tmp_path):
    for f in glob.glob("/usr/include/rpcsvc/*.x"):
        shutil.copy(f, tmp_path)
    name = os.path.basename(x)[:-2]
    sh([str(RPCGEN), os.path.basename(x)], tmp_path)
    files = [f"{name}_xdr.c", f"{name}_clnt.c", f"{name}_svc.c"]
    if name == "nis_callback":
        # its RPC_XDR section includes Solaris' "nis_clnt.h", which Linux does not have (the
        # system rpcgen's output fails the same way): check the header and client stubs only
        (tmp_path / "nis_clnt.h").write_text("")
        files = [f"{name}.h"]
    for f in files:
        # -Wno-unknown-pragmas: some files pass "#pragma ident" through in % lines (their text)
        sh(["cc", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-Wno-unknown-pragmas",
            "-DMEMLAN_RPC_PLAIN", "-I.", "-I/usr/include/tirpc", "-c", "-o", "/dev/null",
            *(["-x", "c"] if f.endswith(".h") else []), f], tmp_path)


BAD = [
    ("struct a { int x }", "1:18: error: expected ';' after the member"),
    ("const X = ;", "1:11: error: expected the constant's value"),
    ("typedef string s[4];", "1:16: error: a string takes <max>, not [size]"),
    ("struct a { int x; };\nstruct a { int y; };", "2:8: error: \"a\" is defined twice"),
    ("/* open", "1:1: error: unterminated comment"),
    ("program P { version V { int F(int, int) = 1; } = 1; } = 9;",
     "1:36: error: procedure F takes 2 arguments"),
    ("#ifdef X\nconst A = 1;\n", "missing #endif"),
    ("enum e { A = 1, B = }", "1:21: error: expected the value"),
    ("union u switch (int d) { default: void; };", "error: a union needs at least one case"),
    ("struct s { opaque o; };", "1:19: error: opaque \"o\" needs a length"),
    ("const C = 1 @", "1:13: error: unexpected character '@'"),
]


@pytest.mark.parametrize("text,msg", BAD, ids=[str(i) for i in range(len(BAD))])
def test_rpcgen_errors_name_file_line_column(text, msg, tmp_path):
    (tmp_path / "bad.x").write_text(text)
    p = subprocess.run([str(RPCGEN), "-h", "bad.x"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 1, p
    assert p.stderr.startswith("bad.x:") and msg in p.stderr, p.stderr
