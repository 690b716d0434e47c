"""Chained keys: deterministic, chained, namespaced by state kind, isolated by cache_salt."""

import pytest

from hybridmem.events import StateKind
from hybridmem.hashing import chunk_hash, extra_keys, hash_chain

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
