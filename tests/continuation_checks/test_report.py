"""report.json / cases.parquet / plot from constructed results (no engine)."""

from __future__ import annotations

import json
from pathlib import Path

from continuation_checks.cases import Case
from continuation_checks.engine import Submitted
from continuation_checks.report import write_outputs
from continuation_checks.run import CaseResult
from continuation_checks.verdict import ALL_RUNS, RETAINED_RUNS, classify
from tests.continuation_checks.test_verdict import DIVERGED, TOKENS, baseline, perturbed, state

KEYS = {"case", "boundary", "adopted_depth", "verdict", "first_divergence",
        "margin_at_divergence", "state_bitwise_equal", "state_max_abs_diff"}


def result(i: int, ev, faulted: bool = False) -> CaseResult:
    runs = {}
    for r in ALL_RUNS:
        s = Submitted(f"{i}/{r}", engine_id=f"{i}/{r}-x", token_ids=list(ev.tokens[r]),
                      top2=[(-0.1, -0.1 - 0.01 * (k + 1)) for k in range(len(TOKENS))])
        if r in RETAINED_RUNS:
            s.adopted_depth = ev.adopted_depth[r]
        runs[r] = s
    producers = {r: Submitted(f"{i}/{r}/p") for r in RETAINED_RUNS}
    case = Case(i, 0, tuple(range(16, 316)), ev.boundary, len(TOKENS))
    return CaseResult(case, runs, producers, ev, classify(ev), faulted)


def test_outputs_from_constructed_cases(tmp_path: Path):
    clean = baseline()
    numerics = baseline()
    numerics.tokens["retained"] = list(DIVERGED)
    bad = baseline()
    ref = state()
    from continuation_checks.compare import state_diff

    bad.copy["retained"] = state_diff(perturbed(ref, 0.5), ref)
    results = [result(0, clean), result(1, numerics), result(2, bad, faulted=True)]
    report = write_outputs(tmp_path, results, {"model": "m", "org": "vllm", "dtype": "float32",
                                               "fault": "corrupt-checkpoint"}, {"check_s": 1.0})
    on_disk = json.loads((tmp_path / "report.json").read_text())
    assert on_disk == json.loads(json.dumps(report))
    assert report["summary"] == {"identical": 1, "untreated": 0, "reference-unstable": 0,
                                 "numerics": 1, "state-mismatch": 1, "unexplained": 0}
    assert all(KEYS <= set(c) for c in report["cases"])
    assert (report["model"], report["org"], report["dtype"], report["fault"]) == (
        "m", "vllm", "float32", "corrupt-checkpoint")
    c1 = report["cases"][1]
    assert c1["first_divergence"] == 4 and abs(c1["margin_at_divergence"] - 0.05) < 1e-9
    sup = " ".join(report["explanation"]["supported"])
    assert "state corruption: 1 of 3" in sup and "fault control: 1 of 1" in sup
    assert "batch-variant numerics" in sup  # retained vs retained-alone diverged in case 1
    assert report["margins"]["at_divergence"]["n"] == 1
    import pyarrow.parquet as pq

    rows = pq.read_table(tmp_path / "cases.parquet").to_pylist()
    assert len(rows) == 3 * len(ALL_RUNS)
    assert (tmp_path / "continuation.png").stat().st_size > 1000
    assert not list(tmp_path.glob(".*tmp*"))  # temporaries renamed away
