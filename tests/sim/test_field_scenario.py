"""The field's complaint as a shipped scenario: chat-like system prompts shorter than stock
vLLM's inflated block (campaigns/field_short_prefix.toml)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridmem.errors import HybridMemError
from hybridmem.sim.campaign_spec import load_spec
from hybridmem.sim.run import SimConfig, run_sim

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "campaigns" / "field_short_prefix.toml"


def test_shipped_scenario_parses_and_names_its_prefixes(tmp_path: Path) -> None:
    spec = load_spec(SPEC)
    assert spec.system_prompt_tokens == (300, 1200)
    assert {c.org for c in spec.cells} == {"vllm", "S1", "S2", "D0"} and len(spec.cells) == 12
    assert all(c.trace and c.share == 1.0 and c.budget == "b63" for c in spec.cells)
    # the prefix range is part of every cell's id: without it the same grid is other cells
    plain = tmp_path / "plain.toml"
    plain.write_text(SPEC.read_text().replace("system_prompt_tokens = [300, 1200]\n", ""))
    other = load_spec(plain)
    assert other.system_prompt_tokens is None
    assert spec.cell_id(spec.cells[0]) != other.cell_id(other.cells[0])


@pytest.mark.parametrize("value", ["[300]", "[900, 300]", "[0, 10]", "\"300-1200\""])
def test_bad_prefix_ranges_are_one_line_errors(tmp_path: Path, value: str) -> None:
    p = tmp_path / "bad.toml"
    p.write_text(SPEC.read_text().replace("[300, 1200]", value))
    with pytest.raises(HybridMemError, match="system_prompt_tokens"):
        load_spec(p)


@pytest.mark.vllm
def test_short_system_prompts_defeat_the_stock_block_only(tmp_path: Path) -> None:
    """40 requests of the scenario: vLLM's 1,568-token block finds no boundary inside a
    300-1,200-token prefix (0 hit tokens), S2's 512-token grid does. Negative control: with
    the whole prompt shared (no system prompt), stock vLLM does reuse."""
    def hits(org: str, system: tuple[int, int] | None) -> int:
        cfg = SimConfig(org=org, budget="b63", requests=40, share=1.0, seed=0,
                        system_prompt=system, out=tmp_path / f"{org}-{system is None}")
        return int(run_sim(cfg).summary["prefix_hit_tokens"])
    assert hits("vllm", (300, 1200)) == 0
    assert hits("S2", (300, 1200)) > 0
    assert hits("vllm", None) > 0
