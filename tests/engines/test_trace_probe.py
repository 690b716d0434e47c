"""Attaching and detaching the tracing hooks on a live engine, and the side-by-side probe-cost
benchmark built on them (``benchmarks/bench_trace_probe.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

HOOKED = {
    "scheduler": ("schedule", "add_request", "_preempt_request", "_free_request", "shutdown"),
    "kvm": ("allocate_slots", "record_prefix_cache_stats"),
    "coordinator": ("get_num_blocks_to_allocate",),
    "pool": ("_insert_block_hash", "_remove_cached_block_hashes", "move_block_hashes",
             "cache_full_blocks", "reset_prefix_cache"),
}


def _objects(scheduler):
    kvm = scheduler.kv_cache_manager
    return {"scheduler": scheduler, "kvm": kvm, "coordinator": kvm.coordinator,
            "pool": kvm.block_pool}


def test_detach_restores_vllm_methods_and_closes_the_trace(tiny_model: Path,
                                                           tmp_path: Path) -> None:
    from vllm import SamplingParams

    from hybridmem.engines.vllm_run import RunConfig, build_engine, engine_scheduler
    from hybridmem.vllm_plugin import tracing
    from tracer import verify

    engine = build_engine(RunConfig(model=str(tiny_model), max_model_len=512), tiny_model)
    try:
        scheduler = engine_scheduler(engine)
        objs = _objects(scheduler)
        assert all(name not in vars(objs[o]) for o, names in HOOKED.items() for name in names)

        path = tmp_path / "t.hmt"
        tracer = tracing.attach(scheduler, str(path))
        assert {(id(obj), name) for obj, name in tracer.hooked} == {
            (id(objs[o]), name) for o, names in HOOKED.items() for name in names}
        engine.add_request("a", {"prompt_token_ids": list(range(20, 60))},
                           SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
        while engine.has_unfinished_requests():
            engine.step()
        tracing.detach(scheduler)

        assert all(name not in vars(objs[o]) for o, names in HOOKED.items() for name in names)
        assert getattr(scheduler, tracing.TRACER_ATTR, None) is None
        verdict = verify(str(path))
        assert verdict.accepted, verdict.reason
        assert verdict.records >= 3  # waiting entry, adoption/allocation, finish
        tracing.detach(scheduler)  # untraced: a no-op
    finally:
        engine.engine_core.shutdown()


@pytest.mark.slow  # the benchmark script end to end (~7 s); the hooks are tested above
def test_bench_trace_probe_runs_both_arms(tiny_model: Path, tmp_path: Path) -> None:
    from benchmarks.bench_trace_probe import main

    out = tmp_path / "probe.json"
    rc = main(["--pairs", "2", "--requests", "4", "--model", str(tiny_model),
               "--out", str(tmp_path / "traces"), "--json", str(out)])
    assert rc == 0
    got = json.loads(out.read_text())
    assert got["traces_accepted"] == 2 and got["trace_events"] > 0
    assert len(got["pairs"]) == 2
    assert all(p["tokens"] > 0 and p["traced_s"] > 0 and p["untraced_s"] > 0
               for p in got["pairs"])
    assert set(got["wall"]) == {"mean", "low", "high"}


def test_bench_trace_probe_rejects_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.bench_trace_probe import main

    assert main(["--pairs", "1"]) == 2
    assert "--pairs must be >= 2, got 1" in capsys.readouterr().err
