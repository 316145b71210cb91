# SPDX-License-Identifier: Apache-2.0 OR MIT
"""Every exported function has a current reference page, and the library exports nothing else."""
import re
import subprocess

from conftest import LIB, ROOT


def test_api_pages_are_current():
    p = subprocess.run(["python3", str(ROOT / "scripts" / "gen-api-docs.py"), "--check"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def dynamic_symbols(lib):
    """{name: version node} of what lib defines and exports."""
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True,
                         text=True, check=True).stdout
    return {m.group(1): m.group(2) for m in re.finditer(r" T (\w+)@@?([\w.]+)", out)}


def test_exports_are_exactly_the_documented_api():
    core = dynamic_symbols(LIB)
    rpc = dynamic_symbols(LIB.with_name("libmemlan-rpc.so"))
    documented = {p.stem for p in (ROOT / "docs" / "api").glob("memlan_*.md")}
    rpc_documented = {n for n in documented if n in rpc_header_names()}
    public = {s for s, v in core.items() if v != "MEMLAN_PRIVATE"}
    assert public == documented - rpc_documented
    assert set(rpc) == rpc_documented and set(rpc.values()) == {"MEMLAN_RPC_0.1"}
    # libmemlan-rpc's needs of the core, in a node that says they are not API.
    private = {s for s, v in core.items() if v == "MEMLAN_PRIVATE"}
    assert all(s.startswith("__ml") for s in private)
    assert not any(s.startswith("__ml") for s in public)


def rpc_header_names():
    text = (ROOT / "include" / "memlan" / "rpc.h").read_text()
    return set(re.findall(r"\b(memlan_\w+)\(", text))


def test_man_pages_are_current():
    p = subprocess.run(["python3", str(ROOT / "scripts" / "gen-man.py"), "--check"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_memlan_7_names_every_environment_variable():
    """Every MEMLAN_* name that the code passes to getenv (as a whole string literal) is
    described in memlan(7)'s ENVIRONMENT section."""
    names = set()
    for f in [*(ROOT / "src").rglob("*.[ch]"), ROOT / "tools" / "memlan.c"]:
        names |= set(re.findall(r'"(MEMLAN(?:_[A-Z_]+)?)"', f.read_text()))
    assert "MEMLAN_FABRIC" in names and "MEMLAN_RPC_LOAN" in names  # the scan itself works
    env = (ROOT / "docs" / "man" / "memlan.7.md").read_text().split("## ENVIRONMENT")[1]
    env = env.split("\n## ")[0]
    described = set(re.findall(r"^- `(MEMLAN\w*)`:", env, re.M))
    assert names <= described, f"not in memlan(7): {sorted(names - described)}"


def test_memlan_1_names_every_command_and_option():
    """What `memlan --help` and each `memlan COMMAND --help` print is in memlan(1) (stat's --pid,
    --kind, --interval, --count and --tokens were not: its page said `stat [--json]`)."""
    from conftest import MEMLAN
    page = (ROOT / "docs" / "man" / "memlan.1.md").read_text()
    top = subprocess.run([str(MEMLAN), "--help"], capture_output=True, text=True)
    commands = set(re.findall(r"^  ([a-z]+)\b", top.stdout + top.stderr, re.M))
    assert {"run", "stat", "clean", "bench", "fabric", "version"} <= commands
    assert not {c for c in commands if f"- `{c}" not in page}
    missing = []
    for c in sorted(commands):
        h = subprocess.run([str(MEMLAN), c, "--help"], capture_output=True, text=True)
        assert h.returncode == 0, (c, h.stderr)
        for o in set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*|-[a-z])\b", h.stdout)):
            if f"`{o}" not in page and f"[{o}" not in page and f"({o})" not in page \
                    and f"(`{o}`)" not in page:
                missing.append(f"{c} {o}")
    assert not missing, missing


def test_readme_container_example_names_a_fabric_that_exists(tmp_path):
    """The README's docker example, as far as it can run without docker: each container mounts a
    fresh volume and names a fabric in it.  A fabric that is not the volume itself is a directory
    nobody made (memlan creates a named fabric only with MEMLAN_FABRIC_CREATE=1), so everything
    stayed on TCP.  Here the volume is a fresh empty directory, the fabric the same path in it,
    and a connection made under memlan run with the example's options must be accelerated."""
    import os
    import sys
    from conftest import MEMLAN
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Containers and network namespaces", 1)[1].split("```sh", 1)[1]
    block = block.split("```", 1)[0].replace("\\\n", " ")
    runs = [l for l in block.splitlines() if l.strip().startswith("docker run")]
    assert len(runs) == 2, block
    volume = tmp_path / "volume"
    volume.mkdir()
    connect = ("import socket; l = socket.socket(); l.bind(('127.0.0.1', 0)); l.listen(4); "
               "c = socket.create_connection(l.getsockname()); a, _ = l.accept(); "
               "c.sendall(b'hi'); print(a.recv(2).decode())")
    for line in runs:
        mounts = dict(m.split(":")[:2] for m in re.findall(r"-v (\S+)", line))
        env = dict(e.split("=", 1) for e in re.findall(r"-e (\S+)", line))
        fab = re.search(r"--fabric (\S+)", line).group(1)
        vol_mount = [m for v, m in mounts.items() if not v.startswith(("$", "/"))]
        assert len(vol_mount) == 1, line
        mount = vol_mount[0]
        assert fab == mount or fab.startswith(mount + "/"), line
        here = str(volume) + fab[len(mount):]
        p = subprocess.run([str(MEMLAN), "run", "--fabric", here, "--log", "stderr", "--",
                            sys.executable, "-c", connect], capture_output=True, text=True,
                           timeout=60, env=dict(os.environ, **env))
        assert p.returncode == 0 and p.stdout == "hi\n", p.stderr
        assert "accelerated (client)" in p.stderr and "cannot accelerate" not in p.stderr, (
            line, p.stderr)


def test_return_conventions_fit_their_function_types():
    """Each API page ends with a return-convention line; it must fit the function's type: void
    returns nothing (memlan_svc_run's page promised libtirpc's NULL or FALSE), an int that is never
    an error says so (memlan_spin_us's and memlan_clnt_is_fast's promised a negative errno or a
    NULL), and only the calls that stand in for libtirpc's take libtirpc's convention."""
    want = [("void *", "a pointer"), ("void ", "none (void)"), ("const char *", "a string"),
            ("size_t ", "a size, never an error"), ("CLIENT *", "NULL or FALSE"),
            ("bool_t ", "NULL or FALSE"), ("int ", None), ("ssize_t ", "a negative errno")]
    pages = sorted((ROOT / "docs" / "api").glob("memlan_*.md"))
    assert len(pages) > 40
    for page in pages:
        text = page.read_text()
        proto = text.split("```c\n", 1)[1].split("\n", 1)[0]
        conv = [l for l in text.splitlines() if l.startswith("Return convention:")]
        assert len(conv) == 1, page.name
        kind, phrase = next((k, w) for k, w in want if proto.startswith(k))
        if phrase is None:  # an int: an errno, or said never to be one
            phrase = "never an error" if page.stem in ("memlan_spin_us", "memlan_clnt_is_fast") \
                else "a negative errno"
        assert phrase in conv[0], (page.name, proto, conv[0])
        if kind not in ("CLIENT *", "bool_t "):
            assert "NULL or FALSE" not in conv[0], (page.name, conv[0])
    # What the two pages claim: memlan_spin_us never fails, even on a bad MEMLAN_SPIN_US.
    import os
    out = subprocess.run(["python3", "-c", "import ctypes, sys; l = ctypes.CDLL(sys.argv[1]); "
                          "print(l.memlan_spin_us())", str(LIB)], capture_output=True, text=True,
                         env=dict(os.environ, MEMLAN_SPIN_US="abc", MEMLAN_QUIET="1"))
    assert out.stdout.strip() == "50", out.stderr
    out = subprocess.run(["python3", "-c", "import ctypes, sys; l = ctypes.CDLL(sys.argv[1]); "
                          "print(l.memlan_clnt_is_fast(None))", str(LIB.parent / "libmemlan-rpc.so")],
                         capture_output=True, text=True)
    assert out.stdout.strip() == "0", out.stderr


def test_man_page_name_lines_are_whole():
    """The NAME line (what whatis and apropos show) is a whole clause: its parentheses close (a
    cut at the first ';' left 'memlan_listener_fd - ... (level-triggered'), and it is one line's
    worth, not memlan_strerror's list of examples."""
    for page in sorted((ROOT / "man").glob("man*/*.[137]")):
        text = page.read_text()
        name = text.split(".SH NAME\n", 1)[1].split("\n", 1)[0]
        summary = name.split(r" \- ", 1)[1]
        depth = 0
        for ch in summary:
            depth += {"(": 1, ")": -1}.get(ch, 0)
            assert depth >= 0, (page.name, summary)
        assert depth == 0, (page.name, summary)
        assert len(summary) <= 200, (page.name, len(summary))


def test_memlan_7_names_every_fabric_file_and_named_endpoints():
    """memlan(7) is the page for concepts: it had no word of named endpoints (memlan_listen,
    memlan_connect), and its FILES listed seg-, bell- and rpc- but not ep- (named endpoints) nor
    the preload's ls-, la- and cx- records, which a user finds in the fabric directory."""
    page = (ROOT / "docs" / "man" / "memlan.7.md").read_text()
    files = page.split("## FILES", 1)[1].split("\n## ", 1)[0]
    src = "".join(p.read_text() for p in (ROOT / "src").rglob("*.c"))
    prefixes = set(re.findall(r'"([a-z]{2,4})-%', src))
    prefixes |= set(re.findall(r'__ml_fabric_name\([^;]*?"([a-z]+)"', src))
    prefixes |= set(re.findall(r'"/?([a-z]{2,4})-(?:PROG|%s|NAME)', src))
    assert {"seg", "bell", "ep", "ls", "la", "cx"} <= prefixes, prefixes
    assert not {p for p in prefixes if f"`{p}-" not in files and f"/{p}-" not in files}, prefixes
    concepts = page.split("## CONCEPTS", 1)[1].split("\n## ", 1)[0]
    for fn in ("memlan_listen", "memlan_connect", "memlan_accept"):
        assert f"**{fn}**(3)" in concepts, fn
