"""OrgScheduler's chunk rule alone (no engine): with chunk stops every recurrent boundary ends a
chunk; with boundary exports the manager's ``fit_chunk`` decides, and decode is left alone.
Negative controls of the ``scheduler`` mutants in ``invariants/serving_mutants.py``."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("vllm")

from hybridmem.vllm_plugin.org_scheduler import OrgScheduler  # noqa: E402


def split(computed: int, vllm_n: int, *, stops: bool, interval: int = 32, prompt: int = 200,
          hit: int = 0, fitted: Any = None) -> tuple[int, list[tuple[int, int]]]:
    calls: list[tuple[int, int]] = []

    def fit_chunk(request: Any, start: int, end: int) -> int:
        calls.append((start, end))
        return end if fitted is None else fitted(start, end)

    sched = SimpleNamespace(vllm_split=lambda *a: vllm_n, _chunk_stops=stops, _interval=interval,
                            kv_cache_manager=SimpleNamespace(fit_chunk=fit_chunk))
    request = SimpleNamespace(num_computed_tokens=computed, num_prompt_tokens=prompt,
                              num_tokens=prompt)
    n = OrgScheduler._mamba_block_aligned_split(sched, request, vllm_n, hit)  # type: ignore[arg-type]
    return n, calls


def test_chunk_stops_end_every_chunk_at_the_next_boundary() -> None:
    assert split(0, 100, stops=True)[0] == 32  # [chunk-stops-every-other-boundary]
    assert split(40, 100, stops=True)[0] == 24  # 40 -> 64
    assert split(0, 100, stops=True, hit=64)[0] == 32  # a hit starts the chunk at 64
    assert split(40, 10, stops=True)[0] == 10  # vLLM's shorter chunk stands
    assert split(0, 300, stops=True, interval=256)[0] == 256  # D0: its interval


def test_exports_let_the_manager_fit_the_chunk() -> None:
    n, calls = split(40, 100, stops=False, fitted=lambda s, e: 64)
    assert n == 24 and calls == [(40, 140)]  # [chunks-not-fitted]
    n, calls = split(0, 100, stops=False)
    assert n == 100 and calls == [(0, 100)]
