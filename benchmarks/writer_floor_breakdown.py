"""Where the trace writer's cost over the floor goes (``trace bench`` times the writer itself).

    PYTHONPATH=. python benchmarks/writer_floor_breakdown.py

The floor loop and method variants of increasing completeness, each writing one repeated event
into a preallocated buffer, timed by the thread's CPU clock, interleaved, best of 11:

    m0  a method that only packs (method call + one pack_into)
    m3  + string-id lookups (dict.get), chain/END checks, seq, under threading.Lock
    m5  the checks folded into one try/except around pack_into, no lock at all (unsafe with
        threads: the lower bound of a Python writer method)
    m6  m5 with ids[...] subscripts, under the list-token mutex tracer/writer.py uses
"""

from __future__ import annotations

import struct
import threading
import time
from typing import Any

from hybridmem.events import EventKind
from tracer import format as fmt
from tracer.synthetic import synthetic_events

_END = EventKind.END
_NO: tuple[int, ...] = ()
_mono = time.monotonic_ns
_clk = time.thread_time_ns
PACK = fmt.EVENT_NO_CHAIN.pack_into


class Variants:
    def __init__(self, rid: str) -> None:
        self._off = self._seq = 0
        self._buf = bytearray(100 * 1024)
        self._limit = 100 * 1023
        self._ids = {"": 0, rid: 1}
        lock = threading.Lock()
        self._acquire, self._release = lock.acquire, lock.release
        self._tok: list[None] = [None]
        self._take, self._give = self._tok.pop, self._tok.append

    def m0(self, e: Any) -> None:
        off = self._off
        if off > self._limit:
            off = 0
        PACK(self._buf, off, e.kind, e.state_kind, e.cause, e.outcome, 0, _mono(), e.step, 1, 2,
             e.preemption_count, e.hash, e.depth, e.page, e.line, e.need, e.free)
        self._off = off + 100

    def m3(self, e: Any) -> None:
        ids = self._ids
        rid, qid = ids.get(e.request_id), ids.get(e.requester)
        self._acquire()
        try:
            off = self._off
            if rid is None or qid is None or off > self._limit or e.chain or e.recurrent_chain \
                    or e.kind is _END:
                self._off = 0
                return
            seq = self._seq
            PACK(self._buf, off, e.kind, e.state_kind, e.cause, e.outcome, seq, _mono(), e.step,
                 rid, qid, e.preemption_count, e.hash, e.depth, e.page, e.line, e.need, e.free)
            self._off = off + 100
            self._seq = seq + 1
        finally:
            self._release()

    def m5(self, e: Any) -> None:
        ids = self._ids
        kind = e.kind
        if kind is not _END and e.chain is _NO and e.recurrent_chain is _NO:
            seq = self._seq
            try:
                PACK(self._buf, self._off, kind, e.state_kind, e.cause, e.outcome, seq, _mono(),
                     e.step, ids.get(e.request_id), ids.get(e.requester), e.preemption_count,
                     e.hash, e.depth, e.page, e.line, e.need, e.free)
                self._off += 100
                self._seq = seq + 1
                return
            except struct.error:
                pass
        self._off = 0

    def m6(self, e: Any) -> None:
        kind = e.kind
        self._take()
        try:
            if kind is not _END and e.chain is _NO and e.recurrent_chain is _NO:
                ids = self._ids
                seq = self._seq
                try:
                    PACK(self._buf, self._off, kind, e.state_kind, e.cause, e.outcome, seq,
                         _mono(), e.step, ids[e.request_id], ids[e.requester],
                         e.preemption_count, e.hash, e.depth, e.page, e.line, e.need, e.free)
                    self._off += 100
                    self._seq = seq + 1
                    return
                except (struct.error, KeyError):
                    pass
            self._off = 0
        finally:
            self._give(None)


def main() -> None:
    one = next(e for e in synthetic_events(1000) if not e.chain)
    same = [one] * 50_000
    buf = bytearray(100 * 1024)

    def floor() -> int:
        t0, off = _clk(), 0
        for e in same:
            if off > 100 * 1023:
                off = 0
            PACK(buf, off, e.kind, e.state_kind, e.cause, e.outcome, 0, _mono(), e.step, 1, 2,
                 e.preemption_count, e.hash, e.depth, e.page, e.line, e.need, e.free)
            off += 100
        return _clk() - t0

    def variant(name: str) -> int:
        f = getattr(Variants(one.request_id), name)
        t0 = _clk()
        for e in same:
            f(e)
        return _clk() - t0

    res: dict[str, list[float]] = {}
    for _ in range(11):
        res.setdefault("floor", []).append(floor() / len(same))
        for name in ("m0", "m3", "m5", "m6"):
            res.setdefault(name, []).append(variant(name) / len(same))
    fl = min(res["floor"])
    for k, v in res.items():
        print(f"{k:6s} {min(v):7.0f} ns/event (thread CPU)  {min(v) / fl:5.2f}x the floor")


if __name__ == "__main__":
    main()
