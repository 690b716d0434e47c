"""CRC32 of any byte range in O(1) zlib work, for the reader's resynchronisation.

Checking one candidate packet costs its claimed content length in CRC work. A crafted file of
packet headers with bad checksums makes every 48 bytes a candidate claiming most of the file,
so a plain check is quadratic (1 MiB 2.3 s, 4 MiB 38 s). Here the window keeps the CRC of every
``BLOCK``-aligned prefix, and a range's CRC comes from two prefixes and the CRC "shift" (zlib's
``crc32_combine``), so each candidate costs O(BLOCK) bytes plus a few GF(2) products::

    P(x) = crc32(file[origin:x])                       (checkpoint every BLOCK bytes + tail)
    crc32(file[s:e]) = P(e) ^ shift(P(s), e - s)       shift(c, n) = c * x^(8n) mod poly
    crc32(head || file[s:e]) = shift(crc32(head) ^ P(s), e - s) ^ P(e)

``shift`` multiplies by ``x^(8n)`` (byte-indexed tables of ``x^(8 b 256^j)``, at most five
products) in the normal bit order, where a product is a carry-less multiply; ``multmodp`` is
zlib's reflected reference, kept for the self-test.
"""

from __future__ import annotations

import zlib
from functools import lru_cache

POLY = 0xEDB88320  # CRC-32 (IEEE), reflected
ONE = 1 << 31  # x^0 in the reflected representation


def multmodp(a: int, b: int) -> int:
    """a(x) * b(x) modulo the CRC polynomial (reflected, as zlib's ``multmodp``)."""
    m, p = ONE, 0
    while True:
        if a & m:
            p ^= b
            if not a & (m - 1):
                return p
        m >>= 1
        b = (b >> 1) ^ POLY if b & 1 else b >> 1
        if not m:
            return p


# ---- fast path: the same arithmetic in the normal (MSB-first) bit order, where a product is a
# carry-less multiply (one Python int op per set bit) and a reduction is four table steps.
NPOLY = 0x04C11DB7  # the same polynomial, normal bit order
_REDUCE = tuple(
    (lambda t: [t := ((t << 1) ^ NPOLY) & 0xFFFFFFFF if t & 0x80000000 else (t << 1)
                for _ in range(8)][-1])(b << 24)
    for b in range(256)
)
_REV8 = tuple(int(f"{b:08b}"[::-1], 2) for b in range(256))


def _rev32(v: int) -> int:
    return (_REV8[v & 0xFF] << 24 | _REV8[v >> 8 & 0xFF] << 16 | _REV8[v >> 16 & 0xFF] << 8
            | _REV8[v >> 24])


def _mulmod(a: int, b: int) -> int:
    """a(x) b(x) mod poly, normal bit order (degree < 32 each)."""
    if bin(a).count("1") > bin(b).count("1"):
        a, b = b, a
    p = 0
    while a:
        low = a & -a
        p ^= b * low
        a ^= low
    hi, r = p >> 32, 0
    for k in (24, 16, 8, 0):  # r = hi(x) x^32 mod poly, MSB-first table CRC of hi's bytes
        r = ((r << 8) & 0xFFFFFFFF) ^ _REDUCE[(r >> 24) ^ (hi >> k & 0xFF)]
    return (p & 0xFFFFFFFF) ^ r


@lru_cache(maxsize=1)
def _tables() -> tuple[tuple[int, ...], ...]:
    """T[j][b] = x^(8 * b * 256^j) mod poly (normal order), j = 0..4 (lengths < 2^40 B)."""
    tables = []
    base = 1 << 8  # x^8
    for _ in range(5):
        row = [1]
        for _b in range(255):
            row.append(_mulmod(row[-1], base))
        tables.append(tuple(row))
        base = _mulmod(row[-1], base)  # x^(8 * 256^(j+1))
    return tuple(tables)


@lru_cache(maxsize=4096)
def xpow8n(n: int) -> int:
    """x^(8n) mod poly (normal order) for 0 <= n < 2^40."""
    tables = _tables()
    p, j = 1, 0
    while n:
        b = n & 0xFF
        if b:
            p = _mulmod(tables[j][b], p)
        n >>= 8
        j += 1
    return p


def shift(crc: int, n: int) -> int:
    """The CRC register ``crc`` (zlib's reflected value) advanced by ``n`` bytes: the combine
    step ``crc * x^(8n) mod poly``."""
    return _rev32(_mulmod(xpow8n(n), _rev32(crc)))


def combine(crc_a: int, crc_b: int, len_b: int) -> int:
    """crc32(A || B) from crc32(A), crc32(B) and len(B) (zlib's ``crc32_combine``)."""
    return shift(crc_a, len_b) ^ crc_b


def check() -> None:
    """Self-test against zlib (cheap; the tests call it)."""
    a, b = b"hybridmem", bytes(range(256)) * 3
    assert combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)
    assert _rev32(multmodp(_rev32(0x1234567), _rev32(0x89ABCDE))) == _mulmod(0x1234567, 0x89ABCDE)
