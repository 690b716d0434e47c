"""The organization that joins the memory core's parts (§3.1, App. B.2, D.2-D.3): the request
lifecycle an engine drives, the joint-reuse lookup and the paper's admission rule.

Lifetime of one storage unit::

    take ----> in use ----(last reference dropped)----> cached ----(reclaim)----> free
      ^          |  ^                                     |                        |
      |          |  +---------(adopted: incref)-----------+                        |
      |          +--(last reference, nothing discoverable)------------------------>+
      +-----------------------------------------------------------------------------+

Blocks (:mod:`~hybridmem.memory.blocks`), checkpoints (:mod:`~hybridmem.memory.checkpoints`),
reclaim (:mod:`~hybridmem.memory.reclaim`), demand / pins / retention
(:mod:`~hybridmem.memory.policy`) and the integrity checks (:mod:`~hybridmem.memory.integrity`)
are the parts; a layout (:mod:`~hybridmem.memory.layouts`) gives the pools and the conv
placement. Every operation has one implementation: the state machines, the mutant runner and
``--check-invariants`` (which record events and watch the pools) run the code that serving and
simulation run; a pool watcher or an observer only adds calls to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import takewhile

from hybridmem.events import Cause, EventKind, Outcome, StateKind
from hybridmem.geometry import ceil_div
from hybridmem.memory.blocks import Blocks
from hybridmem.memory.checkpoints import Checkpoints
from hybridmem.memory.integrity import Integrity
from hybridmem.memory.interface import (
    AllocationResult,
    CheckpointHit,
    Held,
    LookupResult,
    Need,
    Organization,
    PinDecision,
)
from hybridmem.memory.keys import extra_keys, hash_chain, hash_chain_pair, token_array
from hybridmem.memory.policy import Policy
from hybridmem.memory.pool import PagePool
from hybridmem.memory.reclaim import Reclaim
from hybridmem.memory.tables import RequestState, Tables


class MemoryOrganization(Reclaim, Policy, Integrity, Blocks, Checkpoints, Tables, Organization):
    """One memory organization; :mod:`~hybridmem.memory.layouts` builds S0, S1, S2 and D0."""

    # == requests ==============================================================================
    def add_request(self, request_id: str, token_ids: Sequence[int],
                    cache_salt: str | None = None) -> None:
        if request_id in self.requests:
            raise ValueError(f"request {request_id!r} is already registered")
        tokens = token_array(token_ids)
        extra = extra_keys(cache_salt)
        attn_chain, rec_chain = hash_chain_pair(tokens, self.attention_grid,
                                                self.recurrent_grid, extra)
        self.requests[request_id] = RequestState(request_id, tokens, cache_salt, attn_chain,
                                                 rec_chain)

    def append_tokens(self, request_id: str, token_ids: Sequence[int]) -> None:
        req = self._req(request_id)
        tokens = req.tokens
        tokens.extend(token_array(token_ids))  # converted first: a bad token appends nothing
        n = len(tokens)
        if n < (len(req.attn_chain) + 1) * self.attention_grid \
                and n < (len(req.rec_chain) + 1) * self.recurrent_grid:
            return  # no chunk completed (a decode step, nearly always): both chains unchanged
        extra = extra_keys(req.salt)
        for chain, kind, grid in ((req.attn_chain, StateKind.ATTENTION, self.attention_grid),
                                  (req.rec_chain, StateKind.RECURRENT, self.recurrent_grid)):
            start = len(chain) * grid
            chain.extend(hash_chain(kind, req.tokens, grid, extra,
                                    parent=chain[-1] if chain else 0, start=start))

    def hash_chains(self, request_id: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
        req = self._req(request_id)
        return tuple(req.attn_chain), tuple(req.rec_chain)

    # == joint reuse ===========================================================================
    def lookup(self, request_id: str) -> LookupResult:
        """Joint reuse over boundaries ``b <= len(tokens) - 1`` (one token is always computed)::

            attention  [blk0][blk1][blk2][ -- ]          contiguous valid prefix: 3 blocks
            recurrent        ^512  x1024 ^1536           complete checkpoints at 512 and 1536
            a_max = 1536, r_max = 1536, j = 1536         (on a 512 grid)
        """
        req = self._req(request_id)
        ga, gr = self.attention_grid, self.recurrent_grid
        limit = len(req.tokens) - 1
        # the contiguous discoverable prefix among the blocks that end at or before ``limit``
        # (block i ends at (i + 1) g_a); an empty request has an empty chain
        n_attn = len(list(takewhile(self.attn_index.__contains__,
                                    req.attn_chain[:max(limit, 0) // ga])))
        a_max = (n_attn * ga) // gr * gr
        r_max = j = 0
        j_ckpt = None
        for i, key in enumerate(req.rec_chain):
            b = (i + 1) * gr
            if b > limit:
                break
            ck = self.rec_index.get(key)
            if ck is None or not self._complete(ck):
                continue
            self.demand.setdefault(key, set()).add(request_id)  # resident hit evidence
            r_max = b
            if b <= a_max:
                j, j_ckpt = b, ck
        n_blocks = j // ga
        keys = tuple(req.attn_chain[:n_blocks])
        hit = None
        if j_ckpt is not None:
            hit = CheckpointHit(j_ckpt.key, j, tuple(j_ckpt.members), j_ckpt.conv)
        return LookupResult(request_id, a_max, r_max, j,
                            tuple([self.attn_index[k].page for k in keys]), keys, hit)

    def adopt(self, request_id: str, hit: LookupResult) -> None:
        req = self._req(request_id)
        if hit.request_id != request_id:
            raise ValueError(f"hit of {hit.request_id!r} adopted by {request_id!r}")
        if req.holds_storage:
            raise ValueError(f"request {request_id!r} already holds storage; adopt only when "
                             "waiting")
        blocks = []
        for key, page in zip(hit.block_keys, hit.blocks, strict=True):
            blk = self.attn_index.get(key)
            if blk is None or blk.page != page:
                raise ValueError(f"stale hit: attention key {key:#x} no longer on page {page}")
            blocks.append(blk)
        ck = None
        if hit.checkpoint is not None:
            ck = self.rec_index.get(hit.checkpoint.key)
            if ck is None or tuple(ck.members) != hit.checkpoint.members \
                    or ck.conv != hit.checkpoint.conv:
                raise ValueError(f"stale hit: checkpoint {hit.checkpoint.key:#x} at "
                                 f"{hit.checkpoint.boundary} changed since lookup")
        # 1. execution references on everything the request will read ...
        if blocks:
            self._blocks_ref(blocks, request_id)
            req.blocks.extend(blocks)
        if ck is not None:
            self._ckpt_ref(ck, request_id)
            req.ckpts[hit.j] = ck
        req.ckpt_top = req.computed = hit.j
        req.keyed = len(req.blocks)  # every adopted block carries its key: settled
        # 2. ... and only then the pins that protected it across preemption are released.
        self._unpin_owned(request_id)
        self._emit(EventKind.ADOPTION, request_id=request_id, preemption_count=req.preemptions,
                   hash=ck.key if ck is not None else 0, depth=hit.j,
                   state_kind=StateKind.RECURRENT if ck is not None else StateKind.NONE,
                   page=ck.home_page if ck is not None else -1,
                   line=ck.home_line if ck is not None else -1)

    # == admission and allocation ==============================================================
    def _check_growth(self, req: RequestState, num_tokens: int) -> None:
        """The ValueError of a ``num_tokens`` the request cannot grow to."""
        if num_tokens > len(req.tokens):
            raise ValueError(f"request {req.request_id!r}: cannot allocate {num_tokens} tokens, "
                             f"only {len(req.tokens)} are known")
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")

    def ckpts_after(self, depth: int, total: int) -> int:
        """Checkpoints a request at ``depth`` writes up to ``total`` tokens: one per recurrent
        boundary in ``(depth, ceil(total / g_r) g_r]``."""
        gr = self.recurrent_grid
        return len(range(depth + gr, -(-total // gr) * gr + 1, gr))  # ceil(total / gr) gr

    def pages_needed(self, request_id: str, num_tokens: int) -> Need:
        req = self._req(request_id)
        if not 0 <= num_tokens <= len(req.tokens):
            self._check_growth(req, num_tokens)
        # (asked on every decode step: mostly no new block and no new boundary)
        blocks = -(-num_tokens // self.attention_grid) - len(req.blocks)
        ckpts = self.ckpts_after(req.ckpt_top, num_tokens) if num_tokens > req.ckpt_top else 0
        return Need(max(blocks, 0), self.ckpt_units(ckpts) if ckpts else 0)

    def available(self) -> Need:
        return Need(self.pool_for(StateKind.ATTENTION).num_available,
                    self.pool_for(StateKind.RECURRENT).num_available)

    def shares_one_pool(self) -> bool:
        """One pool serves both state kinds (S0-S2), not one pool each (D0)."""
        return self.pool_for(StateKind.ATTENTION) is self.pool_for(StateKind.RECURRENT)

    def _fits_in(self, need: Need, apool: PagePool, rpool: PagePool) -> bool:
        if apool is rpool:
            return need.total <= apool.num_available
        return need.attention <= apool.num_available \
            and need.recurrent <= rpool.num_available

    def can_allocate(self, request_id: str, num_tokens: int) -> bool:
        need = self.pages_needed(request_id, num_tokens)
        return self._fits_in(need, self.pool_for(StateKind.ATTENTION, need.attention),
                             self.pool_for(StateKind.RECURRENT, need.recurrent))

    def fits(self, blocks: int, units: int, avail_a: int, avail_r: int,
             headroom: tuple[int, int] = (0, 0)) -> bool:
        """The admission rule ``need + H <= available``: per pool (D0), or on the sum with the
        attention headroom (one shared pool: ``avail_a`` is that pool, ``avail_r`` unused)."""
        ha, hr = headroom
        if self.shares_one_pool():
            return blocks + units + ha <= avail_a
        return blocks + ha <= avail_a and units + hr <= avail_r

    def admission(self, hit: LookupResult, total: int,
                  headroom: tuple[int, int] = (0, 0)) -> tuple[bool, int, int]:
        """Pure: ``(admit?, need, available)`` for admitting ``hit``'s request to hold ``total``
        tokens (the whole sequence where the engine reserves it): ``need + H <= available`` per
        pool, where the units the hit would take out of the reclaimable set (cached pages it
        adopts) are no longer available. ``need`` counts every checkpoint boundary up to
        ``total``, although a request holds at most two at once without retention."""
        n_blocks = max(0, ceil_div(total, self.attention_grid) - len(hit.blocks))
        rec_units = self.ckpt_units(self.ckpts_after(hit.j, total))
        apool = self.pool_for(StateKind.ATTENTION)
        rpool = self.pool_for(StateKind.RECURRENT)
        taken_a = sum(1 for p in set(hit.blocks) if apool.refs(p) == 0)
        taken_r = 0
        if hit.checkpoint is not None:
            ck = self.rec_index.get(hit.checkpoint.key)
            if ck is not None:
                taken_r = sum(1 for p in set(self.ckpt_pages(ck)) if rpool.refs(p) == 0)
        need = n_blocks + rec_units
        if self.shares_one_pool():  # one pool: both takings come out of it
            avail = apool.num_available - taken_a - taken_r
            return self.fits(n_blocks, rec_units, avail, 0, headroom), need, avail
        avail_a = apool.num_available - taken_a
        avail_r = rpool.num_available - taken_r
        return self.fits(n_blocks, rec_units, avail_a, avail_r, headroom), need, \
            avail_a + avail_r

    def allocate(self, request_id: str, num_tokens: int) -> AllocationResult:
        """Grow ``request_id`` to ``num_tokens`` tokens: new blocks and new checkpoint
        boundaries, all or nothing::

            num_tokens = 1300, grid 512:  blocks [0,512) [512,1024) [1024,1536)
                                          checkpoints 512, 1024, 1536 (the last is the
                                          destination the running state is computed into)
        """
        req = self._req(request_id)
        if not 0 <= num_tokens <= len(req.tokens):
            self._check_growth(req, num_tokens)
        n_blocks = max(0, ceil_div(num_tokens, self.attention_grid) - len(req.blocks))
        gr = self.recurrent_grid
        bounds = list(range(req.ckpt_top + gr, ceil_div(num_tokens, gr) * gr + 1, gr))
        n_rec = self.ckpt_units(len(bounds)) if bounds else 0
        need = Need(n_blocks, n_rec)
        avail = self.available()
        apool = self.pool_for(StateKind.ATTENTION, n_blocks)
        rpool = self.pool_for(StateKind.RECURRENT, n_rec)
        ok = self._fits_in(need, apool, rpool)
        if self._emitting:
            self._emit_allocation(req, need, avail, ok)
        if not ok:
            return AllocationResult(False, need, avail)
        if apool is rpool:
            self._make_free(apool, n_blocks + n_rec, request_id)
        else:
            self._make_free(apool, n_blocks, request_id)
            self._make_free(rpool, n_rec, request_id)
        if n_blocks:
            self._new_blocks(req, apool, n_blocks)
        for b in bounds:
            req.ckpts[b] = self._new_checkpoint(rpool, b, request_id)
        if bounds:
            req.ckpt_top = bounds[-1]
        return AllocationResult(True, need, avail)

    def _emit_allocation(self, req: RequestState, need: Need, avail: Need, ok: bool) -> None:
        outcome = Outcome.OK if ok else Outcome.REJECTED
        common = {"request_id": req.request_id, "preemption_count": req.preemptions,
                  "requester": req.request_id, "outcome": outcome}
        if self.shares_one_pool():
            self._emit(EventKind.ALLOCATION, need=need.total, free=avail.attention, **common)
        else:  # D0: one event per pool; both carry the overall outcome
            self._emit(EventKind.ALLOCATION, need=need.attention, free=avail.attention,
                       state_kind=StateKind.ATTENTION, **common)
            self._emit(EventKind.ALLOCATION, need=need.recurrent, free=avail.recurrent,
                       state_kind=StateKind.RECURRENT, **common)

    # == publication and release ===============================================================
    def publish(self, request_id: str, num_computed: int) -> list[int]:
        req = self._req(request_id)
        if num_computed > len(req.tokens):
            raise ValueError(f"request {request_id!r}: {num_computed} computed tokens but only "
                             f"{len(req.tokens)} known")
        req.computed = max(req.computed, num_computed)
        published: list[int] = []
        self._publish_blocks(req, published)
        self._publish_ckpts(req, published)
        return published

    def _release_all(self, req: RequestState, cause: Cause) -> None:
        """Drop every execution reference, deepest first (so deeper entries are older in LRU)."""
        ckpts = req.ckpts
        if ckpts:
            self._ckpt_unref(list(map(ckpts.pop, sorted(ckpts, reverse=True))),
                             req.request_id, req, cause)
        blocks, rid = req.blocks, req.request_id
        gone = blocks[::-1]  # deepest first
        blocks.clear()
        for blk in gone:
            self._emit(EventKind.RELEASE, request_id=rid, preemption_count=req.preemptions,
                       hash=blk.key, depth=blk.depth, state_kind=StateKind.ATTENTION,
                       page=blk.page, cause=cause)
        if gone:
            self._blocks_unref(gone, rid)
        req.ckpt_top = req.computed = req.keyed = 0
        req.retained.clear()
        for key in req.waits:  # no block left to wait for another copy
            waiting = self.key_waiters.get(key)
            if waiting is not None:
                waiting.discard(rid)
                if not waiting:
                    del self.key_waiters[key]
        req.waits.clear()

    def preempt(self, request_id: str) -> PinDecision | None:
        req = self._req(request_id)
        decision = self._pin_on_preemption(req)
        self._release_all(req, Cause.PREEMPTION)
        req.preemptions += 1
        return decision

    def release(self, request_id: str) -> None:
        self._release_all(self._req(request_id), Cause.NONE)

    def finish(self, request_id: str) -> None:
        req = self._req(request_id)
        self._release_all(req, Cause.FINISH)
        self._unpin_owned(request_id)
        del self.requests[request_id]

    # == accounting ============================================================================
    def held(self) -> Held:
        return Held(self.num_blocks, len(self.live_ckpts),
                    self.slabs.num_slabs if self.slabs is not None else 0)

    def allocated_bytes(self) -> int:
        return sum((p.total - p.num_free) * self._unit_bytes(p) for p in self.pools())
