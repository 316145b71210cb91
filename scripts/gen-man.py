#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 OR MIT
"""Write the man pages under man/ from the same sources as the rest of the documentation:
section 3, one page per public function, from the pages that scripts/gen-api-docs.py renders
from the headers' comments (docs/api/); memlan(1), memlan-rpcgen(1) and memlan(7) from
docs/man/*.md.  The pages are committed so that a build needs no Python; `--check` (run by
tests/py/test_docs.py) fails if one is missing, stale or left over.

The Markdown understood is the small subset those sources use: `# name(section) - summary` as the
first line, `##`/`###` headings, paragraphs, ``` blocks, `- ` lists (a list item that starts with a
`code` term and a colon becomes a tagged paragraph), `code`, **bold** and *italic*."""
import importlib.util
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT = ROOT / "man"
SRC = ROOT / "docs" / "man"

spec = importlib.util.spec_from_file_location("gen_api_docs", ROOT / "scripts" / "gen-api-docs.py")
api = importlib.util.module_from_spec(spec)
spec.loader.exec_module(api)


def version():
    h = (ROOT / "include" / "memlan.h").read_text()
    return ".".join(re.search(rf"#define MEMLAN_VERSION_{k} (\d+)", h).group(1)
                    for k in ("MAJOR", "MINOR", "PATCH"))


def esc(text):
    """Escape roff's specials in running text; a hyphen that starts a word (an option, -EPIPE,
    -1) is a minus sign, so that it can be copied and pasted."""
    text = text.replace("\\", "\\e")
    return re.sub(r"(?<![\w])-", r"\\-", text)


def code(text):
    return text.replace("\\", "\\e").replace("-", "\\-")


def inline(text, markdown=True):
    """Running text to roff: `code` bold, **bold**, *italic* (markdown only), escaped, and a
    line that would start with . or ' (a request) guarded."""
    out = []
    for i, part in enumerate(re.split(r"(`[^`]*`)", text)):
        if i % 2:
            out.append(r"\fB" + code(part[1:-1]) + r"\fR")
            continue
        part = esc(part)
        if markdown:
            part = re.sub(r"\*\*([^*]+)\*\*", r"\\fB\1\\fR", part)
            part = re.sub(r"(?<![\w*])\*([^*\s][^*]*?)\*(?![\w*])", r"\\fI\1\\fR", part)
        out.append(part)
    return guard("".join(out))


def guard(text):
    """roff reads a line that starts with . or ' as a request: guard those."""
    return "\n".join("\\&" + l if l[:1] in (".", "'") else l for l in text.split("\n"))


def th(name, section, summary):
    return (f'.TH "{name.upper()}" "{section}" "" "memlan {version()}" "memlan manual"\n'
            f".SH NAME\n{code(name)} \\- {inline(summary)}\n")


def body(md, markdown=True):
    """Markdown blocks (headings, paragraphs, code, lists) to roff."""
    out, para, item = [], [], None
    lines = md.split("\n")

    def flush():
        nonlocal para, item
        if item is not None:
            m = re.match(r"(`[^`]+`(?: [^:]*)?):\s+(.*)", item, re.S) if markdown else None
            if m:
                out.append(".TP\n" + inline(m.group(1)) + "\n" + inline(m.group(2), markdown))
            else:
                out.append(".IP \\(bu 2\n" + inline(item, markdown))
            item = None
        if para:
            runs = "\n".join(l if l is not None else "\0" for l in para).split("\n\0\n")
            out.append(".PP\n" + "\n.br\n".join(inline(r, markdown) for r in runs))
            para = []

    i = 0
    while i < len(lines):
        l = lines[i]
        if l.startswith("```"):
            flush()
            block = []
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                block.append(guard(code(lines[i])))
                i += 1
            out.append(".PP\n.RS 4\n.nf\n" + "\n".join(block) + "\n.fi\n.RE")
        elif markdown and l.startswith("### "):
            flush()
            out.append(".SS " + inline(l[4:]))
        elif markdown and l.startswith("## "):
            flush()
            out.append(".SH " + inline(l[3:].upper()))
        elif not l.strip():
            flush()
        elif markdown and l.startswith("- "):
            flush()
            item = l[2:]
        elif item is not None and l.startswith(" "):
            item += "\n" + l.strip()
        else:
            if item is not None:
                flush()
            # A line of its own in a header comment (a list, a table) stays one.
            if not markdown and para and re.match(r"\s|- ", l):
                para.append(None)
            para.append(l.strip() if markdown else l.rstrip())
        i += 1
    flush()
    return "\n".join(out) + "\n"


def page_from_markdown(src):
    text = src.read_text()
    first, rest = text.split("\n", 1)
    m = re.match(r"# ([\w-]+)\((\d)\) - (.*)", first)
    assert m, f"{src}: the first line must be '# name(section) - summary'"
    name, section, summary = m.groups()
    return f"man{section}/{name}.{section}", th(name, section, summary) + body(rest)


def name_line(para):
    """The NAME line's summary: the first clause of the description, cut only outside
    parentheses (a cut inside left "... (level-triggered" on memlan_listener_fd's), and past 80
    characters without its parenthesised asides, so that whatis(1) and apropos(1) show a line."""
    depth = 0
    for i, ch in enumerate(para):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0 and ch in ".;:" and (i + 1 == len(para) or para[i + 1].isspace()):
            para = para[:i]
            break
    while len(para) > 80:
        shorter = re.sub(r" \([^()]*(\([^()]*\)[^()]*)*\)(?=[^()]*$)", "", para)
        if shorter == para:
            break
        para = shorter
    return para.rstrip(".;:, ")


def api_page(name, section, proto, text, header, everything):
    """Section 3 from the Markdown that gen-api-docs.py writes for docs/api/NAME.md."""
    md = api.render(name, section, proto, text, header)
    before, block, after = md.split("```")
    meta = before.split("\n", 1)[1].strip()            # *section* (`#include ...`, link with ...)
    proto_lines = block.split("\n", 1)[1].strip()
    paras = [p for p in after.strip().split("\n\n")]
    ret = [p for p in paras if p.startswith("Return convention")]
    desc = "\n\n".join(p for p in paras if p not in ret)
    desc = re.sub(rf"^{re.escape(name)} - ", "", desc)
    summary = name_line(desc.split("\n\n")[0].replace("\n", " "))
    inc = re.search(r"#include <[^>]+>", meta).group(0)
    link = re.search(r"link with `([^`]+)`", meta).group(1)
    pc = "memlan-rpc" if "rpc" in header else "memlan"
    see = sorted(n for n, v in everything.items() if v[0] == section and n != name)
    out = th(name, 3, summary)
    out += ".SH SYNOPSIS\n.nf\n" + r"\fB" + code(inc) + r"\fR" + "\n.PP\n" + guard(code(proto_lines)) + "\n.fi\n"
    out += body(f"*{section.strip('*')}*: link with `{link}` (`pkg-config --libs {pc}`).")
    out += ".SH DESCRIPTION\n" + body(desc, markdown=False)
    if ret:
        out += ".SH RETURN VALUE\n" + body("\n\n".join(ret), markdown=False)
    out += ".SH SEE ALSO\n" + ",\n".join(r"\fB" + code(n) + r"\fR(3)" for n in see)
    out += (",\n" if see else "") + r"\fBmemlan\fR(7)" + "\n"
    return f"man3/{name}.3", out


def pages():
    want = {}
    everything = api.pages()
    for name, v in everything.items():
        path, text = api_page(name, *v, everything)
        want[path] = text
    for src in sorted(SRC.glob("*.md")):
        path, text = page_from_markdown(src)
        want[path] = text
    return want


def main():
    want = pages()
    check = "--check" in sys.argv
    have = {p.relative_to(OUT).as_posix() for p in OUT.glob("man*/*")} if OUT.exists() else set()
    if check:
        bad = sorted(p for p, t in want.items()
                     if not (OUT / p).exists() or (OUT / p).read_text() != t)
        extra = sorted(have - set(want))
        if bad or extra:
            print("stale or missing man pages:", ", ".join(bad),
                  "; left over:" if extra else "", ", ".join(extra))
            return 1
    else:
        for p in have - set(want):
            (OUT / p).unlink()
        for p, t in want.items():
            (OUT / p).parent.mkdir(parents=True, exist_ok=True)
            (OUT / p).write_text(t)
    print(f"{len(want)} man pages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
