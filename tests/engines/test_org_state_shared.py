"""The shared arena: S0 checkpoints stored in vLLM's own KV buffer (org page p = block p + 1).

The organization grid is chosen so that one page holds a whole checkpoint (G x a >= s + c; S0's
page is max(r, P) = P), so each Mamba block id of vLLM's stock manager owns exactly the page
the checkpoint needs. Greedy tokens must equal those of S1 in a private arena on the same
engine (S1 private equals stock vLLM: test_org_state_grid). Negative control: overwriting the
shared pages changes tokens. One engine start: slow.
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


def _s0_grid(model: Path) -> int:
    """Smallest multiple of 32 tokens (CPU attention's block unit) whose page holds a
    float32-state checkpoint: 32 for the v1 tiny model, 192 for v2."""
    from hybridmem.geometry import ceil_div, load_geometry

    geo = load_geometry(str(model), ssm_dtype="float32")  # the CPU platform keeps fp32 state
    return 32 * ceil_div(geo.ssm_bytes + geo.conv_bytes, 32 * geo.attn_bytes_per_token)


@pytest.fixture(scope="module")
def shared_llm(tiny_model: Path) -> Any:
    from vllm import LLM

    from hybridmem.vllm_plugin import org_geometry, org_state

    org_geometry.install()
    org_state.install()
    grid = org_geometry.serving_grid(_s0_grid(tiny_model))
    org_geometry.activate_grid(grid.grid_tokens)
    try:
        llm = LLM(model=str(tiny_model), dtype="float32", seed=0, enforce_eager=True,
                  max_model_len=1024, max_num_seqs=4, kv_cache_memory_bytes=16 << 20,
                  **grid.engine_kwargs)
    finally:
        org_geometry.activate_grid(None)
    yield llm
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


def _serve(llm: Any, org: str, corrupt: set[int] | None = None) -> tuple[list[list[int]], Any]:
    """Both waves; ``corrupt``: a set that collects the pages written in wave 1 (recorded by
    the caller's patched scatter), all overwritten before wave 2."""
    import torch
    from vllm import SamplingParams

    from hybridmem.vllm_plugin import org_state, state_table

    cache = llm.llm_engine.vllm_config.cache_config
    layer = mamba_layers(llm)[0]
    n = int(cache.num_gpu_blocks) - 1  # Mamba block ids 1..n; page b - 1 is block b's page
    sizes = org_state.state_sizes(layer)
    if org == "S0":
        table = synthetic_table("S0", sizes, n, cache.block_size,
                                page_bytes=layer._hybridmem_pages.shape[1], own_page=True)
        org_state.set_arena_mode("shared")
    else:
        table = synthetic_table(org, sizes, n, cache.block_size)
        org_state.set_arena_mode("private")
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    wave1, wave2 = workload(cache.block_size)
    assert llm.reset_prefix_cache()
    state_table.activate(table)
    try:
        out = llm.generate([{"prompt_token_ids": p} for p in wave1], params, use_tqdm=False)
        if corrupt is not None:
            assert corrupt, "wave 1 wrote no checkpoint"
            rows = torch.tensor(sorted(corrupt))
            with torch.inference_mode():
                for lay in mamba_layers(llm):
                    lay._hybridmem_store[1].pages[rows] = 0x3F  # float32 0.75
        out += llm.generate([{"prompt_token_ids": p} for p in wave2], params, use_tqdm=False)
    finally:
        state_table.activate(None)
        org_state.set_arena_mode("auto")
    return [list(o.outputs[0].token_ids) for o in out], layer._hybridmem_store[1]


def test_s0_in_vllms_buffer_equals_s1_private(shared_llm: Any) -> None:
    private, _ = _serve(shared_llm, "S1")
    shared, store = _serve(shared_llm, "S0")
    layer = mamba_layers(shared_llm)[0]
    assert store.pages.data_ptr() == layer._hybridmem_pages[1].data_ptr(), "arena not shared"
    assert bool(store.pages.any()), "nothing was stored in vLLM's buffer"
    assert shared == private


def test_overwriting_the_shared_pages_changes_tokens(shared_llm: Any,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Only pages that held checkpoints are overwritten (attention blocks live in the same
    buffer and must stay intact, or the control would not isolate the recurrent state)."""
    from hybridmem.vllm_plugin.layer_store import LayerStore

    require_state_sensitive_model()
    good, _ = _serve(shared_llm, "S0")
    written: set[int] = set()
    write_rows = LayerStore.write_rows

    def recording(self: LayerStore, t: Any, ssm: Any, conv: Any) -> None:
        written.update(t.members[:, 0].tolist())
        write_rows(self, t, ssm, conv)

    monkeypatch.setattr(LayerStore, "write_rows", recording)
    bad, _ = _serve(shared_llm, "S0", corrupt=written)
    changed = sum(a != b for a, b in zip(bad[1:], good[1:], strict=True))
    print(f"CONTROL: changed {changed} of {len(bad[1:])} requests")
    assert changed >= 1, "overwriting the shared pages changed no request of wave 2"
