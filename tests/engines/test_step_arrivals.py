"""Arrivals by engine step (``RunConfig(arrivals="step")``, the demo's): the counted outcome of a
run (per-request prefix hits, preemptions) is the same on a slow machine as on a fast one.

The machine's speed is the driver's clock, replaced by a fake one that advances by a fixed time
per engine step (5 ms: a quiet box; 500 ms: a loaded one), so the two speeds are exact and the
test sleeps nowhere. Negative control: with wall-clock arrivals the slow clock lets requests pile
up before the engine meets them, and the counts differ."""

from __future__ import annotations

import time
import types
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]  # four tiny-model serving runs (~1 min idle)


def counted(cfg: Any, step_cost_s: float, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    import pyarrow.parquet as pq
    from vllm.v1.engine.llm_engine import LLMEngine

    from hybridmem.engines import vllm_run

    clock = [0.0]

    def sleep(s: float) -> None:
        clock[0] += max(0.0, s)

    real = LLMEngine.step

    def step(self):  # type: ignore[no-untyped-def]
        clock[0] += step_cost_s
        return real(self)

    fake = types.SimpleNamespace(perf_counter=lambda: clock[0], sleep=sleep,
                                 process_time=time.process_time)
    with monkeypatch.context() as m:
        m.setattr(LLMEngine, "step", step)
        m.setattr(vllm_run, "time", fake)
        r = vllm_run.run_serving(cfg, progress=False)
    t = pq.read_table(r.results_path).to_pydict()
    return {"cached": t["cached_tokens"], "preemptions": r.summary["preemptions"],
            "hits": r.summary["prefix_hit_tokens"]}


def test_counts_repeat_under_step_arrivals_not_wall(tiny_model: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from hybridmem.engines.vllm_run import RunConfig

    base = RunConfig(model=str(tiny_model), requests=16, rate=4.0, share=0.8, seed=1, cap=8,
                     org="S2", budget="b40", out=tmp_path / "x", arrivals="step", step_s=0.05)
    fast = counted(replace(base, out=tmp_path / "fast"), 0.005, monkeypatch)
    slow = counted(replace(base, out=tmp_path / "slow"), 0.5, monkeypatch)
    assert fast == slow
    assert fast["hits"] > 0, "the workload reuses prefixes"
    wall = replace(base, arrivals="wall")
    wfast = counted(replace(wall, out=tmp_path / "wfast"), 0.005, monkeypatch)
    wslow = counted(replace(wall, out=tmp_path / "wslow"), 0.5, monkeypatch)
    assert wfast != wslow, "negative control: wall-clock arrivals follow the machine's speed"
