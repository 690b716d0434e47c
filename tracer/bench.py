"""Writer cost per event, enabled and disabled (``hybridmem trace bench``).

Events are built before timing (an organization builds them either way). Each figure is the
fastest of ``repeats`` timed loops over the same events, wall time divided by the event count,
loop overhead included (``ns_loop_overhead`` gives it separately). The loops run interleaved,
one of each per round, so every figure of a round saw the same machine load:

* ``floor_ns_per_event``: the floor from Python, timed in the same run: the same loop over the
  same events packing each one's fixed 100 B record (``tracer.format.EVENT_NO_CHAIN``: its 16
  fields read from the event, a ``time.monotonic_ns()`` stamp, a running sequence number) with
  one ``Struct.pack_into`` into a preallocated packet buffer, nothing else (no strings, no
  chains, no locking, no I/O);
* ``ratio_to_floor``: ``ns_per_event_enabled / floor_ns_per_event`` (best of each);
  ``ratio_to_floor_median`` is the median over rounds of the same ratio within one round;

* ``ns_per_event_enabled``: ``writer.on_event(event)`` with the background flusher running, on
  the writer ``TraceWriter(...)`` builds (``writer_path``: ``c``, the compiled on_event of
  ``tracer/accel.py``, or ``python``; ``writer_path_note`` says why); ``cpu_ratio_to_floor``
  compares the emitting thread's CPU time with the floor loop's (less sensitive to other
  tenants than wall time);
* ``*_pure``: the same on_event loop on the pure-Python writer, timed in the same rounds when
  the compiled one is the writer measured above (None otherwise);
* ``ns_per_event_enabled_record``: the fast path ``writer.record(kind, step, ...)``;
* ``ns_per_event_enabled_same_event``: on_event with one publication event repeated (its fields
  stay in cache, as for an event built just before it is emitted; the main figure walks 200k
  distinct prebuilt events, which adds cache misses);
* ``ns_per_event_enabled_with_close``: on_event loop plus ``close()`` (drain, END, fsync);
* ``ns_per_event_disabled``: ``NULL_WRITER.on_event(event)`` (a call of a no-op method: what a
  call site without a guard pays);
* ``ns_per_event_disabled_guard``: ``if writer.enabled: ...`` at the call site;
* ``ns_per_event_disabled_call_site``: the guard as the organizations' hot call sites pay it
  (``if self._emitting:`` on an instance attribute, before any Event or field dict is built:
  publication, release, loss, allocation in ``hybridmem/memory/organization.py``): the disabled cost
  a traced run's call sites actually pay;
* ``*_net``: the same minus ``ns_loop_overhead`` (the ``for`` loop alone; each term the fastest
  of its rounds), i.e. the cost per event the disabled path adds to the caller's own loop.

On a shared machine wall time includes time the OS gave to other processes, so the ``cpu_``
figures add CPU time: of the emitting thread (``time.thread_time_ns``) and of the whole process
(emitting thread + flusher, ``time.process_time_ns``) over the enabled on_event loop + close().
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from hybridmem.events import Event
from tracer import accel
from tracer import format as fmt
from tracer.synthetic import synthetic_events
from tracer.verdict import verify
from tracer.writer import NULL_WRITER, TraceWriter

_clock = time.perf_counter_ns
BENCH_META = {"organization": "S2", "engine": "synthetic", "seed": 0, "budget": "b83",
              "geometry": "falcon-h1-7b", "attention_grid_tokens": 512,
              "recurrent_grid_tokens": 512}


def _args(e: Event) -> tuple[Any, ...]:
    return (e.kind, e.step, e.request_id, e.preemption_count, e.hash, e.depth, e.state_kind,
            e.page, e.line, e.cause, e.requester, e.need, e.free, e.outcome, e.chain,
            e.recurrent_chain)


def floor_loop(events: Sequence[Event]) -> tuple[int, int]:
    """The floor of an enabled writer: one ``struct.pack_into`` of the fixed-layout record per
    event into a preallocated buffer. Returns (wall ns, emitting-thread CPU ns)."""
    pack = fmt.EVENT_NO_CHAIN.pack_into
    size = fmt.EVENT_NO_CHAIN.size
    buf = bytearray(1024 * size)
    limit = len(buf) - size
    mono = time.monotonic_ns
    off = seq = 0
    c0 = time.thread_time_ns()
    t0 = _clock()
    for e in events:
        if off > limit:
            off = 0
        pack(buf, off, e.kind, e.state_kind, e.cause, e.outcome, seq, mono(), e.step, 1, 2,
             e.preemption_count, e.hash, e.depth, e.page, e.line, e.need, e.free)
        off += size
        seq += 1
    return _clock() - t0, time.thread_time_ns() - c0

class _CallSite:
    """An emitter shaped like the organizations (``MemoryOrganization``): its observer is the
    disabled writer and ``_emitting`` is the instance flag its hot call sites test."""

    def __init__(self) -> None:
        self.observer = NULL_WRITER
        self._emitting = self.observer.enabled

    def run(self, events: Sequence[Event]) -> int:
        t0 = _clock()
        for e in events:
            if self._emitting:
                self.observer.on_event(e)
        return _clock() - t0


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

    floor_cpu: list[int] = []

    def loop_floor() -> int:
        t, cpu = floor_loop(events)
        floor_cpu.append(cpu)
        return t

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

    site = _CallSite()

    def loop_call_site() -> int:
        return site.run(events)

    cls = accel.writer_class()
    if cls is not TraceWriter:
        note = "compiled on_event (tracer/_ctrace.c)"
    elif accel.pure_forced():
        note = f"{accel.PURE_ENV}={os.environ.get(accel.PURE_ENV)} forces the pure-Python writer"
    else:
        note = f"pure-Python writer: {accel.UNAVAILABLE}"
    both = cls is not TraceWriter  # time the pure-Python reference too, in the same rounds
    cpu: list[tuple[int, int]] = []
    cpu_pure: list[tuple[int, int]] = []

    def loop_enabled(target: str, fast: bool, same: bool = False,
                     writer_cls: type[TraceWriter] = cls) -> tuple[int, int]:
        w = writer_cls(target, BENCH_META, handle_signals=False)
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
            (cpu if writer_cls is cls else cpu_pure).append((c1 - c0,
                                                             time.process_time_ns() - p0))
        return t1 - t0, _clock() - t0

    floor: list[int] = []
    empty: list[int] = []
    null: list[int] = []
    guard: list[int] = []
    call_site: list[int] = []
    enabled: list[tuple[int, int]] = []
    enabled_pure: list[tuple[int, int]] = []
    fast: list[tuple[int, int]] = []
    same: list[tuple[int, int]] = []
    for r in range(repeats):
        say(f"round {r + 1} of {repeats}: floor, enabled ({cls.implementation}: on_event, "
            f"record, same event{'; python: on_event' if both else ''}), disabled")
        floor.append(loop_floor())
        # the last round's on_event trace is kept and verified
        enabled.append(loop_enabled(out if r == repeats - 1 else scratch, fast=False))
        if both:
            enabled_pure.append(loop_enabled(scratch, fast=False,
                                             writer_cls=accel.PureTraceWriter))
        fast.append(loop_enabled(scratch, fast=True))
        same.append(loop_enabled(scratch, fast=False, same=True))
        empty.append(loop_empty())
        null.append(loop_null())
        guard.append(loop_guard())
        call_site.append(loop_call_site())
    os.unlink(scratch)
    say("verifying the written trace")
    verdict = verify(out)
    size = os.path.getsize(out)
    ratios = sorted(t / f for (t, _), f in zip(enabled, floor, strict=True))
    pure: dict[str, float | None] = dict.fromkeys(
        ("ns_per_event_enabled_pure", "ratio_to_floor_pure", "ratio_to_floor_pure_median",
         "cpu_ratio_to_floor_pure", "cpu_ns_per_event_enabled_thread_pure"))
    if both:
        ratios_pure = sorted(t / f for (t, _), f in zip(enabled_pure, floor, strict=True))
        best_pure = min(t for t, _ in enabled_pure)
        pure.update({
            "ns_per_event_enabled_pure": round(best_pure / n, 1),
            "ratio_to_floor_pure": round(best_pure / min(floor), 3),
            "ratio_to_floor_pure_median": round(ratios_pure[len(ratios_pure) // 2], 3),
            "cpu_ratio_to_floor_pure": round(min(c for c, _ in cpu_pure) / min(floor_cpu), 3),
            "cpu_ns_per_event_enabled_thread_pure": round(min(c for c, _ in cpu_pure) / n, 1),
        })
    return {
        "ns_per_event_enabled": round(min(t for t, _ in enabled) / n, 1),
        "ns_per_event_disabled": round(min(null) / n, 1),
        "events": n,
        "path": out,
        "writer_path": cls.implementation,
        "writer_path_note": note,
        "floor_ns_per_event": round(min(floor) / n, 1),
        "ratio_to_floor": round(min(t for t, _ in enabled) / min(floor), 3),
        "ratio_to_floor_median": round(ratios[len(ratios) // 2], 3),
        "cpu_floor_ns_per_event": round(min(floor_cpu) / n, 1),
        "cpu_ratio_to_floor": round(min(c for c, _ in cpu) / min(floor_cpu), 3),
        "ns_per_event_enabled_record": round(min(t for t, _ in fast) / n, 1),
        "ns_per_event_enabled_same_event": round(min(t for t, _ in same) / n, 1),
        "ns_per_event_enabled_with_close": round(min(t for _, t in enabled) / n, 1),
        "ns_per_event_disabled_guard": round(min(guard) / n, 1),
        "ns_per_event_disabled_call_site": round(min(call_site) / n, 1),
        "ns_per_event_disabled_net": round(max(0, min(null) - min(empty)) / n, 1),
        "ns_per_event_disabled_guard_net": round(max(0, min(guard) - min(empty)) / n, 1),
        "ns_per_event_disabled_call_site_net": round(max(0, min(call_site) - min(empty)) / n, 1),
        "ns_loop_overhead": round(min(empty) / n, 1),
        "cpu_ns_per_event_enabled_thread": round(min(c for c, _ in cpu) / n, 1),
        "cpu_ns_per_event_enabled_process": round(min(p for _, p in cpu) / n, 1),
        **pure,
        "repeats": repeats,
        "accepted": verdict.accepted,
        "bytes": size,
        "bytes_per_event": round(size / n, 1),
    }
