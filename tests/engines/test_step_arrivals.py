"""Arrivals by engine step (``RunConfig(arrivals="step")``, the demo's): the counted outcome of a
run (per-request prefix hits, episodes, preemptions) is the same on a slow machine as on a fast
one. The machine is made slow by a sleep in every engine step. Negative control: with wall-clock
arrivals the same slowdown changes what requests meet, and the counts differ."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]  # four tiny-model serving runs (~1 min idle)


def counted(cfg: Any, slow_s: float, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    import pyarrow.parquet as pq
    from vllm.v1.engine.llm_engine import LLMEngine

    from hybridmem.engines.vllm_run import run_serving

    real = LLMEngine.step

    def step(self):  # type: ignore[no-untyped-def]
        time.sleep(slow_s)
        return real(self)

    with monkeypatch.context() as m:
        m.setattr(LLMEngine, "step", step)
        r = run_serving(cfg, progress=False)
    t = pq.read_table(r.results_path).to_pydict()
    return {"cached": t["cached_tokens"], "preemptions": r.summary["preemptions"],
            "hits": r.summary["prefix_hit_tokens"]}


def test_counts_repeat_under_step_arrivals_not_wall(tiny_model: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from hybridmem.engines.vllm_run import RunConfig

    base = RunConfig(model=str(tiny_model), requests=16, rate=20.0, share=0.8, seed=1, cap=8,
                     org="S2", budget="b40", out=tmp_path / "x", arrivals="step", step_s=0.02)
    fast = counted(replace(base, out=tmp_path / "fast"), 0.0, monkeypatch)
    slow = counted(replace(base, out=tmp_path / "slow"), 0.08, monkeypatch)
    assert fast == slow
    assert sum(fast["cached"]) > 0, "the workload reuses prefixes"
    wall = replace(base, arrivals="wall")
    wfast = counted(replace(wall, out=tmp_path / "wfast"), 0.0, monkeypatch)
    wslow = counted(replace(wall, out=tmp_path / "wslow"), 0.08, monkeypatch)
    assert wfast != wslow, "negative control: wall-clock arrivals follow the machine's speed"
