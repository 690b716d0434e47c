"""Hypothesis state machines that drive a memory organization against a plain reference model.

One :class:`OrganizationMachine` subclass per organization (``MACHINES``), kept in the package so
any other backend can reuse it (the zarr ``testing/stateful.py`` pattern). A machine plays an
engine: it registers requests over a few shared contexts (with and without ``cache_salt``),
admits them (lookup, adopt, allocate), advances them (publish, release superseded checkpoints,
allocate), preempts, finishes, evicts and invalidates, all on deliberately small pools so that
reclaim, slab sharing, pinning and retention happen in almost every run.

The reference model is plain dicts and sets:

* ``keys``: discoverable key -> (state kind, depth), maintained only from PUBLICATION and LOSS
  events; it must equal the organization's indexes after every step (no silent loss or
  publication) and every event must be a real transition;
* hash chains recomputed from the model's own tokens and salts;
* the joint-reuse oracle (``A_max``, ``R_max``, ``J``) computed from ``keys`` alone;
* each request's held extent (blocks, highest checkpoint) to predict ``pages_needed``;
* accounting: allocated bytes equal the SPEC §3 formula for :meth:`held`.

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

from hybridmem.cached_org import CachedOrganization
from hybridmem.events import Cause, EventKind, RecordingObserver, StateKind
from hybridmem.geometry import PRESETS, Geometry, ceil_div
from hybridmem.hashing import extra_keys, hash_chain
from hybridmem.organization import build
from hybridmem.storage import bytes_d0_pools, bytes_s0, bytes_s1, bytes_s2
from hybridmem.units import Units, derive_units
from invariants.checkers import DebugOrganization

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


def expected_bytes(org: CachedOrganization, units: Units) -> int:
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
    PIN_BUDGETS: tuple[int | None, ...] = (None, None, 1, 2)  # most simultaneous pins
    pin_budget: int | None = None

    def __init__(self) -> None:
        super().__init__()
        self.obs = RecordingObserver()
        self.debug: DebugOrganization | None = None
        self.org: CachedOrganization | None = None
        self.keys: dict[int, tuple[StateKind, int]] = {}
        self.tokens: dict[str, list[int]] = {}
        self.salts: dict[str, str | None] = {}
        self.running: set[str] = set()
        self.waiting: set[str] = set()
        self.blocks_held: dict[str, int] = {}
        self.top: dict[str, int] = {}
        self.allocated: dict[str, int] = {}  # tokens of storage the request holds
        self.seen = 0
        self.counter = 0
        self._chain_cache: dict[str, tuple[int, list[int], list[int]]] = {}

    # -- configuration -----------------------------------------------------------------------
    def capacity(self, data: Any) -> int | tuple[int, int]:
        if self.ORG == "D0":
            return (data.draw(st.integers(120, 1200), label="attention units"),
                    data.draw(st.integers(2, 10), label="recurrent units"))
        high = 16 if self.ORG == "S0" else 48  # S0: one page per object
        return data.draw(st.integers(4 if self.ORG == "S0" else 6, high), label="pages")

    @initialize(data=st.data(), retention=st.booleans())
    def setup(self, data: Any, retention: bool) -> None:
        capacity = self.capacity(data)
        pin_k = data.draw(st.sampled_from(self.PIN_CHOICES), label="pin_k")
        self.pin_budget = data.draw(st.sampled_from(self.PIN_BUDGETS), label="pin_budget")
        self.org = build(self.ORG, self.units, capacity, self.obs, pin_k=pin_k,
                         pin_budget=self.pin_budget, retention=retention)
        self.debug = DebugOrganization(self.org)
        note(f"{self.ORG} capacity={capacity} pin_k={pin_k} retention={retention}")

    @property
    def ga(self) -> int:
        assert self.org is not None
        return self.org.attention_grid

    @property
    def gr(self) -> int:
        assert self.org is not None
        return self.org.recurrent_grid

    def _pick(self, pool: set[str], i: int) -> str:
        ids = sorted(pool)
        return ids[i % len(ids)]

    # -- the model's own joint-reuse oracle ----------------------------------------------------
    def _chains(self, rid: str) -> tuple[list[int], list[int]]:
        toks = self.tokens[rid]
        cached = self._chain_cache.get(rid)
        if cached is None or cached[0] != len(toks):
            extra = extra_keys(self.salts[rid])
            cached = (len(toks), hash_chain(StateKind.ATTENTION, toks, self.ga, extra),
                      hash_chain(StateKind.RECURRENT, toks, self.gr, extra))
            self._chain_cache[rid] = cached
        return cached[1], cached[2]

    def _oracle(self, rid: str) -> tuple[int, int, int]:
        attn, rec = self._chains(rid)
        limit = len(self.tokens[rid]) - 1
        k = 0
        for i, key in enumerate(attn):
            if (i + 1) * self.ga > limit or self.keys.get(key, (None,))[0] != StateKind.ATTENTION:
                break
            k = i + 1
        a_max = k * self.ga // self.gr * self.gr
        r_max = j = 0
        for i, key in enumerate(rec):
            b = (i + 1) * self.gr
            if b > limit:
                break
            if self.keys.get(key, (None,))[0] == StateKind.RECURRENT:
                r_max = b
                if b <= a_max:
                    j = b
        return a_max, r_max, j

    def _expected_need(self, rid: str, n: int) -> tuple[int, int, int]:
        """(blocks, min recurrent units, max recurrent units) for growing ``rid`` to ``n``."""
        assert self.org is not None
        blocks = max(0, ceil_div(n, self.ga) - self.blocks_held[rid])
        k = len(range(self.top[rid] + self.gr, ceil_div(n, self.gr) * self.gr + 1, self.gr))
        per = {"S0": 1, "S1": self.units.ssm_members + 1, "D0": 1}
        if self.ORG in per:
            return blocks, k * per[self.ORG], k * per[self.ORG]
        members = self.units.ssm_members * k
        return blocks, members, members + ceil_div(k, self.units.slots_per_slab)

    def _allocate(self, rid: str, n: int) -> bool:
        assert self.debug is not None
        blocks, lo, hi = self._expected_need(rid, n)
        need = self.debug.pages_needed(rid, n)
        assert need.attention == blocks and lo <= need.recurrent <= hi, \
            f"pages_needed({rid}, {n}) = {need}, model expects {blocks} blocks and {lo}..{hi} " \
            "recurrent units"
        can = self.debug.can_allocate(rid, n)
        res = self.debug.allocate(rid, n)
        assert res.ok == can, f"can_allocate said {can}, allocate said {res.ok}"
        shared = self.org is not None and self.ORG != "D0"
        fits = (need.total <= res.available.attention if shared else
                need.attention <= res.available.attention
                and need.recurrent <= res.available.recurrent)
        assert res.ok == fits, f"allocation {res} inconsistent with need vs available"
        if res.ok:
            self.blocks_held[rid] = max(self.blocks_held[rid], ceil_div(n, self.ga))
            self.top[rid] = max(self.top[rid], ceil_div(n, self.gr) * self.gr)
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
        self.debug.add_request(rid, toks, cache_salt)
        self.tokens[rid], self.salts[rid] = toks, cache_salt
        self.waiting.add(rid)
        self.blocks_held[rid] = self.top[rid] = self.allocated[rid] = 0
        note(f"{rid}: context {ctx} x {ctx_chunks} chunks + {tail_len}, salt {cache_salt}")
        assert self.debug.hash_chains(rid) == tuple(map(tuple, self._chains(rid))), \
            "organization hash chains differ from the model's"
        self._admit(rid, 2, rounds, keep)

    @precondition(lambda self: bool(self.tokens))
    @rule(i=st.integers(0, 63))
    def probe(self, i: int) -> None:
        assert self.debug is not None
        rid = self._pick(set(self.tokens), i)
        hit = self.debug.lookup(rid)
        assert (hit.a_max, hit.r_max, hit.j) == self._oracle(rid), \
            f"lookup {rid}: org {hit.a_max, hit.r_max, hit.j} != model {self._oracle(rid)}"

    @precondition(lambda self: bool(self.waiting))
    @rule(i=st.integers(0, 63), chunk=st.integers(1, 4), rounds=st.integers(0, 3),
          keep=st.booleans())
    def resume(self, i: int, chunk: int, rounds: int, keep: bool) -> None:
        self._admit(self._pick(self.waiting, i), chunk, rounds, keep)

    def _admit(self, rid: str, chunk: int, rounds: int, keep: bool) -> None:
        assert self.debug is not None and self.org is not None
        hit = self.debug.lookup(rid)
        want = self._oracle(rid)
        assert (hit.a_max, hit.r_max, hit.j) == want, \
            f"lookup {rid}: org {hit.a_max, hit.r_max, hit.j} != model {want}"
        self.debug.adopt(rid, hit)
        assert not any(owner == rid for _ck, owner in self.org.pins.values()), \
            f"{rid} still pins after adoption"
        self.blocks_held[rid] = hit.j // self.ga
        self.top[rid] = self.allocated[rid] = hit.j
        self.waiting.discard(rid)
        self.running.add(rid)
        n = min(len(self.tokens[rid]), hit.j + chunk * self.gr // 2)
        if not self._allocate(rid, n):
            self.debug.release(rid)
            self._to_waiting(rid)
            return
        for _ in range(rounds):
            self._advance(rid, chunk, keep)

    def _to_waiting(self, rid: str) -> None:
        self.running.discard(rid)
        self.waiting.add(rid)
        self.blocks_held[rid] = self.top[rid] = self.allocated[rid] = 0

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
        self.debug.publish(rid, done)
        attn, rec = self._chains(rid)
        for b in range(self.ga, done + 1, self.ga):
            assert attn[b // self.ga - 1] in self.org.attn_index, \
                f"{rid}: block ending at {b} computed but not discoverable"
        req = self.org.requests[rid]
        for b in req.ckpts:
            if b <= done:
                assert rec[b // self.gr - 1] in self.org.rec_index, \
                    f"{rid}: checkpoint {b} computed and held but not discoverable"
        if not keep:
            self.debug.release_superseded(rid)
        n = min(len(self.tokens[rid]), done + chunk * self.gr // 2)
        if n > done:
            self._allocate(rid, n)

    @precondition(lambda self: bool(self.tokens))
    @rule(i=st.integers(0, 63), count=st.integers(1, 600))
    def append(self, i: int, count: int) -> None:
        assert self.debug is not None
        rid = self._pick(set(self.tokens), i)
        new = [90_000 + 13 * self.counter + j for j in range(count)]
        self.counter += 1
        self.debug.append_tokens(rid, new)
        self.tokens[rid].extend(new)

    @precondition(lambda self: bool(self.running))
    @rule(i=st.integers(0, 63))
    def preempt(self, i: int) -> None:
        assert self.debug is not None and self.org is not None
        rid = self._pick(self.running, i)
        decision = self.debug.preempt(rid)
        if decision is not None and decision.pinned:
            assert self.org.pin_k is not None and decision.demand >= self.org.pin_k
        self._to_waiting(rid)

    @precondition(lambda self: bool(self.tokens))
    @rule(i=st.integers(0, 63))
    def finish(self, i: int) -> None:
        assert self.debug is not None and self.org is not None
        rid = self._pick(set(self.tokens), i)
        self.debug.finish(rid)
        for d in (self.tokens, self.salts, self.blocks_held, self.top, self.allocated):
            del d[rid]
        self.running.discard(rid)
        self.waiting.discard(rid)
        assert rid not in self.org.requests

    @rule(n=st.integers(1, 4))
    def evict(self, n: int) -> None:
        assert self.debug is not None
        self.debug.evict(n)

    @precondition(lambda self: bool(self.keys))
    @rule(i=st.integers(0, 255))
    def invalidate(self, i: int) -> None:
        assert self.debug is not None
        key = sorted(self.keys)[i % len(self.keys)]
        assert self.debug.invalidate(key), f"model key {key:#x} not discoverable in the org"

    # -- invariants ----------------------------------------------------------------------------
    @invariant()
    def events_match_indexes(self) -> None:
        if self.org is None:
            return
        for ev in self.obs.events[self.seen:]:
            if ev.kind in (EventKind.LOSS, EventKind.PIN, EventKind.RETENTION):
                event(f"{ev.kind.name} {ev.cause.name} {ev.outcome.name}")
            elif ev.kind == EventKind.ADOPTION:
                event(f"ADOPTION {'hit' if ev.depth else 'miss'}")
            elif ev.kind == EventKind.ALLOCATION:
                event(f"ALLOCATION {ev.outcome.name}")
            if ev.kind == EventKind.PUBLICATION:
                assert ev.hash not in self.keys, f"publication of discoverable key {ev.hash:#x}"
                self.keys[ev.hash] = (ev.state_kind, ev.depth)
            elif ev.kind == EventKind.LOSS:
                assert self.keys.get(ev.hash) == (ev.state_kind, ev.depth), \
                    f"loss of {ev.hash:#x} ({ev.state_kind.name}, {ev.depth}) not matching " \
                    f"model {self.keys.get(ev.hash)}"
                assert ev.cause in (Cause.ALLOCATION, Cause.SLAB_RECLAIM, Cause.EVICTION,
                                    Cause.INVALIDATION), f"loss with cause {ev.cause.name}"
                assert bool(ev.requester) == (ev.cause == Cause.ALLOCATION) or \
                    ev.cause == Cause.SLAB_RECLAIM, \
                    f"loss by {ev.cause.name} with requester {ev.requester!r}"
                del self.keys[ev.hash]
        self.seen = len(self.obs.events)
        org_keys = {k: (StateKind.ATTENTION, b.depth) for k, b in self.org.attn_index.items()}
        org_keys |= {k: (StateKind.RECURRENT, c.boundary) for k, c in self.org.rec_index.items()}
        assert org_keys == self.keys, \
            f"discoverable keys differ: org-only {set(org_keys) - set(self.keys)}, " \
            f"model-only {set(self.keys) - set(org_keys)}"

    @invariant()
    def pins_within_budget(self) -> None:
        if self.org is not None and self.pin_budget is not None:
            assert len(self.org.pins) <= self.pin_budget, \
                f"{len(self.org.pins)} pins held, budget {self.pin_budget}"

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
# 1..4 (a slab geometry of 16 slots hid a decoder that assumed 16: issue 14).
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
