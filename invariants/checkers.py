"""Runtime checkers for the four safety invariants of App. D.2 (Table D-1).

=========================  ==================================================================
invariant                  checked as
=========================  ==================================================================
complete checkpoint        every discoverable checkpoint, and every checkpoint a lookup
                           returns, has all SSM members and its conv state present
protected access           every unit a request holds (or adopts, while adoption runs) has
                           the references its holders and pins account for, and is owned by
                           the entry the request reads; no such unit reaches zero references
invalidate before reuse    every discoverable entry's units are not free and still owned by
                           it; a unit handed out by the pool backs no discoverable entry
valid location or absence  a conv line is the sentinel or a non-negative ``16 p + s`` whose
                           slab page ``p`` holds this checkpoint in slot ``s``; line 0 is valid
=========================  ==================================================================

D0 adds a structural check, *static pools*: blocks live only in the attention pool and
checkpoints only in the recurrent pool, whose sizes never change.

The checkers read the organization's tables but never call its predicates
(``checkpoints.is_complete``, ``placement.decode_line``): they recompute everything, so a bug in
those predicates cannot hide itself. :class:`DebugOrganization` wraps any organization and runs
every check after every mutating call, plus two transient checks through pool watchers.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

from hybridmem.events import StateKind
from hybridmem.memory.blocks import Block
from hybridmem.memory.checkpoints import Checkpoint
from hybridmem.memory.interface import (
    AllocationResult,
    Held,
    LookupResult,
    Need,
    Organization,
    PinDecision,
)
from hybridmem.memory.organization import MemoryOrganization
from hybridmem.memory.placement import NO_LINE, ConvPlacement
from hybridmem.memory.pool import PagePool

ACTIONS = {"reclaim": "reclaimed for reuse", "take": "reassigned"}


class Invariant(Enum):
    COMPLETE_CHECKPOINT = "complete checkpoint"
    PROTECTED_ACCESS = "protected access"
    INVALIDATE_BEFORE_REUSE = "invalidate before reuse"
    VALID_LOCATION = "valid location or absence"
    STATIC_POOLS = "static pools"  # D0 only; not one of the four of Table D-1


class InvariantViolation(AssertionError):
    """An invariant broke: names the invariant, the storage unit and the logical entry."""

    def __init__(self, invariant: Invariant, unit: str, entry: str, detail: str) -> None:
        self.invariant = invariant
        self.unit = unit
        self.entry = entry
        super().__init__(f"[{invariant.value}] unit {unit}, entry {entry}: {detail}")


def _ck_name(ck: Checkpoint) -> str:
    return f"checkpoint #{ck.ident} key={ck.key:#x} boundary={ck.boundary}"


def _blk_name(blk: Block) -> str:
    return f"block key={blk.key:#x} depth={blk.depth}"


class Checker:
    """All checks for one organization (works on every :class:`MemoryOrganization`)."""

    def __init__(self, org: MemoryOrganization) -> None:
        self.org = org
        self.adopting: set[tuple[str, int]] = set()  # (pool, page) of an adoption in flight
        self._on_page: dict[tuple[str, int], list[object]] | None = None  # built at first take
        self.rpool = org.pool_for(StateKind.RECURRENT)
        self.apool = org.pool_for(StateKind.ATTENTION)

    # -- independent arithmetic --------------------------------------------------------------
    def _slots(self) -> int:
        assert self.org.slabs is not None
        return self.org.slabs.slots_per_slab

    def conv_units(self, ck: Checkpoint) -> list[int]:
        """Pages carrying the conv state of ``ck`` (computed here, not by the organization)."""
        if ck.conv < 0:
            return []
        if self.org.placement.kind == ConvPlacement.INSIDE:
            return []
        if self.org.placement.kind == ConvPlacement.PAGE:
            return [ck.conv]
        return [ck.conv // self._slots()]

    def ckpt_units(self, ck: Checkpoint) -> list[int]:
        return [p for p in ck.members if p >= 0] + self.conv_units(ck)

    # -- the four invariants -----------------------------------------------------------------
    def check_complete(self, ck: Checkpoint, where: str) -> None:
        org = self.org
        if len(ck.members) != org.members:
            raise InvariantViolation(Invariant.COMPLETE_CHECKPOINT, f"{len(ck.members)} members",
                                     _ck_name(ck), f"{where}: needs {org.members} SSM members")
        for j, p in enumerate(ck.members):
            if not 0 <= p < self.rpool.total:
                raise InvariantViolation(Invariant.COMPLETE_CHECKPOINT,
                                         f"{self.rpool.name} member {j} = {p}", _ck_name(ck),
                                         f"{where}: SSM member missing")
        if ck.conv < 0:
            raise InvariantViolation(Invariant.COMPLETE_CHECKPOINT, f"conv {ck.conv}",
                                     _ck_name(ck), f"{where}: conv state absent")
        if org.placement.kind == ConvPlacement.INSIDE and ck.conv != ck.members[0]:
            raise InvariantViolation(Invariant.COMPLETE_CHECKPOINT, f"conv {ck.conv}",
                                     _ck_name(ck), f"{where}: conv not inside member 0")

    def check_discoverable(self) -> None:
        """Complete checkpoint + invalidate before reuse over both indexes."""
        org = self.org
        for blk in org.attn_index.values():
            self._check_owned(blk.pool, blk.page, blk, "attention block")
        for ck in org.rec_index.values():
            self.check_complete(ck, "discoverable")
            for p in ck.members:
                self._check_owned(self.rpool, p, ck, "SSM member")
            if org.placement.kind == ConvPlacement.PAGE:
                self._check_owned(self.rpool, ck.conv, ck, "conv page")
            elif org.placement.kind == ConvPlacement.SLOT:
                page = ck.conv // self._slots()
                if self.rpool.is_free(page) or org.owner[self.rpool.name][page] != "slab":
                    raise InvariantViolation(
                        Invariant.INVALIDATE_BEFORE_REUSE, f"{self.rpool.name} page {page}",
                        _ck_name(ck), f"conv line {ck.conv} points into a page that is "
                        f"{self.rpool.state(page)} and owned by "
                        f"{org.owner[self.rpool.name][page]!r}, not a slab")

    def _check_owned(self, pool: PagePool, page: int, entry: object, what: str) -> None:
        owner = self.org.owner[pool.name][page]
        if pool.is_free(page) or owner is not entry:
            raise InvariantViolation(
                Invariant.INVALIDATE_BEFORE_REUSE, f"{pool.name} page {page}", _describe(entry),
                f"{what} is discoverable but its page is {pool.state(page)} and owned by "
                f"{_describe(owner)}")

    def check_protected(self) -> None:
        org = self.org
        want: dict[tuple[str, int], int] = {}
        for rid, req in org.requests.items():
            for blk in req.blocks:
                if org.owner[blk.pool.name][blk.page] is not blk or rid not in blk.holders:
                    raise InvariantViolation(
                        Invariant.PROTECTED_ACCESS, f"{blk.pool.name} page {blk.page}",
                        _blk_name(blk), f"request {rid} reads a page owned by "
                        f"{_describe(org.owner[blk.pool.name][blk.page])}")
                want[blk.pool.name, blk.page] = want.get((blk.pool.name, blk.page), 0) + 1
            for ck in req.ckpts.values():
                self.check_complete(ck, f"held by {rid}")
                own_page = org.placement.kind == ConvPlacement.PAGE
                for p in ck.members + ([ck.conv] if own_page else []):
                    if org.owner[self.rpool.name][p] is not ck:
                        raise InvariantViolation(
                            Invariant.PROTECTED_ACCESS, f"{self.rpool.name} page {p}",
                            _ck_name(ck), f"request {rid} reads a page owned by "
                            f"{_describe(org.owner[self.rpool.name][p])}")
                for p in self.ckpt_units(ck):
                    want[self.rpool.name, p] = want.get((self.rpool.name, p), 0) + 1
        for ck, _owner in org.pins.values():
            for p in self.ckpt_units(ck):
                want[self.rpool.name, p] = want.get((self.rpool.name, p), 0) + 1
        for pool in org.pools():
            expected = [0] * pool.total
            for (name, page), n in want.items():
                if name == pool.name:
                    if not 0 <= page < pool.total:
                        raise InvariantViolation(Invariant.PROTECTED_ACCESS, f"{name} page {page}",
                                                 "-", "held storage outside the pool")
                    expected[page] = n
            got = pool.ref_counts()
            if got == expected:
                continue
            for page in range(pool.total):
                need = expected[page]
                if got[page] != need:
                    raise InvariantViolation(
                        Invariant.PROTECTED_ACCESS, f"{pool.name} page {page}",
                        _describe(org.owner[pool.name][page]),
                        f"{pool.refs(page)} execution references, but request tables and pins "
                        f"account for {need}")

    def check_locations(self) -> None:
        org = self.org
        if org.placement.kind != ConvPlacement.SLOT:
            for ck in org.live_ckpts.values():
                if ck.conv < 0 and ck.conv != NO_LINE:
                    raise InvariantViolation(Invariant.VALID_LOCATION, f"conv {ck.conv}",
                                             _ck_name(ck), "negative location other than the "
                                             "sentinel")
            return
        assert org.slabs is not None
        slots = self._slots()
        table = org.slabs._slabs  # read directly: never through decode_line
        for ck in org.live_ckpts.values():
            if ck.conv == NO_LINE:
                if ck.key or ck.holders:
                    raise InvariantViolation(Invariant.VALID_LOCATION, "line NO_LINE",
                                             _ck_name(ck), "absent conv state in a checkpoint "
                                             "that is discoverable or held")
                continue
            if ck.conv < 0:
                raise InvariantViolation(Invariant.VALID_LOCATION, f"line {ck.conv}",
                                         _ck_name(ck), "negative line other than the sentinel")
            page, slot = divmod(ck.conv, slots)
            slab = table[page] if page < len(table) else None
            if slab is None or slab[slot] != ck.ident:
                raise InvariantViolation(
                    Invariant.VALID_LOCATION, f"line {ck.conv} (page {page} slot {slot})",
                    _ck_name(ck), f"slot holds {None if slab is None else slab[slot]!r}")
        for page, slab in enumerate(table):
            if slab is None:
                continue
            for slot, ident in enumerate(slab):
                if ident is None:
                    continue
                occupant = org.live_ckpts.get(ident)
                if occupant is None or occupant.conv != slots * page + slot:
                    raise InvariantViolation(
                        Invariant.VALID_LOCATION, f"line {slots * page + slot}",
                        f"checkpoint #{ident}", "slot occupied by a checkpoint that does not "
                        f"point back to it ({None if occupant is None else occupant.conv})")

    def check_static_pools(self) -> None:
        org = self.org
        if self.apool is self.rpool:
            return
        for blk in org.live_blocks:
            if blk.pool is not self.apool:
                raise InvariantViolation(Invariant.STATIC_POOLS, f"{blk.pool.name} page "
                                         f"{blk.page}", _blk_name(blk),
                                         "attention block stored outside the attention pool")
        for ck in org.live_ckpts.values():
            for p in ck.members:
                if p >= self.rpool.total or (p >= 0 and org.owner[self.rpool.name][p] is not ck):
                    raise InvariantViolation(Invariant.STATIC_POOLS, f"recurrent unit {p}",
                                             _ck_name(ck), "checkpoint unit not owned in the "
                                             "recurrent pool")

    def check_all(self) -> None:
        self._on_page = None
        self.check_static_pools()
        self.check_locations()
        self.check_discoverable()
        self.check_protected()

    # -- transient checks through pool watchers ----------------------------------------------
    def watch(self, pool: str, page: int, event: str) -> None:
        if event == "ref0" and (pool, page) in self.adopting:
            raise InvariantViolation(Invariant.PROTECTED_ACCESS, f"{pool} page {page}",
                                     _describe(self.org.owner[pool][page]),
                                     "last execution reference dropped while an adoption of "
                                     "this page is in flight")
        if event in ("reclaim", "take"):
            if self._on_page is None:  # built once per call: no publication inside one call
                self._on_page = self._discoverable_pages()
            for entry in self._on_page.get((pool, page), ()):
                if self._still_on(entry, page):  # the map may hold entries lost since
                    raise InvariantViolation(
                        Invariant.INVALIDATE_BEFORE_REUSE, f"{pool} page {page}",
                        _describe(entry), f"page {ACTIONS[event]} while a discoverable entry "
                        "still depends on it")

    def _still_on(self, entry: object, page: int) -> bool:
        """``entry`` is still discoverable and still stored on ``page``."""
        org = self.org
        if isinstance(entry, Block):
            return bool(entry.key) and org.attn_index.get(entry.key) is entry \
                and entry.page == page
        assert isinstance(entry, Checkpoint)
        return bool(entry.key) and org.rec_index.get(entry.key) is entry \
            and (page in entry.members or page in self.conv_units(entry))

    def _discoverable_pages(self) -> dict[tuple[str, int], list[object]]:
        """(pool, page) -> the discoverable entries stored on it (named only on a violation)."""
        org = self.org
        on: dict[tuple[str, int], list[object]] = {}
        for blk in org.attn_index.values():
            key = (blk.pool.name, blk.page)
            if key in on:
                on[key].append(blk)
            else:
                on[key] = [blk]
        rpool = self.rpool.name
        for ck in org.rec_index.values():
            for p in [p for p in ck.members if p >= 0] + self.conv_units(ck):
                on.setdefault((rpool, p), []).append(ck)
        return on


def _describe(owner: object) -> str:
    if isinstance(owner, Block):
        return _blk_name(owner)
    if isinstance(owner, Checkpoint):
        return _ck_name(owner)
    return repr(owner)


class DebugOrganization(Organization):
    """Wraps an organization; runs every invariant check after each mutating call."""

    def __init__(self, org: MemoryOrganization) -> None:
        self.inner = org
        self.checker = Checker(org)
        self.name = org.name
        self.attention_grid = org.attention_grid
        self.recurrent_grid = org.recurrent_grid
        for pool in org.pools():
            pool.watcher = self.checker.watch
        self.checker.check_all()

    def _after(self) -> None:
        self.checker.check_all()

    def add_request(self, request_id: str, token_ids: Sequence[int],
                    cache_salt: str | None = None) -> None:
        self.inner.add_request(request_id, token_ids, cache_salt)

    def append_tokens(self, request_id: str, token_ids: Sequence[int]) -> None:
        self.inner.append_tokens(request_id, token_ids)

    def hash_chains(self, request_id: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return self.inner.hash_chains(request_id)

    def lookup(self, request_id: str) -> LookupResult:
        hit = self.inner.lookup(request_id)
        if hit.checkpoint is not None:
            ck = self.inner.rec_index.get(hit.checkpoint.key)
            if ck is None:
                raise InvariantViolation(Invariant.COMPLETE_CHECKPOINT, "-",
                                         f"key={hit.checkpoint.key:#x}", "hit not discoverable")
            self.checker.check_complete(ck, f"lookup hit for {request_id}")
        return hit

    def adopt(self, request_id: str, hit: LookupResult) -> None:
        apool = self.inner.pool_for(StateKind.ATTENTION).name
        rpool = self.inner.pool_for(StateKind.RECURRENT).name
        flight = {(apool, p) for p in hit.blocks}
        if hit.checkpoint is not None:
            ck = self.inner.rec_index.get(hit.checkpoint.key)
            if ck is not None:
                flight |= {(rpool, p) for p in self.checker.ckpt_units(ck)}
        self.checker.adopting = flight
        try:
            self.inner.adopt(request_id, hit)
        finally:
            self.checker.adopting = set()
        self._after()

    def pages_needed(self, request_id: str, num_tokens: int) -> Need:
        return self.inner.pages_needed(request_id, num_tokens)

    def can_allocate(self, request_id: str, num_tokens: int) -> bool:
        return self.inner.can_allocate(request_id, num_tokens)

    def allocate(self, request_id: str, num_tokens: int) -> AllocationResult:
        result = self.inner.allocate(request_id, num_tokens)
        self._after()
        return result

    def publish(self, request_id: str, num_computed: int) -> list[int]:
        keys = self.inner.publish(request_id, num_computed)
        self._after()
        return keys

    def release_superseded(self, request_id: str) -> list[int]:
        kept = self.inner.release_superseded(request_id)
        self._after()
        return kept

    def preempt(self, request_id: str) -> PinDecision | None:
        decision = self.inner.preempt(request_id)
        self._after()
        return decision

    def release(self, request_id: str) -> None:
        self.inner.release(request_id)
        self._after()

    def finish(self, request_id: str) -> None:
        self.inner.finish(request_id)
        self._after()

    def evict(self, num_units: int) -> int:
        n = self.inner.evict(num_units)
        self._after()
        return n

    def invalidate(self, key: int) -> bool:
        done = self.inner.invalidate(key)
        self._after()
        return done

    def available(self) -> Need:
        return self.inner.available()

    def held(self) -> Held:
        return self.inner.held()

    def allocated_bytes(self) -> int:
        return self.inner.allocated_bytes()

    def check_integrity(self) -> None:
        self.inner.check_integrity()
        self.checker.check_all()
