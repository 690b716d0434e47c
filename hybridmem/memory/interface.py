"""The interface every memory organization implements, and its typed results (SPEC §2, §5).

An engine drives an organization per request in this order (each pure check beside its
mutation)::

    add_request(r, tokens, salt)                    register; the hash chains are fixed here
    hit = lookup(r)          -> LookupResult        pure except demand registration (hit evidence)
    adopt(r, hit)                                   execution references first, then pins dropped
    pages_needed(r, n) / can_allocate(r, n)         pure
    allocate(r, n)           -> AllocationResult    reclaims LRU cached storage if needed
    publish(r, computed)                            full blocks / checkpoints become discoverable
    release_superseded(r)                           older checkpoints released (or retained)
    preempt(r) | finish(r)                          pin decision, then every reference released

Every state change reaches the observer as an :class:`hybridmem.events.Event`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import NamedTuple


class Need(NamedTuple):
    """Units an allocation needs: ``attention`` blocks and ``recurrent`` units (S1: 4 pages per
    checkpoint; S2: 3 per checkpoint plus new slabs). One shared pool serves both for S0-S2;
    D0 draws each from its own pool."""

    attention: int
    recurrent: int

    @property
    def total(self) -> int:
        return self.attention + self.recurrent


class AllocationResult(NamedTuple):
    ok: bool
    need: Need
    available: Need  # free + reclaimable cached units per pool (shared: both fields equal)


class CheckpointHit(NamedTuple):
    key: int
    boundary: int
    members: tuple[int, ...]  # SSM member page ids (S0/D0: the one page / composite)
    conv: int  # conv location: S1 page id, S2 line id 16p+s, S0/D0 the member page


class LookupResult(NamedTuple):
    """Joint reuse at one lookup (SPEC §5), all depths in tokens on the recurrent grid.

    ``a_max``: deepest recurrent boundary covered by the contiguous valid attention prefix;
    ``r_max``: deepest complete checkpoint regardless of attention; ``j``: deepest boundary with
    both. ``blocks`` are the attention pages covering ``[0, j)`` and ``checkpoint`` the state at
    ``j`` (None when ``j == 0``): the physical ids to adopt.
    """

    request_id: str
    a_max: int
    r_max: int
    j: int
    blocks: tuple[int, ...]
    block_keys: tuple[int, ...]
    checkpoint: CheckpointHit | None

    @property
    def gap_r(self) -> int:
        return self.r_max - self.j


class Held(NamedTuple):
    """What an organization holds in storage (in use or cached): ``attention`` blocks on its
    own grid (D0: native 16-token units), ``recurrent`` checkpoints, ``slabs`` (S2 only)."""

    attention: int
    recurrent: int
    slabs: int


class PinDecision(NamedTuple):
    key: int
    boundary: int
    demand: int
    pinned: bool


class Organization(ABC):
    """A memory organization: allocation units, pools, mapping and lifetime rules."""

    name: str
    attention_grid: int  # tokens per attention block
    recurrent_grid: int  # tokens between checkpoints

    @abstractmethod
    def add_request(self, request_id: str, token_ids: Sequence[int],
                    cache_salt: str | None = None) -> None:
        """Register a request (waiting); its hash chains include ``cache_salt``."""

    @abstractmethod
    def append_tokens(self, request_id: str, token_ids: Sequence[int]) -> None:
        """Extend a request's known tokens (decode); extends its hash chains."""

    @abstractmethod
    def hash_chains(self, request_id: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(attention keys per block, recurrent keys per checkpoint boundary)."""

    @abstractmethod
    def lookup(self, request_id: str) -> LookupResult:
        """Joint-reuse lookup. Mutates only the demand record (hit evidence); the result is safe
        to adopt until the next mutating call."""

    @abstractmethod
    def adopt(self, request_id: str, hit: LookupResult) -> None:
        """Take execution references on ``hit`` (before any pin is released); ADOPTION event."""

    @abstractmethod
    def pages_needed(self, request_id: str, num_tokens: int) -> Need:
        """Pure: units to add so the request holds storage for ``num_tokens`` tokens."""

    @abstractmethod
    def can_allocate(self, request_id: str, num_tokens: int) -> bool:
        """Pure: whether :meth:`allocate` would succeed now."""

    @abstractmethod
    def allocate(self, request_id: str, num_tokens: int) -> AllocationResult:
        """Grow the request's blocks and checkpoints, reclaiming LRU cached storage (with LOSS
        events) when needed; emits one ALLOCATION event per pool; no change when rejected."""

    @abstractmethod
    def publish(self, request_id: str, num_computed: int) -> list[int]:
        """Make full blocks and checkpoints at boundaries <= ``num_computed`` discoverable."""

    @abstractmethod
    def release_superseded(self, request_id: str) -> list[int]:
        """Release checkpoints older than the newest complete one, except those retained;
        returns the keys retained."""

    @abstractmethod
    def preempt(self, request_id: str) -> PinDecision | None:
        """Pin decision for the rightmost complete checkpoint, then release every reference."""

    @abstractmethod
    def release(self, request_id: str) -> None:
        """Release every reference (e.g. a failed admission); the request stays waiting."""

    @abstractmethod
    def finish(self, request_id: str) -> None:
        """Release every reference and pin of the request and forget it."""

    @abstractmethod
    def evict(self, num_units: int) -> int:
        """Reclaim up to ``num_units`` LRU cached units (EVICTION); returns how many."""

    @abstractmethod
    def invalidate(self, key: int) -> bool:
        """Explicitly invalidate a discoverable key (INVALIDATION); False if not discoverable."""

    @abstractmethod
    def available(self) -> Need:
        """Free plus reclaimable units per pool."""

    @abstractmethod
    def held(self) -> Held: ...

    @abstractmethod
    def allocated_bytes(self) -> int:
        """Bytes of every unit not free (in use or cached), counted once per unit."""

    @abstractmethod
    def check_integrity(self) -> None:
        """Raise AssertionError stating the violated equation (free + cached + in use == total
        per pool, slab occupancy, entry/storage agreement)."""
