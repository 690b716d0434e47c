"""org_state on vLLM's stock KV-cache manager: Mamba state kept at S0/S1/S2/D0 addresses.

A synthetic StateTable maps every vLLM Mamba block id to an address in an organization arena
(``org_state_helpers``). Greedy tokens must equal the unwrapped run's, bit for bit, on a
shared-prefix workload with prefix hits and decodes crossing block boundaries (so align mode's
boundary copy runs). Negative controls: the ``swap-members`` fault and a corrupted member page
change tokens; poisoning vLLM's own rows changes tokens only when organization mode is off.
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

pytestmark = pytest.mark.vllm

MAX_TOKENS = 12


def workload(block: int) -> tuple[list[list[int]], list[list[int]]]:
    """Wave 1: one prompt of 2 blocks - 2 tokens (its decodes cross a block boundary, so align
    mode copies a checkpoint); wave 2: three prompts sharing its first 2 blocks - 6 tokens (prefix
    hits adopt the first checkpoint), tails of 3, block / 3 and block + 22 tokens."""
    shared = [16 + (7 * i) % 480 for i in range(2 * block - 6)]
    wave1 = [shared + [16 + (5 * i) % 480 for i in range(4)]]
    wave2 = [shared + [16 + (11 * i + 3 * j) % 480 for i in range(n)]
             for j, n in enumerate((3, block // 3, block + 22))]
    return wave1, wave2


@pytest.fixture(scope="module")
def llm(tiny_model: Path) -> Any:
    from vllm import LLM

    from hybridmem.vllm_plugin import org_state

    org_state.install()
    engine = LLM(model=str(tiny_model), dtype="float32", seed=0, enforce_eager=True,
                 enable_prefix_caching=True, max_model_len=1024, max_num_seqs=4,
                 kv_cache_memory_bytes=16 << 20)
    yield engine
    engine.llm_engine.engine_core.shutdown()
    del engine
    gc.collect()


def _block(llm: Any) -> int:
    return int(llm.llm_engine.vllm_config.cache_config.block_size)


def _num_blocks(llm: Any) -> int:
    return int(llm.llm_engine.vllm_config.cache_config.num_gpu_blocks)


def _sizes(llm: Any) -> Any:
    from hybridmem.vllm_plugin.org_state import state_sizes

    return state_sizes(mamba_layers(llm)[0])


def _serve(llm: Any, table: Any = None, poison: bool = False) -> tuple[list[list[int]], int]:
    """Greedy tokens of both waves (fresh prefix cache) and the prefix-hit tokens of wave 2."""
    from vllm import SamplingParams

    from hybridmem.vllm_plugin import org_state, state_table

    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    wave1, wave2 = workload(_block(llm))
    assert llm.reset_prefix_cache()
    state_table.activate(table)
    org_state.set_poison(poison)
    try:
        out1 = llm.generate([{"prompt_token_ids": p} for p in wave1], params, use_tqdm=False)
        out2 = llm.generate([{"prompt_token_ids": p} for p in wave2], params, use_tqdm=False)
    finally:
        state_table.activate(None)
        org_state.set_poison(False)
    tokens = [list(o.outputs[0].token_ids) for o in out1 + out2]
    return tokens, sum(o.num_cached_tokens or 0 for o in out2)


@pytest.fixture(scope="module")
def reference(llm: Any) -> list[list[int]]:
    tokens, hits = _serve(llm)
    assert hits >= 3 * _block(llm), f"wave 2 hit only {hits} prefix tokens; no hits to test"
    return tokens


def _count_copies(monkeypatch: pytest.MonkeyPatch, skip: bool = False) -> list[int]:
    """Count LayerStore.copy calls (align mode's boundary copies); ``skip``: do not copy."""
    from hybridmem.vllm_plugin.layer_store import LayerStore

    calls = [0]
    original = LayerStore.copy

    def copy(self: LayerStore, src: Any, dst: Any) -> None:
        calls[0] += 1
        if not skip:
            original(self, src, dst)

    monkeypatch.setattr(LayerStore, "copy", copy)
    return calls


@pytest.mark.parametrize("org", ["S0", "S1", "S2", "D0"])
def test_org_addresses_keep_greedy_tokens_under_poison(llm: Any, reference: list[list[int]],
                                                       org: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    table = synthetic_table(org, _sizes(llm), _num_blocks(llm), grid=_block(llm))
    copies = _count_copies(monkeypatch)
    tokens, hits = _serve(llm, table, poison=True)
    assert hits >= 3 * _block(llm)
    assert copies[0] >= 2 * len(mamba_layers(llm)), "align mode's boundary copy did not run"
    assert tokens == reference, f"{org}: tokens differ from the unwrapped run"
    store = mamba_layers(llm)[0]._hybridmem_store[1]
    assert store.layout.org == org and bool(store.pages.any()), "nothing was stored in the arena"


def test_poison_without_org_mode_changes_tokens(llm: Any, reference: list[list[int]]) -> None:
    """Negative control: the poison does reach what vLLM reads when the wrapper is off."""
    tokens, _ = _serve(llm, None, poison=True)
    changed = sum(a != b for a, b in zip(tokens, reference, strict=True))
    print(f"CONTROL: changed {changed} of {len(tokens)} requests")
    assert changed >= 3, f"poison changed only {changed} of {len(tokens)} requests"


def test_skipping_the_boundary_copy_changes_tokens(llm: Any, reference: list[list[int]],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control for the copy wrapper: without the copy between org addresses a request
    crossing a boundary (or adopting a prefix) starts from a stale or empty checkpoint."""
    require_state_sensitive_model()
    table = synthetic_table("S2", _sizes(llm), _num_blocks(llm), grid=_block(llm))
    copies = _count_copies(monkeypatch, skip=True)
    tokens, _ = _serve(llm, table)
    assert copies[0] > 0
    changed = sum(a != b for a, b in zip(tokens, reference, strict=True))
    print(f"CONTROL: changed {changed} of {len(tokens)} requests")
    assert changed >= 1, "skipping every boundary copy changed no request"


def test_swap_members_fault_changes_tokens(llm: Any, reference: list[list[int]],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    require_state_sensitive_model()
    monkeypatch.setenv("HYBRIDMEM_FAULT", "swap-members")
    table = synthetic_table("S2", _sizes(llm), _num_blocks(llm), grid=_block(llm))
    tokens, _ = _serve(llm, table)
    changed = sum(a != b for a, b in zip(tokens, reference, strict=True))
    print(f"CONTROL: changed {changed} of {len(tokens)} requests")
    assert changed >= 1, "swap-members changed no request"


def test_corrupted_member_page_changes_tokens(llm: Any, reference: list[list[int]]) -> None:
    """Corrupt member 1 of the shared prefix's last checkpoint after wave 1: wave 2 adopts it."""
    require_state_sensitive_model()
    import torch
    from vllm import SamplingParams

    from hybridmem.vllm_plugin import state_table

    table = synthetic_table("S1", _sizes(llm), _num_blocks(llm), grid=_block(llm))
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    wave1, wave2 = workload(_block(llm))
    assert llm.reset_prefix_cache()
    state_table.activate(table)
    try:
        out = llm.generate([{"prompt_token_ids": p} for p in wave1], params, use_tqdm=False)
        with torch.inference_mode():  # the arena was made inside vLLM's inference mode
            for layer in mamba_layers(llm):
                store = layer._hybridmem_store[1]
                for b in range(1, _num_blocks(llm) + 1):
                    page = store.pages[table.resolve(b).members[1]]
                    if page.any():
                        page.fill_(0x3F)  # float32 0x3F3F3F3F = 0.75
        out += llm.generate([{"prompt_token_ids": p} for p in wave2], params, use_tqdm=False)
    finally:
        state_table.activate(None)
    tokens = [list(o.outputs[0].token_ids) for o in out]
    assert tokens[0] == reference[0]
    changed = sum(a != b for a, b in zip(tokens[1:], reference[1:], strict=True))
    print(f"CONTROL: changed {changed} of {len(tokens[1:])} requests")
    assert changed >= 1, "a corrupted member page changed no request of wave 2"
