"""vLLM (CPU, prefix caching on and off) against transformers' greedy generation, and the CPU
prefix-caching fix for Mamba2 hybrids (a prompt crossing a block crashes without it)."""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.vllm

MAX_TOKENS = 24
# Three prompts over one 256-token shared prefix (two 128-token blocks), then own tails.
_SHARED = [16 + (7 * i) % 480 for i in range(256)]
PROMPTS = [_SHARED + [16 + (11 * i + 3 * j) % 480 for i in range(n)]
           for j, n in enumerate((60, 150, 44))]


def _llm(model: Path, prefix_caching: bool) -> Any:
    from vllm import LLM

    return LLM(model=str(model), dtype="float32", seed=0, enforce_eager=True,
               enable_prefix_caching=prefix_caching, max_model_len=1024, max_num_seqs=4,
               kv_cache_memory_bytes=64 << 20)


def _generate(llm: Any) -> tuple[list[list[int]], list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs], [o.num_cached_tokens for o in outs]


def _shutdown(llm: Any) -> None:
    llm.llm_engine.engine_core.shutdown()


def hf_greedy(model_dir: Path, prompts: list[list[int]]) -> list[list[int]]:
    """transformers' greedy MAX_TOKENS continuation of every prompt (never stopping early)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # like vLLM's ignore_eos: never stop early
    out = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])
            gen = model.generate(ids, max_new_tokens=MAX_TOKENS, do_sample=False,
                                 attention_mask=torch.ones_like(ids), pad_token_id=0)
            out.append(gen[0, len(p):].tolist())
    assert all(len(o) == MAX_TOKENS for o in out), "reference stopped early"
    return out


@pytest.fixture(scope="module")
def reference(tiny_model: Path) -> list[list[int]]:
    return hf_greedy(tiny_model, PROMPTS)


def test_prefix_caching_off_matches_transformers(tiny_model: Path,
                                                 reference: list[list[int]]) -> None:
    llm = _llm(tiny_model, prefix_caching=False)
    tokens, _ = _generate(llm)
    _shutdown(llm)
    assert tokens == reference


def test_prefix_caching_on_matches_transformers_with_hits(tiny_model: Path,
                                                          reference: list[list[int]]) -> None:
    llm = _llm(tiny_model, prefix_caching=True)
    cold, _ = _generate(llm)
    warm, hits = _generate(llm)  # second pass adopts cached attention + Mamba state
    _shutdown(llm)
    assert cold == reference
    assert min(hits) >= 256, f"second pass should reuse the shared 256 tokens, got {hits}"
    assert warm == reference


def test_cpu_prefix_fix_is_what_makes_block_crossing_prompts_run(
        tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hybridmem.vllm_plugin import cpu_fix

    assert cpu_fix.apply()  # the plugin installed it already; idempotent
    monkeypatch.setenv(cpu_fix.DISABLE_ENV, "0")
    llm = _llm(tiny_model, prefix_caching=True)
    with pytest.raises(Exception) as info:  # noqa: B017 - vLLM wraps the worker's IndexError
        _generate(llm)
    assert "IndexError" in repr(info.value) or "out of bounds" in str(info.value)
    _shutdown(llm)
    del llm
    gc.collect()  # tear the crashed engine down fully before the next one starts
    monkeypatch.setenv(cpu_fix.DISABLE_ENV, "1")
    assert os.environ[cpu_fix.DISABLE_ENV] == "1"
    fixed = _llm(tiny_model, prefix_caching=True)
    tokens, _ = _generate(fixed)
    _shutdown(fixed)
    assert len(tokens) == len(PROMPTS) and all(len(t) == MAX_TOKENS for t in tokens)
