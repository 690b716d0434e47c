"""The organization's integrity checks: every pool's accounting, the slab table, and the
agreement of the tables with the pools (``check_integrity`` raises AssertionError naming the
violated equation). The state machines and ``--check-invariants`` call it after every operation;
serving and simulation never do.

Equations checked::

    free + cached + in use == total                          per pool (PagePool.check_integrity)
    refs(page) == holders + pins of the entries on it         per page (expected_refs)
    units not free == blocks + checkpoints x units each + slabs
    attention / recurrent index: key -> a live entry carrying that key
    owner record set  <=>  page not free                      per page
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybridmem.memory.blocks import Block

if TYPE_CHECKING:
    from hybridmem.memory.checkpoints import Checkpoints
    from hybridmem.memory.interface import Organization

    class _Base(Checkpoints, Organization):
        pass
else:
    _Base = object


class Integrity(_Base):
    """Integrity checks (see :class:`~hybridmem.memory.tables.Tables`)."""

    @property
    def live_blocks(self) -> set[Block]:
        """The blocks with storage: the owner records that are blocks (a block owns exactly its
        page from allocation until it is forgotten; :attr:`num_blocks` counts them)."""
        return {e for owners in self.owner.values() for e in owners if e.__class__ is Block}

    def expected_refs(self, live: set[Block] | None = None) -> dict[tuple[str, int], int]:
        """``(pool, page) -> references`` the holders and pins of the live entries account for
        (pages with none are absent)."""
        refs: dict[tuple[str, int], int] = {}
        for blk in self.live_blocks if live is None else live:
            if blk.holders:
                refs[blk.pool.name, blk.page] = len(blk.holders)
        pool = self.ckpt_pool().name
        for ck in self.live_ckpts.values():
            n = len(ck.holders) + (ck.ident in self.pins)
            if n:
                for p in self.ckpt_pages(ck):
                    refs[pool, p] = refs.get((pool, p), 0) + n
        return refs

    def check_integrity(self) -> None:
        for pool in self.pools():
            pool.check_integrity()
        if self.slabs is not None:
            self.slabs.check_integrity()
        live = self.live_blocks
        refs = self.expected_refs(live)
        for pool in self.pools():
            got, wants, total = pool.ref_counts(), [0] * pool.total, pool.total
            for (name, page), n in refs.items():  # every page's expected count, 0 if none
                if name == pool.name and 0 <= page < total:
                    wants[page] = n
            if got != wants:  # the first page that differs
                page = next(p for p in range(total) if got[p] != wants[p])
                raise AssertionError(
                    f"{self.name} pool {pool.name} page {page}: {pool.refs(page)} references"
                    f", holders and pins account for {wants[page]}")
        used = sum(p.total - p.num_free for p in self.pools())
        xa, xr, m = self.held()
        per_ckpt = self.placement.units_each(self.members)
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
            stale = [p for p in range(pool.total) if (owners[p] is None) != pool.is_free(p)]
            if stale:
                p = stale[0]
                raise AssertionError(f"{self.name} pool {pool.name}: {len(stale)} pages whose "
                                     f"owner record disagrees with their state, first page {p} "
                                     f"({pool.state(p)}, owner {owners[p]!r})")
