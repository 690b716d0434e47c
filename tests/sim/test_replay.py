"""``hybridmem sim --replay``: a recorded run's workload re-run per organization, and its
fidelity against the recorded run (vLLM's scheduler in both)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from hybridmem.errors import HybridMemError
from hybridmem.sim.replay import load_recorded, plan_replay, replay, tiny_config_dir
from hybridmem.sim.run import SimConfig, run_sim

BLOCK = 256          # vLLM's block for the tiny model on CPU
A1 = 512             # the tiny model's attention bytes per token and layer


def _record(tmp: Path, blocks: int = 40) -> Path:
    """A stored tiny workload with what vLLM's own manager made of it: a simulated run on the
    tiny model's geometry, vLLM's CPU block and step budget, a pool tight enough to evict."""
    model = tiny_config_dir(tmp / "rec-model")
    out = tmp / "rec"
    run_sim(SimConfig(model=str(model), org="vllm", budget=str(blocks * BLOCK * A1), requests=24,
                      share=1.0, seed=0, cap=8, max_model_len=1024, stock_block=BLOCK,
                      max_num_batched_tokens=2048, trace_dir=out / "trace", out=out))
    return out


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _record(tmp_path_factory.mktemp("replay"))


@pytest.mark.vllm
@pytest.mark.parametrize("arrivals", ["steps", "planned"])
def test_vllm_arm_reproduces_the_recorded_run(recorded: Path, tmp_path: Path,
                                              arrivals: str) -> None:
    rec = load_recorded(recorded)
    assert rec.org == "vllm" and len(rec.entry_steps) == 24 and len(rec.admit_steps) == 24
    assert sum(rec.cached.values()) > 0, "the check needs prefix hits to compare"
    arms, cond = plan_replay(rec, ["vllm"], tmp_path)
    assert cond["stock_block_tokens"] == BLOCK and cond["max_num_batched_tokens"] == 2048
    assert cond["cap"] == 8 and cond["max_model_len"] == 1024
    doc = replay(rec, arms, cond, tmp_path, arrivals=arrivals)
    f = doc["fidelity"]
    assert f["requests"] == 24 and f["requests_differing"] == 0
    assert f["replay_hit_tokens"] == f["recorded_hit_tokens"] == sum(rec.cached.values())
    assert f["admission_order_same"]
    if arrivals == "steps":
        assert f["admissions_same_step"] == 24
    assert (tmp_path / "vllm" / "summary.json").is_file()
    assert "vllm arm against the recorded run" in (tmp_path / "comparison.md").read_text()


@pytest.mark.vllm
def test_fidelity_check_sees_a_different_engine(recorded: Path, tmp_path: Path) -> None:
    """Negative control: the same replay on a 512-token block (not the recorded 256) must
    report differing prefix hits, so the equality above is not vacuous."""
    rec = load_recorded(recorded)
    arms, cond = plan_replay(rec, ["vllm"], tmp_path)
    assert arms[0].config is not None
    wrong = [replace(arms[0], config=replace(arms[0].config, stock_block=2 * BLOCK))]
    f = replay(rec, wrong, cond, tmp_path, arrivals="steps")["fidelity"]
    assert f["requests_differing"] > 0
    assert f["replay_hit_tokens"] != f["recorded_hit_tokens"]


@pytest.mark.vllm
def test_every_organization_at_the_recorded_bytes(recorded: Path, tmp_path: Path) -> None:
    rec = load_recorded(recorded)
    arms, cond = plan_replay(rec, ["vllm", "S2", "D0"], tmp_path)
    assert cond["budget"] == str(40 * BLOCK * A1)
    assert {a.org: a.skipped is None for a in arms} == {"vllm": True, "S2": True, "D0": False}
    assert "attention-fraction" in str(arms[2].skipped)
    doc = replay(rec, arms, cond, tmp_path)
    assert [r["org"] for r in doc["arms"]] == ["vllm", "S2"]
    assert all(r["completed"] == 24 for r in doc["arms"])
    assert json.loads((tmp_path / "comparison.json").read_text())["skipped"] == {
        "D0": arms[2].skipped}


@pytest.mark.vllm
def test_named_model_replay(recorded: Path, tmp_path: Path) -> None:
    """The same requests at Falcon-H1-7B geometry: b63, vLLM's GPU block (1,568 tokens)."""
    rec = load_recorded(recorded)
    arms, cond = plan_replay(rec, ["vllm"], tmp_path, model="falcon-h1-7b")
    assert cond["budget"] == "b63" and cond["stock_block_tokens"] is None
    doc = replay(rec, arms, cond, tmp_path)
    assert doc["arms"][0]["block_tokens"] == 1568 and doc["fidelity"] is None


def test_replay_needs_the_workload(tmp_path: Path) -> None:
    (tmp_path / "trace").mkdir()
    with pytest.raises(HybridMemError, match="workload.json"):
        load_recorded(tmp_path)


@pytest.mark.parametrize("argv, needle", [
    (["--org", "S2,bogus"], "comma list"),
    (["--requests", "10"], "does not apply to --replay"),
])
def test_replay_cli_refuses_in_one_line(recorded: Path, tmp_path: Path, argv: list[str],
                                        needle: str) -> None:
    p = subprocess.run([sys.executable, "-m", "hybridmem.cli.main", "sim", "--replay",
                        str(recorded), "--out", str(tmp_path / "o"), *argv],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert needle in p.stderr and "Traceback" not in p.stderr


@pytest.mark.slow  # an engine run of the tiny model on CPU (about a minute here)
@pytest.mark.vllm
def test_replay_of_a_real_cpu_run(tmp_path: Path) -> None:
    """The replay's vllm arm against a real `hybridmem run --org vllm` of the tiny model:
    recorded entry steps reproduce every admission step and prefix hit; planned arrivals on
    virtual time keep the total within 2%."""
    run = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "hybridmem.cli.main", "run", "--model", "tiny",
                    "--org", "vllm", "--requests", "24", "--share", "1", "--quiet",
                    "--out", str(run)], check=True, timeout=600, cwd=tmp_path)
    rec = load_recorded(run)
    for arrivals in ("steps", "planned"):
        out = tmp_path / arrivals
        arms, cond = plan_replay(rec, ["vllm"], out)
        f = replay(rec, arms, cond, out, arrivals=arrivals)["fidelity"]
        if arrivals == "steps":
            assert f["requests_differing"] == 0 and f["admissions_same_step"] == 24
        assert abs(f["relative_difference"]) <= 0.02


@pytest.mark.vllm
def test_nemotron_h_builds_every_organization_but_d0(tmp_path: Path) -> None:
    """transformers' NemotronHConfig does not serialize num_hidden_layers (it derives it from
    its layer types); the organizations' geometry must still read it."""
    from hybridmem.sim import vllm_env
    from hybridmem.sim.model_shape import load_shape

    vc = vllm_env.engine_config(load_shape("nemotron-h-8b"), 8, 8192, 2048, 0)
    assert "num_hidden_layers" not in vc.model_config.hf_config.to_dict()  # the case at hand
    s = run_sim(SimConfig(model="nemotron-h-8b", org="S2", requests=4, out=tmp_path / "s2"))
    assert s.summary["completed"] == 4
    with pytest.raises(HybridMemError, match="attention"):
        run_sim(SimConfig(model="nemotron-h-8b", org="D0", requests=4, out=tmp_path / "d0"))
