"""D0 at its native geometry (SPEC §2, §4; paper §3.5, Table B-2), without an engine.

Each organization has its own grid: S0-S2 the shared one (512 tokens, the tiny model's 64), D0
its 16-token attention unit with its model's checkpoint interval (1,792 tokens for
Falcon-H1-7B). On CPU that needs vLLM's attention kernel to run 16-token blocks: its ``vec16``
path, which the plugin's block-size widening relies on (tested here at the kernel, end to end
in ``test_org_serving``'s D0 runs).
"""

from __future__ import annotations

import platform
from types import SimpleNamespace
from typing import Any

import pytest

from hybridmem.errors import GeometryError
from hybridmem.geometry import PRESETS, Geometry
from hybridmem.units import GRID_TOKENS, derive_units, org_grid_tokens

torch = pytest.importorskip("torch")

FALCON = PRESETS["falcon-h1-7b"]
# Table B-2: D0 attention bytes / 16,384 and recurrent bytes / 1,594,368 per budget
TABLE_B2_D0 = {"b63": (3256, 29), "b83": (4289, 39), "b108": (5581, 51)}


def test_each_organization_has_its_own_grid() -> None:
    assert [org_grid_tokens(o) for o in ("S0", "S1", "S2", "D0")] == [512, 512, 512, 16]
    assert [org_grid_tokens(o, 64) for o in ("S0", "S1", "S2", "D0")] == [64, 64, 64, 16]
    with pytest.raises(GeometryError, match="unknown organization"):
        org_grid_tokens("vllm")


def test_d0_units_do_not_depend_on_s2_slots() -> None:
    """A 16-token page (16 a = 16 KiB for Falcon-H1-7B) cannot hold S2's 32-KiB conv slot: the
    slot check refuses it, and D0's units come out without it, equal to the 512 grid's."""
    with pytest.raises(GeometryError, match="conv slot"):
        derive_units(FALCON, grid_tokens=16)
    at16 = derive_units(FALCON, grid_tokens=16, check_slots=False)
    at512 = derive_units(FALCON, grid_tokens=GRID_TOKENS)
    assert at16.slots_per_slab == 0 and at512.slots_per_slab == 16
    d0 = ("d0_attn_tokens", "d0_attn_unit_bytes", "d0_recurrent_unit_bytes",
          "d0_interval_tokens", "uniform_tokens", "label_unit_bytes")
    assert {k: getattr(at16, k) for k in d0} == {k: getattr(at512, k) for k in d0}
    assert (at16.d0_attn_unit_bytes, at16.d0_interval_tokens) == (16_384, 1_792)


@pytest.mark.parametrize("budget", sorted(TABLE_B2_D0))
def test_d0_native_plan_is_table_b2(budget: str) -> None:
    """plan_org (what vLLM and the simulator size D0 by) at D0's own grid: 16-token units, the
    1,792-token interval, Table B-2's integer units, one vLLM block id per unit plus null."""
    from hybridmem.vllm_plugin.org_settings import OrgSettings, plan_org

    plan = plan_org(OrgSettings(org="D0", budget=budget).check(), FALCON, org_grid_tokens("D0"))
    units = TABLE_B2_D0[budget]
    d = plan.as_dict()
    assert (d["attention_grid_tokens"], d["recurrent_grid_tokens"]) == (16, 1792)
    assert plan.capacity == units
    assert d["num_block_ids"] == units[0] + units[1] + 1
    # negative control: on the shared grid D0 would be converted (512-token units, 2,048)
    coarse = plan_org(OrgSettings(org="D0", budget=budget).check(), FALCON, GRID_TOKENS)
    assert (coarse.grid, coarse.interval) == (512, 2048) and coarse.capacity != units


def test_shared_organizations_keep_their_grid() -> None:
    from hybridmem.vllm_plugin.org_settings import OrgSettings, plan_org

    plan = plan_org(OrgSettings(org="S2", budget="b63").check(), FALCON, org_grid_tokens("S2"))
    assert (plan.grid, plan.interval, plan.capacity) == (512, 512, 193)


# -- CPU attention at 16-token blocks ---------------------------------------------------------
def _cpu_attn() -> Any:
    pytest.importorskip("vllm")
    from vllm.v1.attention.backends import cpu_attn

    return cpu_attn


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                    reason="the vec16 dispatch checked here is x86's")
def test_vllm_cpu_attention_has_a_16_token_kernel_path() -> None:
    """vLLM's CPU attention dispatch sends a 16-token block to its ``vec16`` kernel, and that
    kernel computes causal attention over 16-token pages (against a float64 reference). If
    vLLM drops the path, this fails, and so must D0's 16-token blocks on CPU."""
    cpu_attn = _cpu_attn()
    from vllm import _custom_ops as ops

    assert cpu_attn._get_attn_isa(torch.float32, 16, 64) == "vec16"
    assert cpu_attn._get_attn_isa(torch.float32, 32, 64) != "vec16"  # control: 32 is not
    heads, head, block, n = 2, 64, 16, 40  # 40 tokens over 3 pages, the last partial
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(n, heads, head, generator=gen) for _ in range(3))
    kv = torch.zeros(4, heads, block, 2 * head).view(4, heads, 2 * block, head)
    key_cache, value_cache = kv.chunk(2, dim=2)
    table = torch.tensor([[3, 1, 2]], dtype=torch.int32)  # pages out of order
    slots = torch.tensor([int(table[0, t // block]) * block + t % block for t in range(n)])
    ops.cpu_attn_reshape_and_cache(k, v, key_cache, value_cache, slots, "vec16")
    qsl = torch.tensor([0, n], dtype=torch.int32)
    seq = torch.tensor([n], dtype=torch.int32)
    meta = ops.cpu_attn_get_scheduler_metadata(
        num_reqs=1, num_heads=heads, num_kv_heads=heads, head_dim=head, seq_lens=seq,
        dtype=torch.float32, query_start_loc=qsl, causal=True, sliding_window_size=-1,
        isa="vec16", enable_kv_split=False)
    out = torch.zeros(n, heads, head)
    scale = head ** -0.5
    ops.cpu_attention_with_kv_cache(
        query=q, key_cache=key_cache, value_cache=value_cache, output=out,
        query_start_loc=qsl, seq_lens=seq, scale=scale, causal=True, alibi_slopes=None,
        sliding_window=-1, block_table=table, softcap=0.0, scheduler_metadata=meta, s_aux=None)
    qd, kd, vd = (t.double().transpose(0, 1) for t in (q, k, v))
    logits = qd @ kd.transpose(1, 2) * scale
    logits = logits.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    ref = (logits.softmax(-1) @ vd).transpose(0, 1)
    assert torch.allclose(out.double(), ref, atol=1e-4), (out.double() - ref).abs().max()


def test_organization_mode_lets_cpu_attention_take_16_token_blocks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Stock CPU attention refuses a 16-token block; with the organization grid on it takes it
    (and still multiples of 32); without the grid nothing changes."""
    cpu_attn = _cpu_attn()
    from hybridmem.vllm_plugin import org_geometry

    org_geometry.install()
    backend = cpu_attn.CPUAttentionBackend
    monkeypatch.delenv(org_geometry.GRID_ENV, raising=False)
    assert not backend.supports_block_size(16) and backend.supports_block_size(64)
    monkeypatch.setenv(org_geometry.GRID_ENV, "16")
    assert backend.supports_block_size(16) and backend.supports_block_size(64)
    assert not backend.supports_block_size(8)


# -- align-mode copies -------------------------------------------------------------------------
def test_align_copy_between_one_block_id_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    """D0: the positions of one interval name one composite; the align-mode copy between two
    of them is skipped, a copy between two ids is made (control)."""
    pytest.importorskip("vllm")
    from hybridmem.vllm_plugin import org_state

    copies: list[tuple[Any, Any]] = []
    table = SimpleNamespace(resolve=lambda block_id: f"addr{block_id}")
    monkeypatch.setattr(org_state.state_table, "active", lambda: table)
    monkeypatch.setattr(org_state, "store_for",
                        lambda layer, t: SimpleNamespace(copy=lambda s, d: copies.append((s, d))))
    monkeypatch.setattr(org_state, "RESIDENT",
                        SimpleNamespace(flush=lambda a: None, forget=lambda a: None))

    def original(*args: Any) -> None:
        raise AssertionError("organization mode must not run vLLM's own copy")

    wrapped = org_state._wrap_copy(original)
    cfg = SimpleNamespace(kv_cache_groups=[None, SimpleNamespace(layer_names=["m0"])])
    req = SimpleNamespace(block_ids=([], [7, 7, 7, 9]))  # positions 0-2: one composite
    wrapped(None, cfg, None, [1], 0, 2, 0, req, {"m0": object()})
    assert copies == []
    wrapped(None, cfg, None, [1], 2, 3, 0, req, {"m0": object()})
    assert copies == [("addr7", "addr9")]


def test_geometry_without_preset_fraction_still_needs_one() -> None:
    """D0's plan without an attention fraction is refused in one line (nothing native hides
    the missing preset)."""
    from hybridmem.errors import HybridMemError
    from hybridmem.vllm_plugin.org_settings import OrgSettings, plan_org

    geo = Geometry(model="unit", layers=2, kv_heads=2, head_dim=32, dtype="float32",
                   mamba_heads=8, mamba_head_dim=16, d_state=16, n_groups=1, d_conv=4,
                   ssm_dtype="float32")
    with pytest.raises(HybridMemError, match="attention fraction"):
        plan_org(OrgSettings(org="D0", budget="b8").check(), geo, 16)
