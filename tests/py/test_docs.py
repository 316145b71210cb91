# SPDX-License-Identifier: Apache-2.0 OR MIT
"""Every exported function has a current reference page, and the library exports nothing else."""
import re
import subprocess

from conftest import LIB, ROOT


def test_api_pages_are_current():
    p = subprocess.run(["python3", str(ROOT / "scripts" / "gen-api-docs.py"), "--check"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_exports_are_exactly_the_documented_api():
    out = subprocess.run(["nm", "-D", "--defined-only", str(LIB)], capture_output=True,
                         text=True, check=True).stdout
    exported = {m.group(1) for m in re.finditer(r" T (\w+)", out)}
    documented = {p.stem for p in (ROOT / "docs" / "api").glob("memlan_*.md")}
    assert exported == documented
    assert not any(s.startswith("__ml") for s in exported)
