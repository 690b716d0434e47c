"""Synthetic StateTables for vLLM's stock KV-cache manager (tests of org_state before the
organization-backed manager exists).

vLLM hands out Mamba block ids ``b`` in ``1..N`` (``N`` = its block count). Each is mapped to a
synthetic address in an arena of its own, scrambled so that an address bug cannot go unseen::

    S0/D0  k = b - 1:  page N - 1 - k                           (num_pages N)
    S1     members (m k + m - 1, m k, ..., m k + m - 2), conv page m N + k   (num_pages (m+1) N)
    S2     members as S1; conv line spp (m N + k % L) + k // L,  L = ceil(N / spp) slab pages
"""

from __future__ import annotations

from typing import Any

from hybridmem.geometry import ceil_div, next_pow2
from hybridmem.vllm_plugin.layer_store import StateSizes
from hybridmem.vllm_plugin.state_table import StateAddress, StateLayout, StateTable


def member_page_bytes(sizes: StateSizes) -> int:
    """A page P (a multiple of the conv slot) giving 2-4 SSM members with the last partial."""
    slot = next_pow2(sizes.conv_bytes)
    fallback = None
    for k in range(2, 4096):
        page = k * slot
        members = ceil_div(sizes.ssm_bytes, page)
        if 2 <= members <= 4:
            if sizes.ssm_bytes % page:
                return page
            fallback = fallback or page
    if fallback is None:
        raise ValueError(f"no page for ssm {sizes.ssm_bytes} B with slot {slot} B")
    return fallback


def synthetic_table(org: str, sizes: StateSizes, num_blocks: int, grid: int,
                    page_bytes: int | None = None, own_page: bool = False) -> StateTable:
    """``page_bytes``: the page P (default: S0/D0 the checkpoint rounded up to 64 B, S1/S2
    :func:`member_page_bytes`). ``own_page`` (S0): block b's checkpoint on page b - 1, the bytes
    vLLM gave block b, so the arena can be vLLM's own buffer (``page_bytes`` = its page)."""
    n = num_blocks
    s, c = sizes
    if org in ("S0", "D0"):
        page = page_bytes or 64 * ceil_div(s + c, 64)
        table = StateTable(StateLayout(org, "inside", n, page, 1, 0, 0, grid))
        for b in range(1, n + 1):
            p = b - 1 if own_page else n - b
            table.set(b, StateAddress((p,), p))
        return table
    page = page_bytes or member_page_bytes(sizes)
    m = ceil_div(s, page)
    slot = next_pow2(c)
    spp = page // slot
    slabs = ceil_div(n, spp)
    if org == "S1":
        layout = StateLayout("S1", "page", (m + 1) * n, page, m, 0, 0, grid)
    else:
        layout = StateLayout("S2", "slot", m * n + slabs, page, m, slot, spp, grid)
    table = StateTable(layout)
    for b in range(1, n + 1):
        k = b - 1
        members = (m * k + m - 1, *range(m * k, m * k + m - 1))
        conv = m * n + k if org == "S1" else spp * (m * n + k % slabs) + k // slabs
        table.set(b, StateAddress(members, conv))
    return table


def require_state_sensitive_model() -> None:
    """Skip a negative control on the v1 tiny model, which forgets its SSM state within a few
    tokens (vllm-seams trap 1): corrupting a checkpoint changes no token there."""
    import pytest

    from hybridmem.engines import tiny_model

    if getattr(tiny_model, "MODEL_VERSION", 1) < 2:
        pytest.skip("the embedded tiny model v1 forgets its SSM state (trap 1); this negative "
                    "control needs the state-sensitive v2 model")


def mamba_layers(llm: Any) -> list[Any]:
    from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2

    ctx = llm.llm_engine.vllm_config.compilation_config.static_forward_context
    return [layer for layer in ctx.values() if isinstance(layer, MambaMixer2)]
