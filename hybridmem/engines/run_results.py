"""What a serving run writes, whichever driver ran it: per-request records, summary, results.

Both drivers -- in-process (:mod:`.vllm_run`) and over HTTP (:mod:`.http_run`) -- fill one
:class:`RequestRecord` per workload request (times in seconds after t0, the start of submission)
and hand them to :func:`write_run`, so ``results.parquet`` and ``summary.json`` carry the same
columns and keys (:data:`SUMMARY_KEYS` at least) and the same definitions:

* TTFT = first output token seen by the driver - planned arrival; E2E = finished - planned arrival;
* ``throughput_tok_s`` = completed output tokens / request span (first arrival to last completion);
* ``throughput_ledger_tok_s`` = the same tokens / ledger interval (t0 to engine shut down, trace
  flushed).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from hybridmem.outputs import atomic_output, write_text_atomic
from hybridmem.workload import WorkloadRequest

SUMMARY_KEYS = (
    "seed", "trace", "throughput_tok_s", "throughput_ledger_tok_s", "ttft_p50", "ttft_p99",
    "e2e_p50", "e2e_p99", "preemptions", "prefix_hit_tokens", "requests", "completed",
    "trace_path", "trace_verdict",
)
OK_REASONS = ("length", "stop")


@dataclass
class RequestRecord:
    """One request as the driver saw it (times: seconds after t0; NaN = never happened)."""

    spec: WorkloadRequest
    submitted: float = math.nan
    first_token: float = math.nan
    finished: float = math.nan
    token_ids: list[int] = field(default_factory=list)
    cached_tokens: int = 0
    finish_reason: str = ""
    engine_id: str = ""  # vLLM's internal id (external id + "-" + 8 random chars) = trace id
    error: str = ""       # why the driver gave up on it (HTTP driver: timeout, HTTP status)


class RunResult(NamedTuple):
    summary: dict[str, Any]
    results_path: Path
    summary_path: Path
    manifest_path: Path


def _pct(values: Sequence[float], q: float) -> float | None:
    vals = [v for v in values if not math.isnan(v)]
    return float(np.percentile(vals, q)) if vals else None


def summarize(cfg: Any, records: dict[str, RequestRecord], ledger: float, init_s: float,
              trace_path: Path | None, preemptions: int, engine_version: str,
              driver: str) -> dict[str, Any]:
    """The run's summary dict (keys: :data:`SUMMARY_KEYS` and the extras below)."""
    recs = list(records.values())
    done = [r for r in recs if not math.isnan(r.finished)]
    ok = [r for r in done if r.finish_reason in OK_REASONS]
    tokens = sum(len(r.token_ids) for r in ok)
    first_arrival = min(r.spec.arrival_s for r in recs)
    last_done = max((r.finished for r in done), default=math.nan)
    span = last_done - first_arrival
    ttft = [r.first_token - r.spec.arrival_s for r in ok]
    e2e = [r.finished - r.spec.arrival_s for r in ok]
    return {
        "seed": cfg.seed,
        "trace": trace_path is not None,
        "throughput_tok_s": tokens / span if span > 0 else None,
        "throughput_ledger_tok_s": tokens / ledger if ledger > 0 else None,
        "ttft_p50": _pct(ttft, 50), "ttft_p99": _pct(ttft, 99),
        "e2e_p50": _pct(e2e, 50), "e2e_p99": _pct(e2e, 99),
        "preemptions": preemptions,
        "prefix_hit_tokens": sum(r.cached_tokens for r in recs),
        "requests": len(recs),
        "completed": len(ok),
        "output_tokens": tokens,
        "request_span_s": span,
        "ledger_s": ledger,
        "engine_init_s": init_s,
        "trace_path": str(trace_path) if trace_path is not None else None,
        "trace_verdict": _verdict(trace_path),
        "engine": "vllm", "engine_version": engine_version,
        "driver": driver,
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()},
    }


def _verdict(trace_path: Path | None) -> dict[str, Any] | None:
    from hybridmem.engines.trace_sink import verify_trace

    if trace_path is None:
        return None
    if not Path(trace_path).exists():  # the engine died before its scheduler opened the sink
        return {"accepted": False, "reason": f"no trace file at {trace_path}"}
    return verify_trace(trace_path)


RESULTS_FILE = "results.parquet"
SUMMARY_FILE = "summary.json"


def clear_previous_outputs(out: Path) -> list[Path]:
    """Remove a previous run's summary and results from ``out`` before a run starts, so a run
    killed midway never leaves an old summary (claiming an accepted trace) beside this run's
    truncated trace. Returns what was removed."""
    removed = []
    for name in (SUMMARY_FILE, RESULTS_FILE):
        p = out / name
        if p.is_file():
            p.unlink()
            removed.append(p)
    return removed


def write_results(records: dict[str, RequestRecord], path: Path) -> Path:
    """``results.parquet``: one row per request, in workload order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    recs = list(records.values())
    nan = float("nan")
    table = pa.table({
        "request_id": [r.spec.request_id for r in recs],
        "engine_request_id": [r.engine_id for r in recs],
        "arrival_s": [r.spec.arrival_s for r in recs],
        "input_tokens": [len(r.spec.prompt_token_ids) for r in recs],
        "max_output_tokens": [r.spec.max_output_tokens for r in recs],
        "output_tokens": [len(r.token_ids) for r in recs],
        "ttft_s": [r.first_token - r.spec.arrival_s if r.first_token == r.first_token else nan
                   for r in recs],
        "e2e_s": [r.finished - r.spec.arrival_s if r.finished == r.finished else nan
                  for r in recs],
        "success": [r.finish_reason in OK_REASONS for r in recs],
        "finish_reason": [r.finish_reason for r in recs],
        "cached_tokens": [r.cached_tokens for r in recs],
        "output_token_ids": pa.array([r.token_ids for r in recs], type=pa.list_(pa.int32())),
    })
    with atomic_output(path, what="results") as tmp:
        pq.write_table(table, tmp)
    return path


def write_run(out: Path, summary: dict[str, Any], records: dict[str, RequestRecord],
              manifest: Path) -> RunResult:
    """Write results.parquet, then summary.json (last: its presence means the run finished),
    each atomically."""
    results = write_results(records, out / RESULTS_FILE)
    summary_path = out / SUMMARY_FILE
    write_text_atomic(summary_path, json.dumps(summary, indent=2, sort_keys=True) + "\n",
                      what="summary")
    return RunResult(summary, results, summary_path, manifest)
