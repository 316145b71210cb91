# SPDX-License-Identifier: Apache-2.0 OR MIT
"""`make install` as a user and a packager use it: a private build, installed into a prefix with
a multiarch LIBDIR and staged under DESTDIR; a program built with `pkg-config` against the
install runs; the man pages render; `memlan run` from the prefix finds its preload library;
libmemlan.so needs only libc; `make uninstall` leaves no file behind; `make` never installs
packages; every source file carries its licence."""
import os
import pathlib
import re
import shutil
import subprocess

import pytest

from conftest import ROOT

ARCH = "x86_64-linux-gnu"
CHANNEL_PROGRAM = r"""
#include <memlan.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int main(void)
{
    memlan_fabric_t *fab;
    memlan_channel_t *ch;
    if (memlan_fabric_open(NULL, &fab) < 0 || memlan_channel_create(fab, NULL, &ch) < 0)
        return 1;
    pid_t pid = fork();
    if (pid == 0) {
        memlan_channel_t *peer;
        if (memlan_channel_attach(fab, memlan_channel_token(ch), &peer) < 0)
            _exit(1);
        char buf[64] = "";
        ssize_t n = memlan_recv(peer, buf, sizeof buf - 1, 0);
        printf("got %zd: %s\n", n, buf);
        fflush(stdout);
        memlan_channel_close(peer);
        _exit(n == 5 ? 0 : 1);
    }
    if (memlan_channel_wait_peer(ch, 5000) < 0 || memlan_send(ch, "hello", 5, 0) != 5)
        return 1;
    int st;
    waitpid(pid, &st, 0);
    memlan_channel_close(ch);
    memlan_fabric_close(fab);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}
"""


def sh(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    assert p.returncode == 0, f"{cmd} exited {p.returncode}:\n{p.stdout}\n{p.stderr}"
    return p


def make(build, *args):
    return sh(["make", "-s", "-j2", f"BUILD={build}", *args], cwd=ROOT)


def files_under(d):
    return sorted(p for p in pathlib.Path(d).rglob("*") if p.is_file() or p.is_symlink())


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """A private build (so that LIBDIR compiled into the CLI does not touch build/), installed
    into a prefix whose LIBDIR is multiarch: ../lib beside bin/ holds nothing."""
    t = tmp_path_factory.mktemp("install")
    prefix = t / "prefix"
    libdir = prefix / "lib" / ARCH
    make(t / "build", "install", f"PREFIX={prefix}", f"LIBDIR={libdir}")
    return {"tmp": t, "build": t / "build", "prefix": prefix, "libdir": libdir,
            "mandir": prefix / "share" / "man"}


def pkgconfig(tree, *args):
    env = dict(os.environ, PKG_CONFIG_PATH=str(tree["libdir"] / "pkgconfig"))
    return sh(["pkg-config", *args], env=env).stdout.split()


def test_installed_layout(tree):
    lib = tree["libdir"]
    for name in ("libmemlan", "libmemlan-rpc"):
        real = lib / f"{name}.so.0.1.0"
        assert real.is_file() and not real.is_symlink()
        assert os.readlink(lib / f"{name}.so.0") == real.name
        assert os.readlink(lib / f"{name}.so") == f"{name}.so.0"
        soname = re.search(r"SONAME.*\[(.*)\]", sh(["readelf", "-d", str(real)]).stdout)
        assert soname and soname.group(1) == f"{name}.so.0"
    assert (lib / "libmemlan-preload.so").is_file()
    assert (tree["prefix"] / "include" / "memlan.h").is_file()
    assert (tree["prefix"] / "include" / "memlan" / "rpc.h").is_file()


def test_libmemlan_needs_only_libc(tree):
    def needed(f):
        return set(re.findall(r"\(NEEDED\).*\[(.*)\]", sh(["readelf", "-d", str(f)]).stdout))
    assert needed(tree["libdir"] / "libmemlan.so.0.1.0") == {"libc.so.6"}
    rpc = needed(tree["libdir"] / "libmemlan-rpc.so.0.1.0")
    assert "libmemlan.so.0" in rpc and any(n.startswith("libtirpc.so") for n in rpc)
    libs = pkgconfig(tree, "--libs", "memlan")
    assert "-lmemlan" in libs and not any("tirpc" in a for a in libs)
    rpclibs = pkgconfig(tree, "--libs", "memlan-rpc")
    assert "-lmemlan-rpc" in rpclibs and "-ltirpc" in rpclibs


def test_pkg_config_builds_a_program_that_runs(tree, fabric):
    """Built as the README says: pkg-config for the flags, an rpath for the run-time linker."""
    src = tree["tmp"] / "chan.c"
    src.write_text(CHANNEL_PROGRAM)
    exe = tree["tmp"] / "chan"
    flags = pkgconfig(tree, "--cflags", "--libs", "memlan")
    libdir = pkgconfig(tree, "--variable=libdir", "memlan")[0]
    assert libdir == str(tree["libdir"])
    sh(["cc", "-std=c11", "-D_GNU_SOURCE", "-o", str(exe), str(src), *flags,
        f"-Wl,-rpath,{libdir}"])
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    out = sh([str(exe)], env=env).stdout
    assert "got 5: hello" in out
    # The installed library is the one it runs with, not the build tree's.
    ldd = sh(["ldd", str(exe)], env=env).stdout
    assert f"{tree['libdir']}/libmemlan.so.0" in ldd


def test_pkg_config_builds_an_rpc_program_that_runs(tree):
    """memlan-rpc.pc brings libtirpc's flags; libmemlan-rpc finds libmemlan.so.0 beside itself
    though the program's rpath (DT_RUNPATH) names only its direct libraries' directory."""
    src = tree["tmp"] / "rpc.c"
    src.write_text('#include <memlan/rpc.h>\n#include <stdio.h>\n'
                   'int main(void) { printf("fast=%d\\n", memlan_clnt_is_fast(NULL)); '
                   'return 0; }\n')
    exe = tree["tmp"] / "rpc"
    flags = pkgconfig(tree, "--cflags", "--libs", "memlan-rpc")
    sh(["cc", "-o", str(exe), str(src), *flags, f"-Wl,-rpath,{tree['libdir']}"])
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    assert sh([str(exe)], env=env).stdout == "fast=0\n"


@pytest.mark.parametrize("page", ["man1/memlan.1", "man3/memlan_send.3", "man1/memlan-rpcgen.1",
                                  "man7/memlan.7"])
def test_man_pages_render(tree, page):
    f = tree["mandir"] / page
    name = f.stem
    env = {k: v for k, v in os.environ.items() if k != "MAN_KEEP_FORMATTING"}
    env.update(MANWIDTH="80", LC_ALL="C.UTF-8")
    p = subprocess.run(["man", "--warnings", "-l", str(f)], capture_output=True, text=True,
                       env=env, timeout=60)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    text = re.sub(".\b", "", p.stdout)  # overstrike, should man format for a terminal
    assert re.match(rf"{re.escape(name.upper())}\({page[3]}\)", text.lstrip())
    for section in ("NAME", "SEE ALSO"):
        assert re.search(rf"^{section}$", text, re.M)
    leaked = re.findall(r"(?:^|\s)\.(?:PP|SH|SS|TP|IP|nf|fi|RS|RE|br|TH)\b", text)
    assert not leaked, f"roff requests printed as text: {leaked}"
    # And by name, from the installed MANDIR, as `man memlan_send` finds it.
    w = sh(["man", "-M", str(tree["mandir"]), "-w", page[3], name]).stdout.strip()
    assert pathlib.Path(w).resolve() == f.resolve()


def test_memlan_run_finds_the_installed_preload_library(tree, fabric):
    """From BINDIR it uses LIBDIR; here ../lib beside bin/ holds no preload library, so only
    the compiled-in LIBDIR can find it."""
    assert not (tree["prefix"] / "lib" / "libmemlan-preload.so").exists()
    env = {k: v for k, v in os.environ.items()
           if k not in ("MEMLAN_PRELOAD_LIB", "LD_LIBRARY_PATH", "LD_PRELOAD")}
    p = sh([str(tree["prefix"] / "bin" / "memlan"), "run", "--", "cat", "/proc/self/maps"],
           env=env)
    want = str((tree["libdir"] / "libmemlan-preload.so").resolve())
    assert want in p.stdout, p.stdout[-2000:] + p.stderr


def test_uninstall_removes_every_installed_file(tree):
    """A packager's staged install (DESTDIR), then uninstall with the same variables."""
    stage = tree["tmp"] / "stage"
    args = [f"DESTDIR={stage}", "PREFIX=/opt/memlan", "MANDIR=/opt/memlan/man"]
    make(tree["build"], "install", *args)
    installed = files_under(stage)
    rel = {p.relative_to(stage).as_posix() for p in installed}
    for want in ("opt/memlan/bin/memlan", "opt/memlan/bin/memlan-rpcgen",
                 "opt/memlan/lib/libmemlan.so.0.1.0", "opt/memlan/lib/libmemlan-rpc.a",
                 "opt/memlan/lib/pkgconfig/memlan.pc", "opt/memlan/lib/pkgconfig/memlan-rpc.pc",
                 "opt/memlan/man/man1/memlan.1", "opt/memlan/man/man3/memlan_send.3",
                 "opt/memlan/man/man7/memlan.7", "opt/memlan/include/memlan/layout.h"):
        assert want in rel
    assert len([r for r in rel if "/man3/" in r]) == len(list((ROOT / "man" / "man3").glob("*.3")))
    # Staged, the binary is not in its BINDIR: it finds the library beside itself, in ../lib.
    env = {k: v for k, v in os.environ.items() if k not in ("MEMLAN_PRELOAD_LIB", "LD_PRELOAD")}
    p = sh([str(stage / "opt/memlan/bin/memlan"), "run", "--", "sh", "-c", "echo $LD_PRELOAD"],
           env=env)
    assert p.stdout.strip() == str((stage / "opt/memlan/lib/libmemlan-preload.so").resolve())
    make(tree["build"], "uninstall", *args)
    assert files_under(stage) == [], [str(p) for p in files_under(stage)]


def test_make_never_installs_packages(tmp_path):
    p = sh(["make", "-n", f"BUILD={tmp_path / 'b'}", "all"], cwd=ROOT)
    assert "install-deps" not in p.stdout and "apt-get" not in p.stdout
    assert "install-deps" in sh(["make", "-n", "deps"], cwd=ROOT).stdout


@pytest.mark.skipif(pathlib.Path("/usr/include/rpc/rpc.h").exists(),
                    reason="the C library itself provides rpc/rpc.h here")
def test_make_says_run_make_deps_without_libtirpc(tmp_path):
    b = tmp_path / "b"
    p = subprocess.run(["make", f"BUILD={b}", "TIRPC_CFLAGS=-I/nonexistent",
                        f"{b}/obj/src/rpc/rpc.o"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode != 0 and "run make deps" in p.stderr


def test_every_source_file_carries_its_licence():
    assert "Apache-2.0 OR MIT" in (ROOT / "LICENSE").read_text()
    assert "Apache License" in (ROOT / "LICENSE-APACHE").read_text()
    assert "MIT License" in (ROOT / "LICENSE-MIT").read_text()
    files = sh(["git", "ls-files"], cwd=ROOT).stdout.split()
    source = [f for f in files if re.search(r"\.(c|h|py|sh|x|map|in)$|(^|/)Makefile$", f)
              or f in ("bench/apps", ".ci/run")]
    assert len(source) > 50
    missing = [f for f in source if "SPDX-License-Identifier: Apache-2.0 OR MIT"
               not in "".join((ROOT / f).read_text().splitlines(True)[:2])]
    assert not missing, missing
