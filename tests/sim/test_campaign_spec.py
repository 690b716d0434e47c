"""Campaign specs and the paired statistics over runs.parquet (no vLLM needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridmem.errors import HybridMemError
from hybridmem.sim.campaign_run import write_runs
from hybridmem.sim.campaign_spec import load_spec
from hybridmem.sim.campaign_stats import analyse, load_runs

ROOT = Path(__file__).resolve().parents[2]


def test_shipped_specs_parse() -> None:
    q1 = load_spec(ROOT / "campaigns" / "q1_exp1a.toml")
    assert len(q1.cells) == 4 * 3 * 12
    assert {c.seed for c in q1.cells} == set(range(42000, 42012))
    assert [c.name for c in q1.contrasts] == ["S1/S0", "S2/S1", "S2/vllm"]
    assert len(load_spec(ROOT / "campaigns" / "q5_load.toml").cells) == 3 * (2 * 4 * 3 + 6 + 6
                                                                             + 9)
    assert len(load_spec(ROOT / "campaigns" / "q6_headroom.toml").cells) == 2 * 3 * 5 * 12
    ids = [q1.cell_id(c) for c in q1.cells]
    assert len(set(ids)) == len(ids)
    assert q1.cell_id(q1.cells[0]) == load_spec(ROOT / "campaigns" / "q1_exp1a.toml").cell_id(
        q1.cells[0])


@pytest.mark.parametrize("body, match", [
    ('[grid]\norg = ["S9"]\nseeds = [0]', "unknown organization"),
    ("[grid]\nseeds = [0, 0]", "duplicates"),
    ("[grid]\nrate = [nan]\nseeds = [0]", "rate"),
    ("[grid]\nshare = [1.5]\nseeds = [0]", "share"),
    ('[grid]\npin_k = [4]\nseeds = [0]', "pin_k"),
    ("[grid]\norg = [\"S1\"]", "needs seeds"),
    ("[grid]\nseeds = [0]\nbogus = 1", "unknown"),
    ('[grid]\nseeds = [0]\n[[contrast]]\nname = "x"\nnum = {org = "S1"}\n'
     'den = {budget = "b63"}', "same factors"),
])
def test_bad_specs_are_one_line_errors(tmp_path: Path, body: str, match: str) -> None:
    p = tmp_path / "bad.toml"
    p.write_text(body)
    with pytest.raises(HybridMemError, match=match):
        load_spec(p)


def _rows(effect: float, seeds: range, flip: int | None = None) -> list[dict[str, object]]:
    rows = []
    for s in seeds:
        for org, tput in (("S1", 100.0 + s), ("S2", (100.0 + s) * (1 + effect))):
            if flip is not None and s == flip and org == "S2":
                tput = (100.0 + s) * (1 - effect)
            rows.append({"cell_id": f"{org}-{s}", "org": org, "budget": "b63", "rate": 3.0,
                         "cap": 63, "headroom": 0.0, "pin_k": -1, "retention": False,
                         "share": 0.5, "isolate": False, "seed": s, "throughput_tok_s": tput})
    return rows


def test_stats_over_runs_parquet(tmp_path: Path) -> None:
    spec = tmp_path / "s.toml"
    spec.write_text('[grid]\norg = ["S1", "S2"]\nseeds = {start = 0, count = 12}\n'
                    '[[contrast]]\nname = "S2/S1"\nnum = {org = "S2"}\nden = {org = "S1"}\n')
    contrasts = load_spec(spec).contrasts
    runs = write_runs(tmp_path, _rows(0.10, range(12)))
    tests = analyse(load_runs(runs), contrasts, ("throughput_tok_s",), 0.95)
    (t,) = tests
    assert t["n"] == 12 and t["positive_seeds"] == 12
    assert t["mean_relative_pct"] == pytest.approx(10.0)
    assert t["sign_flip_p"] == pytest.approx(2 / 4096)
    assert t["ci_low_pct"] == pytest.approx(10.0) and t["ci_high_pct"] == pytest.approx(10.0)
    # negative control: one seed reversed changes the effect and the p value
    tests2 = analyse(_rows(0.10, range(12), flip=3), contrasts, ("throughput_tok_s",), 0.95)
    assert tests2[0]["sign_flip_p"] > 2 / 4096
    assert tests2[0]["mean_relative_pct"] < 10.0


def test_unpaired_seeds_are_an_error(tmp_path: Path) -> None:
    spec = tmp_path / "s.toml"
    spec.write_text('[grid]\norg = ["S1", "S2"]\nseeds = [0, 1, 2]\n'
                    '[[contrast]]\nname = "S2/S1"\nnum = {org = "S2"}\nden = {org = "S1"}\n')
    rows = [r for r in _rows(0.1, range(3)) if not (r["org"] == "S2" and r["seed"] == 2)]
    with pytest.raises(HybridMemError, match="not paired"):
        analyse(rows, load_spec(spec).contrasts, ("throughput_tok_s",), 0.95)


def test_a_failed_cell_leaves_its_traceback_and_no_tmp_folder(tmp_path, monkeypatch):
    from hybridmem.sim import campaign_run
    from hybridmem.sim import run as sim_run
    from hybridmem.sim.campaign_spec import load_spec

    spec_path = tmp_path / "s.toml"
    spec_path.write_text('[campaign]\nrequests = 5\n[grid]\norg = ["S2"]\nseeds = [1]\n')
    spec = load_spec(spec_path)
    seen = []

    def half_written(cfg):
        (cfg.out / "partial").parent.mkdir(parents=True)
        (cfg.out / "partial").write_text("x")
        seen.append(cfg.out.exists())  # control: the cell did leave a .tmp folder behind
        raise RuntimeError("cell failed midway")

    monkeypatch.setattr(sim_run, "run_sim", half_written)
    cell_dir = tmp_path / "cells" / "c1"
    cell_dir.parent.mkdir()
    row = campaign_run.cell_job(campaign_run._fixed(spec), spec.cells[0].params, str(cell_dir))
    assert seen == [True] and "cell failed midway" in row["error"]
    assert (tmp_path / "cells" / "c1.error").is_file()
    assert sorted(p.name for p in cell_dir.parent.iterdir()) == ["c1.error"]
