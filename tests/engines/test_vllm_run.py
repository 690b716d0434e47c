"""Traced serving runs on CPU vLLM with the tiny model.

One module-scoped set of runs (8 requests each, same seed and workload):
  traced      prefix caching on, trace on
  untraced    the same, trace off
  isolated    the same, trace off, per-request cache_salt
  pressured   traced, a 10-block KV pool so that preemption, resume and losses happen
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hybridmem.events import Cause, EventKind, StateKind

pytestmark = pytest.mark.vllm

K = EventKind


def _run(cfg: Any) -> dict[str, Any]:
    import pyarrow.parquet as pq

    from hybridmem.engines.vllm_run import run_serving

    result = run_serving(cfg, progress=False)
    table = pq.read_table(result.results_path).to_pydict()
    manifest = json.loads(result.manifest_path.read_text())
    return {"summary": result.summary, "results": table, "manifest": manifest}


# vLLM's block for the tiny model: its 87,296-B Mamba page padded to the attention page, rounded to
# 128-token kernel blocks -> 256 tokens x 512 B (hybridmem/engines/README.md, "Embedded tiny model")
VLLM_BLOCK = 256

@pytest.fixture(scope="module")
def runs(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from hybridmem.engines.vllm_run import RunConfig

    root = tmp_path_factory.mktemp("runs")
    base = RunConfig(model=str(tiny_model), requests=12, rate=6.0, share=1.0, seed=3,
                     max_model_len=1024, out=root / "x")  # prompts long enough for 256-token hits
    return {
        "traced": _run(replace(base, out=root / "traced", trace_dir=root / "traced" / "trace")),
        "untraced": _run(replace(base, out=root / "untraced")),
        "isolated": _run(replace(base, out=root / "isolated", isolate=True)),
        "pressured": _run(replace(base, out=root / "pressured", rate=100.0, kv_blocks=10,
                                  trace_dir=root / "pressured" / "trace")),
    }


def _events(run: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    from hybridmem.engines.trace_sink import read_trace

    return read_trace(run["summary"]["trace_path"])


def test_traced_run_completes_with_an_accepted_trace(runs: dict[str, Any]) -> None:
    s = runs["traced"]["summary"]
    assert (s["requests"], s["completed"], s["trace"]) == (12, 12, True)
    assert s["trace_verdict"]["accepted"], s["trace_verdict"]
    meta, events = _events(runs["traced"])
    assert events[-1]["kind"] == K.END
    assert (meta["organization"], meta["attention_grid_tokens"]) == ("vllm", VLLM_BLOCK)
    assert (meta["recurrent_grid_tokens"], meta["seed"]) == (VLLM_BLOCK, 3)
    for key in ("seed", "trace", "throughput_tok_s", "throughput_ledger_tok_s", "ttft_p50",
                "ttft_p99", "e2e_p50", "e2e_p99", "preemptions", "prefix_hit_tokens",
                "requests", "completed", "trace_path", "trace_verdict"):
        assert key in s, key


def test_trace_events_follow_each_request(runs: dict[str, Any]) -> None:
    run = runs["traced"]
    _, events = _events(run)
    engine_id = dict(zip(run["results"]["request_id"], run["results"]["engine_request_id"],
                         strict=True))  # the trace carries vLLM's internal ids
    prompts = {engine_id[r["request_id"]]: r["prompt_token_ids"]
               for r in run["manifest"]["requests"]}
    entries = {e["request_id"]: e for e in events if e["kind"] == K.WAITING_ENTRY}
    assert set(entries) == set(prompts)
    for rid, e in entries.items():
        # chain: one key per full vLLM block of the prompt, for both groups
        assert e["depth"] == len(prompts[rid])
        assert len(e["chain"]) == len(prompts[rid]) // VLLM_BLOCK == len(e["recurrent_chain"])
    finished = Counter(e["request_id"] for e in events if e["kind"] == K.FINISH)
    assert finished == Counter(list(prompts))
    kinds = {e["state_kind"] for e in events if e["kind"] == K.PUBLICATION}
    assert kinds == {StateKind.ATTENTION, StateKind.RECURRENT}
    # the adopted depths of the first episodes are the prefix hits the engine reported
    adopted = sum(e["depth"] for e in events
                  if e["kind"] == K.ADOPTION and e["preemption_count"] == 0)
    assert adopted == run["summary"]["prefix_hit_tokens"] > 0
    # every published recurrent key sits on some request's recurrent chain
    chains = {h for e in entries.values() for h in e["recurrent_chain"]}
    for e in events:
        if e["kind"] == K.PUBLICATION and e["state_kind"] == StateKind.RECURRENT:
            assert e["hash"] in chains and e["depth"] % VLLM_BLOCK == 0


def test_pressure_gives_preemption_resume_and_allocation_losses(runs: dict[str, Any]) -> None:
    run = runs["pressured"]
    assert run["summary"]["completed"] == 12
    assert run["summary"]["trace_verdict"]["accepted"]
    _, events = _events(run)
    pre = [e for e in events if e["kind"] == K.PREEMPTION]
    assert pre and len(pre) == run["summary"]["preemptions"]
    for p in pre:
        # episode (rid, k) preempted -> waiting-entry of (rid, k+1) -> resume of (rid, k+1)
        nxt = (p["request_id"], p["preemption_count"] + 1)
        assert any(e["kind"] == K.WAITING_ENTRY and (e["request_id"], e["preemption_count"])
                   == nxt for e in events), nxt
        assert any(e["kind"] == K.RESUME and (e["request_id"], e["preemption_count"]) == nxt
                   for e in events), nxt
    live: dict[tuple[int, int], int] = {}
    for e in events:  # a loss removes a key that a publication made discoverable
        key = (e["hash"], e["state_kind"])
        if e["kind"] == K.PUBLICATION:
            assert live.get(key, 0) == 0, f"published twice without a loss: {e}"
            live[key] = 1
        elif e["kind"] == K.LOSS:
            assert live.get(key) == 1, f"loss of a key never published: {e}"
            live[key] = 0
    losses = [e for e in events if e["kind"] == K.LOSS]
    assert losses and all(e["cause"] == Cause.ALLOCATION and e["requester"] for e in losses)
    allocs = [e for e in events if e["kind"] == K.ALLOCATION]
    assert all(e["requester"] == e["request_id"] and 0 <= e["free"] <= 10 for e in allocs)
    assert any(e["outcome"] == 2 for e in allocs), "a 10-block pool must reject some attempt"


def test_greedy_outputs_identical_trace_on_and_off(runs: dict[str, Any]) -> None:
    on, off = runs["traced"]["results"], runs["untraced"]["results"]
    assert on["request_id"] == off["request_id"]
    assert on["output_token_ids"] == off["output_token_ids"]
    assert on["output_tokens"] == on["max_output_tokens"]  # ignore_eos: targets are met
    assert runs["untraced"]["summary"]["trace_path"] is None


def test_isolated_run_has_no_cross_request_prefix_hits(runs: dict[str, Any]) -> None:
    assert runs["untraced"]["summary"]["prefix_hit_tokens"] > 0, "shared run must reuse"
    assert runs["isolated"]["summary"]["prefix_hit_tokens"] == 0
    assert sum(runs["isolated"]["results"]["cached_tokens"]) == 0
    salts = [r["cache_salt"] for r in runs["isolated"]["manifest"]["requests"]]
    assert len(set(salts)) == len(salts) and None not in salts
