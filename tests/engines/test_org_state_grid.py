"""Organization grid inside vLLM (org_geometry): attention and Mamba blocks of G = 64 tokens,
one 64 x a page for both groups, the real Mamba state only in org_state's arenas.

Stock manager, synthetic StateTables: greedy tokens equal a stock engine's (native hybrid
block, state in vLLM's rows) for S1 and S2 in private arenas, each checkpoint over several
64-token pages. Negative control: corrupted checkpoint pages change tokens. Two engine starts:
slow.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest

from tests.engines.org_state_helpers import (
    mamba_layers,
    require_state_sensitive_model,
    synthetic_table,
)
from tests.engines.test_org_state_engine import MAX_TOKENS, workload

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

GRID = 64


def _llm(model: Path, **kwargs: Any) -> Any:
    from vllm import LLM

    return LLM(model=str(model), dtype="float32", seed=0, enforce_eager=True,
               enable_prefix_caching=True, max_model_len=1024, max_num_seqs=4,
               kv_cache_memory_bytes=16 << 20, **kwargs)


def _serve(llm: Any, prompts: tuple[list[list[int]], list[list[int]]], table: Any = None
           ) -> tuple[list[list[int]], int]:
    from vllm import SamplingParams

    from hybridmem.vllm_plugin import state_table

    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    assert llm.reset_prefix_cache()
    state_table.activate(table)
    try:
        out1 = llm.generate([{"prompt_token_ids": p} for p in prompts[0]], params, use_tqdm=False)
        out2 = llm.generate([{"prompt_token_ids": p} for p in prompts[1]], params, use_tqdm=False)
    finally:
        state_table.activate(None)
    return ([list(o.outputs[0].token_ids) for o in out1 + out2],
            sum(o.num_cached_tokens or 0 for o in out2))


PROMPTS = workload(2 * GRID)  # prompt shapes on the stock block of the old tiny model


@pytest.fixture(scope="module")
def reference(tiny_model: Path) -> list[list[int]]:
    from hybridmem.vllm_plugin import org_geometry, org_state

    org_geometry.install()
    org_state.install()
    org_geometry.activate_grid(None)
    llm = _llm(tiny_model)
    try:
        tokens, _ = _serve(llm, PROMPTS)
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
    return tokens


@pytest.fixture(scope="module")
def grid_llm(tiny_model: Path, reference: list[list[int]]) -> Any:
    from hybridmem.vllm_plugin import org_geometry

    grid = org_geometry.serving_grid(GRID)
    org_geometry.activate_grid(GRID)
    try:
        llm = _llm(tiny_model, **{k: v for k, v in grid.engine_kwargs.items()
                                  if k != "enable_prefix_caching"})
    finally:
        org_geometry.activate_grid(None)
    yield llm
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


def test_grid_blocks_and_pages(grid_llm: Any) -> None:
    import torch

    cache = grid_llm.llm_engine.vllm_config.cache_config
    assert (cache.block_size, cache.mamba_block_size) == (GRID, GRID)
    layer = mamba_layers(grid_llm)[0]
    pages = layer._hybridmem_pages
    assert pages.shape[1] == cache.mamba_page_size_padded
    assert all(t.shape[1:] == (1,) for t in layer.kv_cache), "vLLM's rows are not placeholders"
    # The Mamba layer's page of block b is an attention layer's block b: the same bytes.
    ctx = grid_llm.llm_engine.vllm_config.compilation_config.static_forward_context
    attn = [x.kv_cache for x in ctx.values() if isinstance(getattr(x, "kv_cache", None),
                                                          torch.Tensor)]
    assert any(a.data_ptr() == pages.data_ptr() and a.stride(0) * a.element_size() ==
               pages.stride(0) and a[0].numel() * a.element_size() == pages.shape[1]
               for a in attn), "no attention layer shares the Mamba layer's pages"


@pytest.mark.parametrize("org", ["S1", "S2"])
def test_grid_org_tokens_equal_stock_engine(grid_llm: Any, reference: list[list[int]],
                                            org: str) -> None:
    """Member pages of the grid's page size P = 64 x a, in private arenas (v2 tiny model: SSM
    state 2.5 P -> 3 members, conv slots 8 KiB, 4 per slab; the shared arena:
    test_org_state_shared)."""
    from hybridmem.vllm_plugin import org_state

    layer = mamba_layers(grid_llm)[0]
    sizes = org_state.state_sizes(layer)
    n = int(grid_llm.llm_engine.vllm_config.cache_config.num_gpu_blocks)
    page = layer._hybridmem_pages.shape[1]  # P = 64 x a
    table = synthetic_table(org, sizes, n - 1, GRID, page_bytes=page)
    org_state.set_arena_mode("private")
    try:
        tokens, hits = _serve(grid_llm, PROMPTS, table)
    finally:
        org_state.set_arena_mode("auto")
    assert hits >= 3 * 2 * GRID
    assert tokens == reference
    store = layer._hybridmem_store[1]
    assert store.pages.data_ptr() != layer._hybridmem_pages[1].data_ptr()
    print(f"LAYOUT: {store.layout}")


def test_grid_corrupted_checkpoint_changes_tokens(grid_llm: Any,
                                                  reference: list[list[int]]) -> None:
    import torch
    from vllm import SamplingParams

    from hybridmem.vllm_plugin import org_state, state_table

    require_state_sensitive_model()
    layer = mamba_layers(grid_llm)[0]
    n = int(grid_llm.llm_engine.vllm_config.cache_config.num_gpu_blocks)
    table = synthetic_table("S1", org_state.state_sizes(layer), n - 1, GRID)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    assert grid_llm.reset_prefix_cache()
    state_table.activate(table)
    try:
        out = grid_llm.generate([{"prompt_token_ids": p} for p in PROMPTS[0]], params,
                                use_tqdm=False)
        with torch.inference_mode():  # the arena was made inside vLLM's inference mode
            for lay in mamba_layers(grid_llm):
                pages = lay._hybridmem_store[1].pages
                used = pages.ne(0).any(dim=1)
                pages[used] = 0x3F  # float32 0.75 everywhere
        out += grid_llm.generate([{"prompt_token_ids": p} for p in PROMPTS[1]], params,
                                 use_tqdm=False)
    finally:
        state_table.activate(None)
    tokens = [list(o.outputs[0].token_ids) for o in out]
    changed = sum(a != b for a, b in zip(tokens[1:], reference[1:], strict=True))
    print(f"CONTROL: changed {changed} of {len(tokens[1:])} requests")
    assert changed >= 1, "corrupted checkpoints changed no request of wave 2"
