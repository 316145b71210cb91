# SPDX-License-Identifier: Apache-2.0 OR MIT
"""bench/seedplot.py: the omniORB oneway plot bench/seeds writes (the ORL paper's Figure 4 in
our numbers), from made-up results: a line and a marker per point for each transport and
placement, in order of block size, every size labelled; nothing when no oneway figure was
measured; a figure left unmeasured (starved rounds) is left out, not drawn at zero."""
import re
import sys

from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import seedplot  # noqa: E402


def fig(k, m):
    return {"kernel": k, "memlan": m, "ratio": m / k if k and m else None}


RESULTS = {"omniorb": {
    "split": {"oneway 64 B: MBps": fig(35.0, 64.0), "oneway 1048576 B: MBps": fig(3300.0, 5100.0),
              "oneway 4096 B: MBps": fig(800.0, 3000.0), "null RPC: RTT p50 us": fig(90.0, 1.4)},
    "same": {"oneway 64 B: MBps": fig(20.0, 30.0), "oneway 4096 B: MBps": fig(500.0, None)},
}}


def test_oneway_series_in_size_order_without_unmeasured_points():
    s = seedplot.oneway_series(RESULTS)
    assert s[("kernel", "split")] == [(64, 35.0), (4096, 800.0), (1048576, 3300.0)]
    assert s[("memlan", "split")] == [(64, 64.0), (4096, 3000.0), (1048576, 5100.0)]
    assert s[("memlan", "same")] == [(64, 30.0)]  # 4096 B not measured: no point at all
    assert len(s) == 4


def test_oneway_svg_marks_every_point_and_labels_sizes():
    svg = seedplot.oneway_svg(RESULTS, "t")
    assert svg.startswith("<svg") and svg.rstrip().endswith("</svg>")
    # 3 + 3 + 2 + 1 points, each a marker, plus one marker per legend entry
    assert svg.count("<circle cx") == 9 and svg.count("<circle class=\"legend\"") == 4
    assert svg.count("<polyline") == 4
    for label in ("64 B", "4 KiB", "1 MiB", "kernel TCP, split", "memlan, same"):
        assert f">{label}<" in svg, label
    # every marker inside the frame (80..570 by 50..400 for these sizes)
    for cx, cy in re.findall(r'<circle cx="([\d.]+)" cy="([\d.]+)" r="3.5" fill="#[0-9a-f]+"/>', svg):
        assert 80 < float(cx) < 570 and 50 <= float(cy) <= 400, (cx, cy)


def test_no_oneway_figure_no_plot():
    assert seedplot.oneway_svg({"omniorb": {"split": {"null RPC: RTT p50 us": fig(90.0, 1.4)}}}, "t") is None
    assert seedplot.oneway_svg({"nfs": {}}, "t") is None
