# SPDX-License-Identifier: Apache-2.0 OR MIT
"""The papers' systems under `memlan run` (issue 22), data checked, no timing: nfs-ganesha with
its VFS FSAL and a libnfs client, omniORB, Open MPI's tcp BTL and MPICH over UCX's TCP.

Each runs over kernel TCP and with every process under `memlan run`; memlan's logs must show
the connections accelerated.  The programs are Debian's (scripts/install-seeds.sh, which
`make test` runs, installs them; a test installs what is missing itself and skips, saying why,
only when that install fails).  ganesha and its rpcbind (port 111) run inside a network and
mount namespace of the test's own, loopback only.  Sources and helpers: tests/seeds/.
"""
import hashlib
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "tests" / "seeds"))
import seeds  # noqa: E402

MODES = ["kernel", "memlan"]


def need(system):
    why = seeds.ensure(system)
    if why:
        pytest.skip(why)
    return seeds.build(system)


def accelerated(log):
    t = log.read_text() if log.exists() else ""
    return t.count("accelerated (client)") + t.count("accelerated (accepted")


def run(argv, timeout=120, **kw):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    out = p.stdout + p.stderr
    assert p.returncode == 0, f"{argv} exited {p.returncode}\n{out[-3000:]}"
    assert "MISMATCH" not in out and "FAIL" not in out, out[-3000:]
    return p.stdout


def settle():
    subprocess.run([str(seeds.MEMLAN), "clean"], capture_output=True, timeout=30)


# ---- NFS: nfs-ganesha (VFS FSAL) and libnfs ------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_nfs_ganesha(fabric, tmp_path, mode):
    exe = need("nfs")
    on = mode == "memlan"
    slog, clog = tmp_path / "server.log", tmp_path / "client.log"
    srv = seeds.NfsServer(tmp_path / "nfs", memlan=on, log=slog)
    try:
        # nfsbench with no time: each test once through, every reply checked (NULL with a 1 KB
        # payload one at a time and 16 in flight, a 4 MB file in 4 KB writes and reads, the mix).
        out = run(srv.cmd(seeds.memlan_wrap([str(exe), "127.0.0.1", "/export", str(seeds.NFS_PORT),
                                             "0", "null", "storm", "write", "read", "pebbles"],
                                            clog, on)))
        assert out.strip().endswith("ok"), out
        for t in ("null", "storm", "write", "read", "pebbles"):
            assert re.search(rf"^{t} ", out, re.M), out
        # libnfs's own tools: a file of odd length there and back, compared with what ganesha
        # wrote on disk.
        data = os.urandom(3 * 1024 * 1024 + 12345)
        src, back = tmp_path / "src.bin", tmp_path / "back.bin"
        src.write_bytes(data)
        url = f"nfs://127.0.0.1/export/copy.bin?version=3"
        run(srv.cmd(seeds.memlan_wrap(["nfs-cp", str(src), url], clog, on)))
        run(srv.cmd(seeds.memlan_wrap(["nfs-cp", url, str(back)], clog, on)))
        assert hashlib.sha256((srv.export / "copy.bin").read_bytes()).digest() == \
            hashlib.sha256(data).digest()
        assert hashlib.sha256(back.read_bytes()).digest() == hashlib.sha256(data).digest()
        # nfs-ls lists the file with its size (READDIRPLUS).
        ls = run(srv.cmd(seeds.memlan_wrap(["nfs-ls", "nfs://127.0.0.1/export/?version=3"], clog, on)))
        assert re.search(rf"\s{len(data)}\s+copy\.bin$", ls, re.M), ls
        if on:
            # mountd and nfsd connections of nfsbench and of both nfs-cp runs; rpcbind (not
            # under memlan) stays on TCP.
            assert accelerated(clog) >= 6, clog.read_text()
            assert accelerated(slog) >= 6, slog.read_text()
        else:
            assert not clog.exists() and not slog.exists()
        assert srv.ganesha.poll() is None, "ganesha died"
    finally:
        srv.close()
    settle()


# ---- omniORB ---------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_omniorb(fabric, tmp_path, mode):
    exe = need("omniorb")
    on = mode == "memlan"
    from test_apps import next_port
    port = next_port()
    slog, clog = tmp_path / "server.log", tmp_path / "client.log"
    ior = tmp_path / "echo.ior"
    srv = subprocess.Popen(seeds.memlan_wrap([str(exe), "server", str(port), str(ior)], slog, on),
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        import time
        end = time.time() + 30
        while not ior.exists():
            assert srv.poll() is None, f"server exited {srv.returncode}: {srv.stderr.read()}"
            assert time.time() < end, "no IOR from the server"
            time.sleep(0.05)
        # null calls, two-way echo of 0 B .. 1 MB (every byte complemented and checked), 4000
        # oneways of 16 B .. 70 KB checked in order by the server.
        out = run(seeds.memlan_wrap([str(exe), "check", str(ior)], clog, on))
        assert "check null 100 echo 27 oneway 4000 ok" in out, out
        # Several client threads at once, each call on a connection of its own.
        out = run(seeds.memlan_wrap([str(exe), "rate", str(ior), "0.3", "4"], clog, on))
        assert re.search(r"^rate threads 4 calls [1-9]", out, re.M), out
        out = run(seeds.memlan_wrap([str(exe), "oneway", str(ior), "0.3", "65536"], clog, on))
        assert re.search(r"^oneway size 65536 blocks [1-9]", out, re.M), out
        if on:
            assert accelerated(clog) >= 3 and accelerated(slog) >= 3, slog.read_text()
    finally:
        seeds.stop(srv)
    settle()


# ---- MPI: Open MPI (tcp BTL) and MPICH (UCX over TCP) ----------------------------------------

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("mpi", ["openmpi", "mpich"])
def test_mpi(fabric, tmp_path, mpi, mode):
    exe = need(mpi)
    on = mode == "memlan"
    logs = (tmp_path / "rank0.log", tmp_path / "rank1.log")
    # Few iterations, every byte of every message checked (ITERS <= 100); the count, not the
    # clock, ends each size (-t 600), so that a slow round trip cannot shorten the check.
    sizes = (1, 64, 4096, 65536, 300001, 1048576)
    argv, env = seeds.mpi_cmd(mpi, exe, ["-i", "10", "-t", "600", "-s", ",".join(map(str, sizes)),
                                         "-a", "1,1000,70000"], "tcp", on, logs=logs)
    r = seeds.run_group(argv, 180, env=env)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "MISMATCH" not in out, out[-3000:]
    out = r.stdout
    for size in sizes:
        assert re.search(rf"^pingpong {size} 10 ", out, re.M), out
    for count in (1, 1000, 70000):
        assert re.search(rf"^allreduce {count} 10 ", out, re.M), out
    assert out.strip().endswith("ok"), out
    if on:
        # Every rank under memlan, and the ranks' connection to each other carried by it.
        for log in logs:
            assert accelerated(log) >= 1, log.read_text() if log.exists() else "no log"
    settle()
