"""A vLLM 0.32 KV-cache manager whose every decision is an organization's (paper §3.1, §4.4).

:class:`OrgKVCacheManager` replaces ``Scheduler.kv_cache_manager`` (see :mod:`.org_scheduler`).
vLLM's real scheduler keeps admitting, chunking, preempting and stepping; memory is the
organization's (:class:`hybridmem.memory.organization.MemoryOrganization`)::

    scheduler call                       organization
    -----------------------------------  --------------------------------------------------
    add_request (scheduler subclass)     add_request(r, all tokens, cache_salt)
    get_computed_blocks(r)               lookup(r): A_max, R_max, J (hit <= len - 1); kept
    allocate_slots(r, n, hit...)  admit  pure admission check  need + H <= available
                                         (H = floor(f B), units the hit would pin deducted;
                                         need for the whole sequence under vLLM's
                                         full-sequence gate, its default, else the chunk);
                                         only if it passes: adopt(r, hit), allocate(r, c + n)
    allocate_slots(r, n)          run    publish(r, computed), release_superseded(r),
                                         allocate(r, c + n)  (None -> vLLM preempts)
    free(r)                       done   publish(r, computed), finish(r)
    free(r)                       preempt publish(r, computed), preempt(r) (pin decision)

``computed`` is the scheduler's ``num_computed_tokens`` at the *next* call: async scheduling is
off in organization mode, so every token counted there has been executed and its state written.
A checkpoint is therefore never discoverable before its state exists.

Block ids (vLLM's id 0 is the null block)::

    attention group   one id per organization block, in order: page + 1
    Mamba group       vLLM's mamba_cache_mode='align' POSITIONAL table:
                      position i = checkpoint at boundary ceil((i+1) G / g_r) g_r,
                      id = home id + 1 (+ attention-pool size for D0), 0 where not held

For S0-S2 ``g_r = G`` (position i = state after (i+1) G tokens). For D0 ``G`` is its 16-token unit
and ``g_r`` its interval (a multiple of 16), so the ``g_r / 16`` positions of one interval share
the destination checkpoint (the worker skips the copy between two positions with one id). The
worker's tables are append-only: a running request receives only positions past what it already
has; a released checkpoint's id stays in its table at a position the worker never reads again (the
worker reads the previous state index and the current one only). Each checkpoint with storage is
registered in the process-wide :class:`~hybridmem.vllm_plugin.state_table.StateTable` (``set`` when
it gets storage, ``drop`` once it has none), the contract with the worker side.

The worker side (:mod:`.org_state`) reads and writes each checkpoint's state at that address
(S1/S2 member pages and conv page / slot line, S0 one page, D0 a composite); vLLM's own Mamba
rows are never used (on the organization grid they are a 1-element dummy per block).
"""

from __future__ import annotations

from typing import Any

from hybridmem.errors import HybridMemError
from hybridmem.events import Event, EventKind, Observer, Outcome, StateKind
from hybridmem.geometry import ceil_div
from hybridmem.memory.interface import LookupResult, Organization
from hybridmem.memory.organization import MemoryOrganization
from hybridmem.memory.placement import ConvPlacement
from hybridmem.vllm_plugin.org_settings import OrgPlan
from hybridmem.vllm_plugin.state_table import Export, StateAddress, StateLayout, StateTable

_CONV = {"S0": "inside", "S1": "page", "S2": "slot", "D0": "inside"}


def plan_layout(plan: OrgPlan) -> StateLayout:
    """How ``plan``'s organization lays out one checkpoint (the worker's contract)."""
    u = plan.units
    name = plan.settings.org
    if isinstance(plan.capacity, tuple):
        return StateLayout("D0", "inside", plan.capacity[1], u.d0_recurrent_unit_bytes, 1, 0, 0,
                           plan.interval)
    if name == "S0":
        return StateLayout("S0", "inside", plan.capacity, u.s0_page_bytes, 1, 0, 0,
                           plan.interval)
    slot = name == "S2"
    return StateLayout(name, _CONV[name], plan.capacity, u.page_bytes, u.ssm_members,
                       u.conv_slot_bytes if slot else 0, u.slots_per_slab if slot else 0,
                       plan.interval)


def state_layout(plan: OrgPlan, org: MemoryOrganization) -> StateLayout:
    """:func:`plan_layout`, checked against the organization actually built."""
    layout = plan_layout(plan)
    conv = {ConvPlacement.INSIDE: "inside", ConvPlacement.PAGE: "page",
            ConvPlacement.SLOT: "slot"}[org.placement.kind]
    if (org.name, conv, org.members) != (layout.org, layout.conv, layout.members):
        raise HybridMemError(f"{org.name}: built with conv {conv}, {org.members} members; the "
                             f"plan's layout says {layout.conv}, {layout.members}")
    return layout


class OrgKVCacheManager:
    """Drop-in for ``vllm.v1.core.kv_cache_manager.KVCacheManager`` backed by an organization.

    ``stock`` is the manager vLLM built; its ``coordinator`` (read by the scheduler and the
    engine core for block sizes and specs) and its block objects are kept, its pool unused.
    ``ops`` is what mutating calls go through (the organization, or an invariant-checking
    wrapper around it); ``org`` is read directly.
    """

    def __init__(self, stock: Any, plan: OrgPlan, org: MemoryOrganization,
                 ops: Organization | None = None, sink: Observer | None = None) -> None:
        from vllm.v1.kv_cache_interface import AttentionSpec, MambaSpec
        from vllm.v1.metrics.stats import PrefixCacheStats
        from vllm.v1.request import RequestStatus

        self._stats_cls = PrefixCacheStats
        self._admitting = (RequestStatus.WAITING, RequestStatus.PREEMPTED)
        self.plan = plan
        self.org = org
        self.ops: Organization = ops if ops is not None else org
        self.sink = sink
        # what the scheduler / engine core read on a KV-cache manager
        self.coordinator = stock.coordinator
        self.block_pool = stock.block_pool
        self.kv_cache_config = stock.kv_cache_config
        self.max_model_len = stock.max_model_len
        self.enable_caching = stock.enable_caching
        self.log_stats = stock.log_stats
        self.prefix_cache_stats = PrefixCacheStats() if self.log_stats else None
        self.empty_kv_cache_blocks = stock.empty_kv_cache_blocks
        self.mamba_shared_prefix_checkpoint = False
        self.num_kv_cache_groups = len(self.kv_cache_config.kv_cache_groups)
        self.watermark_blocks = 0
        attn = [g for g, grp in enumerate(self.kv_cache_config.kv_cache_groups)
                if isinstance(grp.kv_cache_spec, AttentionSpec)]
        mamba = [g for g, grp in enumerate(self.kv_cache_config.kv_cache_groups)
                 if isinstance(grp.kv_cache_spec, MambaSpec)]
        if len(attn) != 1 or len(mamba) != 1 or self.num_kv_cache_groups != 2:
            raise HybridMemError(
                f"organization mode needs one attention and one Mamba KV-cache group; vLLM built "
                f"{self.num_kv_cache_groups} groups ({len(attn)} attention, {len(mamba)} Mamba)")
        self.attn_gid, self.mamba_gid = attn[0], mamba[0]
        sizes = {grp.kv_cache_spec.block_size for grp in self.kv_cache_config.kv_cache_groups}
        if sizes != {plan.grid}:
            raise HybridMemError(f"organization grid {plan.grid} tokens, but vLLM's groups use "
                                 f"block sizes {sorted(sizes)}")
        if self.kv_cache_config.num_blocks < plan.num_block_ids:
            raise HybridMemError(
                f"vLLM has {self.kv_cache_config.num_blocks} blocks; {org.name} hands out ids up "
                f"to {plan.num_block_ids - 1} (num_gpu_blocks_override must be "
                f">= {plan.num_block_ids})")
        self._blk = self.block_pool.blocks  # KVCacheBlock by id; 0 is the null block
        self._grid = plan.grid
        self._rec_offset = plan.recurrent_id_offset + 1  # block id = home page + this
        self._headroom = plan.headroom_units()
        # per request
        self._known: dict[str, int] = {}  # tokens the organization knows
        self._hits: dict[str, LookupResult] = {}  # lookup kept for the allocate that follows
        self._sent: dict[str, list[int]] = {}  # [attention ids, Mamba positions] sent
        self._override: dict[str, dict[int, int]] = {}  # fault: Mamba position -> id
        self._adopted: dict[str, int] = {}  # adopted depth of the current episode
        self._new_attn_ids: list[int] = []
        # state table (the worker-side contract)
        self.state_table = StateTable(state_layout(plan, org))
        self.state_table.boundary_checkpoints = True
        self._state: dict[int, StateAddress] = {}
        self._state_sig = (-1, -1)
        # faults
        self.fault = plan.settings.fault
        self.fault_count = 0  # times the fault changed what the worker or the index sees
        if self.fault == "skip-invalidate":
            self._install_skip_invalidate()
        self.counters = {"admissions": 0, "admission_rejections": 0, "adopted_tokens": 0,
                         "preemptions": 0, "finished": 0}

    # == engine-side events ======================================================================
    def _emit(self, kind: EventKind, **fields: Any) -> None:
        if self.sink is not None:
            self.sink.on_event(Event(kind, step=self.org.step, **fields))

    # == requests =================================================================================
    def add_request(self, request: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Register a new request; returns the organization's (attention, recurrent) chains."""
        rid = request.request_id
        tokens = list(request.all_token_ids)
        self.ops.add_request(rid, tokens, request.cache_salt)
        self._known[rid] = len(tokens)
        return self.ops.hash_chains(rid)

    def _sync(self, request: Any) -> str:
        rid: str = request.request_id
        known = self._known.get(rid)
        if known is None:
            self.add_request(request)
            return rid
        n = request.num_tokens
        if n > known:
            self.ops.append_tokens(rid, list(request.all_token_ids[known:n]))
            self._known[rid] = n
        return rid

    def chains(self, request: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return self.ops.hash_chains(self._sync(request))

    # == lookup ===================================================================================
    def prefix_cache_lookup_enabled(self, request: Any) -> bool:
        return bool(self.enable_caching and not request.skip_reading_prefix_cache)

    def get_computed_blocks(self, request: Any) -> tuple[Any, int, int]:
        rid = self._sync(request)
        if not self.prefix_cache_lookup_enabled(request):
            self._hits.pop(rid, None)
            return self.empty_kv_cache_blocks, 0, 0
        hit = self.ops.lookup(rid)
        self._hits[rid] = hit
        if hit.j == 0:
            return self.empty_kv_cache_blocks, 0, 0
        attn = [p + 1 for p in hit.blocks]
        positions = hit.j // self._grid
        mamba = [0] * positions
        assert hit.checkpoint is not None
        mamba[-1] = self._home_id(hit.checkpoint.members[0])
        return self._kv_blocks(attn, mamba), hit.j, 0

    def get_computed_blocks_for_connector(self, request: Any) -> Any:
        raise HybridMemError("organization mode does not support KV connectors")

    def _home_id(self, home_page: int) -> int:
        return home_page + self._rec_offset

    # == allocation ===============================================================================
    def allocate_slots(self, request: Any, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: Any = None, num_lookahead_tokens: int = 0,
                       num_external_computed_tokens: int = 0,
                       full_sequence_must_fit: bool = False, **_: Any) -> Any:
        """vLLM's call. ``full_sequence_must_fit`` (vLLM's ``scheduler_reserve_full_isl``, on by
        default) is its admission gate: a waiting or preempted request is admitted only if its
        whole sequence fits, not just the first chunk; the organization's admission rule then
        counts ``need`` for the whole sequence (what it would hold after its prefill), while
        only the chunk is allocated."""
        rid = self._sync(request)
        computed = request.num_computed_tokens
        total = min(computed + num_new_computed_tokens + num_external_computed_tokens
                    + num_new_tokens + num_lookahead_tokens, self._known[rid])
        if request.status in self._admitting and rid not in self._sent:
            check = total
            if full_sequence_must_fit:
                check = max(total, min(request.num_tokens, self.max_model_len, self._known[rid]))
            return self._admit(request, rid, num_new_computed_tokens, total,
                               computed + num_new_computed_tokens
                               + num_external_computed_tokens, num_new_tokens, check)
        if computed:
            self.ops.publish(rid, computed)
            self.ops.release_superseded(rid)
        if self.org.pages_needed(rid, total).total == 0:
            # nothing to grow: no ALLOCATION event (as vLLM); the superseded checkpoints just
            # released leave the state table now, so it mirrors the organization after every call
            self._sync_state()
            self._register_export(rid, computed, computed + num_new_tokens)
            return self.empty_kv_cache_blocks
        result = self.ops.allocate(rid, total)
        self._sync_state()
        if not result.ok:
            return None
        self._register_export(rid, computed, computed + num_new_tokens)
        return self._new_blocks(rid)

    def _admit(self, request: Any, rid: str, depth: int, total: int, start: int,
               num_new_tokens: int, check: int | None = None) -> Any:
        """Admit ``rid`` holding ``total`` tokens if ``need + H <= available`` for ``check``
        tokens (default ``total``; vLLM's full-sequence gate passes the whole sequence)."""
        from vllm.v1.request import RequestStatus

        hit = self._hits.pop(rid, None)
        if hit is None or hit.j != depth:
            if depth:
                raise AssertionError(f"request {rid}: admitted at depth {depth} without the "
                                     "matching lookup; this indicates a scheduler/manager skew")
            hit = LookupResult(rid, 0, 0, 0, (), (), None)
        check = total if check is None else check
        ok, need, avail = self.org.admission(hit, check, self._headroom)
        if not ok:  # nothing adopted, nothing released: the request stays waiting untouched
            self.counters["admission_rejections"] += 1
            if not any(r.holds_storage for r in self.org.requests.values()):
                raise HybridMemError(
                    f"{self.org.name}: request {rid} ({check} tokens) needs {need} units + "
                    f"headroom {self._headroom[0]} but only {avail} can ever be available "
                    f"({len(self.org.pins)} pinned); the budget {self.plan.settings.budget} is "
                    "too small for it")
            self._emit(EventKind.ALLOCATION, request_id=rid,
                       preemption_count=request.num_preemptions, need=need, free=avail,
                       outcome=Outcome.REJECTED, requester=rid)
            return None
        if request.status == RequestStatus.PREEMPTED:
            self._emit(EventKind.RESUME, request_id=rid, preemption_count=request.num_preemptions)
        self.ops.adopt(rid, hit)
        result = self.ops.allocate(rid, total)
        if not result.ok:
            raise AssertionError(f"request {rid}: admission check passed (need {need}, available "
                                 f"{avail}) but {self.org.name} rejected {result.need}; this "
                                 "indicates the admission arithmetic disagrees with allocate")
        self.counters["admissions"] += 1
        self.counters["adopted_tokens"] += hit.j
        self._adopted[rid] = hit.j
        if self.fault == "stale-checkpoint" and hit.checkpoint is not None and hit.j > 0:
            self._stale_checkpoint(rid, hit)
        self._sync_state()
        self._register_export(rid, start, start + num_new_tokens)
        attn, mamba = self._full_tables(rid)
        self._sent[rid] = [len(attn), len(mamba)]
        self._new_attn_ids.extend(attn[len(hit.blocks):])  # adopted blocks are never zeroed
        return self._kv_blocks(attn, mamba)

    def fit_chunk(self, request: Any, start: int, end: int) -> int:
        """With boundary exports, where the chunk ``[start, e)`` to schedule ends: ``end`` (the
        chunk vLLM chose) if the organization could hold every checkpoint it writes at once,
        else the largest checkpoint boundary ``start < e < end`` (a multiple of the recurrent
        interval: S0-S2 the grid, D0 its interval) that could, else the next boundary.

        A chunk's checkpoints are all written in one step, so none is reclaimable before the
        chunk ends; "could hold" = in the pool with only other owners' pins and the admission
        headroom taken (what vLLM's own preemption can free). Under pressure, admission and
        preemption then decide as in vLLM: a waiting request whose chunk does not fit now
        waits, a running one preempts others."""
        org = self.org
        rid = request.request_id
        ga, gr = org.attention_grid, org.recurrent_grid
        pinned = 0
        for ck, owner in org.pins.values():
            if owner != rid:
                pinned += len(set(org.ckpt_pages(ck)))
        atotal = org.pool_for(StateKind.ATTENTION).total
        rtotal = org.pool_for(StateKind.RECURRENT).total
        base = (start // gr) * gr
        if org.shares_one_pool():
            atotal, rtotal = atotal - pinned, 0
        else:
            rtotal -= pinned

        def fits(e: int) -> bool:
            units = org.ckpt_units(org.ckpts_after(base, e) + (1 if base else 0))
            return org.fits(ceil_div(e, ga), units, atotal, rtotal, self._headroom)

        if fits(end):
            return end
        for e in range((end - 1) // gr * gr, start, -gr):
            if fits(e):
                return e
        return min(end, (start // gr + 1) * gr)

    def _register_export(self, rid: str, start: int, end: int) -> None:
        """This step's chunk ``[start, end)`` of ``rid``: name the checkpoint of every recurrent
        boundary strictly inside it, under the row's destination block id (state_table's
        boundary exports), so the worker writes each one during this step's forward."""
        gr = self.org.recurrent_grid
        first = (start // gr + 1) * gr
        if first >= end:
            return
        req = self.org.requests[rid]
        pairs = []
        for b in range(first, end, gr):
            ck = req.ckpts.get(b)
            if ck is None or ck.conv < 0 or min(ck.members) < 0:
                raise AssertionError(f"request {rid}: chunk [{start}, {end}) spans boundary {b} "
                                     "but the organization holds no checkpoint with storage "
                                     "there; this indicates allocate skipped a boundary")
            pairs.append((b, self._home_id(ck.home_page)))
        dst = self._positions(req, ceil_div(end, self._grid) - 1, ceil_div(end, self._grid))[0]
        self.state_table.set_export(dst, Export(rid, start, end, tuple(pairs)))

    def _full_tables(self, rid: str) -> tuple[list[int], list[int]]:
        req = self.org.requests[rid]
        attn = [b.page + 1 for b in req.blocks]
        mamba = self._positions(req, 0, len(req.blocks))
        for pos, block_id in self._override.get(rid, {}).items():
            if pos < len(mamba):
                mamba[pos] = block_id
        return attn, mamba

    def _positions(self, req: Any, start: int, stop: int) -> list[int]:
        g, gr = self._grid, self.org.recurrent_grid
        out = []
        for i in range(start, stop):
            ck = req.ckpts.get(ceil_div((i + 1) * g, gr) * gr)
            out.append(self._home_id(ck.home_page) if ck is not None else 0)
        return out

    def _new_blocks(self, rid: str) -> Any:
        req = self.org.requests[rid]
        sent = self._sent[rid]
        n = len(req.blocks)
        attn = [b.page + 1 for b in req.blocks[sent[0]:]]
        mamba = self._positions(req, sent[1], n)
        sent[0] = sent[1] = n
        if not attn and not mamba:
            return self.empty_kv_cache_blocks
        self._new_attn_ids.extend(attn)
        return self._kv_blocks(attn, mamba)

    def _kv_blocks(self, attn: list[int], mamba: list[int]) -> Any:
        from vllm.v1.core.kv_cache_manager import KVCacheBlocks

        groups: list[list[Any]] = [[], []]
        blk = self._blk
        groups[self.attn_gid] = [blk[i] for i in attn]
        groups[self.mamba_gid] = [blk[i] for i in mamba]
        return KVCacheBlocks(tuple(groups))

    # == release ==================================================================================
    def free(self, request: Any) -> None:
        rid = request.request_id
        if rid not in self._known:
            return
        self._sync(request)
        computed = request.num_computed_tokens
        if computed and rid in self._sent:
            self.ops.publish(rid, computed)
        if request.is_finished():
            self.ops.finish(rid)
            self._known.pop(rid, None)
            self.counters["finished"] += 1
        else:
            self.ops.preempt(rid)
            self.counters["preemptions"] += 1
        for table in (self._hits, self._sent, self._override, self._adopted):
            table.pop(rid, None)
        self.state_table.drop_exports(rid)
        self._sync_state()

    def pop_blocks_for_free(self, request: Any) -> list[Any]:
        self.free(request)
        return []

    def remove_skipped_blocks(self, *args: Any, **kwargs: Any) -> None:
        return None

    def evict_blocks(self, block_ids: set[int]) -> None:
        return None

    def cache_blocks(self, request: Any, num_computed_tokens: int) -> None:
        rid = self._sync(request)
        if rid in self._sent and num_computed_tokens:
            self.ops.publish(rid, num_computed_tokens)

    def reset_prefix_cache(self) -> bool:
        cached = sum(p.num_cached for p in self.org.pools())
        self.ops.evict(cached)
        self._sync_state()
        if self.prefix_cache_stats is not None:
            self.prefix_cache_stats.reset = True
        return True

    # == state table ==============================================================================
    def _sync_state(self) -> None:
        """Mirror every live complete checkpoint into the state table (set new/changed, drop
        gone). Cheap when nothing changed: keyed on (next ident, live count)."""
        org = self.org
        sig = (org.next_ident, len(org.live_ckpts))
        if sig == self._state_sig:
            return
        self._state_sig = sig
        want: dict[int, StateAddress] = {}
        for ck in org.live_ckpts.values():
            if ck.conv >= 0 and all(p >= 0 for p in ck.members):
                want[self._home_id(ck.home_page)] = StateAddress(tuple(ck.members), ck.conv)
        table = self.state_table
        for block_id in [b for b in self._state if b not in want]:
            table.drop(block_id)
            del self._state[block_id]
        for block_id, addr in want.items():
            if self._state.get(block_id) != addr:
                table.set(block_id, addr)
                self._state[block_id] = addr

    # == faults ===================================================================================
    def _stale_checkpoint(self, rid: str, hit: LookupResult) -> None:
        """Fault: at its depth's position the adopter's Mamba table gets another checkpoint:
        the first discoverable one at a shallower boundary of its chain, else any other live
        complete checkpoint (its state is read before this step's forward writes anything)."""
        org = self.org
        _, rec_chain = org.hash_chains(rid)
        gr = org.recurrent_grid
        assert hit.checkpoint is not None
        right = hit.checkpoint.members[0]
        chosen = None
        for b in range(hit.j - gr, 0, -gr):
            ck = org.rec_index.get(rec_chain[b // gr - 1])
            if ck is not None and ck.conv >= 0 and all(p >= 0 for p in ck.members):
                chosen = ck
                break
        if chosen is None:
            chosen = next((ck for ck in org.live_ckpts.values()
                           if ck.home_page != right and ck.conv >= 0
                           and all(p >= 0 for p in ck.members)), None)
        if chosen is not None:
            self._override.setdefault(rid, {})[hit.j // self._grid - 1] = \
                self._home_id(chosen.home_page)
            self.fault_count += 1

    def _install_skip_invalidate(self) -> None:
        """Fault: reclaiming a cached unit frees it without detaching or invalidating the
        entries stored on it (they stay discoverable on reused storage)."""
        org = self.org
        manager = self

        def _reclaim(pool: Any, page: int, cause: Any, requester: str) -> None:
            if org.owner[pool.name][page] is not None:
                manager.fault_count += 1
            pool.reclaim(page)
            org.owner[pool.name][page] = None

        org._reclaim = _reclaim  # type: ignore[method-assign]

    # == accounting and the rest of vLLM's manager API =============================================
    @property
    def usage(self) -> float:
        pools = self.org.pools()
        total = sum(p.total for p in pools)
        return sum(p.total - p.num_free for p in pools) / total if total else 0.0

    def make_prefix_cache_stats(self) -> Any:
        if not self.log_stats:
            return None
        stats = self.prefix_cache_stats
        self.prefix_cache_stats = self._stats_cls()
        return stats

    def record_prefix_cache_stats(self, request: Any, num_hits: int) -> None:
        if not self.log_stats or not self.prefix_cache_lookup_enabled(request):
            return
        assert self.prefix_cache_stats is not None
        self.prefix_cache_stats.record(num_tokens=request.num_tokens, num_hits=num_hits,
                                       preempted=request.num_preemptions > 0)

    def estimate_cached_tokens(self, request: Any) -> int:
        return self._adopted.get(request.request_id, 0)

    def get_blocks(self, request_id: str) -> Any:
        if request_id not in self.org.requests:
            return self.empty_kv_cache_blocks
        attn, mamba = self._full_tables(request_id)
        return self._kv_blocks(attn, mamba)

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        return self.get_blocks(request_id).get_block_ids()

    def get_block_ids_for_computed_tokens(self, request_id: str,
                                          num_computed_tokens: int) -> tuple[list[int], ...]:
        return self.get_block_ids(request_id)

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        return [0] * self.num_kv_cache_groups

    def take_events(self) -> list[Any]:
        return []

    def take_new_block_ids(self) -> list[int]:
        ids, self._new_attn_ids = self._new_attn_ids, []
        return ids

    def record_blocks_for_zeroing(self, request_id: str, start_token: int) -> None:
        return None

    def take_kv_cache_block_copies(self) -> tuple[list[Any], list[Any]]:
        return [], []

    def take_boundary_state_offloads(self) -> dict[str, list[tuple[int, int, int]]]:
        return {}

    def finalize_partial_tail_offloads(self, request: Any) -> list[tuple[int, int, int]]:
        return []

    def truncate_computed_blocks(self, blocks: Any, num_computed_tokens: int) -> Any:
        raise HybridMemError("organization mode does not support KV connectors")

    def create_kv_cache_blocks(self, blocks: tuple[list[Any], ...]) -> Any:
        from vllm.v1.core.kv_cache_manager import KVCacheBlocks

        return KVCacheBlocks(blocks) if any(blocks) else self.empty_kv_cache_blocks

    def new_step_starts(self) -> None:
        self.state_table.exports.clear()  # exports name one step's chunks
