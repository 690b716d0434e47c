"""The page pools: one pool of equal pages (S0-S2), and D0's two static pools.

This module is the only code that reads or changes a pool's free deque, its LRU of cached pages
and its per-page counters; the organization asks through the methods below.

Every page is in exactly one of three states, decided by two counters the pool owns::

    refs  holds   state     meaning
    > 0   any     in use    an active request (or a pin / retention) may access it
    0     > 0     cached    unreferenced, but backs >= 1 discoverable entry (reclaimable, LRU)
    0     0       free      backs nothing discoverable; next in the free deque

``refs`` count execution references (each holder increments once); ``holds`` count the
discoverable logical entries (blocks, checkpoints, conv slots) stored on the page. Only the
organization that owns the pool changes them. Reclaiming a cached page (:meth:`reclaim`) drops
all of its holds; the caller must first invalidate every logical entry that depended on it.

Accounting equation, checked by :meth:`check_integrity`: ``free + cached + in_use == total``.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Sequence

from hybridmem.events import StateKind

# watcher(pool name, page, event): "ref0" (last reference dropped), "reclaim" (freed for reuse)
# or "take" (handed out); called inside a batch, so the pool's counts may be unsettled
Watcher = Callable[[str, int, str], None]


class PagePool:
    def __init__(self, name: str, num_pages: int) -> None:
        if num_pages < 0:
            raise ValueError(f"pool {name!r}: page count must be >= 0, got {num_pages}")
        self.name = name
        self.total = num_pages
        self._refs = [0] * num_pages  # changed by incref/decref/take only
        # refs(page): the page's reference count (the list's own lookup: no Python frame, for
        # S2's per-allocation count of slab room, which asks it of every slab with room)
        self.refs: Callable[[int], int] = self._refs.__getitem__
        self._holds = [0] * num_pages  # changed by hold/unhold/reclaim only
        self._free: deque[int] = deque(range(num_pages))  # FIFO of free pages
        self._cached: OrderedDict[int, None] = OrderedDict()  # oldest first (LRU head)
        self.num_in_use = 0
        self.watcher: Watcher | None = None  # debug hook (invariant checkers), None in production

    # -- counts ------------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    @property
    def num_available(self) -> int:
        """Free plus reclaimable cached pages: what an allocation may obtain."""
        return len(self._free) + len(self._cached)

    def ref_counts(self) -> list[int]:
        """A copy of every page's reference count, indexed by page id."""
        return list(self._refs)

    def holds(self, page: int) -> int:
        return self._holds[page]

    def state(self, page: int) -> str:
        if self._refs[page]:
            return "in_use"
        return "cached" if self._holds[page] else "free"

    def is_free(self, page: int) -> bool:
        return not self._refs[page] and not self._holds[page]

    def oldest_cached(self) -> int | None:
        return next(iter(self._cached), None)

    def cached_pages(self) -> list[int]:
        return list(self._cached)

    # -- transitions -------------------------------------------------------------------------
    def take(self) -> int:
        """Pop the next free page with one reference. The caller checked ``num_free``."""
        assert self._free, f"pool {self.name}: take() with no free page; this indicates a " \
            "missing can_allocate/reclaim before allocation"
        page = self._free.popleft()
        self._refs[page] = 1
        self.num_in_use += 1
        if self.watcher is not None:
            self.watcher(self.name, page, "take")
        return page

    def take_many(self, count: int) -> list[int]:
        """:meth:`take` ``count`` times, in one call: the next ``count`` free pages in order."""
        free = self._free
        assert len(free) >= count, f"pool {self.name}: take_many({count}) with {len(free)} " \
            "free pages; this indicates a missing can_allocate/reclaim before allocation"
        popleft, refs = free.popleft, self._refs
        pages = [popleft()] if count == 1 else [popleft() for _ in range(count)]
        for page in pages:
            refs[page] = 1
        self.num_in_use += count
        if self.watcher is not None:
            for page in pages:
                self.watcher(self.name, page, "take")
        return pages

    def incref(self, page: int) -> None:
        self.incref_many((page,))

    def incref_many(self, pages: Sequence[int]) -> None:
        """:meth:`incref` of each page, in one call."""
        refs, holds, cached = self._refs, self._holds, self._cached
        for page in pages:
            if refs[page] == 0:
                if holds[page]:
                    del cached[page]  # cached -> in use
                else:  # pragma: no cover - only reachable through a bug
                    raise AssertionError(f"pool {self.name}: incref of free page {page}; this "
                                         "indicates a reference to storage that holds nothing")
                self.num_in_use += 1
            refs[page] += 1

    def decref(self, page: int) -> None:
        self.decref_many((page,))

    def decref_many(self, pages: Sequence[int]) -> None:
        """Drop one reference of each page, in order (the order pages reach the LRU)."""
        refs, holds, watcher = self._refs, self._holds, self.watcher
        cached, free, unused = self._cached, self._free, 0
        for page in pages:
            assert refs[page] > 0, f"pool {self.name}: decref of page {page} with no " \
                "reference; this indicates a double release"
            left = refs[page] = refs[page] - 1
            if left == 0:
                unused += 1
                if holds[page]:
                    cached[page] = None  # most recently used end
                else:
                    free.append(page)
                if watcher is not None:  # (num_in_use is settled after the batch)
                    watcher(self.name, page, "ref0")
        self.num_in_use -= unused

    def hold(self, page: int) -> None:
        """A discoverable entry now lives on ``page`` (which must be in use or cached)."""
        self.hold_many((page,))

    def hold_many(self, pages: Sequence[int]) -> None:
        """A discoverable entry now lives on each of ``pages`` (in use or cached)."""
        refs, holds = self._refs, self._holds
        for page in pages:
            assert refs[page] or holds[page], f"pool {self.name}: hold on free page " \
                f"{page}; this indicates publishing storage that was already released"
            holds[page] += 1

    def unhold(self, page: int) -> None:
        self.unhold_many((page,))

    def unhold_many(self, pages: Sequence[int]) -> None:
        """:meth:`unhold` of each page, in order (the order freed pages join the free deque)."""
        refs, holds = self._refs, self._holds
        for page in pages:
            assert holds[page] > 0, f"pool {self.name}: unhold of page {page} with no hold"
            left = holds[page] = holds[page] - 1
            if left == 0 and refs[page] == 0:
                del self._cached[page]
                self._free.append(page)

    def touch(self, page: int) -> None:
        """Move a cached page to the most recently used end."""
        if page in self._cached:
            self._cached.move_to_end(page)

    def reclaim(self, page: int) -> None:
        """Drop every hold of the cached ``page`` so it becomes free (for reassignment).

        The caller must already have invalidated every logical entry stored on it.
        """
        assert self._refs[page] == 0, f"pool {self.name}: reclaim of page {page} with " \
            f"{self._refs[page]} references; this indicates reclaiming protected storage"
        if self._holds[page]:
            self._holds[page] = 0
            del self._cached[page]
            self._free.append(page)
        if self.watcher is not None:
            self.watcher(self.name, page, "reclaim")

    # -- integrity ---------------------------------------------------------------------------
    def check_integrity(self) -> None:
        free, cached = len(self._free), len(self._cached)
        if free + cached + self.num_in_use != self.total:
            raise AssertionError(
                f"pool {self.name}: free {free} + cached {cached} + in_use {self.num_in_use} "
                f"= {free + cached + self.num_in_use} != total {self.total}")
        in_use = sum(1 for r in self._refs if r)
        bad_free = [p for p in self._free if self._refs[p] or self._holds[p]]
        bad_cached = [p for p in self._cached if self._refs[p] or not self._holds[p]]
        if in_use != self.num_in_use or bad_free or bad_cached or len(set(self._free)) != free:
            raise AssertionError(
                f"pool {self.name}: in_use counter {self.num_in_use} vs {in_use} referenced "
                f"pages; free pages with refs/holds {bad_free[:5]}; cached pages with refs or "
                f"no holds {bad_cached[:5]}")


class DualPools:
    """D0's two static pools: native attention units and native recurrent composites (§3.5).

    Both pools are sized at start-up from the plan and never change::

        attention pool   A units of 16 a bytes  (16 tokens each; 16,384 B for Falcon-H1-7B)
        recurrent pool   R units of r bytes     (one complete checkpoint each; 1,594,368 B)

    An allocation of one state kind is served only by that kind's pool; a full attention pool is
    not relieved by free recurrent capacity, and vice versa. :meth:`pool_for` is the one place
    that maps a state kind to its pool.
    """

    def __init__(self, attention_units: int, recurrent_units: int) -> None:
        self.attention = PagePool("attention", attention_units)
        self.recurrent = PagePool("recurrent", recurrent_units)
        self._totals = (attention_units, recurrent_units)  # fixed at start-up

    def pool_for(self, kind: StateKind, need: int = 0) -> PagePool:
        """The pool that serves ``kind``; ``need`` is unused: no capacity moves between pools."""
        if kind == StateKind.ATTENTION:
            return self.attention
        if kind == StateKind.RECURRENT:
            return self.recurrent
        raise ValueError(f"D0 has no pool for state kind {kind.name}")

    def check_integrity(self) -> None:
        totals = (self.attention.total, self.recurrent.total)
        if totals != self._totals:
            raise AssertionError(f"D0 pool sizes changed from {self._totals} to {totals}; "
                                 "capacity must not move between the static pools")
        self.attention.check_integrity()
        self.recurrent.check_integrity()
