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

:func:`hash_chain` hashes exactly these bytes (traces carry the keys, so they must never change),
on one of two paths that give the same keys::

    compiled  hybridmem._chash.chain (hybridmem/_chash.c: BLAKE2b from RFC 7693): the whole chain
              in one call, tokens read straight from a list or tuple of ints or from an int64
              buffer (:func:`token_array`, how organizations hold tokens); where the CPU
              has AVX2 (AVX-512VL: faster rotations; detected at import) each compression
              holds the state's rows in 256-bit vectors, and ``chain_pair`` runs its two chains
              side by side in one instruction stream (the scalar compression stays the
              definition and the fallback)
    Python    all tokens packed in one call, one ``update`` per chunk on a copy of a preset
              hashlib blake2b object (:func:`_chain_over`; the reference)

The compiled path is used when ``pip install -e .`` built the extension (optional: a failed
compile installs without it) and ``HYBRIDMEM_HASH_PURE`` is unset, empty or ``0`` at import;
:data:`IMPLEMENTATION` says which (``UNAVAILABLE`` why not). Any input the compiled path does not
take (another sequence or item type, a value out of range) goes to the Python path, which returns
the keys or raises its error. ``tests/hybridmem/test_hashing.py`` and ``test_chash.py`` compare
both paths byte for byte with the straightforward per-chunk encoding.
"""

from __future__ import annotations

import hashlib
import os
import struct
from array import array
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache
from typing import Any

from hybridmem.events import StateKind
from hybridmem.extensions import load_extension
from hybridmem.names import ENV_HASH_PURE

ExtraKey = str | int | bytes

NO_HASH = 0  # Event.hash of an entry without a key

_HEAD = struct.Struct("<BQI")  # kind, parent, chunk length
_BLAKE8 = hashlib.blake2b(digest_size=8)  # copied per chunk: cheaper than the constructor
_ATTENTION, _RECURRENT = int(StateKind.ATTENTION), int(StateKind.RECURRENT)
_CHASH_API = 5  # hybridmem/_chash.c CHASH_API_VERSION: bump both on any interface change


def load_compiled(name: str = "hybridmem._chash") -> tuple[Any, str | None]:
    """``(module, None)``: the compiled chains (``chain``, ``chain_pair``), or ``(None, why
    not)``: not built, a stale build (another API version), or ``HYBRIDMEM_HASH_PURE`` set
    (any value but "" and "0")."""
    if os.environ.get(ENV_HASH_PURE, "") not in ("", "0"):
        return None, f"{ENV_HASH_PURE} is set"
    return load_extension(name, _CHASH_API)


_chash, UNAVAILABLE = load_compiled()
IMPLEMENTATION = "python" if _chash is None else "c"
# _compiled None: the Python path only, for single chains and pairs (tests set it so too)
_compiled: Any = None if _chash is None else _chash.chain
_compiled_pair: Any = None if _chash is None else _chash.chain_pair
_compiled_pack: Any = None if _chash is None else _chash.pack


def token_array(token_ids: Iterable[int]) -> array[int]:
    """``token_ids`` as a new int64 array (``array('q')``), how an organization holds a
    request's tokens: 8 bytes a token where a list holds a pointer to a shared int per token
    (which it increments on the copy and decrements on release), and the compiled chains read
    it as one buffer. Raises what ``array('q', token_ids)`` raises for a token that is not an
    int64 (``TypeError``, ``OverflowError``)."""
    if _compiled_pack is not None and type(token_ids) in (list, tuple):
        try:
            return array("q", _compiled_pack(token_ids))
        except Exception:  # not for the compiled path (a bool, a big int): array decides
            pass
    return array("q", token_ids)


@lru_cache(maxsize=256)
def _tokens_packer(n: int) -> Callable[..., bytes]:
    return struct.Struct(f"<{n}q").pack


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


def chunk_hash(kind: StateKind, parent: int, token_ids: Sequence[int],
               extra: Sequence[ExtraKey] = ()) -> int:
    """Key of one chunk: ``H(kind, parent, token ids, extra keys)``; deterministic, never 0."""
    h = hashlib.blake2b(digest_size=8)
    h.update(struct.pack("<BQI", int(kind), parent, len(token_ids)))
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    h.update(_encode_extra(tuple(extra)))
    key = int.from_bytes(h.digest(), "big")
    return key or 1


def extra_keys(cache_salt: str | None) -> tuple[ExtraKey, ...]:
    """Per-request extra keys; ``cache_salt`` isolates a request from every other salt."""
    return () if cache_salt is None else ("cache_salt", cache_salt)


def hash_chain(kind: StateKind, token_ids: Sequence[int], grid: int,
               extra: Sequence[ExtraKey] = (), parent: int = NO_HASH,
               start: int = 0) -> list[int]:
    """Keys of every full ``grid``-token chunk from ``start`` (a multiple of ``grid``), chained
    from ``parent`` (the key of the chunk ending at ``start``; ``NO_HASH`` at 0).

    ``hash_chain(k, t, 512)[i]`` is the key of the prefix ``[0, 512 (i + 1))``.
    """
    if grid <= 0:
        raise ValueError(f"grid must be positive, got {grid}")
    if start % grid:
        raise ValueError(f"start {start} is not a multiple of the {grid}-token grid")
    chunks = (len(token_ids) - start) // grid
    if chunks <= 0:
        return []
    if _compiled is not None:
        try:
            return _compiled(int(kind), token_ids, start, grid, chunks,
                             _encode_extra(tuple(extra)), parent)
        except Exception:  # not for the compiled path: the Python path returns or raises
            pass
    try:
        return _fast_chain(int(kind), token_ids, grid, extra, parent, start, chunks)
    except Exception:  # bad input: raise exactly what the per-chunk encoding raises
        for lo in range(start, len(token_ids) - grid + 1, grid):
            parent = chunk_hash(kind, parent, token_ids[lo:lo + grid], extra)
        raise


def hash_chain_pair(token_ids: Sequence[int], attention_grid: int, recurrent_grid: int,
                    extra: Sequence[ExtraKey] = ()) -> tuple[list[int], list[int]]:
    """``(hash_chain(ATTENTION, t, attention_grid, extra), hash_chain(RECURRENT, t,
    recurrent_grid, extra))``, the same keys, with the token ids packed once for both."""
    if attention_grid > 0 and recurrent_grid > 0:
        try:  # bad input raises here or below: the two chains at the end raise what they raise
            n = len(token_ids)
            ca, cr = n // attention_grid, n // recurrent_grid
            tail = _encode_extra(tuple(extra))
            if _compiled is not None:
                try:
                    return _compiled_pair(token_ids, _ATTENTION, attention_grid, ca, _RECURRENT,
                                          recurrent_grid, cr, tail)
                except Exception:  # not for the compiled path: the Python path decides
                    pass
            used = max(ca * attention_grid, cr * recurrent_grid)
            raw = _tokens_packer(used)(*token_ids[:used])
            return (_chain_over(_ATTENTION, raw, attention_grid, tail, NO_HASH, ca),
                    _chain_over(_RECURRENT, raw, recurrent_grid, tail, NO_HASH, cr))
        except Exception:
            pass
    return (hash_chain(StateKind.ATTENTION, token_ids, attention_grid, extra),
            hash_chain(StateKind.RECURRENT, token_ids, recurrent_grid, extra))


def _fast_chain(kind: int, token_ids: Sequence[int], grid: int, extra: Sequence[ExtraKey],
                parent: int, start: int, chunks: int) -> list[int]:
    """:func:`chunk_hash` chained over ``chunks`` chunks from ``start``, same bytes: one pack
    for all tokens, then :func:`_chain_over`."""
    raw = _tokens_packer(chunks * grid)(*token_ids[start:start + chunks * grid])
    return _chain_over(kind, raw, grid, _encode_extra(tuple(extra)), parent, chunks)


@lru_cache(maxsize=64)
def _message_packer(grid: int, tail_len: int) -> Callable[..., bytes]:
    """Packs one chunk's whole message: ``<BQI`` head, the packed tokens, the extra tail."""
    return struct.Struct(f"<BQI{8 * grid}s{tail_len}s").pack


def _chain_over(kind: int, raw: bytes, grid: int, tail: bytes, parent: int,
                chunks: int) -> list[int]:
    """Keys of the first ``chunks`` ``grid``-token chunks of the packed tokens ``raw``, chained
    from ``parent``: one message pack and one ``update`` per chunk on a copy of a preset
    blake2b object (the bytes of :func:`chunk_hash`)."""
    width = 8 * grid
    message, new, from_bytes = _message_packer(grid, len(tail)), _BLAKE8.copy, int.from_bytes
    keys = []
    for off in range(0, chunks * width, width):
        h = new()
        h.update(message(kind, parent, grid, raw[off:off + width], tail))
        parent = from_bytes(h.digest(), "big") or 1
        keys.append(parent)
    return keys
