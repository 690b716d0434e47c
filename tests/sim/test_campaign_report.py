"""The nine questions' specs, the paper-figure entries and the verdict rule (no vLLM needed)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hybridmem.errors import HybridMemError
from hybridmem.sim import schedulers
from hybridmem.sim.campaign_paper import PaperFigure, verdict
from hybridmem.sim.campaign_report import evaluate
from hybridmem.sim.campaign_spec import Contrast, load_spec

ROOT = Path(__file__).resolve().parents[2]
QUESTIONS = {
    "q1_exp1a.toml": ("Q1", 4 * 3 * 12), "q1_exp1b_lowload.toml": ("Q1", 3 * 2 * 3),
    "q2_recorded_work.toml": ("Q2", 3 * 3 + 3 * 3 + 3 * 12),
    "q3_sharing.toml": ("Q3", 4 * 3 * 12), "q4_budget.toml": ("Q4", 5 * 3 * 12),
    "q5_load.toml": ("Q5", 3 * (4 * 3 + 6 + 4 * 3 + 6 + 9)),
    "q6_headroom.toml": ("Q6", 2 * 3 * 5 * 12), "q7_joint_reuse.toml": ("Q7", 2 * 2 * 2 * 3),
    "q8_retention.toml": ("Q8", 2 * 3), "q9_retention_confirm.toml": ("Q9", 2 * 2 * 6),
}


@pytest.mark.parametrize("name", sorted(QUESTIONS))
def test_every_question_spec_parses_with_paper_figures(name: str) -> None:
    spec = load_spec(ROOT / "campaigns" / name)
    question, cells = QUESTIONS[name]
    assert spec.question == question
    assert len(spec.cells) == cells
    assert spec.paper, "every question names the paper's figures it is read against"
    ids = [spec.cell_id(c) for c in spec.cells]
    assert len(set(ids)) == len(ids)
    for cell in spec.cells:
        if cell.org == "vllm":
            assert cell.headroom == 0 and not cell.retention


def test_the_specs_use_the_papers_settings() -> None:
    q1 = load_spec(ROOT / "campaigns" / "q1_exp1a.toml")
    assert {c.share for c in q1.cells} == {1.0} and {c.pin_k for c in q1.cells} == {2}
    assert {c.org for c in q1.cells} == {"S0", "S1", "S2", "vllm"}
    q1b = load_spec(ROOT / "campaigns" / "q1_exp1b_lowload.toml")
    assert {(c.budget, c.cap) for c in q1b.cells} == {("b63", 63), ("b108", 109)}
    q2 = load_spec(ROOT / "campaigns" / "q2_recorded_work.toml")
    control = [c for c in q2.cells if c.share == 0.0]
    assert {(c.budget, c.rate, c.cap) for c in control} == {("b83", 3.0, 63)}
    assert {c.seed for c in control} == set(range(42000, 42012))
    q5 = load_spec(ROOT / "campaigns" / "q5_load.toml")
    assert {(c.budget, c.cap) for c in q5.cells} == {("b63", 63), ("b108", 109)}
    assert {c.seed for c in q5.cells if c.budget == "b108" and c.rate == 4.5} == set(range(9))
    q6 = load_spec(ROOT / "campaigns" / "q6_headroom.toml")
    assert {c.pin_k for c in q6.cells} == {1}
    q7 = load_spec(ROOT / "campaigns" / "q7_joint_reuse.toml")
    assert {c.trace for c in q7.cells} == {True, False} and q7.level == 0.90
    assert {c.seed for c in q7.cells} == {76600, 76601, 76602}
    q8 = load_spec(ROOT / "campaigns" / "q8_retention.toml")
    assert all(c.trace and c.budget == "b83" and c.headroom == 0 for c in q8.cells)
    q9 = load_spec(ROOT / "campaigns" / "q9_retention_confirm.toml")
    assert {(c.retention, c.isolate) for c in q9.cells} == {(False, False), (False, True),
                                                             (True, False), (True, True)}
    assert {c.seed for c in q9.cells} == set(range(88001, 88007))


def test_kept_cells_keep_their_ids() -> None:
    """The kept Q6 campaign's cell ids are the spec's: the axes added later (chunking, trace)
    enter a cell's id only when set; setting one, or dropping pinning, changes every id
    (negative controls)."""
    import pyarrow.parquet as pq

    spec_text = (ROOT / "campaigns" / "q6_headroom.toml").read_text()
    kept = {r["cell_id"] for r in pq.read_table(
        ROOT / "campaigns" / "results" / "q6_headroom" / "runs.parquet").to_pylist()}
    spec = load_spec(ROOT / "campaigns" / "q6_headroom.toml")
    assert {spec.cell_id(c) for c in spec.cells} == kept
    assert not {spec.cell_id(replace(c, trace=True)) for c in spec.cells} & kept
    assert not {spec.cell_id(replace(c, pin_k=None)) for c in spec.cells} & kept
    assert "pin_k = [1]" in spec_text


def _spec(tmp_path: Path, grid: str, extra: str = "") -> Path:
    p = tmp_path / "s.toml"
    p.write_text(f"[campaign]\nrequests = 6\n{grid}\n{extra}")
    return p


@pytest.mark.parametrize("grid, match", [
    ('[grid]\norg = ["vllm"]\nheadroom = [0.1]\nseeds = [0]', "no admission headroom"),
    ('[grid]\norg = ["vllm", "S2"]\nretention = [true]\nseeds = [0]', "no admission headroom"),
    ('[grid]\ntrace = ["yes"]\nseeds = [0]', "trace"),
    ('[[grid]]\nseeds = [0]\n[[grid]]\nbogus = 1\nseeds = [0]', "grid #2"),
])
def test_bad_grids(tmp_path: Path, grid: str, match: str) -> None:
    with pytest.raises(HybridMemError, match=match):
        load_spec(_spec(tmp_path, grid))


def test_vllm_arm_with_pinning_grid_is_accepted(tmp_path: Path) -> None:
    spec = load_spec(_spec(tmp_path, '[grid]\norg = ["S2", "vllm"]\npin_k = [2]\nseeds = [0]'))
    assert {(c.org, c.pin_k, c.headroom) for c in spec.cells} == {("S2", 2, 0.0),
                                                                 ("vllm", 2, 0.0)}


def test_grid_union_runs_a_repeated_cell_once(tmp_path: Path) -> None:
    spec = load_spec(_spec(tmp_path, '[[grid]]\norg = ["S1", "S2"]\nseeds = [0]\n'
                                     '[[grid]]\norg = ["S2"]\nbudget = ["b108"]\ncap = [109]\n'
                                     'seeds = [0]\n[[grid]]\norg = ["S2"]\nseeds = [0]'))
    assert [(c.org, c.budget, c.cap) for c in spec.cells] == [
        ("S1", "b63", 63), ("S2", "b63", 63), ("S2", "b108", 109)]


def test_chunking_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without ``schedulers.CHUNKINGS`` only the omitted key ("default") is accepted; with it, names
    are validated against it, and every arm of a contrast pairs within one split."""
    # the split names here are made up: the simulator's own preflight (which would refuse
    # them) is out of this test's scope
    import hybridmem.sim.campaign_spec as campaign_spec

    monkeypatch.setattr(campaign_spec, "preflight", lambda spec, where: None)
    monkeypatch.delattr(schedulers, "CHUNKINGS", raising=False)
    base = load_spec(_spec(tmp_path, '[grid]\norg = ["S2"]\nseeds = [0]'))
    assert base.cells[0].chunking is None
    with pytest.raises(HybridMemError, match="names no prefill splits"):
        load_spec(_spec(tmp_path, '[grid]\nchunking = ["block"]\nseeds = [0]'))
    monkeypatch.setattr(schedulers, "CHUNKINGS", ("block", "grid"), raising=False)
    spec = load_spec(_spec(tmp_path, '[grid]\norg = ["S2", "D0"]\nchunking = ["block", "grid"]'
                                     '\nseeds = [0]'))
    assert {c.chunking for c in spec.cells} == {"block", "grid"}
    assert spec.cell_id(spec.cells[0]) != base.cell_id(base.cells[0])
    with pytest.raises(HybridMemError, match="not a prefill split"):
        load_spec(_spec(tmp_path, '[grid]\nchunking = ["nope"]\nseeds = [0]'))
    from hybridmem.sim.campaign_stats import analyse

    rows = [{"org": c.org, "budget": c.budget, "rate": c.rate, "cap": c.cap,
             "headroom": c.headroom, "pin_k": -1, "retention": False, "share": c.share,
             "isolate": False, "chunking": c.chunking, "trace": False, "seed": s,
             "throughput_tok_s": (110.0 if c.org == "D0" else 100.0)
             * (2.0 if c.chunking == "grid" else 1.0) + s}
            for c in spec.cells for s in (0, 1)]
    tests = analyse(rows, (Contrast("D0/S2", {"org": "D0"}, {"org": "S2"}),),
                    ("throughput_tok_s",), 0.95)
    assert sorted(t["stratum"]["chunking"] for t in tests) == ["block", "grid"]
    assert all(9 < t["mean_relative_pct"] < 11 for t in tests)  # never across splits


# --- the verdict rule ------------------------------------------------------------------------

@pytest.mark.parametrize("paper, sim, ci, interval, expected", [
    (4.978, 3.2, (2.0, 4.4), None, "reproduces"),            # same sign, within 5 points
    (4.978, 12.0, (10.0, 14.0), None, "direction only"),     # same sign, 7 points off
    (14.30, 25.0, (5.0, 40.0), (-0.1, 30.8), "reproduces"),  # inside the paper's interval
    (4.978, -27.7, (-30.0, -25.0), None, "contradicts"),     # D0 sized in grid units
    (13.6, -13.1, (-15.0, -11.0), None, "contradicts"),
    (4.978, -1.0, (-3.0, 1.0), None, "inconclusive"),        # opposite sign, CI spans 0
    (4.978, -1.0, None, None, "inconclusive"),               # one seed: no interval
    (0.0, 0.4, (0.0, 1.0), None, "reproduces"),
    (0.0, 9.0, (8.0, 10.0), None, "differs"),
])
def test_verdict_rule(paper: float, sim: float, ci: tuple[float, float] | None,
                      interval: tuple[float, float] | None, expected: str) -> None:
    assert verdict("effect", paper, sim, ci, 5.0, interval) == expected


def test_verdict_values_bounds_and_not_modelled() -> None:
    assert verdict("value", 190.0, 205.0, None, 10.0) == "reproduces"
    assert verdict("value", 190.0, 250.0, None, 10.0) == "differs"
    assert verdict("value", 0.0, 140.0, None, 0.5) == "differs"  # preemptions at q = 0
    assert verdict("within", None, 0.5, (-1.0, 2.0), 0, (-3.0, 3.0)) == "reproduces"
    assert verdict("within", None, 0.5, (-1.0, 4.0), 0, (-3.0, 3.0)) == "differs"
    assert verdict("not_modelled", None, None, None, 0) == "not modelled"
    assert verdict("effect", 5.0, float("nan"), None, 5.0) == "no data"


# --- the simulated figure from seed-paired cells ----------------------------------------------

def _row(seed: int, **kw: Any) -> dict[str, Any]:
    base = {"org": "S2", "budget": "b83", "rate": 3.0, "cap": 63, "headroom": 0.0, "pin_k": 1,
            "retention": False, "share": 1.0, "isolate": False, "chunking": "default",
            "trace": False, "seed": seed, "preemptions": 0.0}
    base.update(kw)
    return base


# Table G-5 of the paper: ledger throughput, seeds 88001-88006 (ISOLATE S2, Ret; SHARE S2, Ret)
G5 = {88001: (367.534, 369.327, 522.152, 560.830), 88002: (381.056, 381.056, 498.836, 715.722),
      88003: (374.522, 374.522, 529.497, 568.719), 88004: (384.449, 384.449, 477.648, 583.793),
      88005: (376.463, 374.636, 571.667, 571.667), 88006: (345.845, 363.490, 487.973, 565.429)}


def _g5_rows(g5: dict[int, tuple[float, ...]]) -> list[dict[str, Any]]:
    rows = []
    for s, vals in g5.items():
        for (iso, ret), v in zip(((True, False), (True, True), (False, False), (False, True)),
                                 vals, strict=True):
            rows.append(_row(s, isolate=iso, retention=ret, throughput_ledger_tok_s=v))
    return rows


def test_q9_kret_reproduces_table_g7_from_table_g5() -> None:
    """The report's interaction on the paper's own per-seed values gives Table G-7's K_ret and
    interval; with one seed's SHARE pair swapped (a fault), it no longer does."""
    spec = load_spec(ROOT / "campaigns" / "q9_retention_confirm.toml")
    kret = next(f for f in spec.paper if f.kind == "interaction"
                and f.metric == "throughput_ledger_tok_s")
    share = next(f for f in spec.paper if f.kind == "effect" and f.where == {"isolate": False}
                 and f.metric == "throughput_ledger_tok_s")
    contrasts = {c.name: c for c in spec.contrasts}
    (r,) = evaluate(kret, _g5_rows(G5), contrasts, spec.level)
    assert r.n == 6 and r.sim == pytest.approx(14.3043, abs=1e-3)
    assert r.ci == pytest.approx((-0.1057, 30.7930), abs=1e-3)
    assert r.verdict == "reproduces"
    (d,) = evaluate(share, _g5_rows(G5), contrasts, spec.level)
    assert d.sim == pytest.approx(15.2563, abs=1e-3)
    assert d.ci == pytest.approx((0.7993, 31.7867), abs=1e-3)
    bad = dict(G5)
    i2, r2, s2, ret2 = G5[88002]
    bad[88002] = (i2, r2, ret2, s2)  # SHARE arms swapped
    (r_bad,) = evaluate(kret, _g5_rows(bad), contrasts, spec.level)
    assert r_bad.sim != pytest.approx(14.3043, abs=1.0)


def _pair_rows(effect: float, seeds: range, preempt: float = 0.0) -> list[dict[str, Any]]:
    rows = []
    for s in seeds:
        rows.append(_row(s, org="S2", budget="b63", throughput_tok_s=400.0 + s,
                         preemptions=preempt))
        rows.append(_row(s, org="D0", budget="b63",
                         throughput_tok_s=(400.0 + s) * (1 + effect / 100) * (1 + 0.001 * s),
                         preemptions=2 * preempt))
    return rows


def test_effect_verdicts_on_constructed_cells() -> None:
    fig = PaperFigure(ref="§5.3", what="D0/S2, b63", kind="effect", contrast="D0/S2",
                      where={"budget": "b63"}, value=4.978)
    c = {"D0/S2": Contrast("D0/S2", {"org": "D0"}, {"org": "S2"})}
    (good,) = evaluate(fig, _pair_rows(3.2, range(12), preempt=100.0), c, 0.95)
    assert good.verdict == "reproduces" and good.n == 12
    assert 3.2 < good.sim < 4.0 and good.ci is not None and good.ci[0] > 0
    assert (good.preempt_num, good.preempt_den) == (200.0, 100.0)
    # negative control: D0 sized in grid units (D0/S2 -27.7%) contradicts the paper
    (bad,) = evaluate(fig, _pair_rows(-27.7, range(12)), c, 0.95)
    assert bad.verdict == "contradicts" and bad.sim < -27
    far = evaluate(replace(fig, value=40.0), _pair_rows(3.2, range(12)), c, 0.95)[0]
    assert far.verdict == "direction only"


def test_values_differences_and_missing_cells() -> None:
    rows = [_row(s, org=o, throughput_tok_s=t + s, preemptions=p,
                 lineage_j_adopt=j + 10 * s)
            for s in range(3) for o, t, p, j in (("S0", 290.0, 0.0, 100.0),
                                                 ("S2", 410.0, 0.0, 900.0))]
    c = {"S2/S0": Contrast("S2/S0", {"org": "S2"}, {"org": "S0"})}
    val = PaperFigure(ref="G-1", what="S0 tok/s", kind="value", where={"org": "S0"},
                      value=293.836, tolerance=10.0)
    (v,) = evaluate(val, rows, c, 0.95)
    assert v.sim == pytest.approx(291.0) and v.verdict == "reproduces" and v.n == 3
    pre = PaperFigure(ref="G-1", what="preemptions", kind="value", where={"org": "S2"},
                      metric="preemptions", value=0.0, tolerance=0.5)
    assert evaluate(pre, rows, c, 0.95)[0].verdict == "reproduces"
    rows_pre = [dict(r, preemptions=150.0) for r in rows]
    assert evaluate(pre, rows_pre, c, 0.95)[0].verdict == "differs"
    diff = PaperFigure(ref="G-4", what="dJ", kind="difference", contrast="S2/S0",
                       metric="lineage_j_adopt", value=800.0, tolerance=50.0)
    (d,) = evaluate(diff, rows, c, 0.95)
    assert d.sim == pytest.approx(800.0) and d.verdict == "reproduces"
    none = evaluate(replace(val, where={"org": "D0"}), rows, c, 0.95)[0]
    assert none.verdict == "no data"
    nm = PaperFigure(ref="G.3", what="ledger", kind="not_modelled", reason="no runner")
    assert evaluate(nm, rows, c, 0.95)[0].verdict == "not modelled"
    assert math.isnan(float("nan"))


def test_pct_interaction_in_points() -> None:
    """Q3's endpoint interaction: per seed, the q = 1 effect minus the q = 0 effect (points)."""
    rows = []
    for s in range(12):
        for q, eff in ((0.0, 0.38), (1.0, 0.48)):
            rows.append(_row(s, org="S0", share=q, throughput_tok_s=300.0 + s))
            rows.append(_row(s, org="S1", share=q, throughput_tok_s=(300.0 + s) * (1 + eff)))
    c = {"S1/S0": Contrast("S1/S0", {"org": "S1"}, {"org": "S0"})}
    fig = PaperFigure(ref="Fig. 4", what="S1/S0 q1-q0", kind="interaction", contrast="S1/S0",
                      across=("share", 1.0, 0.0), value=9.623)
    (r,) = evaluate(fig, rows, c, 0.95)
    assert r.sim == pytest.approx(10.0) and r.verdict == "reproduces"
    assert evaluate(replace(fig, value=-9.623), rows, c, 0.95)[0].verdict == "contradicts"


# --- the campaign process does not wait on a lingering worker ---------------------------------

def _linger_at_exit() -> None:
    import atexit
    import time

    atexit.register(time.sleep, 60)  # stands in for a library's slow teardown


def _one() -> int:
    return 1


def test_pool_close_does_not_wait_on_a_lingering_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker whose interpreter teardown takes a minute is terminated after the grace period
    (its results are in); the campaign returns in seconds, not minutes."""
    import time
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from hybridmem.sim import campaign_run

    monkeypatch.setattr(campaign_run, "WORKER_EXIT_GRACE_S", 1.0)
    pool = ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn"),
                               initializer=_linger_at_exit)
    assert pool.submit(_one).result(timeout=120) == 1
    procs = list(pool._processes.values())  # type: ignore[attr-defined]
    t0 = time.monotonic()
    campaign_run._close_pool(pool)
    assert time.monotonic() - t0 < 20
    assert procs and not any(p.is_alive() for p in procs)
    # the worker really lingers: it was terminated, not exited (SIGTERM exit code)
    assert all(p.exitcode is not None and p.exitcode < 0 for p in procs)


def test_report_over_a_campaign_run_before_its_paper_entries(tmp_path: Path) -> None:
    """``--spec`` supplies the question and paper figures of a directory whose campaign.json has
    none (the kept campaigns); a spec naming no given campaign is an error."""
    import json

    from hybridmem.sim.campaign_report import write_report
    from hybridmem.sim.campaign_run import write_runs

    camp = tmp_path / "camp"
    camp.mkdir()
    write_runs(camp, _pair_rows(3.2, range(6), preempt=10.0))
    (camp / "campaign.json").write_text(json.dumps({
        "name": "old", "fixed": {"model": "falcon-h1-7b", "device": "a100-40gb", "cost": {},
                                 "requests": 300},
        "contrasts": [{"name": "D0/S2", "num": {"org": "D0"}, "den": {"org": "S2"}}]}))
    spec = tmp_path / "old.toml"
    spec.write_text('[campaign]\nname = "old"\nquestion = "Q4"\n[grid]\norg = ["D0", "S2"]\n'
                    'seeds = [0]\n[[contrast]]\nname = "D0/S2"\nnum = {org = "D0"}\n'
                    'den = {org = "S2"}\n[[paper]]\nref = "§5.3"\nwhat = "D0/S2, b63"\n'
                    'kind = "effect"\ncontrast = "D0/S2"\nwhere = {budget = "b63"}\n'
                    'value = 4.978\n')
    bare, _ = write_report([camp], None, None, plots=False)
    assert "| Q" not in bare.split("## Table")[1].split("## What")[0].replace("| Q |", "")
    text, _ = write_report([camp], tmp_path / "r.md", None, plots=False, specs=[spec])
    line = next(s for s in text.splitlines() if s.startswith("| Q4 |"))
    assert "+4.98%" in line and "| reproduces |" in line and "| 12 |" not in line
    assert "?; 20.0 / 10.0" in line
    other = tmp_path / "other.toml"
    other.write_text(spec.read_text().replace('name = "old"', 'name = "new"'))
    with pytest.raises(HybridMemError, match="no campaign directory of that name"):
        write_report([camp], None, None, plots=False, specs=[other])
