"""The lifetime rules all four organizations share (§3.1, App. B.2, D.2-D.3).

:class:`CachedOrganization` owns the request tables, the two discoverable indexes (attention key
-> block, recurrent key -> checkpoint), execution references, pins, retention and LRU reclaim.
Subclasses (:mod:`hybridmem.orgs`) only say how a block and a checkpoint map onto storage:
members per checkpoint, where the conv state lives, and which pool serves which kind.

Lifetime of one storage unit::

    take ----> in use ----(last reference dropped)----> cached ----(reclaim)----> free
      ^          |  ^                                     |                        |
      |          |  +---------(adopted: incref)-----------+                        |
      |          +--(last reference, nothing discoverable)------------------------>+
      +-----------------------------------------------------------------------------+

Reclaiming a cached unit first detaches it from every entry that depends on it (a member page:
its checkpoint; a slab: every checkpoint with a slot in it), invalidates each entry that is no
longer complete (LOSS event, its other units released), and only then frees the unit for reuse.

Demand (for pinning K and retention K = 2) counts distinct requesters per recurrent key: the
producer at publication (owner registration), the preempted owner, and every request whose
lookup found the checkpoint resident (hit evidence). The same requester never counts twice.

Every operation has one implementation, in this module: the state machines, the mutant runner
and ``--check-invariants`` (which record events and watch the pools) run the same loops as
untraced serving and simulation; a pool watcher or an observer only adds calls to them.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import islice, takewhile

from hybridmem import checkpoint as ckpt_mod
from hybridmem import conv_slab
from hybridmem.checkpoint import MISSING_PAGE, Checkpoint, ConvPlacement
from hybridmem.conv_slab import NO_LINE, SlabTable
from hybridmem.events import Cause, Event, EventKind, NullObserver, Observer, Outcome, StateKind
from hybridmem.hashing import extra_keys, hash_chain, hash_chain_pair, token_array
from hybridmem.org_interface import (
    AllocationResult,
    CheckpointHit,
    Held,
    LookupResult,
    Need,
    Organization,
    PinDecision,
)
from hybridmem.page_pool import PagePool

# ``_tuple_new(Need, (a, r))`` is ``Need(a, r)`` without the NamedTuple's Python ``__new__``
_tuple_new = tuple.__new__

# Enum members the per-operation paths compare with, as module globals (the same objects): on
# Python 3.11 ``EnumType`` defines ``__getattr__``, so every ``ConvPlacement.INSIDE`` read in a
# function goes through the type's slow attribute hook (~100 ns, ~10x a global's read)
_INSIDE, _PAGE, _SLOT = ConvPlacement.INSIDE, ConvPlacement.PAGE, ConvPlacement.SLOT
_RECURRENT = StateKind.RECURRENT
_ALLOCATION, _SLAB_RECLAIM, _FINISH = Cause.ALLOCATION, Cause.SLAB_RECLAIM, Cause.FINISH
_NO_CAUSE = Cause.NONE

RETENTION_K = 2  # producer-side retention demand threshold (Q8/Q9)
PIN_THRESHOLDS = {"Roff": None, "R0": 3, "R1": 2, "R2": 1}  # App. B.2 distinct-requester K


@dataclass(eq=False, slots=True)
class Block:
    """One attention unit (512 tokens shared, 16 tokens D0) on one page of ``pool``."""

    pool: PagePool
    page: int
    depth: int  # tokens: end boundary of the block
    key: int = 0  # cache key while discoverable, else 0
    holders: set[str] = field(default_factory=set)  # request ids with an execution reference


@dataclass(eq=False)
class RequestState:
    """Per-request tables. Only the organization mutates them."""

    request_id: str
    tokens: array[int]  # int64 token ids (hashing.token_array)
    salt: str | None
    attn_chain: list[int]
    rec_chain: list[int]
    blocks: list[Block] = field(default_factory=list)  # block i covers [i g_a, (i + 1) g_a)
    ckpts: dict[int, Checkpoint] = field(default_factory=dict)  # boundary -> held checkpoint
    ckpt_top: int = 0  # highest checkpoint boundary held or adopted
    computed: int = 0  # tokens whose state is written
    preemptions: int = 0
    retained: set[int] = field(default_factory=set)  # checkpoint idents exempt from release
    keyed: int = 0  # leading blocks settled for publish (publish starts after them)
    waits: list[int] = field(default_factory=list)  # keys of blocks waiting on another copy

    @property
    def holds_storage(self) -> bool:
        return bool(self.blocks or self.ckpts)


class CachedOrganization(Organization):
    name = "?"
    members = 1  # SSM member units per checkpoint
    placement = ConvPlacement.INSIDE

    def __init__(self, attention_grid: int, recurrent_grid: int, observer: Observer | None = None,
                 pin_k: int | None = None, pin_budget: int | None = None,
                 retention: bool = False) -> None:
        if recurrent_grid % attention_grid:
            raise ValueError(f"recurrent grid {recurrent_grid} is not a multiple of the "
                             f"attention grid {attention_grid}")
        if pin_k is not None and pin_k < 1:
            raise ValueError(f"pin threshold K must be >= 1 or None (off), got {pin_k}")
        self.attention_grid = attention_grid
        self.recurrent_grid = recurrent_grid
        self.observer: Observer = observer if observer is not None else NullObserver()
        self._emitting = not isinstance(self.observer, NullObserver)
        self.pin_k = pin_k
        self.pin_budget = pin_budget
        self.retention = retention
        self.step = -1  # scheduler step stamped on events; the engine sets it
        self.requests: dict[str, RequestState] = {}
        self.attn_index: dict[int, Block] = {}  # discoverable attention keys
        self.rec_index: dict[int, Checkpoint] = {}  # discoverable recurrent keys
        self.pins: dict[int, tuple[Checkpoint, str]] = {}  # ident -> (checkpoint, owner)
        self.demand: dict[int, set[str]] = {}  # recurrent key -> distinct requesters
        self.num_blocks = 0  # blocks with storage (each owns its page: see live_blocks)
        self.live_ckpts: dict[int, Checkpoint] = {}  # ident -> checkpoint with storage
        # attention key -> requests holding an unpublished block with that key, skipped by
        # publish because another copy is discoverable (they rescan when that copy is lost)
        self.key_waiters: dict[int, set[str]] = {}
        self.slabs: SlabTable | None = None
        self.owner: dict[str, list[object | None]] = {}  # pool name -> page -> entry / "slab"
        self._next_ident = 0
        # pool name -> page -> the block last forgotten on that page, None once reused: the
        # next block allocated on the page reuses the object (a forgotten block has key 0 and
        # no holder, and nothing refers to it) instead of building one, as vLLM's BlockPool
        # keeps one block object per block id. Set where a block is forgotten, read and
        # cleared by allocate.
        self.spare_blocks: dict[str, list[Block | None]] = {}
        # allocate's admission without the frames of ``available``, ``_pools_for``,
        # ``_fits_in`` (``_admission_inline``) and ``_ckpt_units``: set at construction where
        # the inline steps are those methods' own (a subclass or a patch that redefines one
        # gets the calls). ``_fixed_pools``: (attention pool, recurrent pool), the same
        # whatever the need (subclasses set it); ``_units_each``: recurrent units per new
        # checkpoint, 0 where ``_ckpt_units`` decides
        self._fixed_pools: tuple[PagePool, PagePool] | None = None
        # ``_ckpt_pool()``'s answer where it never changes (subclasses set it where their own
        # ``_ckpt_pool`` answers a pool fixed at construction), else None: asked per call
        self._fixed_ckpt_pool: PagePool | None = None
        self._units_each = (self.members + (self.placement == _PAGE)
                            if type(self)._ckpt_units is _OWN["_ckpt_units"] else 0)

    # == storage layout (subclasses) ===========================================================
    def pool_for(self, kind: StateKind, need: int = 0) -> PagePool:
        raise NotImplementedError

    def pools(self) -> list[PagePool]:
        raise NotImplementedError

    def _unit_bytes(self, pool: PagePool) -> int:
        raise NotImplementedError

    def _ckpt_units(self, count: int) -> int:
        """Pure: recurrent units ``count`` new checkpoints need (S2 adds new slabs); allocate
        reads ``count * _units_each`` instead where this definition is the organization's."""
        return count * (self.members + (self.placement == _PAGE))

    def _admission_inline(self, pools: tuple[PagePool, PagePool],
                          own: dict[str, object]) -> tuple[PagePool, PagePool] | None:
        """``pools`` when each method named in ``own`` is, on this organization's class, the
        function given there (allocate's inline admission stands for them), else None."""
        cls = type(self)
        return pools if all(getattr(cls, name) is fn for name, fn in own.items()) else None

    # == events ================================================================================
    def _emit(self, kind: EventKind, **fields: object) -> None:
        if self._emitting:
            self.observer.on_event(Event(kind, step=self.step, **fields))  # type: ignore[arg-type]

    def _ckpt_fields(self, ck: Checkpoint) -> dict[str, object]:
        return {"state_kind": StateKind.RECURRENT, "depth": ck.boundary, "page": ck.home_page,
                "line": ck.home_line}

    # == requests ==============================================================================
    def _req(self, request_id: str) -> RequestState:
        try:
            return self.requests[request_id]
        except KeyError:
            raise ValueError(f"unknown request {request_id!r}") from None

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

    # == lookup and adoption ===================================================================
    def _complete(self, ck: Checkpoint) -> bool:
        return ckpt_mod.is_complete(ck, self.members)

    def lookup(self, request_id: str) -> LookupResult:
        """Joint reuse over boundaries ``b <= len(tokens) - 1`` (one token is always computed)::

            attention  [blk0][blk1][blk2][ -- ]          contiguous valid prefix: 3 blocks
            recurrent        ^512  x1024 ^1536           complete checkpoints at 512 and 1536
            a_max = 1536, r_max = 1536, j = 1536         (on a 512 grid)
        """
        req = self.requests.get(request_id)  # self._req(request_id), its frame on error only
        if req is None:
            req = self._req(request_id)
        ga, gr = self.attention_grid, self.recurrent_grid
        limit = len(req.tokens) - 1
        attn_index = self.attn_index
        # the contiguous discoverable prefix among the blocks that end at or before ``limit``
        # (block i ends at (i + 1) g_a); an empty request has an empty chain
        n_attn = len(list(takewhile(attn_index.__contains__,
                                    req.attn_chain[:max(limit, 0) // ga])))
        a_max = (n_attn * ga) // gr * gr
        r_max = j = 0
        j_ckpt: Checkpoint | None = None
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
            hit = _tuple_new(CheckpointHit, (j_ckpt.key, j, tuple(j_ckpt.members),
                                             j_ckpt.conv))  # CheckpointHit(...)
        return LookupResult(request_id, a_max, r_max, j,
                            tuple([attn_index[k].page for k in keys]), keys, hit)

    def adopt(self, request_id: str, hit: LookupResult) -> None:
        req = self.requests.get(request_id)  # self._req(request_id), its frame on error only
        if req is None:
            req = self._req(request_id)
        if hit.request_id != request_id:
            raise ValueError(f"hit of {hit.request_id!r} adopted by {request_id!r}")
        if req.blocks or req.ckpts:  # req.holds_storage
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
        if self.pins:  # (none: _unpin_owned finds nothing to unpin)
            self._unpin_owned(request_id)
        if self._emitting:  # (the test _emit makes, before its fields are built)
            self._emit(EventKind.ADOPTION, request_id=request_id,
                       preemption_count=req.preemptions,
                       hash=ck.key if ck is not None else 0, depth=hit.j,
                       state_kind=StateKind.RECURRENT if ck is not None else StateKind.NONE,
                       page=ck.home_page if ck is not None else -1,
                       line=ck.home_line if ck is not None else -1)

    # == references ============================================================================
    def _blocks_ref(self, blks: list[Block], holder: str) -> None:
        """An execution reference of ``holder`` on each block (one pool)."""
        pages = []
        for blk in blks:
            assert holder not in blk.holders, f"{holder} already references block {blk.page}"
            blk.holders.add(holder)
            pages.append(blk.page)
        blks[0].pool.incref_many(pages)

    def _blocks_unref(self, blks: list[Block], holder: str) -> None:
        """Drop ``holder``'s reference of each block (one pool), in order (the LRU order of the
        pages that become cached); a block with no holder and no key is forgotten.

        The pages' references are dropped in the same loop, as ``PagePool.decref_many`` of the
        blocks' pages would drop them (the pool's own lists, in the same order; its in-use
        count settled after the loop and its watcher called inside it, as there).
        """
        pool = blks[0].pool
        refs, holds, cached, free = pool._refs, pool._holds, pool._cached, pool._free
        owners, spare = self.owner[pool.name], self.spare_blocks[pool.name]
        watcher, unused, forgotten = pool.watcher, 0, 0
        for blk in blks:
            holders = blk.holders
            holders.remove(holder)
            page = blk.page
            assert refs[page] > 0, f"pool {pool.name}: decref of page {page} with no " \
                "reference; this indicates a double release"
            left = refs[page] = refs[page] - 1
            if left == 0:  # (pool.decref_many)
                unused += 1
                if holds[page]:
                    cached[page] = None  # most recently used end of the LRU
                else:
                    free.append(page)
                if watcher is not None:
                    watcher(pool.name, page, "ref0")
            if not holders and not blk.key:  # no holder and no key: forget it
                assert pool.is_free(page), f"block on page {page} forgotten while its " \
                    "page is not free; this indicates a reference or hold leak"
                owners[page] = None
                spare[page] = blk
                forgotten += 1
        pool.num_in_use -= unused
        self.num_blocks -= forgotten

    def _spare(self, pool: PagePool) -> list[Block | None]:
        """A new list of ``pool``'s spare blocks (see :attr:`spare_blocks`)."""
        spare: list[Block | None] = [None] * pool.total
        self.spare_blocks[pool.name] = spare
        return spare

    def _conv_pages(self, ck: Checkpoint) -> list[int]:
        """The page carrying ``ck``'s conv state when it is not inside member 0."""
        placement = self.placement
        if placement is _SLOT:  # the line's page, decoded at placement
            return [ck.conv_page] if ck.conv >= 0 else []
        if placement is _PAGE and ck.conv >= 0:
            return [ck.conv]
        return []

    def _ckpt_pages(self, ck: Checkpoint) -> list[int]:
        """Every pool page that carries references of ``ck``."""
        members = ck.members
        if min(members, default=0) >= 0:  # every member present (always, while referenced)
            return members + self._conv_pages(ck)
        return [p for p in members if p >= 0] + self._conv_pages(ck)

    def _ckpt_pool(self) -> PagePool:
        return self.pool_for(_RECURRENT)

    def _ckpt_ref(self, ck: Checkpoint, holder: str) -> None:
        assert holder not in ck.holders, f"{holder} already references checkpoint {ck.ident}"
        assert self._complete(ck), f"reference to incomplete checkpoint {ck.ident}"
        if self.placement is _INSIDE:  # _ckpt_pages(ck): its present members
            m = ck.members
            pages = m if min(m, default=0) >= 0 else [p for p in m if p >= 0]
        else:
            pages = self._ckpt_pages(ck)
        pool = self._fixed_ckpt_pool  # self._ckpt_pool(), its frame where it decides
        if pool is None:
            pool = self._ckpt_pool()
        pool.incref_many(pages)  # (pool.incref of each page, in order)
        ck.holders.add(holder)

    def _ckpt_unref(self, cks: list[Checkpoint], holder: str | None,
                    req: RequestState | None = None, cause: Cause = Cause.NONE) -> None:
        """Drop one execution reference of each checkpoint in ``cks`` (``holder`` None: its pin;
        ``req`` given: the request ``holder`` releases them, with its RELEASE events of
        ``cause`` first and the checkpoints no longer retained).

        Release order, for the LRU of cached pages::

            S2   every slab of the batch, then every member    (a slab ages with the checkpoints
                                                              released with it, so reclaiming
                                                              it takes them all)
            S1   every member, then every conv page            (a member page is reclaimed
                                                              before its dedicated conv page)

        A checkpoint left with no holder, no pin and no key is forgotten (after the pages'
        references are dropped): no longer live, its pages' owner records cleared.
        """
        if req is not None:  # a request releases them
            if self._emitting:
                for ck in cks:
                    self._emit(EventKind.RELEASE, request_id=req.request_id,
                               preemption_count=req.preemptions, hash=ck.key, cause=cause,
                               **self._ckpt_fields(ck))
            retained = req.retained
            if retained:
                for ck in cks:
                    retained.discard(ck.ident)
        pool = self._fixed_ckpt_pool  # self._ckpt_pool(), its frame where it decides
        if pool is None:
            pool = self._ckpt_pool()
        placement = self.placement
        inside = placement is _INSIDE  # no conv page: _conv_pages is [] for each
        dead = []
        conv: list[int] = []
        members: list[int] = []
        conv_pages = self._conv_pages
        for ck in cks:
            if holder is None:
                del self.pins[ck.ident]
            else:
                ck.holders.remove(holder)
            if not ck.holders and ck.ident not in self.pins and not ck.key:
                dead.append(ck)
            if not inside:
                conv += conv_pages(ck)
            m = ck.members
            members += m if min(m, default=0) >= 0 else [p for p in m if p >= 0]
        if dead and placement is _SLOT:
            for ck in dead:
                self._clear_slot(ck)  # before the slab page can become free
        pool.decref_many(members if inside else (conv + members if self.placement
                                                 == _SLOT else members + conv))
        if dead:  # forget them
            live, owners = self.live_ckpts, self.owner[pool.name]
            conv_page = placement is _PAGE
            for ck in dead:
                del live[ck.ident]
                for p in ck.members:
                    if p >= 0:
                        owners[p] = None
                if conv_page and ck.conv >= 0:
                    owners[ck.conv] = None

    def _clear_slot(self, ck: Checkpoint) -> None:
        assert self.slabs is not None
        ref = self.slabs.clear(ck.conv)
        if ref is not None and self.slabs.used(ref.page) == 0:
            self.slabs.remove_slab(ref.page)
            self.owner[self._ckpt_pool().name][ref.page] = None

    # == allocation ============================================================================
    def _check_growth(self, req: RequestState, num_tokens: int) -> None:
        """The ValueError of a ``num_tokens`` :meth:`allocate` cannot grow ``req`` to (not
        ``0 <= num_tokens <= len(req.tokens)``); returns when there is none."""
        if num_tokens > len(req.tokens):
            raise ValueError(f"request {req.request_id!r}: cannot allocate {num_tokens} tokens, "
                             f"only {len(req.tokens)} are known")
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")

    def pages_needed(self, request_id: str, num_tokens: int) -> Need:
        """``Need`` of :meth:`allocate` (same checks, counts only; no new checkpoint boundary
        needs no recurrent unit, so ``_ckpt_units`` runs only for some)."""
        req = self._req(request_id)
        if not 0 <= num_tokens <= len(req.tokens):
            self._check_growth(req, num_tokens)  # raises the ValueError naming the value
        blocks = -(-num_tokens // self.attention_grid) - len(req.blocks)
        gr = self.recurrent_grid
        ckpts = len(range(req.ckpt_top + gr, -(-num_tokens // gr) * gr + 1, gr))
        return Need(blocks if blocks > 0 else 0,
                    self._ckpt_units(ckpts) if ckpts > 0 else 0)

    def can_allocate(self, request_id: str, num_tokens: int) -> bool:
        need = self.pages_needed(request_id, num_tokens)
        return self._fits(need)

    def _fits(self, need: Need) -> bool:
        apool, rpool = self._pools_for(need.attention, need.recurrent)
        return self._fits_in(need, apool, rpool)

    def _pools_for(self, attention: int, recurrent: int) -> tuple[PagePool, PagePool]:
        """``(pool_for(ATTENTION, attention), pool_for(RECURRENT, recurrent))`` in one call
        (subclasses answer it without the two)."""
        return (self.pool_for(StateKind.ATTENTION, attention),
                self.pool_for(StateKind.RECURRENT, recurrent))

    def _fits_in(self, need: Need, apool: PagePool, rpool: PagePool) -> bool:
        """:meth:`_fits` with the pools ``pool_for`` gave for ``need``."""
        # (len(pool._free) + len(pool._cached) is pool.num_available, without its frame)
        if apool is rpool:
            return need[0] + need[1] <= len(apool._free) + len(apool._cached)  # need.total
        return need.attention <= len(apool._free) + len(apool._cached) \
            and need.recurrent <= len(rpool._free) + len(rpool._cached)

    def available(self) -> Need:
        return Need(self.pool_for(StateKind.ATTENTION).num_available,
                    self.pool_for(StateKind.RECURRENT).num_available)

    def allocate(self, request_id: str, num_tokens: int) -> AllocationResult:
        """Grow ``request_id`` to ``num_tokens`` tokens: new blocks and new checkpoint
        boundaries, all or nothing::

            num_tokens = 1300, grid 512:  blocks [0,512) [512,1024) [1024,1536)
                                          checkpoints 512, 1024, 1536 (the last is the
                                          destination the running state is computed into)
        """
        req = self.requests.get(request_id)  # self._req(request_id), its frame on error only
        if req is None:
            req = self._req(request_id)
        if not 0 <= num_tokens <= len(req.tokens):
            self._check_growth(req, num_tokens)  # raises the ValueError naming the value
        n_blocks = max(0, -(-num_tokens // self.attention_grid) - len(req.blocks))  # ceil_div
        gr = self.recurrent_grid
        top = -(-num_tokens // gr) * gr  # ceil_div(num_tokens, gr) * gr
        bounds = list(range(req.ckpt_top + gr, top + 1, gr))
        if bounds:
            each = self._units_each  # (_ckpt_units(len(bounds)), its frame where it decides)
            n_rec = len(bounds) * each if each else self._ckpt_units(len(bounds))
        else:
            n_rec = 0
        need = _tuple_new(Need, (n_blocks, n_rec))  # Need(n_blocks, n_rec)
        pools = self._fixed_pools
        if pools is None:
            avail = self.available()
            apool, rpool = self._pools_for(n_blocks, n_rec)
            ok = self._fits_in(need, apool, rpool)
        else:  # available(), _pools_for and _fits_in of the fixed pools, in this frame
            apool, rpool = pools
            na = len(apool._free) + len(apool._cached)  # apool.num_available
            if apool is rpool:  # one pool serves both kinds: Need(n, n), need.total fits
                avail = _tuple_new(Need, (na, na))
                ok = n_blocks + n_rec <= na
            else:
                nr = len(rpool._free) + len(rpool._cached)
                avail = _tuple_new(Need, (na, nr))
                ok = n_blocks <= na and n_rec <= nr
        if self._emitting:
            self._emit_allocation(req, need, avail, ok)
        if not ok:
            return _tuple_new(AllocationResult, (False, need, avail))
        # _make_free returns at once when enough pages are free: that is asked here first
        # (read-only: the pool's own deque)
        if apool is rpool:
            if len(apool._free) < n_blocks + n_rec:
                self._make_free(apool, n_blocks + n_rec, request_id)
        else:
            if len(apool._free) < n_blocks:
                self._make_free(apool, n_blocks, request_id)
            if len(rpool._free) < n_rec:
                self._make_free(rpool, n_rec, request_id)
        if n_blocks:
            owners = self.owner[apool.name]
            spare = self.spare_blocks.get(apool.name) or self._spare(apool)
            blocks, ga = req.blocks, self.attention_grid
            depth = len(blocks) * ga
            free, refs = apool._free, apool._refs  # apool.take_many(n_blocks), in this loop:
            assert len(free) >= n_blocks, f"pool {apool.name}: take_many({n_blocks}) with " \
                f"{len(free)} free pages; this indicates a missing can_allocate/reclaim before " \
                "allocation"
            popleft, watcher = free.popleft, apool.watcher
            for _ in range(n_blocks):  # the next free pages in order, one reference each
                page = popleft()
                refs[page] = 1
                if watcher is not None:
                    watcher(apool.name, page, "take")
                depth += ga
                blk = spare[page]
                if blk is None:
                    blk = Block(apool, page, depth, 0, {request_id})
                else:  # the block last forgotten on this page: reused (as vLLM's pool does)
                    assert not blk.key and not blk.holders, f"spare block on page {page} " \
                        f"with key {blk.key:#x}, holders {blk.holders}; this indicates a " \
                        "block forgotten while discoverable or referenced"
                    spare[page] = None
                    blk.depth = depth
                    blk.holders.add(request_id)
                owners[page] = blk
                blocks.append(blk)
            apool.num_in_use += n_blocks
            self.num_blocks += n_blocks
        if bounds and self.placement is _INSIDE:
            # each boundary's checkpoint, in this loop (conv inside member 0: only the
            # members' pages are taken, as rpool.take_many(self.members) takes them, its
            # watcher told of each page once the checkpoint's pages are taken)
            members, n_ckpts = self.members, len(bounds)
            owners, free, refs = self.owner[rpool.name], rpool._free, rpool._refs
            assert len(free) >= members * n_ckpts, f"pool {rpool.name}: take_many({members}) " \
                f"with {len(free)} free pages; this indicates a missing can_allocate/reclaim " \
                "before allocation"
            live_ckpts, ckpts, popleft = self.live_ckpts, req.ckpts, free.popleft
            ident, watcher = self._next_ident, rpool.watcher
            for b in bounds:
                pages = [popleft()] if members == 1 else [popleft() for _ in range(members)]
                for p in pages:
                    refs[p] = 1
                if watcher is not None:
                    for p in pages:
                        watcher(rpool.name, p, "take")
                home = pages[0]
                ck = Checkpoint(ident, b, pages, home, 0, {request_id}, home)
                for p in pages:
                    owners[p] = ck
                live_ckpts[ident] = ck
                ckpts[b] = ck
                ident += 1
            self._next_ident = ident
            rpool.num_in_use += members * n_ckpts
            req.ckpt_top = bounds[-1]
        elif bounds:
            live_ckpts, ckpts, new_checkpoint = self.live_ckpts, req.ckpts, self._new_checkpoint
            for b in bounds:
                ck = new_checkpoint(rpool, b, request_id)
                live_ckpts[ck.ident] = ck
                ckpts[b] = ck
            req.ckpt_top = bounds[-1]
        return _tuple_new(AllocationResult, (True, need, avail))  # AllocationResult(True, ...)

    def _emit_allocation(self, req: RequestState, need: Need, avail: Need, ok: bool) -> None:
        if not self._emitting:
            return
        outcome = Outcome.OK if ok else Outcome.REJECTED
        common = {"request_id": req.request_id, "preemption_count": req.preemptions,
                  "requester": req.request_id, "outcome": outcome}
        if self.pool_for(StateKind.ATTENTION) is self.pool_for(StateKind.RECURRENT):
            self._emit(EventKind.ALLOCATION, need=need.total, free=avail.attention, **common)
        else:  # D0: one event per pool; both carry the overall outcome
            self._emit(EventKind.ALLOCATION, need=need.attention, free=avail.attention,
                       state_kind=StateKind.ATTENTION, **common)
            self._emit(EventKind.ALLOCATION, need=need.recurrent, free=avail.recurrent,
                       state_kind=StateKind.RECURRENT, **common)

    def _new_checkpoint(self, pool: PagePool, boundary: int, holder: str) -> Checkpoint:
        """A new checkpoint whose conv state has its own page (S1) or a slab slot (S2);
        allocate places a checkpoint whose conv state is inside member 0 itself."""
        owners = self.owner[pool.name]
        ident = self._next_ident
        self._next_ident = ident + 1
        ck = Checkpoint(ident, boundary, [], NO_LINE, 0, {holder})
        ck.members = pool.take_many(self.members)
        for page in ck.members:
            owners[page] = ck
        if self.placement is _PAGE:
            ck.conv = pool.take()
            owners[ck.conv] = ck
        else:
            slabs = self.slabs
            assert slabs is not None
            slab = slabs.slab_with_room()
            if slab is None:
                slab = pool.take()  # the new slab's first reference is this slot's
                owners[slab] = "slab"
                slabs.add_slab(slab)
            else:
                pool.incref(slab)
            ck.conv = ck.home_line = slabs.place(slab, ident)
            ref = conv_slab.decode_line(ck.conv, slabs.slots_per_slab)
            assert ref is not None, f"slab {slab} placed checkpoint {ident} at no line"
            ck.conv_page = ref.page
        ck.home_page = ck.members[0]
        return ck

    # == reclaim and invalidation ==============================================================
    def _make_free(self, pool: PagePool, need: int, requester: str) -> None:
        """Reclaim LRU heads of ``pool`` until ``need`` pages are free.

        A cached block's page (no holder, one hold: the block's key) takes the inline path,
        :meth:`_reclaim` -> :meth:`_lose_block` -> ``unhold`` -> ``reclaim`` in one frame with
        the same steps in the same order (index entry, waiters, LOSS event, hold, free deque,
        forget, watcher); any other page (a checkpoint's, a slab, or a block in a state only a
        bug reaches) goes through :meth:`_reclaim`. The inline path's locals are read when it
        first runs (a checkpoint pool's heads never take it).
        """
        if len(pool._free) >= need:
            return  # nothing to reclaim: the loop below would not run
        free, cached = pool._free, pool._cached  # the pool's own: changed as its methods would
        owners, holds, cause, lost = self.owner[pool.name], pool._holds, _ALLOCATION, 0
        spare: list[Block | None] | None = None  # (not read yet: the inline path's locals)
        while len(free) < need:
            head = next(iter(cached), None)  # pool.oldest_cached(): the LRU head
            if head is None:
                raise AssertionError(f"pool {pool.name}: {pool.num_free} free, need {need}, "
                                     "nothing cached; this indicates can_allocate and "
                                     "allocate disagree")
            blk = owners[head]
            if blk.__class__ is not Block or blk.holders or holds[head] != 1:
                self._reclaim(pool, head, cause, requester)
                continue
            if spare is None:  # the inline path's first run: its locals
                refs, attn_index, waiters = pool._refs, self.attn_index, self.key_waiters
                spare = self.spare_blocks.get(pool.name) or self._spare(pool)
                emitting, watcher = self._emitting, pool.watcher
            short = need - len(free)  # the heads, oldest first (one: the head just read)
            for page in list(islice(cached, short)) if short > 1 else (head,):
                blk = owners[page]  # the inline path removes only the page it reclaims
                if blk.__class__ is not Block or blk.holders or holds[page] != 1:
                    break  # the loop above takes it through _reclaim
                key = blk.key  # _lose_block
                del attn_index[key]
                blk.key = 0
                if key in waiters:  # their copies of this key may publish now
                    requests = self.requests
                    for waiter in waiters.pop(key):
                        held_by = requests.get(waiter)
                        if held_by is not None:
                            held_by.keyed = 0
                if emitting:
                    self._emit(EventKind.LOSS, hash=key, depth=blk.depth,
                               state_kind=StateKind.ATTENTION, page=page, cause=cause,
                               requester=requester)
                assert refs[page] == 0, f"pool {pool.name}: reclaim of cached page {page} " \
                    f"with {refs[page]} references; this indicates reclaiming protected storage"
                holds[page] = 0  # pool.unhold: its last hold, no reference: cached -> free
                del cached[page]
                free.append(page)
                lost += 1  # no holder: forget the block
                owners[page] = None
                spare[page] = blk
                if watcher is not None:  # pool.reclaim (nothing left to drop)
                    watcher(pool.name, page, "reclaim")
        self.num_blocks -= lost

    def _detach(self, pool: PagePool, page: int) -> list[Block | Checkpoint]:
        """Cut ``page`` out of every entry stored on it; return those entries.

        A member page becomes MISSING_PAGE in its checkpoint; a reclaimed slab sets the conv
        line of every checkpoint with a slot in it to NO_LINE.
        """
        entry = self.owner[pool.name][page]
        if entry == "slab":
            assert self.slabs is not None
            deps: list[Block | Checkpoint] = []
            for _line, ident in self.slabs.remove_slab(page):
                ck = self.live_ckpts[ident]
                ck.conv = NO_LINE
                deps.append(ck)
            return deps
        if isinstance(entry, Block):
            return [entry]
        assert isinstance(entry, Checkpoint), f"cached page {page} of pool {pool.name} has no " \
            "owner; this indicates a lost ownership record"
        entry.members = [MISSING_PAGE if p == page else p for p in entry.members]
        if self.placement == _PAGE and entry.conv == page:  # S1: conv is a page;
            entry.conv = NO_LINE  # S2's conv is a LINE id, never compared with a page id
        return [entry]

    def _reclaim(self, pool: PagePool, page: int, cause: Cause, requester: str) -> None:
        """Free the cached ``page``: detach it, invalidate every entry that is no longer
        complete, and only then let the pool hand the page out again."""
        owners = self.owner[pool.name]
        entry = owners[page]
        if entry.__class__ is Block:  # what _detach returns for a block's page: the block
            self._lose_block(entry, cause, requester)
        else:
            slab = self.slabs is not None and entry == "slab"
            for entry in self._detach(pool, page):
                if isinstance(entry, Block):
                    self._lose_block(entry, cause, requester)
                elif not ckpt_mod.is_complete(entry, self.members):  # (_complete, inline)
                    self._lose_ckpt(entry, _SLAB_RECLAIM if slab else cause, requester,
                                    pool)  # (a checkpoint's page: the checkpoint pool)
        # pool.reclaim(page), without its frame: the page's holds dropped, cached -> free
        assert pool._refs[page] == 0, f"pool {pool.name}: reclaim of page {page} with " \
            f"{pool._refs[page]} references; this indicates reclaiming protected storage"
        holds = pool._holds
        if holds[page]:
            holds[page] = 0
            del pool._cached[page]
            pool._free.append(page)
        watch = pool.watcher
        if watch is not None:
            watch(pool.name, page, "reclaim")
        owners[page] = None

    def _lose_block(self, blk: Block, cause: Cause, requester: str) -> None:
        key = blk.key
        del self.attn_index[key]
        blk.key = 0
        for holder in blk.holders:  # (invalidate only: a reclaimed block has no holders)
            held_by = self.requests.get(holder)
            if held_by is not None:
                held_by.keyed = 0  # publish rescans: this block may publish again
        if key in self.key_waiters:  # their copies of this key may publish now
            for waiter in self.key_waiters.pop(key):
                held_by = self.requests.get(waiter)
                if held_by is not None:
                    held_by.keyed = 0
        if self._emitting:
            self._emit(EventKind.LOSS, hash=key, depth=blk.depth, state_kind=StateKind.ATTENTION,
                       page=blk.page, cause=cause, requester=requester)
        pool = blk.pool
        pool.unhold(blk.page)
        if not blk.holders:  # forget it
            assert pool.is_free(blk.page), f"block on page {blk.page} forgotten while its " \
                "page is not free; this indicates a reference or hold leak"
            self.num_blocks -= 1
            self.owner[pool.name][blk.page] = None
            self.spare_blocks[pool.name][blk.page] = blk

    def _lose_ckpt(self, ck: Checkpoint, cause: Cause, requester: str,
                   pool: PagePool | None = None) -> None:
        """Invalidate the discoverable ``ck``: its key leaves the index, its pages' holds are
        dropped, and it is forgotten unless a request or a pin still holds it. ``pool``: the
        checkpoint pool (``_ckpt_pool()``) when the caller has it at hand."""
        key = ck.key
        del self.rec_index[key]
        self.demand.pop(key, None)
        ck.key = 0
        if self._emitting:
            self._emit(EventKind.LOSS, hash=key, cause=cause, requester=requester,
                       **self._ckpt_fields(ck))
        held = bool(ck.holders) or ck.ident in self.pins
        if not held and self.placement is _SLOT:
            self._clear_slot(ck)  # the sentinel (slab already gone) clears nothing
        if pool is None:
            pool = self._fixed_ckpt_pool  # self._ckpt_pool(), its frame where it decides
            if pool is None:
                pool = self._ckpt_pool()
        if self.placement is _INSIDE:  # _ckpt_pages(ck): its present members
            m = ck.members
            if min(m, default=0) >= 0:
                pages = m
            elif max(m) < 0:  # none left (a one-member checkpoint whose page is reclaimed)
                pages = []
            else:
                pages = [p for p in m if p >= 0]
        else:
            pages = self._ckpt_pages(ck)
        if pages:  # (unhold_many of no page changes nothing)
            pool.unhold_many(pages)
        if not held:  # forget it: no longer live, its pages' owner records cleared
            del self.live_ckpts[ck.ident]
            owners = self.owner[pool.name]
            for p in ck.members:
                if p >= 0:
                    owners[p] = None
            if self.placement is _PAGE and ck.conv >= 0:
                owners[ck.conv] = None

    def evict(self, num_units: int) -> int:
        done = 0
        for pool in self.pools():
            while done < num_units and pool.num_cached:
                page = pool.oldest_cached()
                assert page is not None
                self._reclaim(pool, page, Cause.EVICTION, "")
                done += 1
        return done

    def invalidate(self, key: int) -> bool:
        if key in self.attn_index:
            self._lose_block(self.attn_index[key], Cause.INVALIDATION, "")
            return True
        if key in self.rec_index:
            self._lose_ckpt(self.rec_index[key], Cause.INVALIDATION, "")
            return True
        return False

    # == publication ===========================================================================
    def publish(self, request_id: str, num_computed: int) -> list[int]:
        req = self.requests.get(request_id)  # self._req(request_id), its frame on error only
        if req is None:
            req = self._req(request_id)
        if num_computed > len(req.tokens):
            raise ValueError(f"request {request_id!r}: {num_computed} computed tokens but only "
                             f"{len(req.tokens)} known")
        computed = req.computed  # max(req.computed, num_computed)
        if num_computed > computed:
            req.computed = computed = num_computed
        published: list[int] = []
        attn_index, emitting = self.attn_index, self._emitting
        # Block i ends at (i + 1) g_a, so the blocks within ``computed`` are the first
        # ``stop = computed // g_a`` (each covers a full chunk, so it has a key: ``stop`` is at
        # most the chain's length). The first ``req.keyed`` blocks are settled: each carries
        # its key, or its key is discoverable on another copy (then the request is in
        # ``key_waiters`` of that key). Both lie within ``computed``, and only _lose_block
        # removes a key from the index: it resets the count of the block's holders and of that
        # key's waiters. So the settled blocks are skipped: the old full scan would only
        # ``continue`` over them. Every block the loop passes is settled by it (so ``keyed``
        # counts them all). Each block published gets its page's hold in the same loop (as
        # ``PagePool.hold_many`` of the published pages would).
        blocks, keyed = req.blocks, req.keyed
        stop = computed // self.attention_grid
        if keyed < stop and keyed < len(blocks):
            chain, waiters, holds = req.attn_chain, self.key_waiters, blocks[0].pool._holds
            refs = blocks[0].pool._refs
            for blk, key in zip(blocks[keyed:stop], chain[keyed:stop], strict=False):
                if blk.key:
                    continue  # already discoverable (published or adopted)
                if key in attn_index:  # another request's copy is discoverable
                    waiting = waiters.get(key)
                    if waiting is None:
                        waiters[key] = {request_id}
                    else:
                        waiting.add(request_id)
                    req.waits.append(key)
                    continue
                blk.key = key
                attn_index[key] = blk
                page = blk.page
                assert refs[page] or holds[page], f"pool {blk.pool.name}: hold on free page " \
                    f"{page}; this indicates publishing storage that was already released"
                holds[page] += 1
                published.append(key)
                if emitting:
                    self._emit(EventKind.PUBLICATION, request_id=request_id,
                               preemption_count=req.preemptions, hash=key, depth=blk.depth,
                               state_kind=StateKind.ATTENTION, page=page)
            req.keyed = min(stop, len(blocks))
        pages: list[int] = []
        rec_index, rec_chain, gr = self.rec_index, req.rec_chain, self.recurrent_grid
        ckpts = req.ckpts  # by boundary (one entry is sorted already)
        for b, ck in sorted(ckpts.items()) if len(ckpts) > 1 else ckpts.items():
            if b > req.computed:
                break
            key = rec_chain[b // gr - 1]
            if ck.key or key in rec_index:
                continue
            assert self._complete(ck), f"publishing incomplete checkpoint {ck.ident} at {b}"
            ck.key = key
            rec_index[key] = ck
            if self.placement is _INSIDE:  # _ckpt_pages(ck): its present members
                m = ck.members
                pages += m if min(m, default=0) >= 0 else [p for p in m if p >= 0]
            else:
                pages += self._ckpt_pages(ck)
            self.demand.setdefault(key, set()).add(request_id)  # owner registration
            published.append(key)
            if emitting:
                self._emit(EventKind.PUBLICATION, request_id=request_id,
                           preemption_count=req.preemptions, hash=key, **self._ckpt_fields(ck))
        if pages:  # every page of every checkpoint published here: one hold each
            pool = self._fixed_ckpt_pool  # self._ckpt_pool(), its frame where it decides
            if pool is None:
                pool = self._ckpt_pool()  # (pool.hold_many(pages), in this loop)
            refs, holds = pool._refs, pool._holds
            for p in pages:
                assert refs[p] or holds[p], f"pool {pool.name}: hold on free page {p}; " \
                    "this indicates publishing storage that was already released"
                holds[p] += 1
        return published

    # == release, retention, pinning ===========================================================
    def release_superseded(self, request_id: str) -> list[int]:
        req = self.requests.get(request_id)  # self._req(request_id), its frame on error only
        if req is None:
            req = self._req(request_id)
        ckpts = req.ckpts
        if len(ckpts) < 2:
            return []  # nothing older than the newest: nothing to release or retain
        # the newest boundary within ``computed`` is the largest of those (boundaries are > 0);
        # the ones the loop can release are the others, below it: all but the last, sorted
        older, computed = [], req.computed
        for b in ckpts:
            if b <= computed:
                older.append(b)
        older.sort()
        del older[-1:]  # the newest (none when no boundary is within ``computed``)
        kept = []
        for b in older:
            ck = ckpts[b]
            if ck.ident in req.retained:
                continue
            if self.retention and ck.key:
                demand = len(self.demand.get(ck.key, ()))
                keep = demand >= RETENTION_K
                self._emit(EventKind.RETENTION, request_id=request_id,
                           preemption_count=req.preemptions, hash=ck.key,
                           outcome=Outcome.OK if keep else Outcome.BELOW_THRESHOLD,
                           need=RETENTION_K, free=demand, **self._ckpt_fields(ck))
                if keep:
                    req.retained.add(ck.ident)
                    kept.append(ck.key)
                    continue
            del req.ckpts[b]
            self._ckpt_unref([ck], request_id, req, _NO_CAUSE)
        return kept

    def _release_all(self, req: RequestState, cause: Cause) -> None:
        """Drop every execution reference, deepest first (so deeper entries are older in LRU)."""
        ckpts = req.ckpts
        if ckpts:  # (none: _ckpt_unref of no checkpoint changes nothing)
            self._ckpt_unref(list(map(ckpts.pop, sorted(ckpts, reverse=True))),
                             req.request_id, req, cause)
        blocks, rid = req.blocks, req.request_id
        gone = blocks[::-1]  # deepest first
        blocks.clear()
        if self._emitting:
            for blk in gone:
                self._emit(EventKind.RELEASE, request_id=rid, preemption_count=req.preemptions,
                           hash=blk.key, depth=blk.depth, state_kind=StateKind.ATTENTION,
                           page=blk.page, cause=cause)
        if gone:
            self._blocks_unref(gone, rid)
        req.ckpt_top = req.computed = req.keyed = 0
        req.retained.clear()
        if req.waits:  # no block left to wait for another copy
            waiters = self.key_waiters
            for key in req.waits:
                waiting = waiters.get(key)
                if waiting is not None:
                    waiting.discard(rid)
                    if not waiting:
                        del waiters[key]
            req.waits.clear()

    def preempt(self, request_id: str) -> PinDecision | None:
        req = self._req(request_id)
        decision = None
        published = [b for b, ck in req.ckpts.items() if ck.key]
        if self.pin_k is not None and published:
            ck = req.ckpts[max(published)]
            requesters = self.demand.setdefault(ck.key, set())
            requesters.add(request_id)  # owner registration at preemption
            within_budget = self.pin_budget is None or len(self.pins) < self.pin_budget
            pin = len(requesters) >= self.pin_k and within_budget \
                and ck.ident not in self.pins
            outcome = Outcome.OK if pin else (
                Outcome.BELOW_THRESHOLD if len(requesters) < self.pin_k else Outcome.SKIPPED)
            if pin:
                pool = self._ckpt_pool()
                for p in self._ckpt_pages(ck):
                    pool.incref(p)
                self.pins[ck.ident] = (ck, request_id)
            self._emit(EventKind.PIN, request_id=request_id, preemption_count=req.preemptions,
                       hash=ck.key, outcome=outcome, need=self.pin_k, free=len(requesters),
                       **self._ckpt_fields(ck))
            decision = PinDecision(ck.key, ck.boundary, len(requesters), pin)
        self._release_all(req, Cause.PREEMPTION)
        req.preemptions += 1
        return decision

    def _unpin_owned(self, request_id: str) -> None:
        for ck, owner in list(self.pins.values()):
            if owner == request_id:
                req = self.requests.get(request_id)
                self._emit(EventKind.UNPIN, request_id=request_id,
                           preemption_count=req.preemptions if req else 0, hash=ck.key,
                           **self._ckpt_fields(ck))
                self._ckpt_unref([ck], None)

    def release(self, request_id: str) -> None:
        req = self._req(request_id)
        self._release_all(req, Cause.NONE)

    def finish(self, request_id: str) -> None:
        req = self.requests.get(request_id)  # self._req(request_id), its frame on error only
        if req is None:
            req = self._req(request_id)
        self._release_all(req, _FINISH)
        if self.pins:  # (none: _unpin_owned finds nothing to unpin)
            self._unpin_owned(request_id)
        del self.requests[request_id]

    # == accounting ============================================================================
    def held(self) -> Held:
        return Held(self.num_blocks, len(self.live_ckpts),
                    self.slabs.num_slabs if self.slabs is not None else 0)

    def allocated_bytes(self) -> int:
        return sum((p.total - p.num_free) * self._unit_bytes(p) for p in self.pools())

    @property
    def live_blocks(self) -> set[Block]:
        """The blocks with storage: the owner records that are blocks (a block owns exactly its
        page from allocation until it is forgotten; :attr:`num_blocks` counts them)."""
        return {e for owners in self.owner.values() for e in owners if e.__class__ is Block}

    def _expected_refs(self, live: set[Block] | None = None) -> dict[tuple[str, int], int]:
        refs: dict[tuple[str, int], int] = {}
        for blk in self.live_blocks if live is None else live:
            if blk.holders:
                refs[blk.pool.name, blk.page] = len(blk.holders)
        pool = self._ckpt_pool().name
        for ck in self.live_ckpts.values():
            n = len(ck.holders) + (ck.ident in self.pins)
            if n:
                for p in self._ckpt_pages(ck):
                    refs[pool, p] = refs.get((pool, p), 0) + n
        return refs

    def check_integrity(self) -> None:
        for pool in self.pools():
            pool.check_integrity()
        if self.slabs is not None:
            self.slabs.check_integrity()
        live = self.live_blocks
        refs = self._expected_refs(live)
        for pool in self.pools():
            got, wants, total = pool.ref_counts(), [0] * pool.total, pool.total
            for (name, page), n in refs.items():  # every page's expected count, 0 if none
                if name == pool.name and 0 <= page < total:
                    wants[page] = n
            if got != wants:  # the first page that differs
                page = next(p for p in range(total) if got[p] != wants[p])
                want = wants[page]
                raise AssertionError(
                    f"{self.name} pool {pool.name} page {page}: {pool.refs(page)} references"
                    f", holders and pins account for {want}")
        used = sum(p.total - p.num_free for p in self.pools())
        xa, xr, m = self.held()
        per_ckpt = self._ckpt_units(1) if self.placement != ConvPlacement.SLOT else self.members
        if used != xa + xr * per_ckpt + m:
            raise AssertionError(
                f"{self.name}: {used} units not free != {xa} blocks + {xr} checkpoints x "
                f"{per_ckpt} + {m} slabs = {xa + xr * per_ckpt + m}")
        if len(live) != self.num_blocks:
            raise AssertionError(f"{self.name}: {len(live)} blocks own a page, "
                                 f"{self.num_blocks} counted")
        for key, blk in self.attn_index.items():
            if blk.key != key or blk not in live:
                raise AssertionError(f"{self.name}: attention key {key:#x} maps to a block "
                                     f"with key {blk.key:#x} (live {blk in live})")
        for key, ck in self.rec_index.items():
            if ck.key != key or self.live_ckpts.get(ck.ident) is not ck:
                raise AssertionError(f"{self.name}: recurrent key {key:#x} maps to checkpoint "
                                     f"{ck.ident} with key {ck.key:#x}")
        for key in self.key_waiters:  # a waiter waits on a discoverable copy
            if key not in self.attn_index:
                raise AssertionError(f"{self.name}: requests {sorted(self.key_waiters[key])} "
                                     f"wait on attention key {key:#x}, which is not indexed")
        for pool in self.pools():  # an owner record exactly for the pages that are not free
            owners = self.owner[pool.name]
            stale = [p for p, o, r, h in zip(range(pool.total), owners, pool._refs,
                                             pool._holds, strict=True)
                     if (o is None) != (not r and not h)]  # (pool.is_free(p): no ref, no hold)
            if stale:
                p = stale[0]
                raise AssertionError(f"{self.name} pool {pool.name}: {len(stale)} pages whose "
                                     f"owner record disagrees with their state, first page {p} "
                                     f"({pool.state(p)}, owner {owners[p]!r})")


# the module's own definitions that allocate's ``_units_each`` stands for (read at construction;
# in a dict, not a module-level function name, which the mutant runner would patch with them)
_OWN: dict[str, object] = {"_ckpt_units": CachedOrganization._ckpt_units}
