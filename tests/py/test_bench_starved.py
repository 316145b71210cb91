# SPDX-License-Identifier: Apache-2.0 OR MIT
"""bench/seeds' starved rounds (bench/rqwait.py): a round whose processes waited on a run queue
for more than half of their runnable time while other processes held more than half of their
cpus is left out of the medians and ratios, and a pair with one starved half is left out of the
ratios whole.  The verdict is a pure function of schedstat and /proc/stat samples, fed here with
made-up ones; a real process is watched only to see that its threads and children are found."""
import importlib.machinery
import importlib.util
import json
import os
import signal
import subprocess
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import rqwait  # noqa: E402

MS = 1_000_000  # ns


def load_seeds():
    loader = importlib.machinery.SourceFileLoader("bench_seeds", str(ROOT / "bench" / "seeds"))
    spec = importlib.util.spec_from_loader("bench_seeds", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def verdict(base, last, wall_s, idle0, idle1, cpus=(0, 1)):
    run, wait, share = rqwait.share(base, {**base, **last})
    others = rqwait.others_share(wall_s, idle0, idle1, list(cpus), run)
    return share, others, rqwait.starved(share, others)


def test_a_healthy_round_is_not_starved():
    # Over 0.5 s on two cpus: the server's thread ran 400 ms and waited 10, a client thread
    # born during the round ran 300 and waited 15; the cpus idled 250 ms between them, so other
    # processes had 0.05 s of the 1 s there was.
    base = {100: (2000 * MS, 50 * MS)}
    last = {100: (2400 * MS, 60 * MS), 200: (300 * MS, 15 * MS)}
    share, others, starved = verdict(base, last, 0.5, {0: 10.0, 1: 20.0}, {0: 10.1, 1: 20.15})
    assert share == pytest.approx(25 / 725)
    assert others == pytest.approx(0.05)
    assert not starved


def test_a_starved_round_is_starved():
    # The case seen on the shared VM: both ends runnable, 5 ms on a cpu and 495 ms waiting each
    # in half a second, the cpus never idle: someone else had them.
    base = {100: (2000 * MS, 50 * MS)}
    last = {100: (2005 * MS, 545 * MS), 200: (5 * MS, 495 * MS)}
    share, others, starved = verdict(base, last, 0.5, {0: 10.0, 1: 20.0}, {0: 10.0, 1: 20.0})
    assert share == pytest.approx(0.99)
    assert others == pytest.approx(0.99)
    assert starved


def test_threads_queueing_behind_each_other_are_not_starved():
    # 8 client threads on cpu 1 and 8 server threads on cpu 0, nobody else on the machine: each
    # thread waits 7/8 of the time (omniORB's 8-thread rate measured 0.78-0.88 on an idle VM),
    # but the measured processes themselves fill both cpus.
    base = {}
    last = {t: (50 * MS, 350 * MS) for t in range(300, 316)}
    share, others, starved = verdict(base, last, 0.4, {0: 1.0, 1: 1.0}, {0: 1.0, 1: 1.0})
    assert share == pytest.approx(0.875)
    assert others == pytest.approx(0.0)
    assert not starved
    # Other processes busy on the cpus, but the measured ones hardly asking for them (asleep,
    # waiting for the network): not starved either.
    last = {100: (40 * MS, 2 * MS)}
    share, others, starved = verdict({}, last, 0.4, {0: 1.0, 1: 1.0}, {0: 1.0, 1: 1.0})
    assert others > 0.9 and share < 0.1 and not starved


def test_others_share_counts_only_the_placements_cpus():
    # Placement "same": both ends on cpu 0, which they filled; cpu 1 busy with someone else.
    o = rqwait.others_share(1.0, {0: 5.0, 1: 5.0}, {0: 5.0, 1: 5.0}, [0], 1000 * MS)
    assert o == pytest.approx(0.0)
    assert rqwait.others_share(1.0, {}, {}, [0], 0) is None
    assert not rqwait.starved(0.99, None) and not rqwait.starved(None, 0.99)


def test_a_reused_thread_id_counts_both_threads():
    base, done = {7: (100 * MS, 10 * MS)}, []
    last = dict(base)
    rqwait.merge(base, last, {7: (150 * MS, 30 * MS)}, done)   # ran 50, waited 20
    rqwait.merge(base, last, {7: (4 * MS, 1 * MS)}, done)      # gone; a new thread, id 7
    run, wait, share = rqwait.share(base, last, done)
    assert (run, wait) == (54 * MS, 21 * MS)


def rounds_of(kernel, memlan, starved_k=(), starved_m=()):
    """Synthetic res['runs'] rounds: one figure, a measured run per mode per round."""
    out = []
    for i, (k, m) in enumerate(zip(kernel, memlan)):
        sched = {mode: [{"figures": ["rate: per_s"], "rq_wait_share": 0.9 if bad else 0.05,
                         "others_cpu_share": 0.9 if bad else 0.05, "starved": bad}]
                 for mode, bad in (("kernel", i in starved_k), ("memlan", i in starved_m))}
        out.append({"kernel": {"rate: per_s": k}, "memlan": {"rate: per_s": m},
                    "load_avg": [1.0, 1.0, 1.0], "sched": sched})
    return out


def summary(seeds, runs):
    res = {"places": ["split"], "runs": runs, "results": {}}
    seeds.summarise(res)
    return res, res["results"]["omniorb"]["split"]["rate: per_s"]


def test_summary_leaves_out_a_pair_with_one_starved_half():
    seeds = load_seeds()
    # Round 2's kernel half starved (collapsed to 2k): out of kernel's median and, with its
    # memlan half, out of the ratios; memlan's own median keeps round 2's memlan figure.
    runs = {"omniorb|split": rounds_of([100.0, 2.0, 120.0], [200.0, 210.0, 300.0], starved_k={1})}
    res, c = summary(seeds, runs)
    assert c["kernel"] == pytest.approx(110.0)
    assert c["memlan"] == pytest.approx(210.0)
    assert c["ratios"] == pytest.approx([2.0, 2.5])
    assert c["ratio"] == pytest.approx(2.25)
    assert c["pairs_left_out"] == 1 and c["starved"]["kernel"] == 1 and c["starved"]["memlan"] == 0
    row = seeds.table(res, "omniorb").splitlines()[-1]
    assert "| 110 | 210 | 2.25× (2.00–2.50) | 1 of 3 (kernel 1) |" in row, row
    # Nothing starved: every round in.
    res, c = summary(seeds, {"omniorb|split": rounds_of([100.0, 2.0], [200.0, 210.0])})
    assert c["kernel"] == pytest.approx(51.0) and len(c["ratios"]) == 2
    assert seeds.table(res, "omniorb").splitlines()[-1].endswith("| none |")
    # A round that measured before starvation was recorded (an old docs/seeds.json): kept.
    old = [{"kernel": {"rate: per_s": 1.0}, "memlan": {"rate: per_s": 3.0}}]
    res, c = summary(seeds, {"omniorb|split": old})
    assert c["ratio"] == pytest.approx(3.0) and c["pairs_left_out"] == 0


def test_a_figure_starved_in_every_round_is_not_measured():
    seeds = load_seeds()
    runs = {"omniorb|split": rounds_of([2.0, 3.0], [200.0, 5.0], starved_k={0, 1}, starved_m={1})}
    res, c = summary(seeds, runs)
    assert c["kernel"] is None and c["ratio"] is None and c["ratios"] == []
    assert c["memlan"] == pytest.approx(200.0)
    row = seeds.table(res, "omniorb").splitlines()[-1]
    assert row == ("| rate: per_s | split | not measured (starved) | 200 | not measured (starved) "
                   "| 2 of 2 (kernel 2, memlan 1) |"), row


def test_watch_follows_threads_and_children():
    if rqwait.available():
        pytest.skip(rqwait.available())
    # A shell whose child sleeps: both are found from the shell's pid, the child counted from
    # zero; the shell says "up" once the child is there.
    p = subprocess.Popen(["sh", "-c", "sleep 30 & echo up; wait"], stdout=subprocess.PIPE,
                         text=True, start_new_session=True)
    try:
        w = rqwait.Watch(cpus=None)
        w.add(p.pid)
        assert p.stdout.readline().strip() == "up"
        m = w.stop()
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    assert m["tasks"] == 2, m
    assert m["rq_wait_share"] is not None and 0 <= m["rq_wait_share"] <= 1
    assert m["others_cpu_share"] is not None and m["starved"] in (True, False)
    assert m["samples"] >= 2 and m["run_ms"] > 0


def test_without_schedstat_it_says_so_once_and_flags_nothing(monkeypatch, capsys):
    seeds = load_seeds()
    monkeypatch.setattr(seeds.rqwait, "available", lambda: "no schedstat here (test)")
    assert seeds.schedstat_check() == "no schedstat here (test)"
    assert capsys.readouterr().out.count("schedstat unavailable") == 1
    meas = []
    with seeds.Measure(meas, "split", os.getpid()) as m:
        m.figures = ["x"]
    assert meas[0]["rq_wait_share"] is None and meas[0]["starved"] is False
    # A process that is not there gives no share either, and no error.
    w = rqwait.Watch(2 ** 22 + 12345)
    assert w.stop()["rq_wait_share"] is None


def test_seeds_records_every_round(tmp_path):
    """One short omniORB round through bench/seeds: each figure's run carries its share, its
    verdict and the load average (only that the fields are there; no timing)."""
    seeds = load_seeds()
    if seeds.seeds.missing("omniorb") or not seeds.seeds.MEMLAN.exists():
        pytest.skip("omniORB (scripts/install-seeds.sh) or build/bin/memlan missing")
    out = tmp_path / "s.json"
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "seeds"), "--quick", "--rounds", "1",
                        "--time", "0.05", "--only", "omniorb", "--no-write", "--json", str(out)],
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["starved_when"] == {"rq_wait_share above": 0.5, "others_cpu_share above": 0.5}
    rnd = res["runs"]["omniorb|split"][0]
    assert len(rnd["load_avg"]) == 3
    for mode in ("kernel", "memlan"):
        figs = [f for m in rnd["sched"][mode] for f in m["figures"]]
        assert sorted(figs) == sorted(rnd[mode]), (figs, rnd[mode])
        for m in rnd["sched"][mode]:
            assert m["rq_wait_share"] is not None and m["starved"] in (True, False)
            assert len(m["load_avg"]) == 3 and m["tasks"] >= 2
    assert "starved rounds left out" in p.stdout
