"""Cost of one request's two key chains (``hybridmem.memory.keys.hash_chain_pair``), beside
``xxhash.xxh3_64`` over the same messages (the faster hash a key change could move to)::

    PYTHONPATH=. python benchmarks/bench_keys.py [--tokens 3000]

Prints microseconds per call (best of 7 rounds of 300 calls) for the grids the organizations
use (512/512: S0-S2; 16/1792: D0), tokens as a list and as the int64 array an organization
holds. The xxh3 row needs the ``xxhash`` package (not a dependency: the row says when it is
missing). The figures and the decision are in ``hybridmem/memory/keys.py``'s docstring.
"""

from __future__ import annotations

import argparse
import random
import struct
import time
from array import array
from collections.abc import Callable
from functools import partial

from hybridmem.memory.keys import _encode_extra, hash_chain_pair

HEAD = struct.Struct("<BQI")


def best_us(fn: Callable[[], object], calls: int = 300, rounds: int = 7) -> float:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t) / calls)
    return min(times) * 1e6


def xxh3_pair(tokens: array[int], ga: int, gr: int) -> tuple[list[int], list[int]]:
    """The two chains' messages (head, tokens, extra tail) hashed with xxh3_64 instead."""
    import xxhash

    raw, tail, n = tokens.tobytes(), _encode_extra(()), len(tokens)

    def chain(kind: int, grid: int) -> list[int]:
        view, width, parent, keys = memoryview(raw), 8 * grid, 0, []
        for off in range(0, n // grid * width, width):
            h = xxhash.xxh3_64(HEAD.pack(kind, parent, grid))
            h.update(view[off:off + width])
            h.update(tail)
            parent = h.intdigest() or 1
            keys.append(parent)
        return keys

    return chain(1, ga), chain(2, gr)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--tokens", type=int, default=3000)
    args = ap.parse_args(argv)
    rng = random.Random(0)
    tokens = [rng.randrange(0, 65536) for _ in range(args.tokens)]
    held = array("q", tokens)
    try:
        import xxhash  # noqa: F401
        have_xx = True
    except ImportError:
        have_xx = False
    for ga, gr in ((512, 512), (16, 1792)):
        row = [f"grids {ga}/{gr}, {args.tokens} tokens:",
               f"blake2b list {best_us(partial(hash_chain_pair, tokens, ga, gr)):.1f} us",
               f"blake2b array {best_us(partial(hash_chain_pair, held, ga, gr)):.1f} us"]
        row.append(f"xxh3_64 array {best_us(partial(xxh3_pair, held, ga, gr)):.1f} us"
                   if have_xx else "xxh3_64: xxhash not installed")
        print("  ".join(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
