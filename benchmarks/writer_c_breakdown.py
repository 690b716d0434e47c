"""Where the compiled trace writer's time goes (``trace bench`` times the writer itself).

    PYTHONPATH=. python benchmarks/writer_c_breakdown.py [--events 200000] [--rounds 5]

Interleaved rounds over the same synthetic events, thread CPU clock per event, best of rounds:

    floor   one EVENT_NO_CHAIN.pack_into per event (tracer.bench.floor_loop)
    c       the compiled on_event (tracer/accel.py) over the distinct events
    c_same  the compiled on_event over one repeated event (its fields stay in cache)
    null    NULL_WRITER.on_event(e) at the call site (its C no-op, tracer._ctrace.NullCore)
    null_py the same with the Python no-op method (tracer.writer._PyNullBase), the fallback
    null_bound / null_py_bound  the same through a bound method fetched once (on = w.on_event)
    pure    the pure-Python writer's on_event (accel.PureTraceWriter)

and how many events the compiled path handed to the Python slow path (full buffers).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from hybridmem.events import Event
from tracer import accel
from tracer.bench import floor_loop
from tracer.synthetic import synthetic_events
from tracer.writer import NULL_WRITER, TraceWriter, _PyNullBase


class _PyNull(_PyNullBase):
    __slots__ = ()
    enabled = False


def _run(cls: type[TraceWriter], events: Sequence[Event], path: str) -> float:
    w = cls(path, {}, handle_signals=False)
    on = w.on_event
    c0 = time.thread_time_ns()
    for e in events:
        on(e)
    c = time.thread_time_ns() - c0
    w.close()
    return c / len(events)


def _null(w: Any, events: Sequence[Event], bound: bool) -> float:
    c0 = time.thread_time_ns()
    if bound:
        on = w.on_event
        for e in events:
            on(e)
    else:
        for e in events:
            w.on_event(e)
    return (time.thread_time_ns() - c0) / len(events)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    if a.events < 1 or a.rounds < 1:
        print("--events and --rounds must be >= 1", file=sys.stderr)
        return 2
    if accel.ACCELERATED is None:
        print(f"the compiled writer is not built: {accel.UNAVAILABLE}", file=sys.stderr)
        return 2
    evs = list(synthetic_events(a.events))
    one = next(e for e in evs if not e.chain)
    same = [one] * len(evs)
    tmp = tempfile.mkdtemp(prefix="writer-c-breakdown-")
    path = os.path.join(tmp, "t.hmtrace")
    rows: dict[str, list[float]] = {k: [] for k in (
        "floor", "c", "c_same", "null", "null_py", "null_bound", "null_py_bound", "pure")}
    py_null = _PyNull()
    try:
        for r in range(a.rounds):
            rows["floor"].append(floor_loop(evs)[1] / len(evs))
            rows["c"].append(_run(accel.ACCELERATED, evs, path))
            rows["c_same"].append(_run(accel.ACCELERATED, same, path))
            rows["null"].append(_null(NULL_WRITER, evs, bound=False))
            rows["null_py"].append(_null(py_null, evs, bound=False))
            rows["null_bound"].append(_null(NULL_WRITER, evs, bound=True))
            rows["null_py_bound"].append(_null(py_null, evs, bound=True))
            rows["pure"].append(_run(accel.PureTraceWriter, evs, path))
            print(f"round {r + 1} of {a.rounds}", file=sys.stderr)
        slow = [0]

        class Counting(accel.ACCELERATED):  # type: ignore[misc,valid-type]
            def _on_event_slow(self, event: Event) -> Any:
                slow[0] += 1
                return super()._on_event_slow(event)

        _run(Counting, evs, path)
    finally:
        shutil.rmtree(tmp)
    best = {k: min(v) for k, v in rows.items()}
    for k, v in best.items():
        print(f"{k:13s} {v:7.1f} ns/event CPU  ({v / best['floor']:.2f}x the floor)")
    print(f"slow-path calls: {slow[0]} of {len(evs):,} events; events with a chain: "
          f"{sum(1 for e in evs if e.chain):,}; distinct request ids: "
          f"{len({e.request_id for e in evs}):,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
