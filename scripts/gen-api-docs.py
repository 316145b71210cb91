#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 OR MIT
"""Write docs/api/FUNCTION.md for every function that include/memlan.h and include/memlan/rpc.h
declare, from the
comment above its declaration, and docs/api/README.md as the index.  Run after editing the header;
tests/py/test_docs.py fails if a page is missing or stale."""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
HEADERS = [ROOT / "include" / "memlan.h", ROOT / "include" / "memlan" / "rpc.h"]
OUT = ROOT / "docs" / "api"

DECL = re.compile(r"^(?P<ret>[A-Za-z_ ]+?[ *]+)(?P<name>memlan_[a-z_]+)\((?P<args>[^;]*)\);", re.S)


def pages():
    out = {}
    for h in HEADERS:
        for name, v in header_pages(h).items():
            out[name] = v + (h.relative_to(ROOT / "include").as_posix(),)
    return out


def header_pages(header):
    text = header.read_text()
    out = {}
    section = "ONC RPC" if header.name == "rpc.h" else ""
    comment = ""
    for chunk in re.split(r"\n(?=/\*|[a-z])", text):
        chunk = chunk.strip()
        m = re.match(r"/\* -+ (.+?) -+ \*/", chunk)
        if m:
            section = m.group(1)
            continue
        if chunk.startswith("/*"):
            end = chunk.find("*/")
            comment = chunk[: end + 2]
            rest = chunk[end + 2 :].strip()
            if not rest:
                continue
            chunk = rest
        d = DECL.match(chunk)
        if d:
            name = d.group("name")
            proto = " ".join((d.group("ret") + name + "(" + d.group("args") + ");").split())
            body = re.sub(r"^/\*+ ?|\*/$", "", comment, flags=re.M)
            body = "\n".join(l.strip().lstrip("* ").rstrip() if l.strip().startswith("*") else l.strip()
                             for l in body.splitlines()).strip()
            out[name] = (section, proto, body)
            # A declaration right after another shares its comment (reserve/commit, peek/release).
            comment = comment
        elif not chunk.startswith("#") or chunk.startswith("#define"):
            comment = ""
    return out


# Functions that return an int that is never an error: their own convention line.
NO_ERRORS = {
    "memlan_spin_us": "Return convention: a count of microseconds, never an error; errno is never "
                      "read or changed.",
    "memlan_clnt_is_fast": "Return convention: 1 or 0, never an error.",
}


def rpc_convention(name, proto):
    """The return convention of an ONC RPC function, by its type: libtirpc's for the calls that
    stand in for libtirpc's (CLIENT *, bool_t), and what the others return."""
    if name in NO_ERRORS:
        return NO_ERRORS[name]
    if proto.startswith(("CLIENT *", "bool_t ")):
        return ("Return convention: libtirpc's (NULL or FALSE on failure, details through "
                "rpc_createerr and clnt_geterr).")
    if proto.startswith("const char *"):
        return "Return convention: a string that belongs to memlan (never free it), never NULL."
    if proto.startswith("void "):
        return "Return convention: none (void)."
    raise SystemExit(f"{name}: no return convention for its type: {proto}")


def render(name, section, proto, body, header):
    if header == "memlan/rpc.h":
        return (f"# {name}\n\n*{section}* (`#include <memlan/rpc.h>`, link with `-lmemlan-rpc "
                f"-ltirpc`)\n\n```c\n{proto}\n```\n\n{body}\n\n"
                f"{rpc_convention(name, proto)} See the header comment in "
                "`include/memlan/rpc.h`.\n")
    if name in NO_ERRORS:
        return (f"# {name}\n\n*{section}* (`#include <memlan.h>`, link with `-lmemlan`)\n\n"
                f"```c\n{proto}\n```\n\n{body}\n\n{NO_ERRORS[name]} See the header comment in "
                "`include/memlan.h` for thread safety.\n")
    if proto.startswith("const char *"):
        return (f"# {name}\n\n*{section}* (`#include <memlan.h>`, link with `-lmemlan`)\n\n"
                f"```c\n{proto}\n```\n\n{body}\n\n"
                "Return convention: a string that belongs to memlan (never free it), as described "
                "above; errno is never read or changed.\n")
    conv = {
        "void *": "Return convention: a pointer, as described above; errno is never read or "
                  "changed.",
        "size_t ": "Return convention: a size, never an error, as described above; errno is "
                   "never read or changed.",
        "void ": "Return convention: none (void); errno is never read or changed.",
    }
    for ret, line in conv.items():
        if proto.startswith(ret) and not proto.startswith("void **"):
            return (f"# {name}\n\n*{section}* (`#include <memlan.h>`, link with `-lmemlan`)\n\n"
                    f"```c\n{proto}\n```\n\n{body}\n\n{line} See the header comment in "
                    "`include/memlan.h` for thread safety.\n")
    return (f"# {name}\n\n*{section}* (`#include <memlan.h>`, link with `-lmemlan`)\n\n"
            f"```c\n{proto}\n```\n\n{body}\n\n"
            "Return convention: non-negative on success, a negative errno on failure; errno is "
            "never read or changed. See the header comment in `include/memlan.h` for thread "
            "safety.\n")


def main():
    p = pages()
    check = "--check" in sys.argv
    stale = []
    want = {f"{n}.md": render(n, *v) for n, v in p.items()}
    index = "# libmemlan API reference\n\n" + "".join(
        f"- [`{n}`]({n}.md): {v[0]}\n" for n, v in sorted(p.items()))
    want["README.md"] = index
    for fn, content in want.items():
        path = OUT / fn
        if check:
            if not path.exists() or path.read_text() != content:
                stale.append(fn)
        else:
            OUT.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
    if check and stale:
        print("stale or missing API pages:", ", ".join(stale))
        return 1
    print(f"{len(p)} functions documented")
    return 0


if __name__ == "__main__":
    sys.exit(main())
