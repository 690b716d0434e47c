"""Simulated runs through vLLM's real scheduler: outputs, trace, lineage, determinism, CLI,
campaigns (in-process) and resume. One process; vLLM is imported once for the module."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from hybridmem.cli.main import main
from hybridmem.sim.run import SimConfig, run_sim

pytestmark = pytest.mark.vllm
SMALL = dict(requests=16, rate=4.0, max_model_len=2048, cap=8)


@pytest.fixture(scope="module")
def traced_s2(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("s2")
    r = run_sim(SimConfig(org="S2", budget="b12", out=out, trace_dir=out / "trace", **SMALL))
    return r.summary


def test_run_outputs_match_a_real_runs(traced_s2: dict) -> None:
    out = Path(traced_s2["config"]["out"])
    assert {p.name for p in out.iterdir()} >= {"results.parquet", "summary.json",
                                                "workload.json", "trace"}
    t = pq.read_table(out / "results.parquet").to_pydict()
    assert traced_s2["completed"] == traced_s2["requests"] == 16
    assert t["output_tokens"] == t["max_output_tokens"]  # synthetic tokens: exact targets
    assert all(e >= f > 0 for e, f in zip(t["e2e_s"], t["ttft_s"], strict=True))
    assert traced_s2["throughput_tok_s"] > 0 and traced_s2["simulated"] is True
    assert traced_s2["grid_tokens"] == 512 and traced_s2["block_tokens"] == 512
    assert traced_s2["org_plan"]["capacity"]["pages"] == 37  # b12 -> round(12 u a / 512 KiB)


def test_trace_accepted_and_lineage_sql_equals_replay(traced_s2: dict) -> None:
    from lineage.report import analyse
    from lineage.source import open_run

    assert traced_s2["trace_verdict"]["accepted"] is True
    rep = analyse(open_run(traced_s2["trace_path"]))
    a = rep.agreement
    assert a.complete and a.episodes == a.agree >= 16
    # negative control: a trace cut short is not accepted
    src = Path(traced_s2["trace_path"])
    cut = src.with_name("cut.hmt")
    cut.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    from hybridmem.engines.trace_sink import verify_trace

    assert verify_trace(cut)["accepted"] is False


def test_stock_manager_traced(tmp_path: Path) -> None:
    s = run_sim(SimConfig(org="vllm", budget="b12", out=tmp_path, trace_dir=tmp_path / "t",
                          **SMALL)).summary
    assert s["trace_verdict"]["accepted"] and s["completed"] == 16
    assert s["block_tokens"] == 1568 and s["num_blocks"] == 12


def test_an_untraced_org_run_hands_back_its_process_state(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """An organization's scheduler activates a process-global state table; the run must end
    its life (shutdown) even untraced, or a later real engine in this process finds the sim's
    table in its forward hook (test_vllm_run after this module failed that way)."""
    from hybridmem.vllm_plugin import org_scheduler, state_table

    seen: list[object] = []
    real = org_scheduler.activate_state_table
    monkeypatch.setattr(org_scheduler, "activate_state_table",
                        lambda t: (seen.append(t), real(t))[1])
    run_sim(SimConfig(org="S2", budget="b12", out=tmp_path, **SMALL))
    assert len(seen) == 2 and seen[0] is not None  # activated (not vacuous) ...
    assert seen[1] is None and state_table.active() is None  # ... and handed back


def test_deterministic_per_seed(tmp_path: Path) -> None:
    def run(seed: int, name: str) -> dict:
        return run_sim(SimConfig(org="S1", budget="b12", seed=seed, out=tmp_path / name,
                                 **SMALL)).summary

    a, b, c = run(3, "a"), run(3, "b"), run(4, "c")
    keys = ("throughput_tok_s", "e2e_p99", "preemptions", "prefix_hit_tokens", "steps")
    assert {k: a[k] for k in keys} == {k: b[k] for k in keys}
    assert {k: a[k] for k in keys} != {k: c[k] for k in keys}  # negative control


def test_d0_runs_at_its_native_geometry(tmp_path: Path) -> None:
    """D0 in the simulator: 16-token blocks, its 1,792-token interval, Table B-2's units at
    b63; the trace is accepted. Control: ``--grid 512`` converts it (512 / 2,048)."""
    s = run_sim(SimConfig(org="D0", budget="b63", requests=8, rate=4.0, cap=8, out=tmp_path / "n",
                          trace_dir=tmp_path / "n" / "trace")).summary
    assert s["completed"] == 8 and s["trace_verdict"]["accepted"]
    assert (s["block_tokens"], s["grid_tokens"]) == (16, 1792)
    plan = s["org_plan"]
    assert (plan["attention_grid_tokens"], plan["recurrent_grid_tokens"]) == (16, 1792)
    assert plan["capacity"] == {"attention_units": 3256, "recurrent_units": 29}
    assert s["num_blocks"] == plan["num_block_ids"] == 3286
    coarse = run_sim(SimConfig(org="D0", budget="b63", requests=8, rate=4.0, cap=8, grid=512,
                               out=tmp_path / "c")).summary
    assert (coarse["block_tokens"], coarse["grid_tokens"]) == (512, 2048)


@pytest.mark.parametrize("org", ["S0", "S2", "D0"])
def test_organizations_on_granite(tmp_path: Path, org: str) -> None:
    s = run_sim(SimConfig(model="granite-4.0-h-micro", org=org, budget="b24",
                          out=tmp_path, **SMALL)).summary
    assert s["completed"] == 16
    if org == "S2":
        assert s["org_plan"]["capacity"]["pages"] > 0


@pytest.mark.parametrize("argv, word", [
    (["--rate", "nan"], "rate"),
    (["--share", "2"], "share"),
    (["--requests", "0"], "requests"),
    (["--headroom", "1.0"], "headroom"),
    (["--budget", "bx"], "budget"),
    (["--model", "/no/such/dir"], "/no/such/dir"),
    (["--cost", "mfu=2"], "mfu"),
    (["--grid", "500", "--org", "S2"], "grid"),
    (["--org", "vllm", "--headroom", "0.1"], "organization policies"),
])
def test_cli_rejects_bad_input_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           argv: list[str], word: str) -> None:
    assert main(["sim", "--out", str(tmp_path / "o"), "--quiet", "--no-trace", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and word in err


def test_cli_run_and_calibrate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert main(["sim", "--org", "S1", "--budget", "b12", "--requests", "12", "--cap", "8",
                 "--max-model-len", "2048", "--step-log", "--quiet", "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["completed"] == 12 and printed["trace_verdict"]["accepted"]
    fit_path = tmp_path / "fit.json"
    assert main(["sim", "calibrate", str(out / "steps.parquet"), "--org", "S1", "--json",
                 "--out", str(fit_path)]) == 0
    fit = json.loads(fit_path.read_text())
    assert fit["rmse_s"] < 1e-6  # the simulated steps are the model's own: an exact fit
    assert main(["sim", "calibrate", str(out / "results.parquet")]) == 2  # wrong columns


def _spec(tmp_path: Path, seeds: str = "[0, 1]", contrast: bool = True) -> Path:
    p = tmp_path / "c.toml"
    text = f"""
[campaign]
name = "t"
requests = 10
max_model_len = 2048
[grid]
org = ["S1", "S2"]
budget = ["b16"]
rate = [4.0]
cap = [8]
seeds = {seeds}
"""
    if contrast:  # a paired contrast needs two seeds
        text += """[[contrast]]
name = "S2/S1"
num = {org = "S2"}
den = {org = "S1"}
"""
    p.write_text(text)
    return p


def test_campaign_in_process_resume_and_stats(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "camp"
    spec = _spec(tmp_path)
    assert main(["campaign", str(spec), "--out", str(out), "--no-plots"]) == 0
    first = capsys.readouterr()
    assert "4 to run" in first.err
    rows = pq.read_table(out / "runs.parquet").to_pylist()
    assert len(rows) == 4 and {r["org"] for r in rows} == {"S1", "S2"}
    stats = json.loads((out / "stats.json").read_text())
    assert stats[0]["contrast"] == "S2/S1" and stats[0]["n"] == 2
    cells = sorted((out / "cells").iterdir())
    stamps = {p.name: (p / "summary.json").stat().st_mtime_ns for p in cells}
    # resume: nothing reruns (the figures are drawn from the stored cells) ...
    assert main(["campaign", str(spec), "--out", str(out)]) == 0
    assert "0 to run" in capsys.readouterr().err
    assert list((out / "figures").glob("fig2_*.png"))
    assert stamps == {p.name: (p / "summary.json").stat().st_mtime_ns for p in cells}
    # ... and (negative control) a removed cell and a new seed are exactly what runs
    import shutil

    shutil.rmtree(cells[0])
    assert main(["campaign", str(_spec(tmp_path, "[0, 1, 2]")), "--out", str(out),
                 "--no-plots"]) == 0
    assert "3 to run" in capsys.readouterr().err
    assert len(pq.read_table(out / "runs.parquet")) == 6


@pytest.fixture(scope="module")
def worker_campaign(traced_s2: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Seed 0 of the spec (2 cells, no contrast yet) on two local worker processes, figures
    drawn. The workers are fresh processes that import vLLM; ``traced_s2`` (an in-process run)
    has already written vLLM's model-class info to the session's VLLM_CACHE_ROOT, so they skip
    vLLM's inspection subprocess (tests/conftest.py)."""
    root = tmp_path_factory.mktemp("camp2")
    assert main(["campaign", str(_spec(root, "[0]", contrast=False)), "--out", str(root / "out"),
                 "--workers", "2"]) == 0
    return root


@pytest.mark.slow  # ~50 s (two worker processes each import vLLM): the default suite's
# 10-minute budget; the in-process campaign above covers the cells, resume and figures
def test_campaign_two_local_workers(worker_campaign: Path) -> None:
    out = worker_campaign / "out"
    rows = pq.read_table(out / "runs.parquet").to_pylist()
    assert sorted(r["org"] for r in rows) == ["S1", "S2"] and {r["seed"] for r in rows} == {0}
    assert all(r["completed"] == 10 for r in rows)
    assert list((out / "figures").glob("fig2_*.png"))


@pytest.mark.slow  # ~23 s (a Ray instance and a worker importing vLLM): the default suite's
# 10-minute budget; the local-worker campaign above covers the same cells without Ray
def test_campaign_on_local_ray_resumes_the_worker_campaign(
        worker_campaign: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A local Ray instance (one CPU: one worker process imports vLLM once) resumes the local
    workers' campaign with a second seed: only seed 1's two cells run, as Ray tasks; the
    finished cells are untouched; runs.parquet holds all four, and the stats pair both seeds."""
    pytest.importorskip("ray")
    out = worker_campaign / "out"
    cells = sorted(p for p in (out / "cells").iterdir() if p.is_dir())
    stamps = {p.name: (p / "summary.json").stat().st_mtime_ns for p in cells}
    capsys.readouterr()
    assert main(["campaign", str(_spec(worker_campaign, "[0, 1]")), "--out", str(out),
                 "--ray", "local", "--workers", "1", "--no-plots"]) == 0
    err = capsys.readouterr().err
    assert "2 to run on Ray local" in err and err.count("/2 Ray ") == 2, err
    assert stamps == {p.name: (p / "summary.json").stat().st_mtime_ns for p in cells}
    rows = pq.read_table(out / "runs.parquet").to_pylist()
    assert sorted((r["seed"], r["org"]) for r in rows) == [(0, "S1"), (0, "S2"), (1, "S1"),
                                                           (1, "S2")]
    assert all(r["completed"] == 10 for r in rows)
    stats = json.loads((out / "stats.json").read_text())
    assert stats[0]["contrast"] == "S2/S1" and stats[0]["n"] == 2
