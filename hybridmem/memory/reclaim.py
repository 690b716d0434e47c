"""Reclaim and invalidation (§3.1, App. D.2): how cached storage is taken back, and LOSS.

A cached unit (no execution reference, still holding a discoverable entry) is reclaimed from the
LRU head of its pool when an allocation needs free units (cause ALLOCATION), by an explicit
eviction (EVICTION), or its entry is invalidated by key (INVALIDATION). Reclaiming a unit first
detaches it from every entry stored on it::

    a block's page      the block
    a member page       its checkpoint (the member becomes MISSING_PAGE)
    S1's conv page      its checkpoint (conv becomes NO_LINE)
    S2's slab page      every checkpoint with a slot in it (conv becomes NO_LINE; cause
                        SLAB_RECLAIM)

then invalidates each entry that is no longer complete (its key leaves the index: a LOSS event,
its other pages' holds dropped), and only then lets the pool hand the unit out again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybridmem.events import Cause, EventKind, StateKind
from hybridmem.memory.blocks import Block
from hybridmem.memory.checkpoints import MISSING_PAGE, Checkpoint
from hybridmem.memory.placement import NO_LINE
from hybridmem.memory.pool import PagePool

if TYPE_CHECKING:
    from hybridmem.memory.blocks import Blocks
    from hybridmem.memory.checkpoints import Checkpoints

    class _Base(Blocks, Checkpoints):
        pass
else:
    _Base = object


class Reclaim(_Base):
    """Reclaim and invalidation (see :class:`~hybridmem.memory.tables.Tables`)."""

    def _make_free(self, pool: PagePool, need: int, requester: str) -> None:
        """Reclaim LRU heads of ``pool`` until ``need`` pages are free."""
        while pool.num_free < need:
            head = pool.oldest_cached()
            if head is None:
                raise AssertionError(f"pool {pool.name}: {pool.num_free} free, need {need}, "
                                     "nothing cached; this indicates can_allocate and "
                                     "allocate disagree")
            self._reclaim(pool, head, Cause.ALLOCATION, requester)

    def _detach(self, pool: PagePool, page: int) -> list[Block | Checkpoint]:
        """Cut ``page`` out of every entry stored on it; return those entries."""
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
        self.placement.detach(entry, page)
        return [entry]

    def _reclaim(self, pool: PagePool, page: int, cause: Cause, requester: str) -> None:
        """Free the cached ``page``: detach it, invalidate every entry that is no longer
        complete, and only then let the pool hand the page out again."""
        slab = self.owner[pool.name][page] == "slab"
        for entry in self._detach(pool, page):
            if isinstance(entry, Block):
                self._lose_block(entry, cause, requester)
            elif not self._complete(entry):
                self._lose_ckpt(entry, Cause.SLAB_RECLAIM if slab else cause, requester)
        pool.reclaim(page)
        self.owner[pool.name][page] = None

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
        self._emit(EventKind.LOSS, hash=key, depth=blk.depth, state_kind=StateKind.ATTENTION,
                   page=blk.page, cause=cause, requester=requester)
        blk.pool.unhold(blk.page)
        if not blk.holders:
            self._forget_block(blk)

    def _lose_ckpt(self, ck: Checkpoint, cause: Cause, requester: str) -> None:
        """Invalidate the discoverable ``ck``: its key leaves the index, its pages' holds are
        dropped, and it is forgotten unless a request or a pin still holds it."""
        key = ck.key
        del self.rec_index[key]
        self.demand.pop(key, None)
        ck.key = 0
        self._emit(EventKind.LOSS, hash=key, cause=cause, requester=requester,
                   **self._ckpt_fields(ck))
        held = bool(ck.holders) or ck.ident in self.pins
        pool = self.ckpt_pool()
        owners = self.owner[pool.name]
        if not held:
            self.placement.release_slot(ck, owners)  # S2's sentinel (slab gone) clears nothing
        pages = self.ckpt_pages(ck)
        if pages:
            pool.unhold_many(pages)
        if not held:
            self._forget_ckpt(ck, owners)

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
