"""The memlan command line: stat, clean and bench, run as a user would run them."""
import json
import os
import signal
import xml.etree.ElementTree as ET

from conftest import memlan

SPLIT_SAME_KEYS = ["rtt_spin_us", "rtt_sleep_us", "floor_spin_us", "floor_futex_us", "tcp_rtt_us",
                   "bw_64k_MBps", "xmax_64k_MBps", "tcp_bw_64k_MBps", "rate_64_Mps",
                   "tcp_rate_64_Mps"]


def test_version_and_help():
    assert memlan("version").stdout.startswith("memlan ")
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
        # X_max is derived from Xt and Xr exactly as SCILAN defines it.
        xt, xr = r[placement]["xt_MBps"], r[placement]["xr_MBps"]
        assert abs(r[placement]["xmax_64k_MBps"] - xt * xr / (xt + xr)) < 0.2
    root = ET.parse(svg).getroot()
    assert root.tag.endswith("svg")
    assert len([e for e in root.iter() if e.tag.endswith("polyline")]) == 4


def test_bench_rejects_bad_arguments(fabric):
    assert memlan("bench", "--placement", "moon", check=False).returncode == 2
    p = memlan("bench", "--plot", "x.png", check=False)
    assert p.returncode == 2 and "SVG" in p.stderr
