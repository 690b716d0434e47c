"""Hypothesis state machines that drive a memory organization against a plain reference model.

One :class:`OrganizationMachine` subclass per organization (``MACHINES``), kept in the package so
any other backend can reuse it (the zarr ``testing/stateful.py`` pattern). A machine plays an
engine: it registers requests over a few shared contexts (with and without ``cache_salt``),
admits them (lookup, adopt, allocate), advances them (publish, release superseded checkpoints,
allocate), preempts, finishes, evicts and invalidates, all on deliberately small pools so that
reclaim, slab sharing, pinning and retention happen in almost every run.

The reference model (:mod:`invariants.model`: logical entries, no pages) replays every
operation and predicts, field by field, the events the organization must emit for it
(PUBLICATION, ADOPTION incl. j = 0, ALLOCATION, RELEASE with cause and deepest-first order,
PIN / UNPIN / RETENTION with demand and outcome); a LOSS from reclaim is checked instead
(unprotected, oldest in the model's LRU). After every step the model's discoverable keys, demand
and pins must equal the organization's. The machine adds: hash chains recomputed from its own
tokens and salts; the joint-reuse oracle (``A_max``, ``R_max``, ``J``); ``pages_needed`` and
available units from the model's protected entries; page / line ids of events stable from
publication on; S2 slabs older in the LRU than the members released with them; accounting
against the SPEC §3 formula for :meth:`held`. ``self.cases`` names the situations a program
reached (the coverage tests require each one).

Every step also runs the App. D.2 invariant checkers through :class:`DebugOrganization`.
"""

from __future__ import annotations

import random
from functools import cache
from typing import Any

from hypothesis import event, note
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from hybridmem.events import Cause, Event, EventKind, Outcome, RecordingObserver, StateKind
from hybridmem.geometry import PRESETS, Geometry, ceil_div
from hybridmem.memory.interface import LookupResult
from hybridmem.memory.keys import extra_keys, hash_chain
from hybridmem.memory.layouts import build
from hybridmem.memory.organization import MemoryOrganization
from hybridmem.storage_cost import bytes_d0_pools, bytes_s0, bytes_s1, bytes_s2
from hybridmem.units import Units, derive_units
from invariants.checkers import DebugOrganization
from invariants.draws import integers
from invariants.model import Expect, Model, Req

UNITS = derive_units(PRESETS["falcon-h1-7b"])
NUM_CONTEXTS = 2
MAX_REQUESTS = 6


@cache
def _context(ctx: int, length: int) -> tuple[int, ...]:
    rng = random.Random(1000 + ctx)  # one seed per context: a longer context extends a shorter
    return tuple(rng.randrange(1, 50_000) for _ in range(length))


def context_tokens(ctx: int, length: int) -> list[int]:
    """Deterministic token ids of shared context ``ctx`` (identical for every request)."""
    return list(_context(ctx, max(length, 3 * UNITS.d0_interval_tokens))[:length])


def expected_bytes(org: MemoryOrganization, units: Units) -> int:
    """SPEC §3 storage formula for what ``org`` holds (S2 with its actual slab count)."""
    xa, xr, m = org.held()
    if org.name == "S0":
        return bytes_s0(units, xa, xr)
    if org.name == "S1":
        return bytes_s1(units, xa, xr)
    if org.name == "S2":
        return bytes_s2(units, xa, xr, m)
    return sum(bytes_d0_pools(units, xa, xr))


class OrganizationMachine(RuleBasedStateMachine):
    ORG = "S2"
    units = UNITS
    PIN_CHOICES: tuple[int | None, ...] = (None, 1, 1, 2, 3)  # K per program (None: Roff)
    PIN_BUDGETS: tuple[int | None, ...] = (None, 1, 1, 2)  # most simultaneous pins
    pin_budget: int | None = None

    def __init__(self) -> None:
        super().__init__()
        self.obs = RecordingObserver()
        self.debug: DebugOrganization | None = None
        self.org: MemoryOrganization | None = None
        self.model = Model(1, 1, None, None, False, True)
        self.tokens: dict[str, list[int]] = {}
        self.salts: dict[str, str | None] = {}
        self.running: set[str] = set()
        self.waiting: set[str] = set()
        self.allocated: dict[str, int] = {}  # tokens of storage the request holds
        self.cases: set[str] = set()  # situations this program reached (coverage tests)
        self.seen = 0
        self.counter = 0
        self._chain_cache: dict[str, tuple[int, list[int], list[int]]] = {}

    # -- configuration -----------------------------------------------------------------------
    def capacity(self, data: Any) -> int | tuple[int, int]:
        if self.ORG == "D0":
            return (data.draw(integers(120, 1200), label="attention units"),
                    data.draw(st.integers(2, 10), label="recurrent units"))
        if self.ORG == "S0":  # one page per object
            return data.draw(st.integers(4, 16), label="pages")
        if self.ORG == "S1":
            return data.draw(st.integers(6, 48), label="pages")
        # S2: now and then a pool large enough to fill one slab with cached checkpoints
        fill = self.units.slots_per_slab * self.units.ssm_members + 16
        return data.draw(st.integers(6, 48) | integers(48, max(48, fill)), label="pages")

    @initialize(data=st.data(), retention=st.booleans())
    def setup(self, data: Any, retention: bool) -> None:
        capacity = self.capacity(data)
        pin_k = data.draw(st.sampled_from(self.PIN_CHOICES), label="pin_k")
        self.pin_budget = data.draw(st.sampled_from(self.PIN_BUDGETS), label="pin_budget")
        self.org = build(self.ORG, self.units, capacity, self.obs, pin_k=pin_k,
                         pin_budget=self.pin_budget, retention=retention)
        self.debug = DebugOrganization(self.org)
        if self.org.slabs is not None:
            assert self.org.slabs.slots_per_slab == self.units.slots_per_slab, \
                f"S2 slabs of {self.org.slabs.slots_per_slab} slots, the geometry has " \
                f"{self.units.slots_per_slab}"
        self.model = Model(self.org.attention_grid, self.org.recurrent_grid, pin_k,
                           self.pin_budget, retention, self.ORG != "D0")
        note(f"{self.ORG} capacity={capacity} pin_k={pin_k} budget={self.pin_budget} "
             f"retention={retention}")

    @property
    def ga(self) -> int:
        return self.model.ga

    @property
    def gr(self) -> int:
        return self.model.gr

    @property
    def keys(self) -> dict[int, tuple[StateKind, int]]:
        """The model's discoverable keys: key -> (state kind, depth)."""
        return {k: (e.kind, e.depth) for k, e in self.model.index.items()}

    def _pick(self, pool: set[str], i: int) -> str:
        ids = sorted(pool)
        return ids[i % len(ids)]

    def _chains(self, rid: str) -> tuple[list[int], list[int]]:
        toks = self.tokens[rid]
        cached = self._chain_cache.get(rid)
        if cached is None or cached[0] != len(toks):
            extra = extra_keys(self.salts[rid])
            cached = (len(toks), hash_chain(StateKind.ATTENTION, toks, self.ga, extra),
                      hash_chain(StateKind.RECURRENT, toks, self.gr, extra))
            self._chain_cache[rid] = cached
        return cached[1], cached[2]

    def _oracle(self, rid: str, evidence: bool = False) -> tuple[int, int, int]:
        """(A_max, R_max, J) from the model's index; ``evidence``: a real lookup (demand)."""
        return self.model.lookup(rid, *self._chains(rid), len(self.tokens[rid]), evidence)

    # -- the event stream: each operation's events against the model's prediction --------------
    def _check(self, what: str, expected: list[Expect], causes: tuple[Cause, ...] = (),
               requester: str = "") -> None:
        new = self.obs.events[self.seen:]
        self.seen = len(self.obs.events)
        got = []
        for ev in new:
            label = ev.kind.name
            if ev.kind in (EventKind.LOSS, EventKind.PIN, EventKind.RETENTION):
                label = f"{ev.kind.name} {ev.cause.name} {ev.outcome.name}"
            elif ev.kind == EventKind.ADOPTION:
                label = f"ADOPTION {'hit' if ev.depth else 'miss'}"
            elif ev.kind in (EventKind.ALLOCATION, EventKind.RELEASE):
                label = f"{ev.kind.name} {ev.outcome.name} {ev.cause.name}"
            event(label)
            self.cases.add(label)
            if ev.kind == EventKind.LOSS:
                self.model.lose(ev, causes, requester)
            else:
                got.append(ev)
                if ev.kind == EventKind.PUBLICATION:
                    self._learn_location(ev)
        if self.ORG == "S2":
            self._slabs_age_first(got)
        for k, (ev, (kind, fields)) in enumerate(zip(got, expected, strict=False)):
            actual = {f: getattr(ev, f) for f in fields}
            assert ev.kind == kind and actual == fields, \
                f"{what}: event {k} is {ev.kind.name} {actual}, the model expects " \
                f"{kind.name} {fields}"
        assert len(got) == len(expected), \
            f"{what}: events {[e.kind.name for e in got]}, the model expects " \
            f"{[kind.name for kind, _ in expected]}"

    def _slabs_age_first(self, events: list[Event]) -> None:
        """S2: a slab made cached by releasing a checkpoint is older in the LRU than that
        checkpoint's member pages (so reclaim takes the slab, and all its checkpoints, first).
        Per slab, only the last checkpoint released in this operation can have made it cached."""
        assert self.org is not None and self.org.slabs is not None
        last: dict[int, Event] = {}
        for ev in events:
            if ev.kind in (EventKind.RELEASE, EventKind.UNPIN) and ev.line >= 0 \
                    and ev.state_kind == StateKind.RECURRENT:
                last[ev.line // self.org.slabs.slots_per_slab] = ev
        if not last:
            return
        order = {p: i for i, p in
                 enumerate(self.org.pool_for(StateKind.RECURRENT).cached_pages())}
        for slab, ev in last.items():
            ck = self.org.rec_index.get(ev.hash) if ev.hash else None
            if ck is None or slab not in order:
                continue
            for m in ck.members:
                assert m not in order or order[slab] < order[m], \
                    f"slab page {slab} is younger in the LRU than member page {m} of the " \
                    f"checkpoint at {ck.boundary} whose release made it cached"

    def _learn_location(self, ev: Event) -> None:
        """A publication names the entry's storage: a block's page; a checkpoint's first
        member page and (S2) its conv line. Later events of the entry must repeat them."""
        assert self.org is not None
        if ev.state_kind == StateKind.ATTENTION:
            blk = self.org.attn_index.get(ev.hash)
            where = (-1, -1) if blk is None else (blk.page, -1)
        else:
            ck = self.org.rec_index.get(ev.hash)
            where = (-1, -1) if ck is None else \
                (ck.members[0], ck.conv if self.ORG == "S2" else -1)
        assert (ev.page, ev.line) == where, f"publication of {ev.state_kind.name} at " \
            f"{ev.depth} names page {ev.page} line {ev.line}; it is stored at {where}"
        e = self.model.index.get(ev.hash)
        if e is not None and e.page < 0:
            e.page, e.line = ev.page, ev.line

    # -- allocation ----------------------------------------------------------------------------
    def _expected_need(self, rid: str, n: int) -> tuple[int, int, int]:
        """(blocks, min recurrent units, max recurrent units) for growing ``rid`` to ``n``."""
        r = self.model.reqs[rid]
        blocks = max(0, ceil_div(n, self.ga) - len(r.blocks))
        k = len(range(r.top + self.gr, ceil_div(n, self.gr) * self.gr + 1, self.gr))
        per = {"S0": 1, "S1": self.units.ssm_members + 1, "D0": 1}
        if self.ORG in per:
            return blocks, k * per[self.ORG], k * per[self.ORG]
        # S2: new slabs only for slots beyond the room of slabs IN USE (a cached slab may be
        # reclaimed by this very allocation), read from the slab table, not the org's estimate
        assert self.org is not None and self.org.slabs is not None
        slabs, pool = self.org.slabs, self.org.pool_for(StateKind.RECURRENT)
        room = sum(slabs.slots_per_slab - slabs.used(p) for p in slabs.slab_pages()
                   if pool.refs(p))
        units = self.units.ssm_members * k + ceil_div(max(0, k - room), self.units.slots_per_slab)
        return blocks, units, units

    def _expected_available(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """(low, high) available units of (attention, recurrent) pool from protected entries:
        exact but for S2's slabs in use (at most one per protected checkpoint)."""
        assert self.org is not None
        members = 1 if self.ORG in ("S0", "D0") else self.units.ssm_members
        blocks, units = self.model.units_in_use(members, self.ORG == "S1")
        slabs = units // members if self.ORG == "S2" else 0
        if self.ORG == "D0":
            a = self.org.pool_for(StateKind.ATTENTION).total - blocks
            r = self.org.pool_for(StateKind.RECURRENT).total - units
            return (a, a), (r, r)
        total = self.org.pool_for(StateKind.ATTENTION).total
        hi = total - blocks - units
        return (hi - slabs, hi), (hi - slabs, hi)

    def _allocate(self, rid: str, n: int) -> bool:
        assert self.debug is not None and self.org is not None
        blocks, lo, hi = self._expected_need(rid, n)
        need = self.debug.pages_needed(rid, n)
        assert need.attention == blocks and lo <= need.recurrent <= hi, \
            f"pages_needed({rid}, {n}) = {need}, model expects {blocks} blocks and {lo}..{hi} " \
            "recurrent units"
        (alo, ahi), (rlo, rhi) = self._expected_available()
        can = self.debug.can_allocate(rid, n)
        res = self.debug.allocate(rid, n)
        assert res.ok == can, f"can_allocate said {can}, allocate said {res.ok}"
        assert alo <= res.available.attention <= ahi and rlo <= res.available.recurrent <= rhi, \
            f"available {res.available}, the model's protected entries leave " \
            f"{alo}..{ahi} / {rlo}..{rhi}"
        shared = self.ORG != "D0"
        fits = (need.total <= res.available.attention if shared else
                need.attention <= res.available.attention
                and need.recurrent <= res.available.recurrent)
        assert res.ok == fits, f"allocation {res} inconsistent with need vs available"
        common = dict(request_id=rid, preemption_count=self.model.reqs[rid].preemptions,
                      requester=rid, outcome=Outcome.OK if res.ok else Outcome.REJECTED)
        if shared:
            expected = [(EventKind.ALLOCATION, dict(common, need=need.total,
                                                    free=res.available.attention))]
        else:
            expected = [(EventKind.ALLOCATION, dict(common, need=need.attention,
                                                    free=res.available.attention,
                                                    state_kind=StateKind.ATTENTION)),
                        (EventKind.ALLOCATION, dict(common, need=need.recurrent,
                                                    free=res.available.recurrent,
                                                    state_kind=StateKind.RECURRENT))]
        self._check(f"allocate({rid}, {n})", expected,
                    (Cause.ALLOCATION, Cause.SLAB_RECLAIM) if res.ok else (), rid)
        if res.ok:
            self.model.allocate(rid, n)
            self.allocated[rid] = max(self.allocated[rid], n)
        return res.ok

    # -- rules ---------------------------------------------------------------------------------
    @precondition(lambda self: len(self.tokens) < MAX_REQUESTS)
    @rule(ctx=st.integers(0, NUM_CONTEXTS - 1), ctx_chunks=st.sampled_from([0, 1, 2, 2, 3]),
          tail=st.integers(1, 3),
          salt=st.sampled_from(["none", "none", "none", "team", "mate", "own"]),
          rounds=st.integers(0, 4), keep=st.booleans(), on_boundary=st.booleans())
    def arrive(self, ctx: int, ctx_chunks: int, tail: int, salt: str, rounds: int,
               keep: bool, on_boundary: bool = False) -> None:
        """A request over ``ctx_chunks`` recurrent chunks of a shared context plus a private
        tail is registered, admitted, and advanced ``rounds`` times. ``on_boundary``: the tail
        ends on an attention-block boundary, so the prompt's last token closes a block (and,
        with whole chunks, a checkpoint the lookup must not adopt: at most L - 1). Salts
        "team" and "mate" have equal length, so a hash that used only the salt's length
        would merge them."""
        assert self.debug is not None
        rid = f"r{self.counter}"
        self.counter += 1
        tail_len = tail * self.ga if on_boundary else tail * self.gr // 2 - 1
        toks = context_tokens(ctx, ctx_chunks * self.gr) + \
            [50_000 + 7 * self.counter + i for i in range(tail_len)]
        cache_salt = {"none": None, "team": "team", "mate": "mate", "own": rid}[salt]
        note(f"{rid}: context {ctx} x {ctx_chunks} chunks + {tail_len}, salt {cache_salt}")
        self._register(rid, toks, cache_salt)
        self._admit(rid, 2, rounds, keep)

    @precondition(lambda self: 0 < len(self.tokens) < MAX_REQUESTS)
    @rule(i=st.integers(0, 63), tail=integers(1, 300), rounds=st.integers(0, 3),
          keep=st.booleans())
    def follow(self, i: int, tail: int, rounds: int, keep: bool) -> None:
        """A request that repeats another's whole prompt (same salt) plus a tail: it finds
        whatever the leader published, pinned or retained, so adoption hits, shared holding and
        losses of shared entries are common."""
        lead = self._pick(set(self.tokens), i)
        rid = f"r{self.counter}"
        self.counter += 1
        toks = self.tokens[lead] + [70_000 + 11 * self.counter + j for j in range(tail)]
        note(f"{rid}: follows {lead} + {tail}")
        self._register(rid, toks, self.salts[lead])
        self._admit(rid, 2, rounds, keep)

    def _register(self, rid: str, toks: list[int], cache_salt: str | None) -> None:
        assert self.debug is not None
        self.debug.add_request(rid, toks, cache_salt)
        self.tokens[rid], self.salts[rid] = toks, cache_salt
        self.model.reqs[rid] = Req()
        self.waiting.add(rid)
        self.allocated[rid] = 0
        if len(toks) % self.ga == 0:
            self.cases.add("prompt ends on a block boundary")
        if cache_salt in ("team", "mate"):
            self.cases.add(f"salt {cache_salt}")
        assert self.debug.hash_chains(rid) == tuple(map(tuple, self._chains(rid))), \
            "organization hash chains differ from the model's"

    def _lookup(self, rid: str) -> LookupResult:
        assert self.debug is not None
        want = self._oracle(rid, evidence=True)
        hit = self.debug.lookup(rid)
        assert (hit.a_max, hit.r_max, hit.j) == want, \
            f"lookup {rid}: org {hit.a_max, hit.r_max, hit.j} != model {want}"
        if hit.checkpoint is not None:  # completeness by length, not only presence
            members = 1 if self.ORG in ("S0", "D0") else self.units.ssm_members
            assert len(hit.checkpoint.members) == members and hit.checkpoint.conv >= 0, \
                f"lookup {rid}: hit at {hit.j} has members {hit.checkpoint.members} and conv " \
                f"{hit.checkpoint.conv}, a complete checkpoint has {members} and a conv state"
        length = len(self.tokens[rid])
        if length % self.gr == 0 and self._chains(rid)[1][-1] in self.model.index:
            self.cases.add("checkpoint at L resident, not adopted")
        self._check(f"lookup({rid})", [])
        return hit

    @precondition(lambda self: bool(self.tokens))
    @rule(i=st.integers(0, 63))
    def probe(self, i: int) -> None:
        self._lookup(self._pick(set(self.tokens), i))

    @precondition(lambda self: bool(self.waiting))
    @rule(i=st.integers(0, 63), chunk=st.integers(1, 4), rounds=st.integers(0, 3),
          keep=st.booleans())
    def resume(self, i: int, chunk: int, rounds: int, keep: bool) -> None:
        self._admit(self._pick(self.waiting, i), chunk, rounds, keep)

    @precondition(lambda self: bool(self.waiting))
    @rule(i=st.integers(0, 63), evict=st.integers(0, 3), chunk=st.integers(1, 4))
    def adopt_after_reclaim(self, i: int, evict: int, chunk: int) -> None:
        """Look up, then lose storage (``evict`` units, or with 0 an invalidation of one key of
        the hit) before adopting: a hit with a lost key is stale and must be refused."""
        assert self.debug is not None
        rid = self._pick(self.waiting, i)
        hit = self._lookup(rid)
        hit_keys = set(hit.block_keys) | ({hit.checkpoint.key} if hit.checkpoint else set())
        before = set(self.model.index)
        if evict:
            self.debug.evict(evict)
            self._check(f"evict({evict})", [], (Cause.EVICTION, Cause.SLAB_RECLAIM))
        elif hit_keys:
            key = sorted(hit_keys)[i % len(hit_keys)]
            assert self.debug.invalidate(key)
            self._check(f"invalidate({key:#x})", [], (Cause.INVALIDATION,))
        lost = hit_keys & (before - set(self.model.index))
        if not lost:
            self._admit(rid, chunk, 0, True, hit)
            return
        self.cases.add("stale hit refused")
        try:
            self.debug.adopt(rid, hit)
        except ValueError:
            self._check(f"stale adopt({rid})", [])
        else:
            raise AssertionError(f"adopted a stale hit of {rid}: keys {sorted(lost)} lost "
                                 "since the lookup")

    def _admit(self, rid: str, chunk: int, rounds: int, keep: bool,
               hit: LookupResult | None = None) -> None:
        assert self.debug is not None and self.org is not None
        if hit is None:
            hit = self._lookup(rid)
        attn, rec = self._chains(rid)
        expected = self.model.adopt(rid, hit.j, attn, rec)
        if any(kind == EventKind.UNPIN for kind, _ in expected):
            self.cases.add("pins released by their owner at adoption")
        self.debug.adopt(rid, hit)
        self._check(f"adopt({rid}, j={hit.j})", expected)
        self.waiting.discard(rid)
        self.running.add(rid)
        self.allocated[rid] = hit.j
        n = min(len(self.tokens[rid]), hit.j + chunk * self.gr // 2)
        if not self._allocate(rid, n):
            expected = self.model.release(rid)
            self.debug.release(rid)
            self._check(f"release({rid})", expected)
            self._to_waiting(rid)
            return
        for _ in range(rounds):
            self._advance(rid, chunk, keep)

    def _to_waiting(self, rid: str) -> None:
        self.running.discard(rid)
        self.waiting.add(rid)
        self.allocated[rid] = 0

    @precondition(lambda self: bool(self.running))
    @rule(i=st.integers(0, 63), chunk=st.integers(1, 4), rounds=st.integers(1, 3),
          keep=st.booleans())
    def advance(self, i: int, chunk: int, rounds: int, keep: bool) -> None:
        rid = self._pick(self.running, i)
        for _ in range(rounds):
            self._advance(rid, chunk, keep)

    def _advance(self, rid: str, chunk: int, keep: bool) -> None:
        """One engine step: the held tokens are computed and published, superseded checkpoints
        released (or retained) unless the engine ``keep``s them all, and the next chunk
        allocated."""
        assert self.debug is not None and self.org is not None
        done = self.allocated[rid]
        attn, rec = self._chains(rid)
        expected, keys = self.model.publish(rid, done, attn, rec)
        got = self.debug.publish(rid, done)
        self._check(f"publish({rid}, {done})", expected)
        assert got == keys, f"publish({rid}, {done}) returned {got}, the model expects {keys}"
        if not keep:
            expected, kept = self.model.release_superseded(rid)
            got = self.debug.release_superseded(rid)
            self._check(f"release_superseded({rid})", expected)
            assert got == kept, f"release_superseded({rid}) kept {got}, model {kept}"
        n = min(len(self.tokens[rid]), done + chunk * self.gr // 2)
        if n > done:
            self._allocate(rid, n)

    @precondition(lambda self: bool(self.tokens))
    @rule(i=st.integers(0, 63), count=integers(1, 600))
    def append(self, i: int, count: int) -> None:
        assert self.debug is not None
        rid = self._pick(set(self.tokens), i)
        new = [90_000 + 13 * self.counter + j for j in range(count)]
        self.counter += 1
        self.debug.append_tokens(rid, new)
        self.tokens[rid].extend(new)
        self._check(f"append({rid})", [])

    @precondition(lambda self: bool(self.running))
    @rule(i=st.integers(0, 63))
    def preempt(self, i: int) -> None:
        assert self.debug is not None and self.org is not None
        rid = self._pick(self.running, i)
        expected, want = self.model.preempt(rid)
        decision = self.debug.preempt(rid)
        self._check(f"preempt({rid})", expected)
        got = None if decision is None else \
            (decision.key, decision.boundary, decision.demand, decision.pinned)
        assert got == want, f"preempt({rid}) decided {got}, the model {want}"
        self._to_waiting(rid)

    @precondition(lambda self: bool(self.tokens))
    @rule(i=st.integers(0, 63))
    def finish(self, i: int) -> None:
        assert self.debug is not None and self.org is not None
        rid = self._pick(set(self.tokens), i)
        expected = self.model.finish(rid)
        if any(kind == EventKind.UNPIN for kind, _ in expected):
            self.cases.add("pins released at finish")
        self.debug.finish(rid)
        self._check(f"finish({rid})", expected)
        for d in (self.tokens, self.salts, self.allocated):
            del d[rid]
        self.running.discard(rid)
        self.waiting.discard(rid)
        assert rid not in self.org.requests

    @rule(n=st.integers(1, 4))
    def evict(self, n: int) -> None:
        assert self.debug is not None
        cached = sum(len(lru) for lru in self.model.lru.values())
        losses = len(self.obs.events)
        done = self.debug.evict(n)
        losses = len(self.obs.events) - losses
        self._check(f"evict({n})", [], (Cause.EVICTION, Cause.SLAB_RECLAIM))
        if self.ORG != "S2":  # one page or one set of pages per entry: one loss per unit
            assert done == losses == min(n, cached), \
                f"evict({n}) reclaimed {done} units with {losses} losses; the model has " \
                f"{cached} cached entries"

    @precondition(lambda self: bool(self.model.index))
    @rule(i=integers(0, 255))
    def invalidate(self, i: int, among: list[int] | None = None) -> None:
        assert self.debug is not None
        keys = among or sorted(self.model.index)
        key = keys[i % len(keys)]
        assert self.debug.invalidate(key), f"model key {key:#x} not discoverable in the org"
        new = self.obs.events[self.seen:]
        assert [(e.kind, e.hash) for e in new] == [(EventKind.LOSS, key)], \
            f"invalidate({key:#x}) emitted {[(e.kind.name, hex(e.hash)) for e in new]}"
        self._check(f"invalidate({key:#x})", [], (Cause.INVALIDATION,))

    @precondition(lambda self: any(e.published and (e in self.model.pins or len(e.holders) > 1)
                                   for e in self.model.index.values()))
    @rule(i=st.integers(0, 63))
    def invalidate_shared(self, i: int) -> None:
        """Invalidate a checkpoint or block that is pinned or held by two requests (its
        holders then release, republish or pin a lost entry)."""
        keys = sorted(k for k, e in self.model.index.items() if e in self.model.pins and e.holders)
        keys = keys or sorted(k for k, e in self.model.index.items()
                              if e in self.model.pins or len(e.holders) > 1)
        e = self.model.index[keys[i % len(keys)]]
        if e in self.model.pins and e.holders:
            self.cases.add("pinned entry lost while another request holds it")
        elif len(e.holders) > 1:
            self.cases.add("entry lost while two requests hold it")
        self.invalidate(i, keys)

    # -- invariants ----------------------------------------------------------------------------
    @invariant()
    def model_matches_org(self) -> None:
        """Indexes, demand and pins equal the model's (and a full slab is noted)."""
        if self.org is None:
            return
        self._check("between rules", [])
        org_keys = {k: (StateKind.ATTENTION, b.depth) for k, b in self.org.attn_index.items()}
        org_keys |= {k: (StateKind.RECURRENT, c.boundary) for k, c in self.org.rec_index.items()}
        assert org_keys == self.keys, \
            f"discoverable keys differ: org-only {set(org_keys) - set(self.keys)}, " \
            f"model-only {set(self.keys) - set(org_keys)}"
        demand = {k: v for k, v in self.org.demand.items() if v}
        want = {k: v for k, v in self.model.demand.items() if v}
        assert demand == want, f"demand differs: org {demand}, model {want}"
        pins = sorted((ck.boundary, owner, ck.key) for ck, owner in self.org.pins.values())
        want_pins = sorted((e.depth, owner, e.key if e.published else 0)
                           for e, owner in self.model.pins.items())
        assert pins == want_pins, f"pins differ: org {pins}, model {want_pins}"
        if self.pin_budget is not None:
            assert len(self.org.pins) <= self.pin_budget, \
                f"{len(self.org.pins)} pins held, budget {self.pin_budget}"
        slabs = self.org.slabs
        if slabs is not None and any(slabs.used(p) == slabs.slots_per_slab
                                     for p in slabs.slab_pages()):
            self.cases.add("slab full")

    @invariant()
    def integrity_and_accounting(self) -> None:
        if self.debug is None or self.org is None:
            return
        self.debug.check_integrity()
        got, want = self.org.allocated_bytes(), expected_bytes(self.org, self.units)
        assert got == want, f"{self.ORG} allocated {got} B != storage formula {want} B for " \
            f"{self.org.held()}"


class S0Machine(OrganizationMachine):
    ORG = "S0"


class S1Machine(OrganizationMachine):
    ORG = "S1"


class S2Machine(OrganizationMachine):
    ORG = "S2"


class D0Machine(OrganizationMachine):
    ORG = "D0"


MACHINES: dict[str, type[OrganizationMachine]] = {
    "S0": S0Machine, "S1": S1Machine, "S2": S2Machine, "D0": D0Machine,
}


# ---- every geometry: the presets, and synthetic ones spanning slots per slab 2..64 and SSM members
# 1..4 (a slab geometry of 16 slots hid a decoder that assumed 16).
def _synthetic(slots: int, members: int, kv: int, head_dim: int, heads: int, head_dim_m: int,
               d_state: int, groups: int) -> tuple[str, Geometry]:
    name = f"syn-slots{slots}-members{members}"
    return name, Geometry(name, 2, kv, head_dim, "bfloat16", heads, head_dim_m, d_state, groups,
                          4, "bfloat16")


SYNTHETIC = dict(_synthetic(*row) for row in (
    (2, 1, 1, 64, 48, 128, 8, 1), (2, 2, 1, 64, 48, 128, 16, 1), (2, 3, 1, 64, 48, 128, 32, 1),
    (2, 4, 1, 64, 64, 128, 32, 1), (4, 1, 1, 64, 1, 8, 256, 8), (4, 2, 1, 64, 4, 128, 256, 8),
    (4, 3, 1, 64, 24, 32, 256, 4), (4, 4, 1, 64, 8, 128, 256, 4), (8, 1, 1, 64, 1, 8, 128, 8),
    (8, 2, 1, 64, 4, 128, 256, 2), (8, 3, 1, 64, 24, 32, 256, 2), (8, 4, 1, 64, 8, 128, 256, 1),
    (16, 1, 1, 64, 1, 8, 64, 8), (16, 2, 1, 64, 4, 128, 256, 1), (16, 4, 1, 128, 16, 128, 256, 1),
    (32, 1, 1, 64, 1, 8, 32, 8), (32, 2, 1, 128, 24, 32, 256, 1), (64, 1, 1, 64, 1, 8, 16, 8),
))
GEOMETRIES: dict[str, Units] = {name: derive_units(g) for name, g in
                                {**PRESETS, **SYNTHETIC}.items()}


def machine_for(org: str, units: Units) -> type[OrganizationMachine]:
    """The state machine of ``org`` on the geometry of ``units``."""
    return type(f"{org}Machine_{units.geometry.model}", (MACHINES[org],), {"units": units})
