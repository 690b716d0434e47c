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

import contextlib
import json
import math
import os
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
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
from hybridmem.inputs import read_input_text
from hybridmem.vllm_plugin.org_settings import OrgSettings
from hybridmem.vllm_plugin.resident import row_copies
from hybridmem.workload import Workload, WorkloadSpec, make_workload

TRACE_FILE = "trace.hmt"
ORG_CHOICES = ("S0", "S1", "S2", "D0", "vllm")
ARRIVALS = ("wall", "step")
DEFAULT_ORG = "vllm"


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
    chunk_tokens: int | None = None  # tokens per engine step (vLLM max_num_batched_tokens)
    # admission checks only the first prefill chunk, not the whole prompt (vLLM's
    # --no-scheduler-reserve-full-isl; its default admits a request only if all of it fits)
    admit_first_chunk: bool = False
    kv_cache_bytes: int = 256 << 20
    dtype: str = "float32"
    data_dir: Path | None = None  # where the tiny model lives (default data/models/tiny-falcon-h1)
    # organization mode: "vllm" = vLLM's own KV-cache manager with tracing hooks
    org: str = "vllm"
    budget: str | None = None    # label bN, bytes or a size per layer (org mode: required)
    headroom: float = 0.0        # admission headroom f: need + floor(f B) <= available
    pin_k: int | None = None     # preemption-time pinning threshold K (1|2|3), None = off
    pin_budget: int | None = None  # most simultaneous pins (None = unlimited)
    retention: bool = False      # producer-side retention, K = 2
    fault: str | None = None     # fault injection (hybridmem.vllm_plugin.faults)
    check_invariants: bool = False  # App. D.2 checkers after every scheduler step
    attention_fraction: float | None = None  # D0's attention share (preset models: theirs)
    poison_vllm_state: bool = False  # check mode: NaN into vLLM's own Mamba rows every step
    # "wall": a request is submitted once its planned arrival has passed on the wall clock (open
    # loop; what the engine meets depends on how fast this machine steps it). "step": once the
    # engine has taken arrival_s / step_s steps (idle stretches skipped), so which requests
    # meet in which step, and every count that follows (hits, reuse, losses, preemptions),
    # repeats on any machine; latencies are still wall clock, from each actual submission.
    arrivals: str = "wall"
    step_s: float = 0.02         # "step" arrivals: seconds of the planned schedule per step

    def org_settings(self) -> OrgSettings | None:
        """The organization settings the engine gets (None: ``--org vllm``)."""
        if self.org == "vllm":
            return None
        return OrgSettings(org=self.org, budget=str(self.budget), headroom=self.headroom,
                           pin_k=self.pin_k, pin_budget=self.pin_budget, retention=self.retention,
                           fault=self.fault, check_invariants=self.check_invariants,
                           attention_fraction=self.attention_fraction)

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
        if self.chunk_tokens is not None and not 16 <= self.chunk_tokens <= 1 << 20:
            raise ValueError(f"chunk_tokens must be in [16, {1 << 20:,}], got "
                             f"{self.chunk_tokens:,}")
        for name, value, hi in (("requests", self.requests, 100_000),
                                ("seed", self.seed, 2**32 - 1), ("cap", self.cap, 4096),
                                ("max_model_len", self.max_model_len, 1 << 20),
                                ("kv_blocks", self.kv_blocks or 0, 1 << 16)):
            if value > hi:  # past these vLLM fails after the engine started
                raise ValueError(f"{name} must be <= {hi:,}, got {value:,}")
        if not math.isfinite(self.rate):
            raise ValueError(f"rate must be finite, got {self.rate}")
        if self.arrivals not in ARRIVALS:
            raise ValueError(f"arrivals must be one of {', '.join(ARRIVALS)}, got "
                             f"{self.arrivals!r}")
        if not (math.isfinite(self.step_s) and 1e-4 <= self.step_s <= 60):
            raise ValueError(f"step_s must be in [0.0001, 60] seconds, got {self.step_s}")
        if self.org not in ORG_CHOICES:
            raise ValueError(f"org must be one of {', '.join(ORG_CHOICES)}, got {self.org!r}")
        if self.org == "vllm":
            extra = {"poison-vllm-state": self.poison_vllm_state,
                     "budget": self.budget is not None, "headroom": self.headroom != 0.0,
                     "pin-k": self.pin_k is not None, "pin-budget": self.pin_budget is not None,
                     "retention": self.retention, "fault": self.fault is not None,
                     "check-invariants": self.check_invariants,
                     "attention-fraction": self.attention_fraction is not None}
            given = [k for k, v in extra.items() if v]
            if given:
                raise ValueError(f"--{given[0]} needs an organization (--org S0|S1|S2|D0), "
                                 "not --org vllm")
            return
        if self.budget is None:
            raise ValueError(f"--org {self.org} needs --budget")
        if not self.prefix_caching:
            raise ValueError(f"--org {self.org} needs prefix caching (Mamba cache mode 'align'); "
                             "drop --no-prefix-caching")
        if self.kv_blocks is not None:
            raise ValueError(f"--kv-blocks does not apply to --org {self.org}: the budget sizes "
                             "the cache")
        check_budget_text(self.budget)
        settings = self.org_settings()
        assert settings is not None
        settings.check()


def check_budget_text(text: str) -> None:
    """ValueError unless ``text`` is a label bN (N >= 1), a byte count, a size, or a total's
    label ``total SIZE``."""
    import re

    from hybridmem.budget import TOTAL_PREFIX, parse_size
    from hybridmem.errors import BudgetError

    if re.fullmatch(r"b[1-9]\d*", text.strip()):
        return
    size = text.strip()
    if size.startswith(TOTAL_PREFIX):
        size = size[len(TOTAL_PREFIX):]
    try:
        parse_size(size)
    except BudgetError:
        raise ValueError(f"bad budget {text!r}: expected a label bN (e.g. b40), a byte count, "
                         "a size such as 2MiB (per layer), or 'total SIZE' (whole cache)") from None


def check_org_model(cfg: RunConfig, model: Path) -> None:
    """HybridMemError before anything is written when the organization cannot serve the
    model: D0 needs an attention fraction (a preset's, or --attention-fraction)."""
    if cfg.org != "D0" or cfg.attention_fraction is not None:
        return
    from hybridmem.geometry import load_geometry

    if load_geometry(str(model)).attention_fraction is None:
        raise HybridMemError(f"--org D0 needs --attention-fraction for model {str(model)!r} "
                             "(no preset gives one)")


def vocab_size(model: Path) -> int:
    """The model's vocabulary size from its config.json (a caller error if unreadable)."""
    try:
        cfg = json.loads(read_input_text(model / "config.json", "config"))
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
    check_org_model(cfg, model)
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


def build_engine(cfg: RunConfig, model: Path) -> Any:
    """An in-process vLLM ``LLMEngine`` for ``cfg`` on ``model`` (with the organization's
    engine arguments); benchmarks and tests reuse it."""
    from vllm import EngineArgs, LLMEngine

    kwargs: dict[str, Any] = dict(
        model=str(model), tokenizer=str(model), dtype=cfg.dtype, seed=cfg.seed,
        enable_prefix_caching=cfg.prefix_caching, max_model_len=cfg.max_model_len,
        max_num_seqs=cfg.cap, enforce_eager=True, disable_log_stats=False,
        use_tqdm_on_load=False,  # its progress bar writes to the terminal, past engine.log
    )
    if cfg.kv_blocks is not None:
        kwargs["num_gpu_blocks_override"] = cfg.kv_blocks
    if cfg.chunk_tokens is not None:
        kwargs["max_num_batched_tokens"] = cfg.chunk_tokens
    if cfg.admit_first_chunk:
        kwargs["scheduler_reserve_full_isl"] = False
    kwargs["kv_cache_memory_bytes"] = cfg.kv_cache_bytes
    kwargs.update(org_engine_args(cfg, model))
    return LLMEngine.from_engine_args(EngineArgs(**kwargs))


def org_grid(cfg: RunConfig, model: Path) -> Any:
    """The organization grid override of the run (None for ``--org vllm``): the
    organization's own grid (``org_geometry.org_grid``: S0-S2 the model's grid, 64 tokens for
    the tiny model, 512 for Falcon-H1 checkpoints; D0 its native 16-token unit)."""
    if cfg.org == "vllm":
        return None
    from hybridmem.vllm_plugin import org_geometry

    return org_geometry.serving_grid(org_geometry.org_grid(cfg.org, model))


def org_env(cfg: RunConfig, model: Path) -> dict[str, str]:
    """Environment of organization mode the engine(-core) process must see: the grid and the
    poison check (``{}`` for ``--org vllm``)."""
    from hybridmem.vllm_plugin.org_state import POISON_ENV

    grid = org_grid(cfg, model)
    if grid is None:
        return {}
    return {**grid.env, POISON_ENV: "1" if cfg.poison_vllm_state else "0"}


def org_engine_args(cfg: RunConfig, model: Path) -> dict[str, Any]:
    """EngineArgs of organization mode: the grid (block size G), the scheduler seam, the
    settings, async scheduling off (``{}`` for ``--org vllm``). The plugin sizes the cache to
    the organization's block ids."""
    settings = cfg.org_settings()
    grid = org_grid(cfg, model)
    if settings is None or grid is None:
        return {}
    from hybridmem.vllm_plugin.org_settings import SCHEDULER_QUALNAME as QUALNAME

    return {**grid.engine_kwargs, "scheduler_cls": QUALNAME,
            "additional_config": settings.as_config(), "async_scheduling": False}


def org_summary(cfg: RunConfig, scheduler: Any | None, error: str | None) -> dict[str, Any]:
    """summary.json keys of the memory organization (``--org vllm`` too)."""
    settings = cfg.org_settings()
    out: dict[str, Any] = {
        "organization": cfg.org, "budget": cfg.budget, "budget_bytes": None,
        "fault": cfg.fault,
        "policy": {"cap": cfg.cap, "headroom": cfg.headroom, "pin_k": cfg.pin_k,
                   "pin_budget": cfg.pin_budget, "retention": cfg.retention,
                   "isolate": cfg.isolate},
        "invariant_checks": "violated: " + error if error else (
            "passed" if cfg.check_invariants else "off"),
        "poison_vllm_state": cfg.poison_vllm_state,
        "state_storage": None,
    }
    plan = getattr(scheduler, "org_plan", None)
    if settings is not None and plan is not None:
        out.update(budget_bytes=plan.nominal_bytes, org_plan=plan.as_dict())
        kvm = scheduler.kv_cache_manager  # type: ignore[union-attr]
        out["org_counters"] = dict(kvm.counters)
        out["fault_count"] = kvm.fault_count
        out["state_storage"] = getattr(scheduler, "state_storage", None)
    return out


def check_budget_fits(cfg: RunConfig, scheduler: Any, workload: Workload) -> None:
    """HybridMemError when the organization cannot hold the workload's longest request (it
    would wait forever)."""
    from hybridmem.vllm_plugin.org_settings import fits_one_request

    plan = getattr(scheduler, "org_plan", None)
    if plan is None:
        return
    longest = max(len(r.prompt_token_ids) + r.max_output_tokens for r in workload.requests)
    why = fits_one_request(plan, longest)
    if why is not None:
        raise HybridMemError(why)


@contextlib.contextmanager
def scoped_env(env: Mapping[str, str | None]) -> Iterator[None]:
    """Set ``env`` in ``os.environ`` for the block (a None value unsets the variable); restore
    every variable, or its absence, afterwards."""
    saved = {k: os.environ.get(k) for k in env}
    try:
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def arrivals_text(cfg: RunConfig) -> str:
    """How requests were submitted, in words (summary and trace metadata)."""
    if cfg.arrivals == "step":
        return f"engine step ({cfg.step_s * 1000:g} ms of the Poisson schedule per step)"
    return "wall clock (Poisson schedule)"


def _device() -> str:
    """Where the engine computes, for the trace metadata (figures name it)."""
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


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
            {"seed": cfg.seed, "device": _device(), "arrivals": arrivals_text(cfg),
             **({"budget": cfg.budget} if cfg.budget is not None else {}),
             "workload": {"requests": cfg.requests, "rate": cfg.rate, "share": cfg.share,
                          "isolate": cfg.isolate}})
        tracing.install()
    try:
        import vllm
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        t_init = time.perf_counter()
        env = org_env(cfg, model)
        if cfg.org != "vllm":
            from hybridmem.vllm_plugin import org_geometry, org_state
            from hybridmem.vllm_plugin.org_settings import install_block_override

            install_block_override()
            org_geometry.install()
            org_state.install()  # reads the poison setting from the environment below
        with scoped_env(env):  # the next engine of this process starts clean
            if cfg.org != "vllm":
                org_state.set_poison(cfg.poison_vllm_state)
            engine = build_engine(cfg, model)
        init_s = time.perf_counter() - t_init
    finally:
        if trace_path is not None:
            os.environ.pop("HYBRIDMEM_TRACE", None)
            os.environ.pop("HYBRIDMEM_TRACE_META", None)
    try:
        check_budget_fits(cfg, engine_scheduler(engine), workload)
    except HybridMemError:
        engine.engine_core.shutdown()
        raise
    tracer = getattr(engine_scheduler(engine), "_hybridmem_tracer", None)
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
    rows0 = row_copies()
    nxt = 0
    by_step, steps = cfg.arrivals == "step", 0
    violation: str | None = None
    try:
        while nxt < len(pending) or engine.has_unfinished_requests():
            now = time.perf_counter() - t0
            clock = steps * cfg.step_s if by_step else now
            while nxt < len(pending) and pending[nxt].arrival_s <= clock:
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
                if by_step:  # an idle engine: on to the step of the next arrival
                    steps = max(steps + 1, math.ceil(pending[nxt].arrival_s / cfg.step_s))
                else:
                    time.sleep(max(0.0, pending[nxt].arrival_s - (time.perf_counter() - t0)))
                continue
            try:
                steps += 1
                outputs = engine.step()
            except Exception as exc:
                violation = _violation(exc)
                if violation is None:
                    raise
                break
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
        scheduler = engine_scheduler(engine)
        rows = row_copies(rows0)
        arenas = observed_arenas(engine) if cfg.org != "vllm" else []
        engine.engine_core.shutdown()  # closes the trace (END)
        if cfg.poison_vllm_state:
            from hybridmem.vllm_plugin import org_state

            org_state.set_poison(False)
    ledger = time.perf_counter() - t0
    cpu_s = time.process_time() - cpu0
    if by_step:  # latencies from each request's actual submission, not its planned second
        for rec in records.values():
            if not math.isnan(rec.submitted):
                rec.spec = replace(rec.spec, arrival_s=rec.submitted)
    summary = summarize(cfg, records, ledger, init_s, trace_path, preemptions,
                        engine_version=vllm.__version__, driver="inprocess")
    summary.update(org_summary(cfg, scheduler, violation))
    if summary.get("state_storage"):
        summary["state_storage"] = {**summary["state_storage"], "observed": arenas, **rows}
    # CPU seconds of this process over the ledger interval: on a shared box, where wall-clock
    # throughput moves with other tenants' load, tokens per CPU second isolates the probe cost.
    summary["arrivals"] = arrivals_text(cfg)
    summary["engine_steps"] = steps if by_step else None
    summary["cpu_s"] = cpu_s
    summary["throughput_cpu_tok_s"] = summary["output_tokens"] / cpu_s if cpu_s > 0 else None
    return write_run(out, summary, records, manifest)


def observed_arenas(engine: Any) -> list[str]:
    """Per Mamba layer, where the worker actually kept recurrent state: "shared" (its pages
    are vLLM's KV buffer), "private" (an arena of its own) or "unused" (no forward ran)."""
    from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2

    from hybridmem.vllm_plugin.org_geometry import PAGES_ATTR

    ctx = engine.vllm_config.compilation_config.static_forward_context
    out = []
    for layer in ctx.values():
        if not isinstance(layer, MambaMixer2):
            continue
        held = getattr(layer, "_hybridmem_store", None)
        raw = getattr(layer, PAGES_ATTR, None)
        if held is None:
            out.append("unused")
        elif raw is not None and (held[1].pages.untyped_storage().data_ptr()
                                  == raw.untyped_storage().data_ptr()):
            out.append("shared")
        else:
            out.append("private")
    return out


def _violation(exc: BaseException) -> str | None:
    """The one-line message of an invariant stop raised inside the engine (else None)."""
    from hybridmem.vllm_plugin.org_scheduler import InvariantStop
    from hybridmem.vllm_plugin.state_table import UnregisteredBlock

    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if isinstance(e, (InvariantStop, UnregisteredBlock)):
            return str(e)
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def engine_scheduler(engine: Any) -> Any:
    """The scheduler inside an in-process engine (None when the engine core is remote)."""
    core = getattr(engine.engine_core, "engine_core", None)
    return getattr(core, "scheduler", None)


def _progress(total: int, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="requests", unit="req", file=sys.stderr, leave=False)
