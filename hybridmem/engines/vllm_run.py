"""Run driver: a timed, optionally traced serving run on vLLM, in-process (paper §4, SPEC §6, §10).

The driver steps one in-process ``LLMEngine`` (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so engine
init takes seconds, not tens of seconds) and submits each request when its planned arrival time
has passed, so arrivals are real wall-clock times (open loop)::

    engine init ── t0 = r0 arrives (0 s) ── r1 (Exp gap) ── ... ── last done ── engine shut down
                   |<------------- request span ------------------------->|    (trace END flushed)
                   |<------------- ledger interval ------------------------------------------->|

``throughput_tok_s`` divides completed output tokens by the request span (first arrival to last
completion); ``throughput_ledger_tok_s`` by the ledger interval, which starts when the driver
starts submitting (t0, engine ready) and ends when the engine has shut down -- so it also pays for
closing and flushing the trace. Engine init is reported apart (``engine_init_s``).

Per request it records TTFT (planned arrival -> first output token seen by the driver), E2E
(planned arrival -> finished), output tokens, success and cached prompt tokens. vLLM appends 8
random characters to each request id; the trace carries that internal id, and results.parquet
keeps both (``request_id``, ``engine_request_id``). ``results.parquet``
holds one row per request, ``summary.json`` the run (keys in :data:`SUMMARY_KEYS`), and
``workload.json`` the manifest (prompts as token ids).

Sampling is greedy with ``ignore_eos`` so output lengths equal the workload's targets. Tracing is
the vLLM plugin's: with ``trace_dir`` set the driver points ``HYBRIDMEM_TRACE`` at
``trace_dir/trace.hmt`` before the engine starts and shuts the engine down at the end (END).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hybridmem.engines.run_results import (  # noqa: F401  (SUMMARY_KEYS: re-exported)
    SUMMARY_KEYS,
    RequestRecord,
    RunResult,
    clear_previous_outputs,
    summarize,
    write_run,
)
from hybridmem.engines.tiny_model import resolve_model
from hybridmem.errors import HybridMemError
from hybridmem.workload import Workload, WorkloadSpec, make_workload

TRACE_FILE = "trace.hmt"


@dataclass(frozen=True)
class RunConfig:
    model: str = "tiny"          # "tiny" (built on demand) or a model directory
    requests: int = 20
    rate: float = 3.0            # Poisson arrival rate, requests/s
    share: float = 0.5           # q: common-prefix fraction of each prompt
    seed: int = 0
    cap: int = 8                 # running-sequence cap (vLLM max_num_seqs)
    isolate: bool = False        # per-request cache_salt: no cross-request prefix hit
    trace_dir: Path | None = None
    out: Path = Path("out/run")
    prefix_caching: bool = True
    max_model_len: int = 1024    # model limit the workload is scaled to
    kv_blocks: int | None = None  # KV-cache blocks (None: from kv_cache_bytes)
    kv_cache_bytes: int = 256 << 20
    dtype: str = "float32"
    data_dir: Path | None = None  # where the tiny model lives (default data/models/tiny-falcon-h1)

    def check(self) -> None:
        if self.requests < 1:
            raise ValueError(f"requests must be >= 1, got {self.requests}")
        if not (self.rate > 0):
            raise ValueError(f"rate must be > 0 requests/s, got {self.rate}")
        if not 0.0 <= self.share <= 1.0:
            raise ValueError(f"share must lie in [0, 1], got {self.share}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        if self.cap < 1:
            raise ValueError(f"cap must be >= 1, got {self.cap}")
        if self.max_model_len < 64:
            raise ValueError(f"max_model_len must be >= 64 tokens, got {self.max_model_len}")
        if self.kv_blocks is not None and self.kv_blocks < 2:
            raise ValueError(f"kv_blocks must be >= 2, got {self.kv_blocks}")
        for name, value, hi in (("requests", self.requests, 100_000),
                                ("seed", self.seed, 2**32 - 1), ("cap", self.cap, 4096),
                                ("max_model_len", self.max_model_len, 1 << 20),
                                ("kv_blocks", self.kv_blocks or 0, 1 << 16)):
            if value > hi:  # past these vLLM fails after the engine started (issue 14)
                raise ValueError(f"{name} must be <= {hi:,}, got {value:,}")
        if not math.isfinite(self.rate):
            raise ValueError(f"rate must be finite, got {self.rate}")


def vocab_size(model: Path) -> int:
    """The model's vocabulary size from its config.json (a caller error if unreadable)."""
    try:
        cfg = json.loads((model / "config.json").read_text())
        vocab = int(cfg["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise HybridMemError(f"model {str(model)!r}: config.json gives no vocab_size "
                             f"({type(exc).__name__}: {exc})") from None
    if vocab < 2:
        raise HybridMemError(f"model {str(model)!r}: vocab_size must be >= 2, got {vocab}")
    return vocab


def make_requests(cfg: RunConfig, vocab_size: int) -> Workload:
    """The run's workload from :mod:`hybridmem.workload` (SPEC §10), scaled to the model limit."""
    return make_workload(WorkloadSpec(
        vocab_size=vocab_size, num_requests=cfg.requests, rate=cfg.rate, share=cfg.share,
        seed=cfg.seed, isolate=cfg.isolate, model_limit=cfg.max_model_len,
    ))


def prepare_run(cfg: RunConfig) -> tuple[Path, Workload, Path, Path, Path | None]:
    """What both drivers set up before serving: the model directory, the workload, the output
    directory, the saved manifest, and the trace path (stale traces removed, so the verdict is
    this run's; ``None`` untraced)."""
    model = resolve_model(cfg.model, cfg.data_dir)
    workload = make_requests(cfg, vocab_size(model))
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    clear_previous_outputs(out)  # a killed re-run leaves no old summary beside a new trace
    manifest = workload.save_manifest(out / "workload.json")
    trace_path: Path | None = None
    if cfg.trace_dir is not None:
        Path(cfg.trace_dir).mkdir(parents=True, exist_ok=True)
        trace_path = Path(cfg.trace_dir) / TRACE_FILE
        trace_path.unlink(missing_ok=True)
    return model, workload, out, manifest, trace_path


def _metric_total(name: str) -> float:
    """Sum of a vLLM Prometheus counter over its label sets (0 when absent)."""
    from vllm.v1.metrics.reader import Counter, get_metrics_snapshot

    return float(sum(m.value for m in get_metrics_snapshot()
                     if m.name == name and isinstance(m, Counter)))


def _engine(cfg: RunConfig, model: Path) -> Any:
    from vllm import EngineArgs, LLMEngine

    kwargs: dict[str, Any] = dict(
        model=str(model), tokenizer=str(model), dtype=cfg.dtype, seed=cfg.seed,
        enable_prefix_caching=cfg.prefix_caching, max_model_len=cfg.max_model_len,
        max_num_seqs=cfg.cap, enforce_eager=True, disable_log_stats=False,
    )
    if cfg.kv_blocks is not None:
        kwargs["num_gpu_blocks_override"] = cfg.kv_blocks
    kwargs["kv_cache_memory_bytes"] = cfg.kv_cache_bytes
    return LLMEngine.from_engine_args(EngineArgs(**kwargs))


def run_serving(cfg: RunConfig, progress: bool = True) -> RunResult:
    """One serving run; writes results.parquet, summary.json and workload.json into cfg.out."""
    cfg.check()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    # vLLM-CPU pins its OpenMP threads to chosen cores by default; on a shared box that pins the
    # run onto a core another tenant may saturate (measured here: ~10x slower, bimodal). Let the OS
    # place threads unless the caller chose a binding.
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    # One OpenMP thread unless the caller says otherwise: with two, an OpenMP barrier waits for a
    # thread another tenant has descheduled, and runs here slowed down 10-40x at random. Takes
    # effect only if OpenMP has not started yet in this process (the CLI imports torch later).
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    model, workload, out, manifest, trace_path = prepare_run(cfg)
    requests = workload.requests

    if trace_path is not None:
        from hybridmem.vllm_plugin import tracing

        os.environ[tracing.TRACE_ENV] = str(trace_path)
        os.environ[tracing.META_ENV] = json.dumps(
            {"seed": cfg.seed, "workload": {"requests": cfg.requests, "rate": cfg.rate,
                                            "share": cfg.share, "isolate": cfg.isolate}})
        tracing.install()
    try:
        import vllm
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        t_init = time.perf_counter()
        engine = _engine(cfg, model)
        init_s = time.perf_counter() - t_init
    finally:
        if trace_path is not None:
            os.environ.pop("HYBRIDMEM_TRACE", None)
            os.environ.pop("HYBRIDMEM_TRACE_META", None)
    tracer = getattr(_scheduler(engine), "_hybridmem_tracer", None)
    if trace_path is not None:
        assert tracer is not None, "traced run but no tracer attached; this indicates a plugin bug"
        trace_path = Path(tracer.sink.path)
    else:
        assert tracer is None, "untraced run has a tracer attached; HYBRIDMEM_TRACE leaked in"

    preempt0 = _metric_total("vllm:num_preemptions")
    records = {r.request_id: RequestRecord(r) for r in requests}
    pending = sorted(requests, key=lambda r: r.arrival_s)
    bar = _progress(len(requests), progress)
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    nxt = 0
    try:
        while nxt < len(pending) or engine.has_unfinished_requests():
            now = time.perf_counter() - t0
            while nxt < len(pending) and pending[nxt].arrival_s <= now:
                r = pending[nxt]
                prompt: dict[str, Any] = {"prompt_token_ids": list(r.prompt_token_ids)}
                if r.cache_salt is not None:
                    prompt["cache_salt"] = r.cache_salt
                params = SamplingParams(max_tokens=r.max_output_tokens, temperature=0.0,
                                        ignore_eos=True, output_kind=RequestOutputKind.DELTA)
                records[r.request_id].engine_id = engine.add_request(r.request_id, prompt, params)
                records[r.request_id].submitted = now
                nxt += 1
            if not engine.has_unfinished_requests():
                time.sleep(max(0.0, pending[nxt].arrival_s - (time.perf_counter() - t0)))
                continue
            outputs = engine.step()
            now = time.perf_counter() - t0
            for o in outputs:
                rec = records[o.request_id]
                new = list(o.outputs[0].token_ids)
                if new and math.isnan(rec.first_token):
                    rec.first_token = now
                    rec.cached_tokens = int(o.num_cached_tokens or 0)
                rec.token_ids.extend(new)
                if o.finished:
                    rec.finished = now
                    rec.finish_reason = str(o.outputs[0].finish_reason)
                    if bar is not None:
                        bar.update(1)
    finally:
        if bar is not None:
            bar.close()
        preemptions = int(_metric_total("vllm:num_preemptions") - preempt0)
        engine.engine_core.shutdown()  # closes the trace (END)
    ledger = time.perf_counter() - t0
    cpu_s = time.process_time() - cpu0
    summary = summarize(cfg, records, ledger, init_s, trace_path, preemptions,
                        engine_version=vllm.__version__, driver="inprocess")
    # CPU seconds of this process over the ledger interval: on a shared box, where wall-clock
    # throughput moves with other tenants' load, tokens per CPU second isolates the probe cost.
    summary["cpu_s"] = cpu_s
    summary["throughput_cpu_tok_s"] = summary["output_tokens"] / cpu_s if cpu_s > 0 else None
    return write_run(out, summary, records, manifest)


def _scheduler(engine: Any) -> Any:
    core = getattr(engine.engine_core, "engine_core", None)
    return getattr(core, "scheduler", None)


def _progress(total: int, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="requests", unit="req", file=sys.stderr, leave=False)
