"""One in-process vLLM engine that runs every arm of a continuation check (salts separate arms).

The engine is vLLM's own ``LLMEngine`` (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) with prefix caching
on, greedy sampling with top-2 logprobs, and instance-level hooks on its scheduler (vLLM's
classes stay untouched, the tracer's way):

* the tracing plugin (:mod:`hybridmem.vllm_plugin.tracing`) writes the run's trace; its sink is
  teed so the driver sees every event as it is emitted (ADOPTION depth, PUBLICATION block id);
* at each consumer's ADOPTION (emitted while the scheduler admits it) the driver marks it; right
  after that ``schedule`` call returns -- before the step's forward -- it records the block id at
  position ``b / G - 1`` of the request's Mamba-group table (``get_block_ids``; G = the block
  size) and reads that checkpoint: the bytes the consumer continues from (for an organization
  after its manager has written the table, stale-checkpoint fault included);
* ``_mamba_block_aligned_split`` gets an extra stop: a request registered with a boundary ``b``
  ends a prefill chunk exactly at ``b`` (the ``split`` arm: the state at ``b`` is materialized and
  continued in the next step, no reuse)::

      recompute   [0 ........................ c) [c .. L)      c = floor((L-1)/grid) * grid
      split       [0 ....... b) [b .......... c) [c .. L)      (one request, no reuse)
      retained    producer [0 ....... b) [b]   consumer: adopt b, [b ... c) [c .. L)

  (under an organization the chunks are vLLM's, boundary states exported during the forward;
  with ``HYBRIDMEM_ORG_CHUNK_STOPS=1`` every chunk ends at each G boundary, all three arms run
  the same chunks ``[0,G) [G,2G) ...`` and the extra stop is a no-op)

The organization is a parameter: ``vllm`` uses vLLM's KV-cache manager and its Mamba rows
(:class:`~continuation_checks.state_readers.VllmRows`); S0/S1/S2/D0 run vLLM's scheduler with the
organization's manager (``OrgScheduler``), built by the same helpers as ``hybridmem run --org X``
(:func:`engine_kwargs_for`), and their state is read at the organization's addresses
(:class:`~continuation_checks.state_readers.OrgStore`). Boundaries lie on the *recurrent* grid
(``interval``: G for S0-S2, D0's checkpoint interval, a multiple of G); table positions count
blocks of G tokens.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from continuation_checks.state_readers import (  # noqa: F401 (StateBytes, VllmRows re-exported)
    OrgStore,
    StateBytes,
    VllmRows,
)
from hybridmem.engines.vllm_run import scoped_env
from hybridmem.errors import HybridMemError
from hybridmem.events import Event, EventKind

SERVING_ORGS = ("vllm", "S0", "S1", "S2", "D0")  # organizations that serve inside vLLM
KNOWN_ORGS = SERVING_ORGS
DEFAULT_BUDGET = "b1536"  # tiny model, G = 64: 4,224 S2 pages per layer, no reclaim in a check
TOP_LOGPROBS = 2


@dataclass(frozen=True)
class EngineConfig:
    model: Path
    org: str = "vllm"
    dtype: str = "float32"
    seed: int = 0
    max_model_len: int = 1024
    max_num_seqs: int = 64
    kv_cache_bytes: int = 512 << 20  # room: a producer's checkpoint must survive to adoption
    trace_path: Path | None = None
    budget: str = DEFAULT_BUDGET  # organization mode: per-layer budget (as `hybridmem run`)
    fault: str | None = None  # an organization's own fault (hybridmem.vllm_plugin.faults)
    attention_fraction: float | None = None  # D0's attention share

    def run_config(self) -> Any:
        """``hybridmem run``'s RunConfig for this engine (its org helpers build the engine)."""
        from hybridmem.engines.vllm_run import RunConfig

        org = self.org != "vllm"
        return RunConfig(model=str(self.model), seed=self.seed, cap=self.max_num_seqs,
                         max_model_len=self.max_model_len, kv_cache_bytes=self.kv_cache_bytes,
                         dtype=self.dtype, org=self.org, budget=self.budget if org else None,
                         fault=self.fault if org else None,
                         attention_fraction=self.attention_fraction if org else None)


@dataclass
class Submitted:
    """One request as the driver sees it: ids, tokens and per-position top-2 logprobs."""

    key: str                      # the driver's id (case/arm/role)
    engine_id: str = ""
    token_ids: list[int] = field(default_factory=list)
    top2: list[tuple[float, float]] = field(default_factory=list)  # (top-1, top-2) logprob
    adopted_depth: int | None = None
    adopted_block: int | None = None
    adopted_state: Any = None     # StateBytes read at admission, before the forward
    state_block: int | None = None  # block holding this request's own state at its watch point
    state: Any = None             # StateBytes right after the step that ended at the watch point
    early_state: Any = None       # StateBytes at its second watch point (a fault's source)
    state_note: str = ""
    finished: bool = False


class ContinuationEngine:
    """A vLLM engine with the continuation hooks; :meth:`run` serves one phase to completion."""

    def __init__(self, cfg: EngineConfig) -> None:
        if cfg.org not in SERVING_ORGS:
            raise HybridMemError(
                f"organization {cfg.org!r} does not serve inside vLLM in this build "
                f"(serving: {', '.join(SERVING_ORGS)})")
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        self.cfg = cfg
        self.boundary_of: dict[str, int] = {}  # engine request id -> b of an adopter
        self.split_at: dict[str, int] = {}
        self.by_engine_id: dict[str, Submitted] = {}
        self.events: list[Event] = []
        self.watch: dict[str, int] = {}  # engine request id -> b: capture its state at b
        self.watch_early: dict[str, int] = {}  # a second point, read into early_state
        # engine request id -> StateBytes written into its adopted block at admission, before
        # its forward (the fresh-slot / boundary-shift fault controls)
        self.inject: dict[str, Any] = {}
        self.adopting: list[str] = []  # ADOPTION seen in this schedule call, table not read yet
        from hybridmem.vllm_plugin import tracing

        env = org_env_for(cfg)
        if cfg.trace_path is not None:
            cfg.trace_path.parent.mkdir(parents=True, exist_ok=True)
            env[tracing.TRACE_ENV] = str(cfg.trace_path)
        tracing.install()
        with scoped_env(env):  # a later engine of this process starts clean
            from vllm import EngineArgs, LLMEngine

            t0 = time.perf_counter()
            self.engine = LLMEngine.from_engine_args(EngineArgs(**engine_kwargs_for(cfg)))
            self.init_s = time.perf_counter() - t0
        core = self.engine.engine_core.engine_core
        self.scheduler = core.scheduler
        self.model_runner = core.model_executor.driver_worker.worker.model_runner
        groups = self.scheduler.kv_cache_config.kv_cache_groups
        from vllm.v1.kv_cache_interface import MambaSpec

        self.mamba_group = next(i for i, g in enumerate(groups)
                                if isinstance(g.kv_cache_spec, MambaSpec))
        self.grid = int(groups[self.mamba_group].kv_cache_spec.block_size)  # G: table positions
        plan = getattr(self.scheduler, "org_plan", None)
        self.plan = plan
        # boundaries: the organization's recurrent grid (D0: its interval, a multiple of G)
        self.interval = int(plan.interval) if plan is not None else self.grid
        self.storage: VllmRows | OrgStore
        if cfg.org == "vllm":
            self.storage = VllmRows(self.model_runner)
        else:
            if plan is None:
                raise HybridMemError(f"--org {cfg.org}: the engine's scheduler is not the "
                                     "organization scheduler (no org_plan)")
            self.storage = OrgStore.from_runner(self.model_runner,
                                                self.scheduler.kv_cache_manager.state_table)
        self._hook_split()
        self._hook_schedule()
        self._tee_trace()

    # -- hooks -----------------------------------------------------------------------------

    def _tee_trace(self) -> None:
        from hybridmem.vllm_plugin.tracing import TRACER_ATTR

        tracer = getattr(self.scheduler, TRACER_ATTR, None)
        if tracer is None:
            raise HybridMemError("the engine has no tracer attached; ADOPTION depths would be "
                                 "unknown (is the hybridmem vLLM plugin installed?)")
        sink = tracer.sink
        original = sink.on_event

        def on_event(event: Event) -> None:
            original(event)
            self.events.append(event)
            if event.kind is EventKind.ADOPTION:
                sub = self.by_engine_id.get(event.request_id)
                if sub is not None:
                    # emitted inside the scheduler's admission, before this step's forward; the
                    # table is read once the schedule call returns (see _hook_schedule)
                    sub.adopted_depth = int(event.depth)
                    if event.request_id in self.boundary_of:
                        self.adopting.append(event.request_id)

        sink.on_event = on_event

    def _hook_schedule(self) -> None:
        """After each ``schedule``: read the checkpoint every new adopter will continue from
        (block tables final, forward not yet run)."""
        sched = self.scheduler
        original = sched.schedule

        @functools.wraps(original)
        def schedule(*args: Any, **kwargs: Any) -> Any:
            out = original(*args, **kwargs)
            for eid in self.adopting:
                sub = self.by_engine_id[eid]
                block = self._block_at(eid, self.boundary_of[eid])
                sub.adopted_block = block
                fault_state = self.inject.pop(eid, None)
                if block is not None and fault_state is not None:
                    self.storage.write(block, fault_state)  # type: ignore[union-attr]
                if block is not None:  # through the read path the forward uses
                    sub.adopted_state = self.storage.read(block)
            self.adopting.clear()
            return out

        sched.schedule = schedule

    def _hook_split(self) -> None:
        sched = self.scheduler
        original = sched._mamba_block_aligned_split
        split_at = self.split_at

        @functools.wraps(original)
        def split(request: Any, num_new_tokens: int, *args: Any, **kwargs: Any) -> int:
            n = int(original(request, num_new_tokens, *args, **kwargs))
            b = split_at.get(request.request_id)
            if b is not None:
                extra = sum(int(a) for a in args) + sum(int(v) for v in kwargs.values())
                start = request.num_computed_tokens + extra
                if start < b < start + n:
                    n = b - start
            return n

        sched._mamba_block_aligned_split = split

    def _block_at(self, engine_id: str, b: int) -> int | None:
        """Block id at position ``b / G - 1`` of the request's Mamba table (None: null)."""
        ids = self.scheduler.kv_cache_manager.get_block_ids(engine_id)
        blocks = ids[self.mamba_group] if len(ids) > self.mamba_group else []
        i = b // self.grid - 1
        if i < 0 or i >= len(blocks) or blocks[i] <= 0:
            return None
        return int(blocks[i])

    def _capture(self) -> None:
        """After a step: read the state at b of every watched request whose chunk ended at b."""
        for eid, b in list(self.watch_early.items()):
            req = self.scheduler.requests.get(eid)
            if req is None or req.num_computed_tokens < b:
                continue
            block = self._block_at(eid, b) if req.num_computed_tokens == b else None
            if block is not None:
                self.by_engine_id[eid].early_state = self.storage.read_stored(block)
            del self.watch_early[eid]
        for eid, b in list(self.watch.items()):
            req = self.scheduler.requests.get(eid)
            if req is None:
                continue
            sub = self.by_engine_id[eid]
            if req.num_computed_tokens == b:
                sub.state_block = self._block_at(eid, b)
                if sub.state_block is None:
                    sub.state_note = f"no Mamba block at b={b}"
                else:  # the reference: what the forward wrote, decoded as stored
                    sub.state = self.storage.read_stored(sub.state_block)
                del self.watch[eid]
            elif req.num_computed_tokens > b:
                sub.state_note = (f"prefill ran past b={b} to {req.num_computed_tokens} "
                                  "without stopping: the state at b was never materialized")
                del self.watch[eid]

    # -- serving ---------------------------------------------------------------------------

    def submit(self, key: str, prompt: list[int], max_tokens: int, salt: str,
               split_at: int | None = None, adopt_at: int | None = None,
               watch: int | None = None, watch_early: int | None = None) -> Submitted:
        """Queue one request. ``split_at``: end a prefill chunk exactly there (split arm);
        ``adopt_at``: read the Mamba block at that boundary when the request is admitted;
        ``watch``: read the request's own state at that boundary right after it is computed."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                                logprobs=TOP_LOGPROBS, output_kind=RequestOutputKind.DELTA)
        sub = Submitted(key)
        engine_id = self.engine.add_request(
            key, {"prompt_token_ids": list(prompt), "cache_salt": salt}, params)
        sub.engine_id = str(engine_id)
        self.by_engine_id[sub.engine_id] = sub
        if split_at is not None:
            self.split_at[sub.engine_id] = split_at
        if adopt_at is not None:
            self.boundary_of[sub.engine_id] = adopt_at
        if watch is not None:
            self.watch[sub.engine_id] = watch
        if watch_early is not None:
            self.watch_early[sub.engine_id] = watch_early
        return sub

    def run(self, subs: list[Submitted]) -> None:
        """Step until every submitted request has finished."""
        by_key = {s.key: s for s in subs}
        while self.engine.has_unfinished_requests():
            outputs = self.engine.step()
            self._capture()
            for out in outputs:
                sub = by_key.get(out.request_id)
                if sub is None:
                    continue
                comp = out.outputs[0]
                sub.token_ids.extend(int(t) for t in comp.token_ids)
                sub.top2.extend(top2(pos) for pos in comp.logprobs or [])
                if out.finished:
                    sub.finished = True

    def shutdown(self) -> None:
        self.engine.engine_core.shutdown()


def top2(position: Any) -> tuple[float, float]:
    """(top-1, top-2) log-probabilities of one generated position (vLLM's ``{token: Logprob}``;
    top-2 is ``-inf`` when only one came back): the largest two, whatever order vLLM lists
    them in."""
    vals = sorted((lp.logprob for lp in position.values()), reverse=True)
    return float(vals[0]), float(vals[1]) if len(vals) > 1 else float("-inf")


def engine_kwargs_for(cfg: EngineConfig) -> dict[str, Any]:
    """EngineArgs of the check's engine: prefix caching, greedy, no async scheduling; for an
    organization plus exactly what ``hybridmem run --org X`` adds (``vllm_run.org_engine_args``:
    the grid's block size, ``scheduler_cls`` OrgScheduler, ``additional_config`` with budget
    and fault)."""
    kwargs: dict[str, Any] = dict(
        model=str(cfg.model), tokenizer=str(cfg.model), dtype=cfg.dtype, seed=cfg.seed,
        enable_prefix_caching=True, max_model_len=cfg.max_model_len,
        max_num_seqs=cfg.max_num_seqs, enforce_eager=True, kv_cache_memory_bytes=cfg.kv_cache_bytes,
        async_scheduling=False,
        use_tqdm_on_load=False,  # its progress bar writes to the terminal, past engine.log
    )
    if cfg.dtype == "bfloat16":
        kwargs["mamba_ssm_cache_dtype"] = "bfloat16"
    if cfg.org != "vllm":
        from hybridmem.engines import vllm_run

        kwargs.update(vllm_run.org_engine_args(cfg.run_config(), cfg.model))
    return kwargs


def org_env_for(cfg: EngineConfig) -> dict[str, str]:
    """Environment an organization engine needs (the grid), and the plugin wrappers installed,
    as ``hybridmem run --org X`` does before it starts the engine (``{}`` for ``vllm``)."""
    if cfg.org == "vllm":
        return {}
    from hybridmem.engines import vllm_run
    from hybridmem.vllm_plugin import org_geometry, org_state
    from hybridmem.vllm_plugin.org_settings import install_block_override

    install_block_override()
    org_geometry.install()
    org_state.install()
    return dict(vllm_run.org_env(cfg.run_config(), cfg.model))


def progress(msg: str) -> None:
    print(f"continuation: {msg}", file=sys.stderr, flush=True)
