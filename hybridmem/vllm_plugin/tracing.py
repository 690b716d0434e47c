"""Tracing hooks inside vLLM v1 core: state-lifecycle events from a real engine (SPEC §6).

:func:`install` wraps one method, ``Scheduler.__init__``. When a scheduler is built while
``HYBRIDMEM_TRACE`` names a trace path, :func:`attach` wraps methods *of that scheduler's own
objects* (scheduler, KV-cache manager, coordinator, block pool) -- vLLM's classes stay untouched and
an untraced engine runs with no wrapper at all. Nothing of vLLM is copied or forked.

Where each event comes from (all in the engine-core process, one thread):

==============  ===========================================================================
event           hook
==============  ===========================================================================
WAITING_ENTRY   ``Scheduler.add_request`` (episode 0) and after ``Scheduler._preempt_request``
                (episode k+1): chain = attention-group block keys, recurrent_chain = Mamba-group
                block keys, both ``hash64`` of vLLM's block hashes at that group's block size;
                depth = the request's token count
PUBLICATION     ``BlockPool._insert_block_hash``: a (block hash, group) key goes from absent
                to present in the prefix-cache map; one event per KV-cache group, state_kind
                ATTENTION (attention groups) or RECURRENT (Mamba groups), depth = boundary
                tokens, page = block id
LOSS            ``BlockPool._remove_cached_block_hashes``: a key's last block leaves the map.
                cause ALLOCATION + requester when it happens inside ``allocate_slots`` of that
                request (the block was reclaimed for it); INVALIDATION for a partial->full
                re-key; EVICTION otherwise (``evict_blocks``, ``reset_prefix_cache``)
ALLOCATION      ``KVCacheManager.allocate_slots`` when it needs >= 1 block or fails:
                need = blocks the coordinator asked for, free = free + reclaimable cached
                blocks before the call, outcome OK / REJECTED, requester = the request
ADOPTION        a successful ``allocate_slots`` that admits a WAITING or PREEMPTED request:
                depth = computed prefix tokens the scheduler adopted (local + external)
RESUME          the same admission of a PREEMPTED request (emitted before its ADOPTION)
PREEMPTION      ``Scheduler._preempt_request`` (episode k, before the count is bumped)
FINISH          ``Scheduler._free_request``
END             ``Scheduler.shutdown`` closes the sink, which writes END
==============  ===========================================================================

Beside the trace, ``<trace>.prefix_cache.json`` holds what vLLM's ``PrefixCacheStats`` would
have summed over the run (``record_prefix_cache_stats``: requests, queries = prompt tokens,
hits = local hit tokens; preempted requests apart), counted whether or not vLLM logs stats, so
``hybridmem diagnose`` can set vLLM's own figures beside the trace's.

``allocate_slots`` holds back the LOSS and PUBLICATION events its call causes and, when it
returns, emits [RESUME], ADOPTION, ALLOCATION and then those held events: the adoption stands at
the lookup cut (the prefix the scheduler found before this allocation reclaimed or cached
anything), which is what lineage's exact lookup-time supply reads by sequence number.
A PUBLICATION inside ``allocate_slots`` carries the allocating request as its ``request_id``
(the producer). Request ids are vLLM's internal ids (the caller's id + ``-`` + 8 random characters).

Episodes are ``(request_id, preemption_count)``: INITIAL is 0, each preemption starts the next.
Steps count ``Scheduler.schedule`` calls (events between steps carry the last step's number).
Moving a block's keys to a private copy (``move_block_hashes``) keeps them discoverable and
emits nothing.

Hook cost. ``allocate_slots`` runs for every scheduled request every step, so its wrapper leaves
after a few attribute stores when a running request allocates nothing and causes no event. The
wrappers' own time (wrapper minus wrapped method, ``time.perf_counter``) on the tiny Falcon-H1,
120 requests, is about 25-30 ms per run (~0.7% of a ~4 s request span); the writer adds nothing
measurable to ``Scheduler.schedule`` against a null sink. Timed side by side on one engine
(``benchmarks/bench_trace_probe.py``: traced and untraced rounds, :func:`detach` between them)
the traced rounds cost from nothing measurable (seed 0, 60 requests) to ~3% (seed 21, 120
requests; ~1% once the process is warm): ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

from hybridmem.engines.trace_sink import Sink, open_sink
from hybridmem.events import Cause, Event, EventKind, Outcome, StateKind, hash64
from hybridmem.names import ENV_TRACE, ENV_TRACE_META
from hybridmem.outputs import write_text_atomic

TRACE_ENV = ENV_TRACE
META_ENV = ENV_TRACE_META  # JSON object merged into the trace metadata
_MARK = "_hybridmem_trace_init"
PREFIX_CACHE_SUFFIX = ".prefix_cache.json"
PREFIX_CACHE_KEYS = ("requests", "queries", "hits", "preempted_requests", "preempted_queries",
                     "preempted_hits")
TRACER_ATTR = "_hybridmem_tracer"


def install() -> None:
    """Wrap ``Scheduler.__init__`` so schedulers built while HYBRIDMEM_TRACE is set get traced.

    Idempotent. The check happens once per scheduler construction, never per step.
    """
    from vllm.v1.core.sched.scheduler import Scheduler

    original = Scheduler.__init__
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        path = os.environ.get(TRACE_ENV)
        if path and getattr(self, TRACER_ATTR, None) is None:
            attach(self, path)

    setattr(__init__, _MARK, True)
    Scheduler.__init__ = __init__


def run_meta(scheduler: Any) -> dict[str, Any]:
    """Trace metadata of a vLLM run (organization, grids, seed, engine version, pool size)."""
    import vllm
    from vllm.v1.kv_cache_interface import MambaSpec

    groups = scheduler.kv_cache_config.kv_cache_groups
    attn = [g.kv_cache_spec.block_size for g in groups
            if not isinstance(g.kv_cache_spec, MambaSpec)]
    rec = [g.kv_cache_spec.block_size for g in groups if isinstance(g.kv_cache_spec, MambaSpec)]
    vc = scheduler.vllm_config
    meta: dict[str, Any] = {
        "organization": "vllm",
        "engine": "vllm",
        "engine_version": vllm.__version__,
        "attention_grid_tokens": attn[0] if attn else 0,
        "recurrent_grid_tokens": rec[0] if rec else 0,
        "kv_cache_groups": [
            {"kind": "recurrent" if isinstance(g.kv_cache_spec, MambaSpec) else "attention",
             "block_size": g.kv_cache_spec.block_size, "layers": len(g.layer_names)}
            for g in groups
        ],
        "num_blocks": scheduler.kv_cache_config.num_blocks,
        "hash_block_size": scheduler.kv_cache_manager.block_pool.hash_block_size,
        "enable_prefix_caching": bool(vc.cache_config.enable_prefix_caching),
        "mamba_cache_mode": str(vc.cache_config.mamba_cache_mode),
        "model": str(vc.model_config.model),
        "seed": vc.model_config.seed,
        "max_num_seqs": scheduler.scheduler_config.max_num_seqs,
        # what a replay needs to schedule as this engine did (hybridmem sim --replay)
        "max_num_batched_tokens": scheduler.scheduler_config.max_num_batched_tokens,
        "max_model_len": vc.model_config.max_model_len,
        "scheduler_reserve_full_isl": bool(getattr(vc.scheduler_config,
                                                   "scheduler_reserve_full_isl", True)),
    }
    extra = os.environ.get(META_ENV)
    if extra:
        meta.update(json.loads(extra))
    return meta


class EngineTracer:
    """Turns calls into one scheduler's objects into :class:`Event`s for one sink."""

    def __init__(self, scheduler: Any, sink: Sink) -> None:
        from vllm.v1.core.kv_cache_utils import get_block_hash, get_group_id, resolve_block_hashes
        from vllm.v1.kv_cache_interface import MambaSpec

        # Resolved once: a function-level import costs a module lookup per event.
        self._get_block_hash = get_block_hash
        self._get_group_id = get_group_id
        self._resolve = resolve_block_hashes

        self.sink = sink
        self.step = 0
        self.closed = False
        groups = scheduler.kv_cache_config.kv_cache_groups
        self.group_kind = [
            StateKind.RECURRENT if isinstance(g.kv_cache_spec, MambaSpec) else StateKind.ATTENTION
            for g in groups
        ]
        self.group_block_size = [g.kv_cache_spec.block_size for g in groups]
        # block size of the first group of each kind (the chain's grid), None when absent
        self.kind_block_size: dict[StateKind, int | None] = {
            kind: next((self.group_block_size[gid] for gid, k in enumerate(self.group_kind)
                        if k is kind), None)
            for kind in (StateKind.ATTENTION, StateKind.RECURRENT)
        }
        self.pool = scheduler.kv_cache_manager.block_pool
        self.hash_block_size = self.pool.hash_block_size
        # Context of the call now running, set by the allocate_slots / cache_full_blocks wrappers.
        self.requester = ""
        self.cause = Cause.EVICTION
        self.suppress = False  # inside move_block_hashes: keys move, none is lost
        self.last_need = 0
        self.depth_of: dict[bytes, int] = {}  # discoverable key -> boundary tokens
        self.held: list[Event] | None = None  # events held back during allocate_slots
        self.hooked: list[tuple[Any, str]] = []  # (object, method name) wrapped by attach()
        self.prefix_cache = dict.fromkeys(PREFIX_CACHE_KEYS, 0)

    # -- emission helpers ------------------------------------------------------------------

    def emit(self, event: Event) -> None:
        if self.held is not None:
            self.held.append(event)
        else:
            self.sink.on_event(event)

    def _chain(self, request: Any, kind: StateKind) -> tuple[int, ...]:
        block_size = self.kind_block_size[kind]
        if block_size is None:
            return ()
        view = self._resolve(request.block_hashes, self.hash_block_size, block_size)
        return tuple(hash64(bytes(h)) for h in view)

    def waiting_entry(self, request: Any) -> None:
        self.emit(Event(
            EventKind.WAITING_ENTRY, step=self.step, request_id=request.request_id,
            preemption_count=request.num_preemptions, depth=request.num_tokens,
            chain=self._chain(request, StateKind.ATTENTION),
            recurrent_chain=self._chain(request, StateKind.RECURRENT),
        ))

    def published(self, key: bytes, block: Any, num_tokens: int | None) -> None:
        gid = self._get_group_id(key)
        depth = num_tokens if num_tokens is not None else self.depth_of.get(key, 0)
        self.depth_of[key] = depth
        self.emit(Event(
            EventKind.PUBLICATION, step=self.step, request_id=self.requester,
            hash=hash64(bytes(self._get_block_hash(key))), depth=depth,
            state_kind=self.group_kind[gid], page=block.block_id,
        ))

    def lost(self, key: bytes, page: int, cause: Cause) -> None:
        gid = self._get_group_id(key)
        self.emit(Event(
            EventKind.LOSS, step=self.step, hash=hash64(bytes(self._get_block_hash(key))),
            depth=self.depth_of.pop(key, 0), state_kind=self.group_kind[gid], page=page,
            cause=cause, requester=self.requester if cause is Cause.ALLOCATION else "",
        ))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.sink.close()
            path = getattr(self.sink, "path", None)
            if path is not None:
                write_text_atomic(f"{path}{PREFIX_CACHE_SUFFIX}", json.dumps(self.prefix_cache))


def _wrap(obj: Any, name: str, make: Any) -> None:
    """Replace bound method ``obj.name`` by ``make(original)`` on this instance only."""
    original = getattr(obj, name)
    setattr(obj, name, functools.wraps(original)(make(original)))


def detach(scheduler: Any) -> None:
    """Close this scheduler's trace (END) and remove every hook ``attach`` put on its objects,
    so their methods are the classes' own again. A no-op on an untraced scheduler.

    For in-process A/B measurements of the hook cost (``benchmarks/bench_trace_probe.py``):
    the same engine alternates traced and untraced rounds.
    """
    tracer = getattr(scheduler, TRACER_ATTR, None)
    if tracer is None:
        return
    for obj, name in tracer.hooked:
        if name in vars(obj):
            delattr(obj, name)
    delattr(scheduler, TRACER_ATTR)
    tracer.close()


def attach(scheduler: Any, path: str) -> EngineTracer:
    """Open the trace at ``path`` and hook this scheduler's objects. Returns the tracer."""
    from vllm.v1.request import RequestStatus

    tracer = EngineTracer(scheduler, open_sink(path, run_meta(scheduler)))
    setattr(scheduler, TRACER_ATTR, tracer)
    kvm = scheduler.kv_cache_manager
    pool = tracer.pool

    # -- scheduler -------------------------------------------------------------------------
    def schedule(orig: Any) -> Any:
        def f(*args: Any, **kwargs: Any) -> Any:
            tracer.step += 1
            return orig(*args, **kwargs)
        return f

    def add_request(orig: Any) -> Any:
        def f(request: Any) -> None:
            is_new = request.request_id not in scheduler.requests
            orig(request)
            if is_new and request.request_id in scheduler.requests:
                tracer.waiting_entry(request)
        return f

    def preempt(orig: Any) -> Any:
        def f(request: Any, *args: Any, **kwargs: Any) -> None:
            episode = request.num_preemptions
            orig(request, *args, **kwargs)
            tracer.emit(Event(EventKind.PREEMPTION, step=tracer.step,
                              request_id=request.request_id, preemption_count=episode,
                              depth=request.num_tokens))
            tracer.waiting_entry(request)
        return f

    def free_request(orig: Any) -> Any:
        def f(request: Any, *args: Any, **kwargs: Any) -> Any:
            tracer.emit(Event(EventKind.FINISH, step=tracer.step, request_id=request.request_id,
                              preemption_count=request.num_preemptions, depth=request.num_tokens))
            return orig(request, *args, **kwargs)
        return f

    def shutdown(orig: Any) -> Any:
        def f(*args: Any, **kwargs: Any) -> Any:
            try:
                return orig(*args, **kwargs)
            finally:
                tracer.close()
        return f

    # -- KV-cache manager / coordinator ------------------------------------------------------
    def num_blocks_to_allocate(orig: Any) -> Any:
        def f(*args: Any, **kwargs: Any) -> int:
            n = orig(*args, **kwargs)
            tracer.last_need = int(n)
            return n
        return f

    admitting = (RequestStatus.WAITING, RequestStatus.PREEMPTED)
    preempted = RequestStatus.PREEMPTED
    held: list[Event] = []  # one buffer for every call (allocate_slots does not nest)

    def allocate_slots(orig: Any) -> Any:
        # Hot path: called for every scheduled request every step. A running request that needs
        # no new block and causes no loss/publication leaves after a few attribute stores.
        def f(request: Any, num_new_tokens: int, *args: Any, **kwargs: Any) -> Any:
            status = request.status
            admitted = status in admitting
            depth = (request.num_computed_tokens + kwargs.get("num_new_computed_tokens", 0)
                     + kwargs.get("num_external_computed_tokens", 0)) if admitted else 0
            free = pool.get_num_free_blocks()
            tracer.last_need = 0
            tracer.requester = request.request_id
            tracer.cause = Cause.ALLOCATION
            tracer.held = held
            try:
                blocks = orig(request, num_new_tokens, *args, **kwargs)
            except BaseException:
                held.clear()  # the call failed: what it would have caused is not emitted
                raise
            finally:
                tracer.requester = ""
                tracer.cause = Cause.EVICTION
                tracer.held = None
            need = tracer.last_need
            if blocks is not None and need <= 0 and not held and not admitted:
                return blocks
            if blocks is not None and admitted and "new_computed_blocks" in kwargs:
                if status == preempted:
                    tracer.emit(Event(EventKind.RESUME, step=tracer.step,
                                      request_id=request.request_id,
                                      preemption_count=request.num_preemptions))
                tracer.emit(Event(EventKind.ADOPTION, step=tracer.step,
                                  request_id=request.request_id,
                                  preemption_count=request.num_preemptions, depth=depth))
            if need > 0 or blocks is None:
                tracer.emit(Event(
                    EventKind.ALLOCATION, step=tracer.step, request_id=request.request_id,
                    preemption_count=request.num_preemptions, need=need, free=free,
                    outcome=Outcome.OK if blocks is not None else Outcome.REJECTED,
                    requester=request.request_id,
                ))
            if held:
                for event in held:
                    tracer.emit(event)
                held.clear()
            return blocks
        return f

    def record_prefix_cache_stats(orig: Any) -> Any:
        def f(request: Any, num_hits: int, *args: Any, **kwargs: Any) -> Any:
            if kvm.prefix_cache_lookup_enabled(request):  # vLLM's own condition for counting
                c = tracer.prefix_cache
                pre = "preempted_" if request.num_preemptions > 0 else ""
                c[pre + "requests"] += 1
                c[pre + "queries"] += request.num_tokens
                c[pre + "hits"] += num_hits
            return orig(request, num_hits, *args, **kwargs)
        return f

    # -- block pool --------------------------------------------------------------------------
    def insert_block_hash(orig: Any) -> Any:
        def f(key: bytes, block: Any, num_tokens: int | None) -> None:
            # A publication is absent -> present; a key already present (or being moved) can't be.
            if tracer.suppress or pool.cached_block_hash_to_block.get_one_block(key) is not None:
                orig(key, block, num_tokens)
                return
            orig(key, block, num_tokens)
            if pool.cached_block_hash_to_block.get_one_block(key) is not None:
                tracer.published(key, block, num_tokens)
        return f

    def remove_cached_block_hashes(orig: Any) -> Any:
        def f(block: Any) -> list[Any]:
            removed = orig(block)
            if removed and not tracer.suppress:
                for key in removed:
                    if pool.cached_block_hash_to_block.get_one_block(key) is None:
                        tracer.lost(key, block.block_id, tracer.cause)
            return removed
        return f

    def move_block_hashes(orig: Any) -> Any:
        def f(*args: Any, **kwargs: Any) -> None:
            tracer.suppress = True
            try:
                orig(*args, **kwargs)
            finally:
                tracer.suppress = False
        return f

    def cache_full_blocks(orig: Any) -> Any:
        def f(*args: Any, **kwargs: Any) -> None:
            saved = tracer.cause
            tracer.cause = Cause.INVALIDATION  # only a partial->full re-key removes keys here
            try:
                orig(*args, **kwargs)
            finally:
                tracer.cause = saved
        return f

    def reset_prefix_cache(orig: Any) -> Any:
        def f(*args: Any, **kwargs: Any) -> bool:
            ok = orig(*args, **kwargs)
            if ok:
                for key in list(tracer.depth_of):
                    tracer.lost(key, -1, Cause.EVICTION)
            return bool(ok)
        return f

    hooks: list[tuple[Any, dict[str, Any]]] = [
        (scheduler, {"schedule": schedule, "add_request": add_request,
                     "_preempt_request": preempt, "_free_request": free_request,
                     "shutdown": shutdown}),
        (kvm, {"allocate_slots": allocate_slots,
               "record_prefix_cache_stats": record_prefix_cache_stats}),
        (kvm.coordinator, {"get_num_blocks_to_allocate": num_blocks_to_allocate}),
        (pool, {"_insert_block_hash": insert_block_hash,
                "_remove_cached_block_hashes": remove_cached_block_hashes,
                "move_block_hashes": move_block_hashes, "cache_full_blocks": cache_full_blocks,
                "reset_prefix_cache": reset_prefix_cache}),
    ]
    for obj, table in hooks:
        for name, make in table.items():
            _wrap(obj, name, make)
    tracer.hooked = [(obj, name) for obj, table in hooks for name in table]
    return tracer
