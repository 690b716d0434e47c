"""Verify time per MiB on hostile traces, at two sizes side by side.

The hostile file: a valid header, then nothing but packet headers (48 B each) with bad
checksums, each claiming the rest of the file as content. Before the reader computed range CRCs
from prefix checkpoints, every header cost a CRC over the rest of the file: 1 MiB took 2.3 s and
4 MiB 38 s (quadratic). Linear means the s/MiB column stays flat as the size grows.

    PYTHONPATH=$PWD python benchmarks/bench_verify_hostile.py [--sizes 1 4]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from tracer import format as fmt
from tracer.verdict import verify


def header(meta: bytes = b'{"organization": "S2"}') -> bytes:
    fixed = fmt.HEADER.pack(fmt.MAGIC, fmt.VERSION, 0, len(meta))
    return fixed + meta + fmt.HEADER_CRC.pack(fmt.crc32(fixed, meta))


def hostile(size: int, claim: str = "rest") -> bytes:
    """Packet headers with bad CRCs; each claims the rest of the file ("rest") or 1 MiB."""
    head = header()
    n = (size - len(head)) // fmt.PACKET.size
    out = bytearray(head)
    for i in range(n):
        rest = (n - i - 1) * fmt.PACKET.size
        length = rest if claim == "rest" else min(rest, 1 << 20)
        out += fmt.PACKET.pack(fmt.PACKET_MAGIC, i, i, length, 1, 0, 0, 0xDEADBEEF)
    return bytes(out)


def time_verify(data: bytes) -> tuple[float, str]:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "hostile.hmt")
        with open(path, "wb") as f:
            f.write(data)
        t0 = time.perf_counter()
        v = verify(path)
        return time.perf_counter() - t0, v.reason


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=float, nargs="+", default=[1.0, 4.0], metavar="MIB")
    args = ap.parse_args()
    print(f"{'file':<28}{'MiB':>6}{'verify s':>10}{'s/MiB':>9}  verdict")
    for claim in ("rest", "1MiB"):
        for mib in args.sizes:
            data = hostile(int(mib * 2**20), claim)
            secs, reason = time_verify(data)
            print(f"{'headers, bad CRC, claim ' + claim:<28}{mib:>6g}{secs:>10.2f}"
                  f"{secs / mib:>9.2f}  {reason}", flush=True)


if __name__ == "__main__":
    main()
