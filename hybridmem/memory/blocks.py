"""Attention blocks (§3.1): one unit of ``g_a`` tokens (512 shared, 16 D0) on one page.

A block is allocated with its request's reference, published under its chained key once its
tokens are computed (then the page holds it and it is discoverable), adopted by later requests
(more references), and forgotten when it has neither a holder nor a key: its page is then free.
Two requests may compute the same block: the first copy published is the discoverable one; the
other request waits on that key (``key_waiters``) and publishes its copy if the first is lost.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hybridmem.events import EventKind, StateKind
from hybridmem.memory.pool import PagePool

if TYPE_CHECKING:
    from hybridmem.memory.tables import RequestState
    from hybridmem.memory.tables import Tables as _Base
else:
    _Base = object


@dataclass(eq=False, slots=True)
class Block:
    """One attention unit (512 tokens shared, 16 tokens D0) on one page of ``pool``."""

    pool: PagePool
    page: int
    depth: int  # tokens: end boundary of the block
    key: int = 0  # cache key while discoverable, else 0
    holders: set[str] = field(default_factory=set)  # request ids with an execution reference


class Blocks(_Base):
    """The organization's block operations (see :class:`~hybridmem.memory.tables.Tables`)."""

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
        pages that become cached); a block left with no holder and no key is forgotten."""
        pool = blks[0].pool
        for blk in blks:
            blk.holders.remove(holder)
        pool.decref_many([blk.page for blk in blks])
        for blk in blks:
            if not blk.holders and not blk.key:  # no holder and no key: forget it
                self._forget_block(blk)

    def _forget_block(self, blk: Block) -> None:
        """``blk`` has no holder and no key: its page is free, the object kept for reuse."""
        pool, page = blk.pool, blk.page
        assert pool.is_free(page), f"block on page {page} forgotten while its page is not " \
            "free; this indicates a reference or hold leak"
        self.num_blocks -= 1
        self.owner[pool.name][page] = None
        self._spare(pool)[page] = blk

    def _spare(self, pool: PagePool) -> list[Block | None]:
        """``pool``'s spare blocks (see :attr:`spare_blocks`)."""
        spare = self.spare_blocks.get(pool.name)
        if spare is None:
            spare = self.spare_blocks[pool.name] = [None] * pool.total
        return spare

    def _new_blocks(self, req: RequestState, pool: PagePool, count: int) -> None:
        """``count`` new blocks after ``req``'s last, on the next free pages of ``pool``."""
        owners, spare, ga = self.owner[pool.name], self._spare(pool), self.attention_grid
        depth = len(req.blocks) * ga
        for page in pool.take_many(count):
            depth += ga
            blk = spare[page]
            if blk is None:
                blk = Block(pool, page, depth, 0, {req.request_id})
            else:  # the block last forgotten on this page: reused (as vLLM's pool does)
                assert not blk.key and not blk.holders, f"spare block on page {page} with key " \
                    f"{blk.key:#x}, holders {blk.holders}; this indicates a block forgotten " \
                    "while discoverable or referenced"
                spare[page] = None
                blk.depth = depth
                blk.holders.add(req.request_id)
            owners[page] = blk
            req.blocks.append(blk)
        self.num_blocks += count

    def _publish_blocks(self, req: RequestState, published: list[int]) -> None:
        """Make ``req``'s full blocks within its computed tokens discoverable (their pages held),
        appending the keys to ``published``.

        Block i ends at (i + 1) g_a, so the blocks within ``computed`` are the first
        ``stop = computed // g_a``. The first ``req.keyed`` blocks are settled: each carries its
        key, or its key is discoverable on another copy (then the request is in ``key_waiters``
        of that key). Only a loss removes a key from the index, and it resets the count of the
        block's holders and of that key's waiters, so the settled blocks are skipped.
        """
        blocks, keyed, request_id = req.blocks, req.keyed, req.request_id
        stop = req.computed // self.attention_grid
        if keyed >= stop or keyed >= len(blocks):
            return
        attn_index, waiters, pages = self.attn_index, self.key_waiters, []
        for blk, key in zip(blocks[keyed:stop], req.attn_chain[keyed:stop], strict=False):
            if blk.key:
                continue  # already discoverable (published or adopted)
            if key in attn_index:  # another request's copy is discoverable
                waiters.setdefault(key, set()).add(request_id)
                req.waits.append(key)
                continue
            blk.key = key
            attn_index[key] = blk
            pages.append(blk.page)
            published.append(key)
            self._emit(EventKind.PUBLICATION, request_id=request_id,
                       preemption_count=req.preemptions, hash=key, depth=blk.depth,
                       state_kind=StateKind.ATTENTION, page=blk.page)
        if pages:
            blocks[0].pool.hold_many(pages)
        req.keyed = min(stop, len(blocks))
