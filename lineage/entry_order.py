"""Sorting rows by cache entry ``(is_rec, hash)`` and seq in NumPy, for the Python
materializations of ``_supply`` (lineage/supply.py) and ``_chain_probe`` (lineage/probe.py).

A 64-bit hash and a seq do not fit one integer, and ``np.lexsort`` of three keys costs ~5x an
``argsort`` of one; so the entry is keyed by the top bits of its hash, as many as fit beside the
seq range; the rows of keys that two hashes share (a collision: adjacent rows, same key,
different hashes; rare at 1M events, common past 10M where the seq range leaves fewer bits) are
sorted again inside their block by the full hash:

    key = ((is_rec, top bits of hash) << bt | seq - min seq) << 1 | first_rows flag
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# the fast entry key (top hash bits, checked for collisions); tests turn it off to run the
# exact dense-id path
_TRY_TOP_BITS = True


@contextmanager
def small_pages() -> Iterator[None]:
    """NumPy without transparent huge pages for the arrays allocated inside (restored after).

    NumPy advises the kernel to back every array of 4 MiB or more with 2 MiB pages
    (``madvise(MADV_HUGEPAGE)``; env ``NUMPY_MADVISE_HUGEPAGE``). The arrays here live for
    milliseconds, and a huge-page fault zeroes (and may first compact) 2 MiB: in a fresh process
    over 1M events the Python materializations took 0.69-0.78 s of system time with the advice
    and 0.35-0.40 without (the history of benchmarks/RESULTS.md)."""
    core = getattr(np, "_core", None) or getattr(np, "core", None)  # NumPy 2 / 1.26
    setter = getattr(getattr(core, "multiarray", None), "_set_madvise_hugepage", None)
    if setter is None:
        yield
        return
    before = setter(False)
    try:
        yield
    finally:
        setter(before)


def as_numpy(col: pa.ChunkedArray | pa.Array, dtype: type, fill: int = 0) -> np.ndarray:
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if arr.null_count:
        arr = pc.fill_null(arr, bool(fill) if pa.types.is_boolean(arr.type) else fill)
    return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=dtype)


def valid_mask(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if not arr.null_count:
        return np.ones(len(arr), bool)
    return np.asarray(pc.is_valid(arr).to_numpy(zero_copy_only=False), bool)


def _entry_keys(rec: np.ndarray, hashes: np.ndarray, bits: int) -> np.ndarray:
    """An integer per row that orders rows of one entry ``(is_rec, hash)`` together: the top
    ``bits - 1`` bits of the hash below the is_rec bit (checked for collisions by the caller),
    or, with ``bits = 0``, dense ids from a hash table (exact, ~2x slower)."""
    if bits:
        ek = (hashes >> np.uint64(65 - bits)).view(np.int64)
        np.add(ek, np.int64(1) << (bits - 1), out=ek, where=rec)
        return ek
    enc = pc.dictionary_encode(pa.array(hashes))
    ek = np.asarray(enc.indices.to_numpy(), np.int64)
    np.add(ek, len(enc.dictionary), out=ek, where=rec)
    return ek


def entry_order(rec: np.ndarray, hashes: np.ndarray, seqs: np.ndarray, first: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Row order by (entry, seq, then rows ``>= first`` before rows ``< first`` at an equal
    seq), a dense entry id per row in that order, and whether each row after the first is of
    the same entry as the row before it. None if the seq range leaves too few bits for the
    entry key and even dense ids overflow. ``seqs`` is modified (shifted to start at 0).

    Entries whose hashes share the key's top bits (a collision: adjacent rows, same key,
    different hashes) sort as one block; only those blocks are sorted again by (hash, seq)."""
    if not len(seqs):
        return None
    seqs -= int(seqs.min())
    bt = int(seqs.max()).bit_length()
    bits = 61 - bt if _TRY_TOP_BITS else 0
    if bits < 8:
        bits = 0
    if bits == 0 and (2 * len(seqs)).bit_length() + bt + 1 > 63:
        return None
    ek = _entry_keys(rec, hashes, bits)
    comb = ek << bt
    comb |= seqs
    comb <<= 1
    comb[:first] |= 1
    order = np.argsort(comb)
    del comb
    ek_o = ek[order]
    del ek
    same = ek_o[1:] == ek_o[:-1]
    if bits:
        h_o = hashes[order]
        clash = same & (h_o[1:] != h_o[:-1])
        if clash.any():
            # the rows of the colliding keys are contiguous blocks (one per key value): sorted
            # again inside them by (hash, seq, flag), every key value keeps its positions
            at = np.flatnonzero(np.isin(ek_o, np.unique(ek_o[1:][clash])))
            sub = order[at]
            order[at] = sub[np.lexsort((sub < first, seqs[sub], hashes[sub], ek_o[at]))]
            h_o[at] = hashes[order[at]]
        same &= h_o[1:] == h_o[:-1]
        del h_o
    eid = np.zeros(len(order), np.int64)
    np.cumsum(~same, out=eid[1:])
    return order, eid, same
