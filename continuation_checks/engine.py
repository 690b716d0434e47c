"""One in-process vLLM engine that runs every arm of a continuation check (salts separate arms).

The engine is vLLM's own ``LLMEngine`` (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) with prefix caching
on, greedy sampling with top-2 logprobs, and three instance-level hooks on its scheduler (vLLM's
classes stay untouched, the tracer's way):

* the tracing plugin (:mod:`hybridmem.vllm_plugin.tracing`) writes the run's trace; its sink is
  teed so the driver sees every event as it is emitted (ADOPTION depth, PUBLICATION block id);
* at each consumer's ADOPTION the driver records the block id at position ``b / grid - 1`` of the
  request's Mamba-group table: the checkpoint the consumer continues from;
* ``_mamba_block_aligned_split`` gets an extra stop: a request registered with a boundary ``b``
  ends a prefill chunk exactly at ``b`` (the ``split`` arm: the state at ``b`` is materialized and
  continued in the next step, no reuse)::

      recompute   [0 ........................ c) [c .. L)      c = floor((L-1)/grid) * grid
      split       [0 ....... b) [b .......... c) [c .. L)      (one request, no reuse)
      retained    producer [0 ....... b) [b]   consumer: adopt b, [b ... c) [c .. L)

The organization is a parameter: ``vllm`` uses vLLM's KV-cache manager and its Mamba rows; other
organizations plug in through :func:`engine_kwargs_for` once they serve inside vLLM.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hybridmem.errors import HybridMemError
from hybridmem.events import Event, EventKind

SERVING_ORGS = ("vllm",)  # organizations that serve inside vLLM in this build
KNOWN_ORGS = ("vllm", "S0", "S1", "S2", "D0")
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
        from hybridmem.vllm_plugin import tracing

        if cfg.trace_path is not None:
            cfg.trace_path.parent.mkdir(parents=True, exist_ok=True)
            os.environ[tracing.TRACE_ENV] = str(cfg.trace_path)
        tracing.install()
        try:
            from vllm import EngineArgs, LLMEngine

            t0 = time.perf_counter()
            self.engine = LLMEngine.from_engine_args(EngineArgs(**engine_kwargs_for(cfg)))
            self.init_s = time.perf_counter() - t0
        finally:
            os.environ.pop(tracing.TRACE_ENV, None)
        core = self.engine.engine_core.engine_core
        self.scheduler = core.scheduler
        self.model_runner = core.model_executor.driver_worker.worker.model_runner
        groups = self.scheduler.kv_cache_config.kv_cache_groups
        from vllm.v1.kv_cache_interface import MambaSpec

        self.mamba_group = next(i for i, g in enumerate(groups)
                                if isinstance(g.kv_cache_spec, MambaSpec))
        self.grid = int(groups[self.mamba_group].kv_cache_spec.block_size)
        self.mamba_manager = self.scheduler.kv_cache_manager.coordinator.single_type_managers[
            self.mamba_group]
        self.storage = VllmRows(self.model_runner)
        self._hook_split()
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
                    # emitted inside allocate_slots, before this step's forward: the block at
                    # b holds exactly the bytes the consumer will continue from
                    sub.adopted_depth = int(event.depth)
                    b = self.boundary_of.get(event.request_id)
                    if b is not None:
                        block = self._block_at(event.request_id, b)
                        sub.adopted_block = block
                        if block is not None:
                            sub.adopted_state = self.storage.read(block)

        sink.on_event = on_event

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
        """Block id at position ``b / grid - 1`` of the request's Mamba table (None: null)."""
        blocks = self.mamba_manager.req_to_blocks.get(engine_id, [])
        i = b // self.grid - 1
        if i < 0 or i >= len(blocks) or blocks[i].is_null:
            return None
        return int(blocks[i].block_id)

    def _capture(self) -> None:
        """After a step: read the state at b of every watched request whose chunk ended at b."""
        for eid, b in list(self.watch.items()):
            req = self.scheduler.requests.get(eid)
            if req is None:
                continue
            sub = self.by_engine_id[eid]
            if req.num_computed_tokens == b:
                sub.state_block = self._block_at(eid, b)
                if sub.state_block is None:
                    sub.state_note = f"no Mamba block at b={b}"
                else:
                    sub.state = self.storage.read(sub.state_block)
                del self.watch[eid]
            elif req.num_computed_tokens > b:
                sub.state_note = (f"prefill ran past b={b} to {req.num_computed_tokens} "
                                  "without stopping: the state at b was never materialized")
                del self.watch[eid]

    # -- serving ---------------------------------------------------------------------------

    def submit(self, key: str, prompt: list[int], max_tokens: int, salt: str,
               split_at: int | None = None, adopt_at: int | None = None,
               watch: int | None = None) -> Submitted:
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
                for pos in comp.logprobs or []:
                    vals = sorted((lp.logprob for lp in pos.values()), reverse=True)
                    sub.top2.append((float(vals[0]), float(vals[1]) if len(vals) > 1
                                     else float("-inf")))
                if out.finished:
                    sub.finished = True

    def shutdown(self) -> None:
        self.engine.engine_core.shutdown()


def engine_kwargs_for(cfg: EngineConfig) -> dict[str, Any]:
    """EngineArgs of the check's engine for an organization (``vllm`` only in this build)."""
    kwargs: dict[str, Any] = dict(
        model=str(cfg.model), tokenizer=str(cfg.model), dtype=cfg.dtype, seed=cfg.seed,
        enable_prefix_caching=True, max_model_len=cfg.max_model_len,
        max_num_seqs=cfg.max_num_seqs, enforce_eager=True, kv_cache_memory_bytes=cfg.kv_cache_bytes,
        async_scheduling=False,
    )
    if cfg.dtype == "bfloat16":
        kwargs["mamba_ssm_cache_dtype"] = "bfloat16"
    return kwargs


def progress(msg: str) -> None:
    print(f"continuation: {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class StateBytes:
    """A checkpoint's recurrent state, every Mamba layer concatenated (layer order fixed)."""

    conv: Any  # torch.Tensor, flat
    ssm: Any   # torch.Tensor, flat


def mamba_layers(model_runner: Any) -> list[tuple[str, Any]]:
    """(name, layer) of every Mamba mixer in the runner's forward context, in name order."""
    ctx = model_runner.vllm_config.compilation_config.static_forward_context
    out = [(n, m) for n, m in ctx.items()
           if isinstance(getattr(m, "kv_cache", None), (tuple, list)) and len(m.kv_cache) == 2]
    if not out:
        raise HybridMemError("no Mamba layer with a (conv, ssm) state cache in this model")
    return sorted(out, key=lambda nm: nm[0])


class VllmRows:
    """State storage of ``--org vllm``: row ``block_id`` of each Mamba layer's conv / SSM cache."""

    def __init__(self, model_runner: Any) -> None:
        self.layers = mamba_layers(model_runner)

    def dtypes(self) -> dict[str, str]:
        """The storage dtypes of the conv and SSM state (what bf16/fp32 runs really hold)."""
        _, m = self.layers[0]
        return {"conv": str(m.kv_cache[0].dtype).removeprefix("torch."),
                "ssm": str(m.kv_cache[1].dtype).removeprefix("torch.")}

    def read(self, block_id: int) -> StateBytes:
        import torch

        if block_id <= 0:
            raise ValueError(f"block id {block_id} is vLLM's null block (or negative)")
        conv = [m.kv_cache[0][block_id].reshape(-1).clone() for _, m in self.layers]
        ssm = [m.kv_cache[1][block_id].reshape(-1).clone() for _, m in self.layers]
        return StateBytes(torch.cat(conv), torch.cat(ssm))

    def corrupt(self, block_id: int, scale: float = 4.0) -> None:
        """Fault control: overwrite the checkpoint in place (SSM x scale + 1, conv negated)."""
        if block_id <= 0:
            raise ValueError(f"block id {block_id} is vLLM's null block (or negative)")
        for _, m in self.layers:
            m.kv_cache[1][block_id].mul_(scale).add_(1.0)
            m.kv_cache[0][block_id].neg_()
