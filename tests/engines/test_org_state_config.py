"""Settings of organization mode that need no engine: the grid override and the fault names."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridmem.vllm_plugin import faults, org_geometry


def test_serving_grid_gives_engine_args_and_env() -> None:
    grid = org_geometry.serving_grid(64)
    assert grid.engine_kwargs == {"block_size": 64, "enable_prefix_caching": True}
    assert grid.env == {org_geometry.GRID_ENV: "64"}


@pytest.mark.parametrize("bad", [0, 8, 72, -64, 64.0, "64"])
def test_serving_grid_refuses_bad_grids(bad: object) -> None:
    with pytest.raises(ValueError, match="multiple of 16"):
        org_geometry.serving_grid(bad)  # type: ignore[arg-type]


def test_activate_grid_sets_and_clears_the_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(org_geometry.GRID_ENV, raising=False)
    assert org_geometry.active_grid() is None
    org_geometry.activate_grid(128)
    assert org_geometry.active_grid() == 128
    org_geometry.activate_grid(None)
    assert org_geometry.active_grid() is None
    monkeypatch.setenv(org_geometry.GRID_ENV, "100")
    with pytest.raises(ValueError, match="HYBRIDMEM_ORG_GRID='100'"):
        org_geometry.active_grid()


def test_faults_from_env_and_activation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(faults.FAULT_ENV, raising=False)
    faults.activate(None)
    assert faults.active() is None and not faults.is_active("swap-members")
    monkeypatch.setenv(faults.FAULT_ENV, "swap-members")
    assert faults.active() == "swap-members" and faults.is_active("swap-members")
    monkeypatch.setenv(faults.FAULT_ENV, "none")
    assert faults.active() is None
    monkeypatch.delenv(faults.FAULT_ENV)
    faults.activate("skip-invalidate")  # the activated fault wins over the env
    monkeypatch.setenv(faults.FAULT_ENV, "swap-members")
    assert faults.is_active("skip-invalidate") and not faults.is_active("swap-members")
    faults.activate(None)
    monkeypatch.delenv(faults.FAULT_ENV)
    with pytest.raises(ValueError, match="unknown fault 'swap'"):
        faults.check("swap")
    with pytest.raises(ValueError, match="unknown fault"):
        faults.activate("nope")
    with pytest.raises(ValueError, match="unknown fault"):
        faults.is_active("nope")
    monkeypatch.setenv(faults.FAULT_ENV, "swap-members, stale-checkpoint")
    with pytest.raises(ValueError, match="unknown fault"):
        faults.active()  # one fault at a time


def test_arena_follows_the_geometry() -> None:
    """Shared arena exactly when the organization's page is vLLM's page (S1/S2 on the grid)."""
    from hybridmem.vllm_plugin.org_state import arena_for
    from hybridmem.vllm_plugin.state_table import StateLayout

    page = 64 * 512
    s2 = StateLayout("S2", "slot", 55, page, 3, 8192, 4, 64)
    s0 = StateLayout("S0", "inside", 21, 87296, 1, 0, 0, 64)
    d0 = StateLayout("D0", "inside", 10, 87296, 1, 0, 0, 256)
    assert arena_for(s2, page, 56, "auto") == "shared"
    assert arena_for(s2, page, 56, "private") == "private"
    assert arena_for(s2, None, 56, "auto") == "private"  # no grid: vLLM's page is not P
    assert arena_for(s2, page, 55, "auto") == "private"  # not enough blocks after the null one
    assert arena_for(s0, page, 56, "auto") == "private"  # max(r, P) = r > P
    assert arena_for(d0, 87296, 56, "auto") == "private"  # D0's pool is separate
    with pytest.raises(ValueError, match="arena mode 'shared'"):
        arena_for(s0, page, 56, "shared")


def test_model_grid_is_the_models_declared_grid_else_512(tmp_path: Path) -> None:
    import json

    from hybridmem.engines.tiny_model import META_NAME, TINY_GRID_TOKENS

    assert org_geometry.model_grid(tmp_path) == org_geometry.DEFAULT_GRID_TOKENS == 512
    (tmp_path / META_NAME).write_text(json.dumps({"grid_tokens": TINY_GRID_TOKENS}))
    assert org_geometry.model_grid(tmp_path) == 64
    (tmp_path / META_NAME).write_text(json.dumps({"grid_tokens": 72}))
    with pytest.raises(ValueError):
        org_geometry.model_grid(tmp_path)
