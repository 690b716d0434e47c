"""Writer cost per event, enabled and disabled (``hybridmem trace bench``).

Events are built before timing (an organization builds them either way). Each figure is the
fastest of ``repeats`` timed loops over the same events, wall time divided by the event count,
loop overhead included (``ns_loop_overhead`` gives it separately):

* ``ns_per_event_enabled``: ``writer.on_event(event)`` with the background flusher running;
* ``ns_per_event_enabled_record``: the fast path ``writer.record(kind, step, ...)``;
* ``ns_per_event_enabled_same_event``: on_event with one publication event repeated (its fields
  stay in cache, as for an event built just before it is emitted; the main figure walks 200k
  distinct prebuilt events, which adds cache misses);
* ``ns_per_event_enabled_with_close``: on_event loop plus ``close()`` (drain, END, fsync);
* ``ns_per_event_disabled``: ``NULL_WRITER.on_event(event)``;
* ``ns_per_event_disabled_guard``: ``if writer.enabled: ...`` at the call site.

On a shared machine wall time includes time the OS gave to other processes, so the ``cpu_``
figures add CPU time: of the emitting thread (``time.thread_time_ns``) and of the whole process
(emitting thread + flusher, ``time.process_time_ns``) over the enabled on_event loop + close().
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

from hybridmem.events import Event
from tracer.synthetic import synthetic_events
from tracer.verdict import verify
from tracer.writer import NULL_WRITER, TraceWriter

_clock = time.perf_counter_ns
BENCH_META = {"organization": "S2", "engine": "synthetic", "seed": 0, "budget": "b83",
              "geometry": "falcon-h1-7b", "attention_grid_tokens": 512,
              "recurrent_grid_tokens": 512}


def _best(repeats: int, run: Callable[[], int]) -> int:
    return min(run() for _ in range(repeats))


def _args(e: Event) -> tuple[Any, ...]:
    return (e.kind, e.step, e.request_id, e.preemption_count, e.hash, e.depth, e.state_kind,
            e.page, e.line, e.cause, e.requester, e.need, e.free, e.outcome, e.chain,
            e.recurrent_chain)


def run_bench(n: int, path: str | None = None, repeats: int = 3,
              progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    if n < 1:
        raise ValueError(f"--events must be >= 1, got {n}")
    if repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {repeats}")
    say = progress or (lambda _msg: None)
    say(f"building {n:,} synthetic events")
    events = list(synthetic_events(n))
    args = [_args(e) for e in events]
    out = path or os.path.join(tempfile.mkdtemp(prefix="hybridmem-bench-"), "bench.hmtrace")
    scratch = out + ".scratch"

    def loop_empty() -> int:
        t0 = _clock()
        for _e in events:
            pass
        return _clock() - t0

    def loop_null() -> int:
        w = NULL_WRITER
        t0 = _clock()
        for e in events:
            w.on_event(e)
        return _clock() - t0

    def loop_guard() -> int:
        w = NULL_WRITER
        t0 = _clock()
        for e in events:
            if w.enabled:
                w.on_event(e)
        return _clock() - t0

    cpu: list[tuple[int, int]] = []

    def loop_enabled(target: str, fast: bool, same: bool = False) -> tuple[int, int]:
        w = TraceWriter(target, BENCH_META, handle_signals=False)
        one = next(e for e in events if not e.chain)
        c0, p0 = time.thread_time_ns(), time.process_time_ns()
        t0 = _clock()
        if fast:
            rec = w.record
            for a in args:
                rec(*a)
        elif same:
            on = w.on_event
            for _e in events:
                on(one)
        else:
            on = w.on_event
            for e in events:
                on(e)
        t1 = _clock()
        c1 = time.thread_time_ns()
        w.close()
        if not fast and not same:
            cpu.append((c1 - c0, time.process_time_ns() - p0))
        return t1 - t0, _clock() - t0

    say("timing disabled paths")
    empty = _best(repeats, loop_empty)
    null = _best(repeats, loop_null)
    guard = _best(repeats, loop_guard)
    say("timing enabled on_event")
    enabled = [loop_enabled(scratch, fast=False) for _ in range(repeats - 1)]
    enabled.append(loop_enabled(out, fast=False))  # the kept trace is a full run too
    say("timing enabled record()")
    fast = [loop_enabled(scratch, fast=True) for _ in range(repeats)]
    say("timing enabled on_event, one event repeated")
    same = [loop_enabled(scratch, fast=False, same=True) for _ in range(repeats)]
    os.unlink(scratch)
    say("verifying the written trace")
    verdict = verify(out)
    size = os.path.getsize(out)
    return {
        "ns_per_event_enabled": round(min(t for t, _ in enabled) / n, 1),
        "ns_per_event_disabled": round(null / n, 1),
        "events": n,
        "path": out,
        "ns_per_event_enabled_record": round(min(t for t, _ in fast) / n, 1),
        "ns_per_event_enabled_same_event": round(min(t for t, _ in same) / n, 1),
        "ns_per_event_enabled_with_close": round(min(t for _, t in enabled) / n, 1),
        "ns_per_event_disabled_guard": round(guard / n, 1),
        "ns_loop_overhead": round(empty / n, 1),
        "cpu_ns_per_event_enabled_thread": round(min(c for c, _ in cpu) / n, 1),
        "cpu_ns_per_event_enabled_process": round(min(p for _, p in cpu) / n, 1),
        "repeats": repeats,
        "accepted": verdict.accepted,
        "bytes": size,
        "bytes_per_event": round(size / n, 1),
    }
