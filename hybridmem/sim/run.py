"""One simulated serving run: the same outputs as ``hybridmem run``, on virtual time.

    SimConfig -> workload (hybridmem.workload, SPEC §10, model limit 8,192 by default)
              -> VllmConfig (no weights) -> organization seam (.schedulers) -> scheduler
              -> [trace hooks: hybridmem.vllm_plugin.tracing.attach, the real run's]
              -> executor (.executor) priced by the cost model (.cost) on a device (.devices)
              -> results.parquet, summary.json, workload.json (hybridmem.engines.run_results)
                 [+ trace/trace.hmt, steps.parquet]

Times in results and summary are virtual seconds (the cost model's), so ``throughput_tok_s`` is
the simulated GPU's; ``wall_s`` is what the simulation itself took. The ledger interval is the
request span here (a simulated engine has no shutdown to pay for).

``SimConfig.check`` is the one check of a run's settings (the CLI, campaign specs and replays all
go through it); it stays plain comparisons rather than a validator library for the reasons
``campaign_spec``'s docstring gives: each message names the value and its range in one line.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hybridmem.engines.run_results import RunResult, summarize, write_run
from hybridmem.errors import HybridMemError
from hybridmem.sim import executor, schedulers, vllm_env
from hybridmem.sim.cost import CostConstants, CostModel
from hybridmem.sim.devices import DEVICES, get_device
from hybridmem.sim.model_shape import load_shape
from hybridmem.workload import Workload, WorkloadSpec, load_manifest, make_workload

TRACE_FILE = "trace.hmt"
MAX_REQUESTS = 100_000


@dataclass(frozen=True)
class SimConfig:
    model: str = "falcon-h1-7b"
    device: str = "a100-40gb"
    org: str = "vllm"
    budget: str = "b63"
    requests: int = 300
    rate: float = 3.0
    share: float = 0.5
    seed: int = 0
    cap: int = 63
    headroom: float = 0.0
    pin_k: int | None = None
    retention: bool = False
    isolate: bool = False
    grid: int | None = None      # organizations' block (None: their own, S0-S2 512, D0 16)
    attention_fraction: float | None = None  # D0 split (None: the model preset's)
    check_invariants: bool = False  # organizations: App. D.2 checkers after every step
    chunking: str | None = None  # prefill split, one of schedulers.CHUNKINGS (None: the default)
    admit_first_chunk: bool = False  # admission checks the first chunk, not the whole prompt
    trace_dir: Path | None = None
    out: Path = Path("out/sim")
    max_model_len: int = 8192
    constants: dict[str, float] = field(default_factory=dict)
    step_log: bool = False
    # replay (hybridmem.sim.replay): the recorded workload instead of a generated one, the
    # recorded engine's step token budget and, for --org vllm, its block size (None: the device
    # preset's budget, vLLM's GPU block)
    replay: Path | None = None
    max_num_batched_tokens: int | None = None
    stock_block: int | None = None
    system_prompt: tuple[int, int] | None = None  # per-context shared prefix range (workload)

    def check(self) -> SimConfig:
        """Every field's type and range; HybridMemError naming the offending value."""
        def bad(msg: str) -> HybridMemError:
            return HybridMemError(msg)
        if self.device not in DEVICES:
            raise bad(f"unknown device {self.device!r}; expected one of {', '.join(DEVICES)}")
        if self.org not in schedulers.ORGS:
            raise bad(f"unknown organization {self.org!r}; expected one of "
                      f"{', '.join(schedulers.ORGS)}")
        if not (isinstance(self.requests, int) and 1 <= self.requests <= MAX_REQUESTS):
            raise bad(f"requests must be an integer in [1, {MAX_REQUESTS}], got {self.requests}")
        if not (isinstance(self.rate, (int, float)) and math.isfinite(self.rate)
                and self.rate > 0):
            raise bad(f"rate must be a finite number > 0 requests/s, got {self.rate}")
        if not (isinstance(self.share, (int, float)) and 0.0 <= self.share <= 1.0):
            raise bad(f"share must lie in [0, 1], got {self.share}")
        if not (isinstance(self.seed, int) and 0 <= self.seed < 2**32):
            raise bad(f"seed must be an integer in [0, 2^32), got {self.seed}")
        if not (isinstance(self.cap, int) and 1 <= self.cap <= 4096):
            raise bad(f"cap must be an integer in [1, 4096], got {self.cap}")
        if not (isinstance(self.headroom, (int, float)) and math.isfinite(self.headroom)
                and 0.0 <= self.headroom < 1.0):
            raise bad(f"headroom must be a finite fraction in [0, 1), got {self.headroom}")
        if self.pin_k is not None and self.pin_k not in (1, 2, 3):
            raise bad(f"pin-k must be 1, 2 or 3, got {self.pin_k}")
        if self.grid is not None and not (isinstance(self.grid, int) and 16 <= self.grid <= 65536
                                          and self.grid % 16 == 0):
            raise bad(f"grid must be a multiple of 16 tokens in [16, 65536], got {self.grid}")
        schedulers.resolve_chunking(schedulers.OrgChoice(self.org, self.budget,
                                                         chunking=self.chunking))
        if self.attention_fraction is not None and not (
                isinstance(self.attention_fraction, float)
                and 0.0 < self.attention_fraction < 1.0):
            raise bad(f"attention fraction must lie in (0, 1), got {self.attention_fraction}")
        if not (isinstance(self.max_model_len, int) and 64 <= self.max_model_len <= 1 << 20):
            raise bad(f"max model length must be an integer in [64, 2^20], "
                      f"got {self.max_model_len}")
        if self.chunking is not None and self.chunking not in getattr(schedulers, "CHUNKINGS", ()):
            known = ", ".join(getattr(schedulers, "CHUNKINGS", ())) or "(none in this build)"
            raise bad(f"unknown chunking {self.chunking!r}; expected one of {known}")
        if self.max_num_batched_tokens is not None and not (
                isinstance(self.max_num_batched_tokens, int)
                and 16 <= self.max_num_batched_tokens <= 1 << 20):
            raise bad(f"max_num_batched_tokens must be an integer in [16, 2^20], "
                      f"got {self.max_num_batched_tokens}")
        if self.stock_block is not None and (self.org != "vllm" or not (
                isinstance(self.stock_block, int) and self.stock_block >= 16
                and self.stock_block % 16 == 0)):
            raise bad(f"a recorded block size applies to --org vllm only and must be a "
                      f"multiple of 16 tokens, got {self.stock_block} for {self.org}")
        CostConstants().with_values(**self.constants)
        return self


def check_budget(cfg: SimConfig) -> SimConfig:
    """The budget parses for the model (before any vLLM import): one-line error otherwise. A
    whole-cache total must also give the run's organization a unit of each kind (``vllm``: one
    page of vLLM's unified block, which S0's page is), as ``hybridmem plan --total`` requires."""
    from hybridmem.budget import parse_budget, plan_budget
    from hybridmem.units import derive_units

    units = derive_units(load_shape(cfg.model).geometry)
    budget = parse_budget(cfg.budget, units)
    if budget.total_bytes is not None:
        plan_budget(units, budget, cfg.attention_fraction).check_holds(
            ("S0",) if cfg.org == "vllm" else (cfg.org,))
    return cfg


def sim_workload(cfg: SimConfig, vocab: int) -> Workload:
    """The generated workload of ``cfg``, or the recorded one it replays (token ids checked
    against the model's vocabulary)."""
    if cfg.replay is None:
        return make_workload(WorkloadSpec(
            vocab_size=vocab, num_requests=cfg.requests, rate=cfg.rate, share=cfg.share,
            seed=cfg.seed, isolate=cfg.isolate, model_limit=cfg.max_model_len,
            system_prompt_min=cfg.system_prompt[0] if cfg.system_prompt else None,
            system_prompt_max=cfg.system_prompt[1] if cfg.system_prompt else None))
    workload = load_manifest(cfg.replay)
    top = max(max(r.prompt_token_ids, default=0) for r in workload.requests)
    if top >= vocab:
        raise HybridMemError(f"{str(cfg.replay)!r}: token id {top} is outside the model's "
                             f"vocabulary of {vocab}")
    longest = max(r.num_input_tokens + r.max_output_tokens for r in workload.requests)
    if longest > cfg.max_model_len:
        raise HybridMemError(f"{str(cfg.replay)!r}: a request of {longest} tokens exceeds the "
                             f"model limit {cfg.max_model_len}")
    return workload


def run_sim(cfg: SimConfig, progress: bool = False,
            entry_steps: dict[str, int] | None = None) -> RunResult:
    """Simulate one run and write its outputs into ``cfg.out``; ``entry_steps`` submits each
    request at a recorded scheduler step instead of its planned arrival (a replay)."""
    cfg.check()
    check_budget(cfg)
    t_init = time.perf_counter()
    shape = load_shape(cfg.model)
    device = get_device(cfg.device)
    workload = sim_workload(cfg, shape.vocab)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    manifest = workload.save_manifest(out / "workload.json")
    budget_tokens = (device.max_num_batched_tokens if cfg.max_num_batched_tokens is None
                     else cfg.max_num_batched_tokens)
    vc = vllm_env.engine_config(shape, cfg.cap, cfg.max_model_len, budget_tokens, cfg.seed,
                                admit_first_chunk=cfg.admit_first_chunk)
    if cfg.stock_block is not None:
        vllm_env.set_stock_block(vc, cfg.stock_block)
    choice = schedulers.OrgChoice(cfg.org, cfg.budget, cfg.headroom, cfg.pin_k, cfg.retention,
                            cfg.grid, cfg.attention_fraction, cfg.check_invariants,
                            chunking=cfg.chunking)
    trace, meta = _trace_target(cfg, device) if cfg.trace_dir is not None else (None, None)
    built = schedulers.build(choice, vc, shape, trace, meta)
    sched = built.scheduler
    cost = CostModel(shape, device, cfg.org, built.grid_tokens,
                     CostConstants().with_values(**cfg.constants))
    trace_path = None
    if trace is not None:
        from hybridmem.vllm_plugin.tracing import TRACER_ATTR

        trace_path = Path(getattr(sched, TRACER_ATTR).sink.path)
    init_s = time.perf_counter() - t_init
    try:
        outcome = executor.simulate(sched, workload.requests, cost, built.detail["hasher"],
                                    progress=progress, entry_steps=entry_steps)
    finally:
        # always: the tracer closes the sink (END), and an organization's scheduler hands back
        # the process-global state table and fault it activated, so a later engine in this
        # process (a real one included) starts clean
        sched.shutdown()
    import vllm

    summary = summarize(cfg, outcome.records, outcome.end_s, init_s, trace_path,
                        outcome.preemptions, engine_version=vllm.__version__, driver="sim")
    summary.update({
        "simulated": True, "org": cfg.org, "budget": cfg.budget, "rate": cfg.rate,
        "share": cfg.share, "cap": cfg.cap, "headroom": cfg.headroom, "pin_k": cfg.pin_k,
        "retention": cfg.retention, "isolate": cfg.isolate, "device": cfg.device,
        "model": shape.name, "num_blocks": built.num_blocks, "grid_tokens": built.grid_tokens,
        "block_tokens": vc.cache_config.block_size, "org_plan": built.detail.get("plan"),
        "chunking": built.detail["chunking"]["name"],
        "chunk_align_tokens": built.detail["chunking"]["align_tokens"],
        "admission_gate": "first chunk" if cfg.admit_first_chunk else "whole sequence",
        "max_num_batched_tokens": budget_tokens,
        "steps": outcome.steps, "wall_s": outcome.wall_s, "init_wall_s": init_s,
        "time_parts_s": outcome.time_parts_s,
        "cost_model": cost.describe(),
    })
    summary.update(recorded_work(outcome.records, outcome.polls, outcome.record_steps))
    if cfg.step_log:
        _write_steps(outcome.step_log, out / "steps.parquet")
    return write_run(out, summary, outcome.records, manifest)


def recorded_work(records: dict[str, Any], polls: list[tuple[int, int]],
                  record_steps: int) -> dict[str, Any]:
    """The paper's serving-level work counters and poller statistics (§4.2, App. B.4, Table
    E-1), as vLLM 0.32's own counters record them, over the whole run:

    * ``recorded_prompt_tokens`` (``C_once = H - O_ctr``, the once-recorded initial-input
      component): each request's prompt less the prefix-cache hit of its first prefill,
      counted once at its first token (``vllm:prompt_tokens_by_source{source="local_compute"}``;
      a preempted request's recomputed prefill is not counted again);
    * ``recorded_prompt_full_tokens``: the whole prompts of those requests;
    * ``recorded_output_tokens`` (``O_ctr``), ``recorded_total_tokens`` (``H``) and
      ``recorded_records`` (``K``: engine steps that recorded a token);
    * ``poll_*``: running / waiting counts sampled every virtual second (mean, median, max).

    The paper's counters cover a common valid poller window of each run (not published); the
    simulator counts the whole run."""
    started = [r for r in records.values() if not math.isnan(r.first_token)]
    full = sum(len(r.spec.prompt_token_ids) for r in started)
    once = full - sum(r.cached_tokens for r in started)
    out = sum(len(r.token_ids) for r in records.values())
    running = [p[0] for p in polls]
    waiting = [p[1] for p in polls]

    def stat(vals: list[int], how: str) -> float | None:
        if not vals:
            return None
        if how == "mean":
            return sum(vals) / len(vals)
        if how == "max":
            return float(max(vals))
        ordered = sorted(vals)
        mid = len(ordered) // 2
        return float(ordered[mid]) if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return {
        "recorded_prompt_tokens": once,
        "recorded_prompt_full_tokens": full,
        "recorded_output_tokens": out,
        "recorded_total_tokens": once + out,
        "recorded_records": record_steps,
        "poll_samples": len(polls),
        **{f"poll_{name}_{how}": stat(vals, how) for name, vals in (("running", running),
                                                                    ("waiting", waiting))
           for how in ("mean", "median", "max")},
    }


def _trace_target(cfg: SimConfig, device: Any) -> tuple[str, dict[str, Any]]:
    assert cfg.trace_dir is not None
    trace_dir = Path(cfg.trace_dir)
    trace_dir.mkdir(parents=True, exist_ok=True)
    path = trace_dir / TRACE_FILE
    for stale in (path, path.with_suffix(".jsonl")):
        stale.unlink(missing_ok=True)
    meta = {"seed": cfg.seed, "simulated": True, "device": device.name, "budget": cfg.budget,
            "cost_constants": dict(cfg.constants),
            "workload": {"requests": cfg.requests, "rate": cfg.rate, "share": cfg.share,
                         "isolate": cfg.isolate}}
    return str(path), meta


def _write_steps(log: executor.StepLog, path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(log.columns), path)
