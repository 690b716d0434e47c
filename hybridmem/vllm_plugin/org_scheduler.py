"""vLLM's real Scheduler serving through an organization: ``OrgScheduler``.

Used through vLLM's supported seam ``scheduler_cls`` (resolved in ``config/scheduler.py``)::

    EngineArgs(..., scheduler_cls="hybridmem.vllm_plugin.org_scheduler.OrgScheduler",
               additional_config={"hybridmem": {"org": "S2", "budget": "b40", ...}},
               async_scheduling=False, enable_prefix_caching=True)
    vllm serve M --scheduler-cls hybridmem.vllm_plugin.org_scheduler.OrgScheduler \\
               --additional-config '{"hybridmem": {...}}' --no-async-scheduling

After ``super().__init__`` it swaps ``kv_cache_manager`` for an
:class:`~hybridmem.vllm_plugin.org_manager.OrgKVCacheManager`. The plugin's
:func:`install_block_override` (installed by ``register()`` in every vLLM process) sets the
number of KV-cache blocks to the organization's block ids (``pages + 1``) when the engine sizes
its cache, so every id the organization hands out exists.

Trace (``HYBRIDMEM_TRACE`` names the path, as in stock mode; the stock hooks are kept off):

==============  ============================================================================
event           source
==============  ============================================================================
WAITING_ENTRY   ``add_request`` (episode 0) and after each preemption (episode k+1), with the
                organization's own hash chains (attention per block, recurrent per boundary)
PREEMPTION      ``_preempt_request`` (episode k), before the organization's PIN / RELEASE
RESUME          the manager, when a preempted request is admitted (before its ADOPTION)
FINISH          ``_free_request``, before the organization's RELEASE events (cause FINISH)
ALLOCATION      REJECTED by the admission headroom check: the manager (nothing adopted);
                every other ALLOCATION, and ADOPTION, PUBLICATION, LOSS, RELEASE, PIN, UNPIN,
                RETENTION: the organization's own observer, with its page and line ids
END             ``shutdown`` closes the sink
==============  ============================================================================

``--check-invariants``: the organization runs inside
:class:`invariants.checkers.DebugOrganization` (every App. D.2 check after every mutating call,
pool watchers for the transient ones) and ``check_integrity`` runs after every ``schedule`` and
``update_from_output``; a violation raises :class:`InvariantStop` naming invariant, unit and
entry, which stops the engine.
"""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace
from typing import Any

from vllm.v1.core.sched.scheduler import Scheduler

from hybridmem.errors import HybridMemError
from hybridmem.events import Event, EventKind, FanOut
from hybridmem.vllm_plugin import faults, org_metrics
from hybridmem.vllm_plugin.org_manager import OrgKVCacheManager
from hybridmem.vllm_plugin.org_settings import (
    SCHEDULER_QUALNAME,
    VIOLATION_MARK,
    OrgSettings,
    build_org,
    plan_org,
    serving_geometry,
    serving_grid,
    settings_from,
)
from hybridmem.vllm_plugin.resident import flush_all as flush_resident
from hybridmem.vllm_plugin.state_table import activate as activate_state_table

QUALNAME = SCHEDULER_QUALNAME
TRACER_ATTR = "_hybridmem_tracer"  # tracing.py's attribute: non-None keeps its hooks off


class InvariantStop(RuntimeError):
    """An App. D.2 invariant broke during serving (one line: invariant, unit, entry)."""


def _raised_by_hybridmem(exc: BaseException) -> bool:
    tb = exc.__traceback__
    last = None
    while tb is not None:
        last = tb.tb_frame.f_code.co_filename
        tb = tb.tb_next
    return last is not None and ("/hybridmem/" in last or "/invariants/" in last)


class OrgTracer:
    """What drivers read on ``scheduler._hybridmem_tracer``: the sink and ``close``."""

    def __init__(self, sink: Any) -> None:
        self.sink = sink
        self.closed = False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.sink.close()


_OFF = object()  # placeholder that keeps tracing.install()'s hook from attaching


def trace_meta(scheduler: Any, settings: OrgSettings, plan: Any) -> dict[str, Any]:
    import vllm

    vc = scheduler.vllm_config
    meta: dict[str, Any] = {
        "engine": "vllm",
        "engine_version": vllm.__version__,
        **plan.as_dict(),
        "organization": settings.org,
        "policy": {"headroom": settings.headroom, "pin_k": settings.pin_k,
                   "pin_budget": settings.pin_budget, "retention": settings.retention,
                   "max_num_seqs": scheduler.scheduler_config.max_num_seqs},
        "fault": settings.fault,
        "check_invariants": settings.check_invariants,
        "state_storage": state_storage(scheduler, plan),
        "units": {k: v for k, v in plan.units.as_dict().items()
                  if k in ("page_bytes", "ssm_members", "conv_slot_bytes", "slots_per_slab",
                           "s0_page_bytes")},
        "num_blocks": scheduler.kv_cache_config.num_blocks,
        "enable_prefix_caching": bool(vc.cache_config.enable_prefix_caching),
        "mamba_cache_mode": str(vc.cache_config.mamba_cache_mode),
        "model": str(vc.model_config.model),
        "seed": vc.model_config.seed,
        "max_num_seqs": scheduler.scheduler_config.max_num_seqs,
    }
    extra = os.environ.get("HYBRIDMEM_TRACE_META")
    if extra:
        meta.update(json.loads(extra))
    return meta


def state_storage(scheduler: Any, plan: Any) -> dict[str, Any]:
    """Where the worker keeps recurrent state (``state_storage`` in trace metadata and summary):
    ``arena`` "shared" (org page p = vLLM block p + 1, the bytes attention would use) or
    "private"; the layout; whether the organization grid is on (vLLM's rows then hold a 1-element
    dummy per block)."""
    from hybridmem.vllm_plugin import org_geometry, org_state
    from hybridmem.vllm_plugin.org_manager import plan_layout

    layout = plan_layout(plan)
    grid = org_geometry.active_grid()
    page = None
    if grid is not None:  # the page vLLM gave each layer (the Mamba group's padded page)
        from vllm.v1.kv_cache_interface import MambaSpec

        specs = [g.kv_cache_spec for g in scheduler.kv_cache_config.kv_cache_groups
                 if isinstance(g.kv_cache_spec, MambaSpec)]
        page = int(specs[0].page_size_bytes) if specs else None
    return {"arena": org_state.arena_for(layout, page, scheduler.kv_cache_config.num_blocks),
            "arena_mode": org_state.arena_mode(), "org_grid": grid is not None,
            "page_bytes": layout.page_bytes, "members": layout.members, "conv": layout.conv,
            "slots_per_slab": layout.slots_per_slab, "num_pages": layout.num_pages,
            "poison_vllm_state": org_state.poison_on(),
            "rows": "resident" if org_state.resident_on() else "read and written every step",
            "boundary_states": "chunk stops" if not org_state.boundary_exports() else "exported"}


class _AtInterval:
    """The scheduler as vLLM's split reads it, with Mamba blocks of ``interval`` tokens (the
    split reads the block size from ``cache_config.block_size`` and ``block_size``; every other
    attribute is the scheduler's)."""

    def __init__(self, scheduler: Scheduler, interval: int) -> None:
        self._scheduler = scheduler
        self.block_size = interval
        self.cache_config = SimpleNamespace(block_size=interval)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._scheduler, name)


class OrgScheduler(Scheduler):
    """vLLM's Scheduler with an organization-backed KV-cache manager."""

    def __init__(self, vllm_config: Any, kv_cache_config: Any, *args: Any, **kwargs: Any) -> None:
        settings = settings_from(vllm_config.additional_config)
        if settings is None:
            raise HybridMemError("OrgScheduler needs additional_config={'hybridmem': {'org': ..., "
                                 "'budget': ...}}")
        if vllm_config.scheduler_config.async_scheduling:
            raise HybridMemError("organization mode needs async scheduling off "
                                 "(--no-async-scheduling): only computed state is published")
        setattr(self, TRACER_ATTR, _OFF)
        super().__init__(vllm_config, kv_cache_config, *args, **kwargs)
        cache = vllm_config.cache_config
        if not cache.enable_prefix_caching or cache.mamba_cache_mode != "align":
            raise HybridMemError("organization mode needs prefix caching on (Mamba cache mode "
                                 f"'align'), got {cache.enable_prefix_caching=} "
                                 f"{cache.mamba_cache_mode=}")
        self.org_settings = settings
        from hybridmem.vllm_plugin import org_state

        self._chunk_stops = not org_state.boundary_exports()
        plan = plan_org(settings, serving_geometry(vllm_config), serving_grid(vllm_config))
        self.org_plan = plan
        self._grid = plan.grid
        self._interval = plan.interval  # where checkpoints are (S0-S2: the grid; D0 its own)
        faults.activate(settings.fault)
        path = os.environ.get("HYBRIDMEM_TRACE")
        sink = None
        if path:
            from hybridmem.engines.trace_sink import open_sink

            sink = open_sink(path, trace_meta(self, settings, plan))
        # /metrics: a reporter beside the trace when vLLM runs this scheduler in its engine
        # core (org_metrics); it sees the same events as the trace
        self._metrics = org_metrics.engine_core_reporter()
        observer: Any = sink
        if self._metrics is not None:
            observer = self._metrics if sink is None else FanOut(sink, self._metrics)
        org = build_org(plan, observer)
        ops: Any = org
        self._checker: Any = None
        if settings.check_invariants:
            from invariants.checkers import DebugOrganization

            ops = DebugOrganization(org)
            self._checker = ops
        self.org = org
        stock = getattr(self, "kv_cache_manager")  # noqa: B009 (vLLM types it KVCacheManager)
        manager = OrgKVCacheManager(stock, plan, org, ops, observer)
        setattr(self, "kv_cache_manager", manager)  # noqa: B010
        activate_state_table(manager.state_table)
        self._sink = sink
        self.state_storage = state_storage(self, plan)
        self.org_step = 0
        setattr(self, TRACER_ATTR, OrgTracer(sink) if sink is not None else None)
        if self._metrics is not None:
            self._metrics.attach(org, manager, plan)
            self._metrics.write(force=True)

    # -- engine-side events ------------------------------------------------------------------
    def _emit(self, kind: EventKind, request: Any, episode: int, **fields: Any) -> None:
        if self._sink is not None:
            self._sink.on_event(Event(kind, step=self.org_step, request_id=request.request_id,
                                      preemption_count=episode, **fields))

    def _waiting_entry(self, request: Any) -> None:
        if self._sink is not None:
            attn, rec = self.kv_cache_manager.chains(request)
            self._emit(EventKind.WAITING_ENTRY, request, request.num_preemptions,
                       depth=request.num_tokens, chain=attn, recurrent_chain=rec)

    def add_request(self, request: Any) -> None:
        is_new = request.request_id not in self.requests
        super().add_request(request)
        if is_new and request.request_id in self.requests:
            self.kv_cache_manager.add_request(request)
            self._waiting_entry(request)

    def _preempt_request(self, request: Any, *args: Any, **kwargs: Any) -> None:
        self._emit(EventKind.PREEMPTION, request, request.num_preemptions,
                   depth=request.num_tokens)
        super()._preempt_request(request, *args, **kwargs)
        self._waiting_entry(request)

    def _free_request(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        self._emit(EventKind.FINISH, request, request.num_preemptions, depth=request.num_tokens)
        return super()._free_request(request, *args, **kwargs)

    # -- prefill chunks ----------------------------------------------------------------------
    def vllm_split(self, request: Any, num_new_tokens: int, num_new_local_computed_tokens: int = 0,
                   num_external_computed_tokens: int = 0) -> int:
        """vLLM's own block-aligned split with the organization's checkpoint interval as the
        Mamba block: S0-S2 (interval = block) exactly vLLM's; D0 (16-token blocks, a longer
        interval) as vLLM cuts a hybrid whose Mamba block is that interval, so chunks stop at
        D0's checkpoints, not at every 16-token block."""
        this: Any = self if self._interval == self._grid else _AtInterval(self, self._interval)
        return Scheduler._mamba_block_aligned_split(this, request, num_new_tokens,
                                                    num_new_local_computed_tokens,
                                                    num_external_computed_tokens)

    def _mamba_block_aligned_split(self, request: Any, num_new_tokens: int,
                                   num_new_local_computed_tokens: int = 0,
                                   num_external_computed_tokens: int = 0) -> int:
        """:meth:`vllm_split`; with chunk stops on, then also stop at the next checkpoint.

        The organization allocates (and later publishes) a checkpoint at every recurrent
        boundary (S0-S2: every grid block; D0: every interval), and vLLM's forward writes only
        a chunk's end state (seams note, trap 3). By default the worker exports every interior
        boundary's state during the forward (``state_table`` boundary exports, :mod:`.org_state`),
        so chunks run as vLLM cuts them (:meth:`OrgKVCacheManager.fit_chunk` shortens one the
        pool cannot hold); where it cannot (``org_state.boundary_exports()`` is False: not on
        CPU, or ``HYBRIDMEM_ORG_CHUNK_STOPS=1``) every boundary is made a chunk end instead
        (outputs unchanged, more steps)."""
        n = self.vllm_split(request, num_new_tokens, num_new_local_computed_tokens,
                            num_external_computed_tokens)
        start = (request.num_computed_tokens + num_new_local_computed_tokens
                 + num_external_computed_tokens)
        if not self._chunk_stops:
            if n <= 0 or start >= max(request.num_prompt_tokens, request.num_tokens - 1):
                return n  # decode (or nothing): no boundary inside
            return self.kv_cache_manager.fit_chunk(request, start, start + n) - start
        stop = (start // self._interval + 1) * self._interval
        return min(n, stop - start)

    # -- steps -------------------------------------------------------------------------------
    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        self.org_step += 1
        self.org.step = self.org_step
        out = self._checked(super().schedule, *args, **kwargs)
        return out

    def update_from_output(self, *args: Any, **kwargs: Any) -> Any:
        out = self._checked(super().update_from_output, *args, **kwargs)
        idle = not self.has_unfinished_requests()
        if idle:
            flush_resident()  # idle: every page current for readers outside the engine
        if self._metrics is not None:
            self._metrics.write(force=idle)
        return out

    def _checked(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run a scheduler step; with checks on, the App. D.2 checkers run after it. An
        AssertionError raised inside the organization (its own accounting, e.g. under a fault)
        or by a checker stops the engine as :class:`InvariantStop`; vLLM's own assertions
        propagate unchanged."""
        try:
            out = fn(*args, **kwargs)
            if self._checker is not None:
                self._checker.check_integrity()
        except AssertionError as exc:
            if self._checker is None and not _raised_by_hybridmem(exc):
                raise
            line = f"step {self.org_step}: {self.org.name}: {exc}".replace("\n", " ")
            print(f"{VIOLATION_MARK} {line}", file=sys.stderr, flush=True)
            raise InvariantStop(line) from None
        return out

    def shutdown(self) -> None:
        try:
            super().shutdown()
        finally:
            tracer = getattr(self, TRACER_ATTR, None)
            if isinstance(tracer, OrgTracer):
                tracer.close()
            flush_resident()
            metrics = getattr(self, "_metrics", None)
            if metrics is not None:
                metrics.close()
            activate_state_table(None)  # a later engine in this process starts clean
            faults.activate(None)
