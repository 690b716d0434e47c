"""``--total SIZE`` in ``run`` and ``sim``: a whole-cache budget (vLLM's
``--kv-cache-memory-bytes``) with ``plan --total``'s validation and messages. The total travels
as the budget text ``total SIZE``, which :func:`hybridmem.budget.parse_budget` reads back, so the
simulator, the vLLM plugin and campaign grids split it by the same rule as ``plan``."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace

import pytest

from hybridmem.budget import parse_budget, parse_total, plan_budget
from hybridmem.cli.main import main
from hybridmem.geometry import PRESETS
from hybridmem.units import derive_units

FALCON = derive_units(PRESETS["falcon-h1-7b"])
B63 = 101_154_816  # bytes per layer of b63 (Falcon-H1-7B)
T44 = 44 * B63  # the whole-cache total of b63 in each of Falcon-H1-7B's 44 layers


def _code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


def test_a_total_label_reads_back_as_the_same_total():
    t = parse_total("8GiB", FALCON)
    assert t.label == "total 8GiB"
    assert parse_budget(t.label, FALCON) == t
    assert plan_budget(FALCON, parse_budget(t.label, FALCON)) == plan_budget(FALCON, t)
    # negative control: the same size as a per-layer budget is another budget altogether
    per_layer = parse_budget("8GiB", FALCON)
    assert per_layer.total_bytes is None and per_layer.nominal_bytes != t.nominal_bytes
    assert plan_budget(FALCON, per_layer).s2 != plan_budget(FALCON, t).s2


def test_total_split_reaches_the_plugin_plan_and_the_stock_blocks():
    from hybridmem.sim.schedulers import stock_blocks
    from hybridmem.vllm_plugin.org_settings import OrgSettings, plan_org

    grid = FALCON.grid_tokens
    total = plan_org(OrgSettings(org="S2", budget=f"total {T44}"), FALCON.geometry, grid)
    label = plan_org(OrgSettings(org="S2", budget="b63"), FALCON.geometry, grid)
    assert (total.capacity, label.capacity) == (192, 193)  # floor versus round-half-up
    shape = SimpleNamespace(geometry=FALCON.geometry)
    page = 16 * FALCON.geometry.attn_bytes_per_token
    blocks = stock_blocks(f"total {T44}", shape, page)
    assert blocks == int(Fraction(T44, 44) // page)
    assert blocks * page * 44 <= T44 < (blocks + 1) * page * 44  # never over, one more is
    assert stock_blocks("b63", shape, page) == round(B63 / page)


def _captured_sim(monkeypatch, tmp_path: Path, *flags: str):
    from hybridmem.sim import run as sim_run

    seen = []

    def fake(cfg, progress=False):
        seen.append(cfg)
        raise SystemExit(0)

    monkeypatch.setattr(sim_run, "run_sim", fake)
    assert _code(["sim", *flags, "--out", str(tmp_path / "o"), "--quiet"]) == 0
    return seen[0]


def test_sim_total_is_the_budget_text(monkeypatch, tmp_path):
    cfg = _captured_sim(monkeypatch, tmp_path, "--org", "S2", "--total", str(T44))
    assert cfg.budget == f"total {T44}"
    # negative control: without --total the default per-layer label is used
    assert _captured_sim(monkeypatch, tmp_path, "--org", "S2").budget == "b63"


@pytest.mark.parametrize("flags, needle", [
    (["--org", "S2", "--total", "1KiB"], "budget total 1KiB (total 1,024 B) is too small: S2 0"),
    (["--org", "vllm", "--total", "1KiB"], "too small: S0 0 pages"),
    (["--org", "D0", "--total", "100MiB"], "D0 0 recurrent composites"),
    (["--org", "S2", "--total", "-5"], "bad size '-5'"),
    (["--org", "S2", "--total", "1.5x"], "bad size '1.5x'"),
    (["--org", "S2", "--total", "9" * 50], "bad size '99999999999999999999'..."),
    (["--org", "S2", "--total", "1GiB", "--budget", "b63"], "not allowed with argument"),
], ids=["small", "small-vllm", "small-d0", "negative", "unit", "long", "both"])
def test_sim_total_refusals_are_plans(flags, needle, tmp_path, capsys):
    assert _code(["sim", *flags, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.strip().count("\n") == 0, err
    assert not (tmp_path / "o").exists()


def test_plan_gives_the_same_message(capsys):
    assert _code(["plan", "--model", "falcon-h1-7b", "--total", "1KiB"]) == 2
    plan_err = capsys.readouterr().err.split("error: ", 1)[1]
    assert _code(["sim", "--org", "S2", "--total", "1KiB", "--out", "/nonexistent/o"]) == 2
    sim_err = capsys.readouterr().err.split("error: ", 1)[1]
    head, clause = sim_err.strip().split(" is too small: ")
    assert plan_err.startswith(head + " is too small: ")  # plan names every organization,
    assert clause == "S2 0 pages (one is 524,288 B)" and clause in plan_err  # sim the run's


def _captured_run(monkeypatch, tmp_path: Path, *flags: str):
    from hybridmem.engines import vllm_run

    seen = []

    def fake(cfg, progress=False):
        seen.append(cfg)
        raise SystemExit(0)

    monkeypatch.setattr(vllm_run, "run_serving", fake)
    assert _code(["run", *flags, "--out", str(tmp_path / "o"), "--quiet"]) == 0
    return seen[0]


def test_run_total_sizes_vllms_cache_or_the_organization(monkeypatch, tmp_path):
    pytest.importorskip("vllm")
    cfg = _captured_run(monkeypatch, tmp_path, "--org", "vllm", "--total", "64MiB")
    assert cfg.kv_cache_bytes == 64 << 20 and cfg.budget is None
    cfg = _captured_run(monkeypatch, tmp_path, "--org", "S2", "--total", "8MiB")
    assert cfg.budget == "total 8MiB" and cfg.kv_cache_bytes == 256 << 20
    # negative control: without --total vLLM's cache keeps its default and S2 its label
    assert _captured_run(monkeypatch, tmp_path, "--org", "vllm").kv_cache_bytes == 256 << 20
    assert _captured_run(monkeypatch, tmp_path, "--org", "S2").budget == "b40"


@pytest.mark.parametrize("flags, needle", [
    (["--org", "S2", "--total", "1KiB"], "budget total 1KiB (total 1,024 B) is too small: S2 0"),
    (["--org", "vllm", "--total", "1KiB"], "too small: S0 0 pages"),
    (["--org", "S2", "--total", "-5"], "bad size '-5'"),
    (["--org", "vllm", "--total", "64MiB", "--kv-blocks", "10"],
     "--total and --kv-blocks both size the cache"),
    (["--org", "S2", "--total", "8MiB", "--budget", "b40"], "not allowed with argument"),
], ids=["small", "small-vllm", "negative", "kv-blocks", "both"])
def test_run_total_refusals(flags, needle, tmp_path, capsys):
    assert _code(["run", *flags, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.strip().count("\n") == 0, err
    assert not (tmp_path / "o").exists()
