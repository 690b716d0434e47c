"""Chained keys: deterministic, chained, namespaced by state kind, isolated by cache_salt."""

import struct

import pytest

from hybridmem.events import StateKind
from hybridmem.memory.keys import chunk_hash, extra_keys, hash_chain, hash_chain_pair, token_array

A, R = StateKind.ATTENTION, StateKind.RECURRENT
TOKENS = list(range(1, 2049))  # four 512-token chunks


def test_chain_is_deterministic_and_pinned():
    # the same input always gives the same key (a fixed value guards the encoding)
    assert hash_chain(A, TOKENS, 512) == hash_chain(A, list(TOKENS), 512)
    assert chunk_hash(A, 0, [1, 2, 3]) == 0x23893163175F5CFA


def test_chain_links_every_prefix():
    keys = hash_chain(A, TOKENS, 512)
    assert len(keys) == 4
    assert keys[1] == chunk_hash(A, keys[0], TOKENS[512:1024])
    changed = TOKENS[:600] + [0] + TOKENS[601:]  # token 600 lies in chunk 1
    other = hash_chain(A, changed, 512)
    # chunk 0 unchanged; chunk 1 and every later key change with it
    assert other[0] == keys[0]
    assert all(o != k for o, k in zip(other[1:], keys[1:], strict=True))


def test_kinds_never_collide_on_the_same_grid():
    assert not set(hash_chain(A, TOKENS, 512)) & set(hash_chain(R, TOKENS, 512))


def test_salt_changes_every_key():
    plain = hash_chain(A, TOKENS, 512)
    salted = hash_chain(A, TOKENS, 512, extra_keys("alice"))
    other = hash_chain(A, TOKENS, 512, extra_keys("bob"))
    assert not set(plain) & set(salted) and not set(salted) & set(other)
    assert extra_keys(None) == ()


def test_partial_chunk_has_no_key_and_chain_extends():
    assert len(hash_chain(A, TOKENS[:1023], 512)) == 1
    head = hash_chain(A, TOKENS, 512)[:2]
    tail = hash_chain(A, TOKENS, 512, parent=head[-1], start=1024)
    assert head + tail == hash_chain(A, TOKENS, 512)


def test_bad_arguments_raise_with_values():
    with pytest.raises(ValueError, match="1000 is not a multiple"):
        hash_chain(A, TOKENS, 512, start=1000)
    with pytest.raises(ValueError, match="must be str, int or bytes"):
        chunk_hash(A, 0, [1], (1.5,))  # type: ignore[arg-type]


def _reference_chain(kind, tokens, grid, extra=(), parent=0, start=0, token_fmt="<{}q"):
    """The per-chunk encoding hash_chain had before its fast path (three updates per chunk)."""
    import hashlib
    import struct

    from hybridmem.memory.keys import _encode_extra

    keys = []
    for lo in range(start, len(tokens) - grid + 1, grid):
        chunk = tokens[lo:lo + grid]
        h = hashlib.blake2b(digest_size=8)
        h.update(struct.pack("<BQI", int(kind), parent, len(chunk)))
        h.update(struct.pack(token_fmt.format(len(chunk)), *chunk))
        h.update(_encode_extra(tuple(extra)))
        parent = int.from_bytes(h.digest(), "big") or 1
        keys.append(parent)
    return keys


def _cases():
    import random

    rng = random.Random(20261201)
    extras = [(), extra_keys("alice"), ("cache_salt", "ü"), (7, b"\x00raw", -3)]
    for _ in range(60):
        grid = rng.choice([16, 32, 512, 48])
        n = rng.randrange(0, 12 * grid)
        tokens = [rng.randrange(0, 2**31) for _ in range(n)]
        start = rng.randrange(0, 4) * grid
        parent = rng.choice([0, 1, rng.randrange(2**64)])
        yield rng.choice([A, R]), tokens, grid, rng.choice(extras), parent, start


def test_fast_chain_hashes_the_same_bytes_as_the_per_chunk_encoding():
    cases = list(_cases())
    assert sum(len(_reference_chain(*c)) for c in cases) > 100  # not vacuous
    for kind, tokens, grid, extra, parent, start in cases:
        want = _reference_chain(kind, tokens, grid, extra, parent, start)
        assert hash_chain(kind, tokens, grid, extra, parent, start) == want
        assert hash_chain(kind, tuple(tokens), grid, extra, parent, start) == want
    # negative control: the same reference with big-endian token ids differs wherever it hashes
    kind, tokens, grid, extra, parent, start = A, TOKENS, 16, (), 0, 0
    faulty = _reference_chain(kind, tokens, grid, extra, parent, start, token_fmt=">{}q")
    good = hash_chain(kind, tokens, grid, extra, parent, start)
    assert len(good) == 128 and all(f != g for f, g in zip(faulty, good, strict=True))


@pytest.mark.parametrize(("args", "error"), [
    ((A, [1, 2**63], 2, (), 0, 0), OverflowError),         # token out of int64 range
    ((A, [1, 2, "x", 4], 2, (), 0, 0), TypeError),          # token not an int
    ((A, [1, 2, 3, 4], 2, (1.5,), 0, 0), ValueError),      # bad extra key
    ((A, [1, 2, "x", 4], 2, (1.5,), 0, 0), ValueError),    # extra keys are checked first
    ((A, [1, 2, 3, 4], 2, (), -1, 0), struct.error),       # parent out of range
])
def test_bad_input_raises_at_the_boundary(args, error):
    """What hashing's docstring promises, for a chain and (grids, tokens, extra) for a pair."""
    with pytest.raises(error):
        hash_chain(*args)
    kind, tokens, grid, extra, parent, _ = args
    if parent == 0:
        with pytest.raises(error):
            hash_chain_pair(tokens, grid, grid, extra)


def test_array_and_list_tokens_give_the_same_keys():
    """Organizations hold tokens as an int64 array (token_array); callers pass lists."""
    tokens = [(7 * i + 3) % 50_000 for i in range(3000)]
    want = hash_chain_pair(tokens, 16, 1792)
    assert hash_chain_pair(token_array(tokens), 16, 1792) == want
    assert hash_chain(R, token_array(tokens), 1792) == want[1]
    # negative control: one token changed in the array changes the keys from its chunk on
    changed = token_array(tokens)
    changed[20] += 1
    got = hash_chain_pair(changed, 16, 1792)
    assert got[0][0] == want[0][0] and got[0][1] != want[0][1] and got[1] != want[1]
