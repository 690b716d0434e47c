"""Chained 64-bit cache keys for attention blocks and recurrent checkpoints (SPEC §5).

A key covers one grid chunk and chains to the key of the chunk before it, so a key names the whole
prefix ``[0, b)`` up to its boundary ``b``::

    tokens   0        g        2g       3g
             |chunk 0 |chunk 1 |chunk 2 |
    keys          k1 = H(kind, 0,  t[0:g],   extra)
                           k2 = H(kind, k1, t[g:2g],  extra)
                                    k3 = H(kind, k2, t[2g:3g], extra)

``kind`` (a :class:`StateKind`) is hashed first, so an attention key and a recurrent key over the
same tokens never collide, even on the shared 512/512 grid. ``extra`` carries per-request keys such
as the ``cache_salt``; it enters every chunk, so two salts never share a key at any depth.

Keys are blake2b digests (hashlib, 8 bytes, big-endian) of a fixed little-endian encoding, so they
are identical across processes, runs and machines. 0 is reserved for "no key" (Event.hash), so a
digest of 0 is mapped to 1. The bytes hashed per chunk::

    <BQI  kind, parent, len(chunk)      13 bytes
    <nq   the chunk's token ids          8 n bytes
    extra encoding (_encode_extra)       4 + per item: tag, <I length, raw

:func:`hash_chain` hashes exactly these bytes (traces carry the keys, so they must never change):
the token ids are packed once per call (``array('q')``, little-endian) and each chunk's message
is one ``update`` on a copy of a preset hashlib blake2b object. This is the only implementation.

Why hashlib's blake2b and not a faster hash (``benchmarks/bench_keys.py``: best of 7 x 300
calls of ``hash_chain_pair`` on one 3,000-token request, tokens an int64 array as organizations
hold them; CPython 3.11, x86-64, a 2-core box at load average ~9, so ranges over 4 runs)::

    grids        this path      xxhash.xxh3_64, same messages   removed C BLAKE2b (AVX)
    512 / 512    74-142 us      9-15 us                         43-57 us
    16 / 1792    190-375 us     90-220 us                       65-108 us

At most ~0.1 s over the 300 requests of ``hybridmem sim --org S2 --budget b63 --rate 3 --share
0.5 --cap 63 --seed 0 --requests 300 --no-trace``, a command of 17-21 CPU-s (under 1%), and
far below a prefill step in serving. No end-to-end reason justifies a key change, which would
have to be versioned in the trace metadata, so the keys stay as they were.

Bad input raises at the boundary: ``ValueError`` for a grid, ``start`` or extra key, what
``array('q', ...)`` raises for a token that is not an int64 (``TypeError``, ``OverflowError``),
``struct.error`` for a parent key outside ``[0, 2**64)``.
"""

from __future__ import annotations

import hashlib
import struct
import sys
from array import array
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache

from hybridmem.events import StateKind

ExtraKey = str | int | bytes

NO_HASH = 0  # Event.hash of an entry without a key

_HEAD = struct.Struct("<BQI")  # kind, parent, chunk length
_BLAKE8 = hashlib.blake2b(digest_size=8)  # copied per chunk: cheaper than the constructor
_ATTENTION, _RECURRENT = int(StateKind.ATTENTION), int(StateKind.RECURRENT)
_SWAP = sys.byteorder != "little"  # array's native order; the keys hash little-endian ids


def token_array(token_ids: Iterable[int]) -> array[int]:
    """``token_ids`` as a new int64 array (``array('q')``), how an organization holds a
    request's tokens: 8 bytes a token where a list holds a pointer to a shared int per token,
    and the chains hash its buffer without packing the ids again. Raises what
    ``array('q', token_ids)`` raises for a token that is not an int64 (``TypeError``,
    ``OverflowError``)."""
    return array("q", token_ids)


def _token_bytes(token_ids: Sequence[int], lo: int, hi: int) -> bytes:
    """Token ids ``[lo, hi)`` as little-endian int64 bytes (``<q`` each)."""
    window = array("q", token_ids[lo:hi])
    if _SWAP:
        window.byteswap()
    return window.tobytes()


@lru_cache(maxsize=1024)
def _encode_extra(extra: tuple[ExtraKey, ...]) -> bytes:
    out = bytearray(struct.pack("<I", len(extra)))
    for item in extra:
        if isinstance(item, bool) or not isinstance(item, (str, int, bytes)):
            raise ValueError(f"extra key {item!r} must be str, int or bytes")
        if isinstance(item, str):
            raw, tag = item.encode("utf-8"), b"s"
        elif isinstance(item, int):
            raw, tag = item.to_bytes(16, "little", signed=True), b"i"
        else:
            raw, tag = item, b"b"
        out += tag + struct.pack("<I", len(raw)) + raw
    return bytes(out)


@lru_cache(maxsize=64)
def _message_packer(grid: int, tail_len: int) -> Callable[..., bytes]:
    """Packs one chunk's whole message: ``<BQI`` head, the chunk's token bytes, the extra tail
    (one ``update`` per chunk: fewer calls than three, which shows on 16-token grids)."""
    return struct.Struct(f"<BQI{8 * grid}s{tail_len}s").pack


def _chain_over(kind: int, raw: bytes, grid: int, tail: bytes, parent: int,
                chunks: int) -> list[int]:
    """Keys of the first ``chunks`` ``grid``-token chunks of the packed tokens ``raw``, chained
    from ``parent``: per chunk, one message and one ``update`` on a copy of a preset blake2b
    object (the bytes in the module docstring)."""
    width = 8 * grid
    message, new, from_bytes = _message_packer(grid, len(tail)), _BLAKE8.copy, int.from_bytes
    keys = []
    for off in range(0, chunks * width, width):
        h = new()
        h.update(message(kind, parent, grid, raw[off:off + width], tail))
        parent = from_bytes(h.digest(), "big") or 1
        keys.append(parent)
    return keys


def chunk_hash(kind: StateKind, parent: int, token_ids: Sequence[int],
               extra: Sequence[ExtraKey] = ()) -> int:
    """Key of one chunk: ``H(kind, parent, token ids, extra keys)``; deterministic, never 0."""
    h = _BLAKE8.copy()
    h.update(_HEAD.pack(int(kind), parent, len(token_ids)))
    h.update(_token_bytes(token_ids, 0, len(token_ids)))
    h.update(_encode_extra(tuple(extra)))
    return int.from_bytes(h.digest(), "big") or 1


def extra_keys(cache_salt: str | None) -> tuple[ExtraKey, ...]:
    """Per-request extra keys; ``cache_salt`` isolates a request from every other salt."""
    return () if cache_salt is None else ("cache_salt", cache_salt)


def _check_grid(grid: int) -> None:
    if grid <= 0:
        raise ValueError(f"grid must be positive, got {grid}")


def hash_chain(kind: StateKind, token_ids: Sequence[int], grid: int,
               extra: Sequence[ExtraKey] = (), parent: int = NO_HASH,
               start: int = 0) -> list[int]:
    """Keys of every full ``grid``-token chunk from ``start`` (a multiple of ``grid``), chained
    from ``parent`` (the key of the chunk ending at ``start``; ``NO_HASH`` at 0).

    ``hash_chain(k, t, 512)[i]`` is the key of the prefix ``[0, 512 (i + 1))``.
    """
    _check_grid(grid)
    if start % grid:
        raise ValueError(f"start {start} is not a multiple of the {grid}-token grid")
    chunks = (len(token_ids) - start) // grid
    if chunks <= 0:
        return []
    tail = _encode_extra(tuple(extra))
    raw = _token_bytes(token_ids, start, start + chunks * grid)
    return _chain_over(int(kind), raw, grid, tail, parent, chunks)


def hash_chain_pair(token_ids: Sequence[int], attention_grid: int, recurrent_grid: int,
                    extra: Sequence[ExtraKey] = ()) -> tuple[list[int], list[int]]:
    """``(hash_chain(ATTENTION, t, attention_grid, extra), hash_chain(RECURRENT, t,
    recurrent_grid, extra))``, the same keys, with the token ids packed once for both."""
    _check_grid(attention_grid)
    _check_grid(recurrent_grid)
    n = len(token_ids)
    ca, cr = n // attention_grid, n // recurrent_grid
    tail = _encode_extra(tuple(extra))
    raw = _token_bytes(token_ids, 0, max(ca * attention_grid, cr * recurrent_grid))
    return (_chain_over(_ATTENTION, raw, attention_grid, tail, NO_HASH, ca),
            _chain_over(_RECURRENT, raw, recurrent_grid, tail, NO_HASH, cr))
