"""The reference model behind the organization state machines: logical entries, no pages.

The model replays every operation on plain objects and predicts the exact event stream the
organization must emit, except which entries an allocation or an eviction reclaims (that choice
needs pages); a reclaim loss is checked instead against the model's LRU::

    per request   held blocks [b0 b1 b2]  held checkpoints {512: c1, 1024: c2}
                  computed tokens, retained checkpoints, preemption count
    shared        index   key -> entry (discoverable)
                  demand  recurrent key -> distinct requesters (producer at publication,
                          owner at preemption, every lookup that found it RESIDENT; dropped
                          with the entry)
                  pins    entry -> owner, insertion order (budget bound; the owner's pins go
                          at its adoption and at its finish)
                  lru     pool -> unprotected discoverable entries, oldest first

Release order is deepest first (checkpoints, then blocks), so the LRU ages deeper entries
first and a reclaim takes them first: every reclaim loss (cause ALLOCATION or EVICTION) must be
of the oldest entry of its pool's LRU, and of no protected entry. S2's slab reclaim
(SLAB_RECLAIM) takes every checkpoint with a slot in the slab at once, so only its
protection is checked.

An entry is *protected* while a request holds it or a pin does; it enters the LRU when it
becomes unprotected while discoverable, and leaves it when adopted or lost.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hybridmem.events import Cause, Event, EventKind, Outcome, StateKind

RETENTION_K = 2  # the paper's producer-side threshold (Q8/Q9), restated, not imported
Expect = tuple[EventKind, dict[str, Any]]


@dataclass(eq=False)
class Entry:
    """One block or checkpoint with storage (identity: the object)."""

    kind: StateKind
    depth: int
    key: int = 0  # chain key (known from publication on)
    published: bool = False
    holders: set[str] = field(default_factory=set)
    page: int = -1  # event page id, learned at first publication (stable: the home page)
    line: int = -1  # event line id (S2 checkpoints), learned likewise

    def fields(self) -> dict[str, Any]:
        """Event fields that name this entry (hash, depth, kind, and page/line once known)."""
        out: dict[str, Any] = dict(hash=self.key if self.published else 0, depth=self.depth,
                                   state_kind=self.kind)
        if self.page >= 0:
            out.update(page=self.page, line=self.line)
        return out


@dataclass
class Req:
    blocks: list[Entry] = field(default_factory=list)
    ckpts: dict[int, Entry] = field(default_factory=dict)
    computed: int = 0
    top: int = 0  # highest checkpoint boundary held or adopted
    preemptions: int = 0
    retained: set[Entry] = field(default_factory=set)


class Model:
    def __init__(self, ga: int, gr: int, pin_k: int | None, pin_budget: int | None,
                 retention: bool, shared: bool) -> None:
        self.ga, self.gr = ga, gr
        self.pin_k, self.pin_budget, self.retention, self.shared = \
            pin_k, pin_budget, retention, shared
        self.index: dict[int, Entry] = {}
        self.reqs: dict[str, Req] = {}
        self.demand: dict[int, set[str]] = {}
        self.pins: dict[Entry, str] = {}
        self.lru: dict[str, dict[Entry, None]] = {}

    # -- protection and LRU --------------------------------------------------------------------
    def pool(self, e: Entry) -> str:
        return "shared" if self.shared else \
            ("attention" if e.kind == StateKind.ATTENTION else "recurrent")

    def protected(self, e: Entry) -> bool:
        return bool(e.holders) or e in self.pins

    def _protect(self, e: Entry) -> None:
        self.lru.get(self.pool(e), {}).pop(e, None)

    def _maybe_cached(self, e: Entry) -> None:
        if e.published and not self.protected(e):
            self.lru.setdefault(self.pool(e), {})[e] = None  # most recently used end

    def _unref(self, e: Entry, rid: str) -> None:
        e.holders.discard(rid)
        self._maybe_cached(e)

    def protected_entries(self) -> set[Entry]:
        out = set(self.pins)
        for r in self.reqs.values():
            out.update(r.blocks)
            out.update(r.ckpts.values())
        return out

    # -- lookup (joint reuse oracle and hit evidence) ------------------------------------------
    def lookup(self, rid: str, attn: list[int], rec: list[int], length: int,
               evidence: bool = True) -> tuple[int, int, int]:
        limit = length - 1
        k = 0
        for i, key in enumerate(attn):
            e = self.index.get(key)
            if (i + 1) * self.ga > limit or e is None or e.kind != StateKind.ATTENTION:
                break
            k = i + 1
        a_max = k * self.ga // self.gr * self.gr
        r_max = j = 0
        for i, key in enumerate(rec):
            b = (i + 1) * self.gr
            if b > limit:
                break
            e = self.index.get(key)
            if e is not None and e.kind == StateKind.RECURRENT:
                if evidence:
                    self.demand.setdefault(key, set()).add(rid)  # resident hit evidence only
                r_max = b
                if b <= a_max:
                    j = b
        return a_max, r_max, j

    # -- operations: each updates the model and returns the events it predicts -------------------
    def adopt(self, rid: str, j: int, attn: list[int], rec: list[int]) -> list[Expect]:
        r = self.reqs[rid]
        ck = self.index[rec[j // self.gr - 1]] if j else None
        for key in attn[:j // self.ga]:
            e = self.index[key]
            e.holders.add(rid)
            self._protect(e)
            r.blocks.append(e)
        if ck is not None:
            ck.holders.add(rid)
            self._protect(ck)
            r.ckpts[j] = ck
        r.top = r.computed = j
        out = self._unpin(rid, r.preemptions)  # only after the adoption's references
        out.append((EventKind.ADOPTION, dict(
            ck.fields() if ck is not None else dict(hash=0, state_kind=StateKind.NONE,
                                                     page=-1, line=-1),
            request_id=rid, preemption_count=r.preemptions, depth=j)))
        return out

    def _unpin(self, rid: str, pc: int) -> list[Expect]:
        out: list[Expect] = []
        for e, owner in list(self.pins.items()):
            if owner == rid:
                out.append((EventKind.UNPIN, dict(e.fields(), request_id=rid,
                                                  preemption_count=pc)))
                del self.pins[e]
                self._maybe_cached(e)
        return out

    def allocate(self, rid: str, n: int) -> None:
        r = self.reqs[rid]
        for i in range(len(r.blocks), -(-n // self.ga)):
            r.blocks.append(Entry(StateKind.ATTENTION, (i + 1) * self.ga, holders={rid}))
        for b in range(r.top + self.gr, -(-n // self.gr) * self.gr + 1, self.gr):
            r.ckpts[b] = Entry(StateKind.RECURRENT, b, holders={rid})
            r.top = b

    def publish(self, rid: str, n: int, attn: list[int], rec: list[int]
                ) -> tuple[list[Expect], list[int]]:
        r = self.reqs[rid]
        r.computed = max(r.computed, n)
        out: list[Expect] = []
        keys: list[int] = []
        todo = [(e, attn, self.ga) for e in r.blocks] + \
            [(r.ckpts[b], rec, self.gr) for b in sorted(r.ckpts)]
        for e, chain, grid in todo:
            if e.depth > r.computed:
                continue  # blocks and checkpoints each in increasing depth
            key = chain[e.depth // grid - 1]
            if e.published or key in self.index:
                continue
            e.key, e.published = key, True
            self.index[key] = e
            if e.kind == StateKind.RECURRENT:
                self.demand.setdefault(key, set()).add(rid)  # owner registration
            keys.append(key)
            out.append((EventKind.PUBLICATION, dict(
                request_id=rid, preemption_count=r.preemptions, hash=key, depth=e.depth,
                state_kind=e.kind)))
        return out, keys

    def _release_event(self, rid: str, e: Entry, cause: Cause) -> Expect:
        return (EventKind.RELEASE, dict(
            e.fields(), request_id=rid, preemption_count=self.reqs[rid].preemptions,
            cause=cause))

    def release_superseded(self, rid: str) -> tuple[list[Expect], list[int]]:
        r = self.reqs[rid]
        done = [b for b in r.ckpts if b <= r.computed]
        out: list[Expect] = []
        kept: list[int] = []
        if not done:
            return out, kept
        newest = max(done)
        for b in sorted(r.ckpts):
            e = r.ckpts[b]
            if b >= newest or e in r.retained:
                continue
            if self.retention and e.published:
                demand = len(self.demand.get(e.key, ()))
                keep = demand >= RETENTION_K
                out.append((EventKind.RETENTION, dict(
                    e.fields(), request_id=rid, preemption_count=r.preemptions,
                    outcome=Outcome.OK if keep else Outcome.BELOW_THRESHOLD,
                    need=RETENTION_K, free=demand)))
                if keep:
                    r.retained.add(e)
                    kept.append(e.key)
                    continue
            del r.ckpts[b]
            out.append(self._release_event(rid, e, Cause.NONE))
            self._unref(e, rid)
        return out, kept

    def _release_all(self, rid: str, cause: Cause) -> list[Expect]:
        r = self.reqs[rid]
        order = [r.ckpts[b] for b in sorted(r.ckpts, reverse=True)] + r.blocks[::-1]
        out = [self._release_event(rid, e, cause) for e in order]  # deepest first
        for e in order:
            self._unref(e, rid)
        r.blocks, r.ckpts, r.retained = [], {}, set()
        r.top = r.computed = 0
        return out

    def preempt(self, rid: str) -> tuple[list[Expect], tuple[int, int, int, bool] | None]:
        r = self.reqs[rid]
        out: list[Expect] = []
        decision = None
        published = [b for b, e in r.ckpts.items() if e.published]
        if self.pin_k is not None and published:
            e = r.ckpts[max(published)]
            requesters = self.demand.setdefault(e.key, set())
            requesters.add(rid)
            within = self.pin_budget is None or len(self.pins) < self.pin_budget
            pin = len(requesters) >= self.pin_k and within and e not in self.pins
            outcome = Outcome.OK if pin else (
                Outcome.BELOW_THRESHOLD if len(requesters) < self.pin_k else Outcome.SKIPPED)
            if pin:
                self.pins[e] = rid
            out.append((EventKind.PIN, dict(
                e.fields(), request_id=rid, preemption_count=r.preemptions,
                outcome=outcome, need=self.pin_k, free=len(requesters))))
            decision = (e.key, e.depth, len(requesters), pin)
        out += self._release_all(rid, Cause.PREEMPTION)
        r.preemptions += 1
        return out, decision

    def release(self, rid: str) -> list[Expect]:
        return self._release_all(rid, Cause.NONE)

    def finish(self, rid: str) -> list[Expect]:
        out = self._release_all(rid, Cause.FINISH)
        out += self._unpin(rid, self.reqs[rid].preemptions)
        del self.reqs[rid]
        return out

    # -- losses ----------------------------------------------------------------------------------
    def lose(self, ev: Event, causes: tuple[Cause, ...], requester: str) -> None:
        """Apply one LOSS event, checking it against the model."""
        e = self.index.get(ev.hash)
        assert e is not None and (e.kind, e.depth) == (ev.state_kind, ev.depth), \
            f"loss of {ev.hash:#x} ({ev.state_kind.name} at {ev.depth}) not discoverable " \
            f"in the model ({None if e is None else (e.kind.name, e.depth)})"
        assert ev.cause in causes, f"loss of {ev.state_kind.name} at {ev.depth} with cause " \
            f"{ev.cause.name}; this operation may only cause {[c.name for c in causes]}"
        assert ev.requester == requester, \
            f"loss by {ev.cause.name} names requester {ev.requester!r}, expected {requester!r}"
        assert e.page < 0 or (ev.page, ev.line) == (e.page, e.line), \
            f"loss of {e.kind.name} at {e.depth} names page {ev.page} line {ev.line}, " \
            f"published as page {e.page} line {e.line}"
        pool = self.lru.setdefault(self.pool(e), {})
        if ev.cause != Cause.INVALIDATION:
            assert not self.protected(e), f"reclaim ({ev.cause.name}) of a protected " \
                f"{e.kind.name} at {e.depth} (holders {sorted(e.holders)}, pinned " \
                f"{e in self.pins})"
            if ev.cause != Cause.SLAB_RECLAIM:
                oldest = next(iter(pool))
                assert oldest is e, f"reclaim out of LRU order: lost {e.kind.name} at " \
                    f"{e.depth} while {oldest.kind.name} at {oldest.depth} is older"
        pool.pop(e, None)
        del self.index[ev.hash]
        e.published = False
        self.demand.pop(ev.hash, None)

    def units_in_use(self, members: int, conv_page: bool) -> tuple[int, int]:
        """(blocks, checkpoint units) of every protected entry (storage that is in use)."""
        blocks = ckpts = 0
        for e in self.protected_entries():
            if e.kind == StateKind.ATTENTION:
                blocks += 1
            else:
                ckpts += members + conv_page
        return blocks, ckpts
