# SPDX-License-Identifier: Apache-2.0 OR MIT
"""git daemon with git clone, push and fetch over git://, protocol v0 and v2, both ends under
`memlan run` and mixed (one end plain).

git is the acceptance case for stdio on an accelerated socket: git daemon hands each connection
to a child on fds 0 and 1 (carried across exec), and upload-pack writes its ref advertisement
with fwrite on stdout, its pack with write.  Before stdio.c, those fwrite bytes went into the
idle kernel socket: protocol v0 "cloned an empty repository", v2 hung.  Every run checks the
data: git fsck on the result and the commit log equal to the source's.
"""
import os
import shutil
import signal
import subprocess
import time

import pytest

from conftest import MEMLAN, memlan, port_free

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")

PORT = [22200]  # below the ephemeral range, as in test_preload


def next_port():
    PORT[0] += 1
    while not port_free(PORT[0]):
        PORT[0] += 1
    return PORT[0]


def git(*args, cwd=None, under=None, timeout=60):
    cmd = ["git", "-c", "user.email=t@t", "-c", "user.name=t", *args]
    if under:
        cmd = [str(MEMLAN), "run", "--log", str(under), "--"] + cmd
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{cmd} exited {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p.stdout


def commit(repo, name, n):
    for i in range(n):
        (repo / f"{name}{i}").write_text(f"{name} {i}\n" * (1 + 300 * i))
        git("add", ".", cwd=repo)
        git("commit", "-qm", f"{name} {i}", cwd=repo)


def log(repo, ref="HEAD"):
    return git("log", "--format=%H %s", ref, cwd=repo)


@pytest.mark.parametrize("version", ["0", "2"])
@pytest.mark.parametrize("ends", ["both", "daemon", "client"])
def test_git_clone_push_fetch(fabric, tmp_path, version, ends):
    """ends: both under memlan, or only the daemon, or only the client."""
    src = tmp_path / "src"
    src.mkdir()
    git("init", "-q", "-b", "main", str(src))
    commit(src, "a", 3)
    srv = tmp_path / "srv"
    srv.mkdir()
    git("clone", "-q", "--bare", str(src), str(srv / "repo.git"))
    port = next_port()
    dlog, clog = tmp_path / "daemon.log", tmp_path / "client.log"
    cmd = ["git", "daemon", "--reuseaddr", f"--base-path={srv}", "--export-all",
           "--enable=receive-pack", f"--port={port}", "--listen=127.0.0.1"]
    if ends in ("both", "daemon"):
        cmd = [str(MEMLAN), "run", "--log", str(dlog), "--"] + cmd
    d = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        for _ in range(100):
            if not port_free(port):
                break
            time.sleep(0.05)
        under = clog if ends in ("both", "client") else None
        url = f"git://127.0.0.1:{port}/repo.git"
        v = ["-c", f"protocol.version={version}"]
        work = tmp_path / "work"
        git(*v, "clone", "-q", url, str(work), under=under)
        assert log(work) == log(src)
        git("fsck", "--strict", cwd=work)
        # push: new commits from the clone reach the daemon's repository
        commit(work, "b", 2)
        git(*v, "push", "-q", "origin", "main", cwd=work, under=under)
        assert log(srv / "repo.git", "main") == log(work)
        git("fsck", "--strict", cwd=srv / "repo.git")
        # fetch: a second clone, behind, catches up
        other = tmp_path / "other"
        git("clone", "-q", "--bare", str(src), str(other))
        git(*v, "fetch", "-q", url, "main:main", cwd=other, under=under)
        assert log(other, "main") == log(work)
        git("fsck", "--strict", cwd=other)
    finally:
        d.send_signal(signal.SIGTERM)
        try:
            d.wait(timeout=10)
        except subprocess.TimeoutExpired:
            d.kill()
            d.wait()
    text = (dlog.read_text() if dlog.exists() else "") + (clog.read_text() if clog.exists() else "")
    if ends == "both":
        # The connections really were accelerated, and the daemon's children wrote through
        # streams of ours.
        assert text.count("accelerated (client)") >= 3, text
        assert "stdout is a stream through the channel" in text, text
        assert "TCP (" not in text, text
    else:
        assert "accelerated (" not in text, text
    time.sleep(0.05)
    memlan("clean")
