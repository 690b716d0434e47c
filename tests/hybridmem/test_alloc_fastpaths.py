"""The allocator fast paths keep the behaviour of the plain methods: both hash chains packed once
equal the two separate chains, and a block skipped because another copy of its key is
discoverable publishes once that copy is lost (``key_waiters``). Each equality beside its
negative control."""

import pytest

from hybridmem.events import EventKind, RecordingObserver, StateKind
from hybridmem.geometry import PRESETS
from hybridmem.memory.keys import hash_chain, hash_chain_pair
from hybridmem.memory.layouts import build
from hybridmem.units import derive_units

U = derive_units(PRESETS["falcon-h1-7b"])


@pytest.mark.parametrize("n", [0, 15, 16, 512, 1800, 4000])
@pytest.mark.parametrize("grids", [(512, 512), (16, 1792), (16, 16)])
@pytest.mark.parametrize("salt", [(), ("cache_salt", "x")])
def test_hash_chain_pair_equals_two_chains(n, grids, salt):
    tokens = [(7 * i + 3) % 50_000 for i in range(n)]
    ga, gr = grids
    want = (hash_chain(StateKind.ATTENTION, tokens, ga, salt),
            hash_chain(StateKind.RECURRENT, tokens, gr, salt))
    assert hash_chain_pair(tokens, ga, gr, salt) == want
    if n >= max(ga, gr):  # negative control: another salt gives other keys at every depth
        other = hash_chain_pair(tokens, ga, gr, ("cache_salt", "y"))
        assert all(a != b for a, b in zip(other[0] + other[1], want[0] + want[1], strict=True))


def test_hash_chain_pair_raises_what_the_chains_raise():
    with pytest.raises(ValueError, match="grid must be positive"):
        hash_chain_pair([1, 2, 3], 0, 16)
    with pytest.raises(ValueError, match="must be str, int or bytes"):
        hash_chain_pair(list(range(40)), 16, 16, (1.5,))  # type: ignore[arg-type]
    with pytest.raises(OverflowError):
        hash_chain_pair([2 ** 70] * 32, 16, 16)


class _Forgetful(dict):
    """A ``key_waiters`` that never remembers a waiter (the mechanism switched off)."""

    def __setitem__(self, key, value):
        pass

    def setdefault(self, key, default=None):
        return set() if default is None else default


def _two_copies(forgetful):
    """r1 and r2 hold copies of the same 2 blocks; r1 publishes first, r2's copies wait; then
    r1's first block is invalidated. Returns what r2's next publish publishes."""
    obs = RecordingObserver()
    org = build("S0", U, 16, obs)
    if forgetful:
        org.key_waiters = _Forgetful()
    tokens = list(range(1, 1100))
    for rid in ("r1", "r2"):
        org.add_request(rid, tokens)
        org.adopt(rid, org.lookup(rid))
        assert org.allocate(rid, 1024).ok
    assert len(org.publish("r1", 1024)) == 4  # 2 blocks + checkpoints at 512, 1024
    assert org.publish("r2", 1024) == []  # every key is discoverable on r1's copies
    key0 = org.hash_chains("r1")[0][0]
    assert org.invalidate(key0)
    return key0, org.publish("r2", 1024), obs


def test_skipped_copy_publishes_after_the_other_copy_is_lost():
    key0, published, obs = _two_copies(forgetful=False)
    assert published == [key0]
    last = obs.events[-1]
    assert (last.kind, last.request_id, last.hash) == (EventKind.PUBLICATION, "r2", key0)
    # negative control: without the waiter record r2 never rescans and publishes nothing
    _, published, _ = _two_copies(forgetful=True)
    assert published == []


# -- batched pool operations and S2's conv page decoded once ---------------------------------

def _pool_state(pool):
    return (pool.ref_counts(), [pool.holds(p) for p in range(pool.total)], list(pool._free),
            pool.cached_pages(), pool.num_in_use)


def _cached_pool():
    """Pages 0-5 taken, held once, released in order: all six cached, oldest first."""
    from hybridmem.memory.pool import PagePool
    pool = PagePool("t", 8)
    pages = pool.take_many(6)
    pool.hold_many(pages)
    pool.decref_many(pages)
    return pool


@pytest.mark.parametrize("pages", [[3], [1, 4, 2], [5, 0, 3, 1]])
def test_incref_many_and_unhold_many_equal_one_page_at_a_time(pages):
    one, many = _cached_pool(), _cached_pool()
    for p in pages:
        one.incref(p)
    many.incref_many(pages)
    assert _pool_state(one) == _pool_state(many)
    one, many = _cached_pool(), _cached_pool()
    for p in pages:
        one.unhold(p)  # cached -> free, joining the free deque in this order
    many.unhold_many(pages)
    assert _pool_state(one) == _pool_state(many)
    if len(pages) > 1:  # negative control: another order frees the pages in another order
        other = _cached_pool()
        other.unhold_many(pages[::-1])
        assert _pool_state(other) != _pool_state(many)


def _s2_checkpoints(geometry, decoder=None, monkeypatch=None):
    """S2 on ``geometry`` with 40 small requests (slabs fill, empty and get reused); returns
    (line, conv_page) of every live checkpoint and the slots per slab."""
    from hybridmem.memory import placement
    if decoder is not None:
        monkeypatch.setattr(placement, "decode_line", decoder)
    units = derive_units(PRESETS[geometry])
    org = build("S2", units, 96)
    g = org.attention_grid
    for i in range(40):
        rid = f"r{i}"
        org.add_request(rid, [1 + (i % 3)] * g + [1000 + i] * (g * (1 + i % 4) + 1))
        org.adopt(rid, org.lookup(rid))
        n = min(len(org.requests[rid].tokens), 3 * g)
        if org.allocate(rid, n).ok:
            org.publish(rid, n)
            org.release_superseded(rid)
        if i % 3:
            org.finish(rid)
    assert org.slabs is not None
    return ([(ck.conv, ck.conv_page) for ck in org.live_ckpts.values() if ck.conv >= 0],
            org.slabs.slots_per_slab)


def test_s2_conv_page_is_the_decoded_line():
    got, slots = _s2_checkpoints("granite-4.0-h-micro")
    assert slots == 32 and len(got) > 5
    assert all(page == line // slots for line, page in got)  # App. A.3: line = slots p + s


def test_s2_conv_page_follows_the_decoder(monkeypatch):
    """Negative control: the page is what ``placement.decode_line`` says (the seam the mutants
    patch): a decoder that assumes 16 slots on granite's 32-slot slabs gives other pages."""
    from hybridmem.memory.placement import SlotRef

    def decode16(line, slots_per_slab):
        return None if line < 0 else SlotRef(*divmod(line, 16))

    try:
        got, slots = _s2_checkpoints("granite-4.0-h-micro", decode16, monkeypatch)
    except AssertionError as exc:  # the wrong page is held: the pool's own check fires
        assert "hold on free page" in str(exc) or "references" in str(exc), exc
    else:
        assert any(page != line // slots for line, page in got)
