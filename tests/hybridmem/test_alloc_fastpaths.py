"""The allocator fast paths of issue 15 keep the old behaviour: both hash chains packed once
equal the two separate chains, and a block skipped because another copy of its key is
discoverable publishes once that copy is lost (``key_waiters``). Each equality beside its
negative control."""

import pytest

from hybridmem.events import EventKind, RecordingObserver, StateKind
from hybridmem.geometry import PRESETS
from hybridmem.hashing import hash_chain, hash_chain_pair
from hybridmem.organization import build
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
    with pytest.raises(struct_error()):
        hash_chain_pair([2 ** 70] * 32, 16, 16)


def struct_error():
    import struct
    return struct.error


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
