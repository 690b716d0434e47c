"""Page pool: free / cached / in-use transitions, LRU order, and the accounting equation."""

import pytest

from hybridmem.memory.pool import PagePool


def counts(pool):
    return pool.num_free, pool.num_cached, pool.num_in_use


def test_lifecycle_and_lru_order():
    pool = PagePool("p", 4)
    a, b, c = pool.take(), pool.take(), pool.take()
    assert (a, b, c) == (0, 1, 2) and counts(pool) == (1, 0, 3)
    for p in (a, b):
        pool.hold(p)  # a and b back discoverable entries
    pool.decref(b)
    pool.decref(a)
    pool.decref(c)  # c holds nothing: straight back to free
    # free: [3, 2]; cached LRU: b (released first), then a
    assert counts(pool) == (2, 2, 0) and pool.cached_pages() == [b, a]
    pool.incref(a)  # adopted again: leaves the LRU
    assert pool.cached_pages() == [b] and pool.state(a) == "in_use"
    pool.reclaim(b)
    assert pool.state(b) == "free" and counts(pool) == (3, 0, 1)
    pool.check_integrity()


def test_unhold_of_unreferenced_page_frees_it():
    pool = PagePool("p", 2)
    p = pool.take()
    pool.hold(p)
    pool.decref(p)
    assert pool.state(p) == "cached"
    pool.unhold(p)
    assert pool.state(p) == "free" and pool.num_available == 2


def test_reclaim_of_referenced_page_is_a_bug():
    pool = PagePool("p", 1)
    p = pool.take()
    with pytest.raises(AssertionError, match="reclaiming protected storage"):
        pool.reclaim(p)


def test_integrity_states_the_equation():
    pool = PagePool("p", 3)
    pool.take()
    pool.num_in_use = 2  # corrupt the counter
    with pytest.raises(AssertionError, match=r"free 2 \+ cached 0 \+ in_use 2 = 4 != total 3"):
        pool.check_integrity()
