"""The compiled writer (tracer/_ctrace.c) against the pure-Python reference: the same events
give the same bytes, its fast path really covers new strings and chains, threads stay
contiguous, the clock is CLOCK_MONOTONIC, and a missing extension falls back."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridmem.events import Event, EventKind, Outcome, StateKind
from tests.tracer.helpers import META, U64, every_kind
from tracer import TraceWriter, accel, read_events, verify
from tracer import writer as writer_mod
from tracer.reader import TraceReader
from tracer.synthetic import synthetic_events
from tracer.writer import TraceWriter as PyTraceWriter

# Each test names the writer classes it compares (or sets the environment itself): once is
# enough. The enum-refusal test goes through TraceWriter(...) and runs on both paths.
pytestmark = pytest.mark.writer_paths("default")
needs_c = pytest.mark.skipif(accel.ACCELERATED is None, reason=f"{accel.UNAVAILABLE}")
VOLATILE_META = ("incarnation_id", "created_unix_ns", "pid")


def tricky_events() -> list[Event | tuple[str, Event]]:
    """Events that exercise every branch of both paths; ("raises", e) must be refused. A fresh
    list per call: one event holds an iterator."""
    big_chain = tuple(range(3000))  # longer than a packet of 8 records: a one-off buffer
    out: list[Event | tuple[str, Event]] = [*every_kind()]
    out += list(synthetic_events(1500, seed=3))
    out += [
        Event(EventKind.ALLOCATION, 1, "new-a", requester="new-a", need=1),  # same new string
        Event(EventKind.LOSS, 2, "new-b", requester="new-c"),  # two new strings
        Event(EventKind.LOSS, 2, "", requester="new-d"),  # a new requester only
        Event(EventKind.PUBLICATION, True, "new-b", False, U64, 0, StateKind.CONV),  # bools
        Event(EventKind.PUBLICATION, np.int64(5), "new-b", hash=np.uint64(U64)),  # __index__
        Event(EventKind.ALLOCATION, 3, "new-b", state_kind=2.0, outcome=True),  # == a member
        ("raises", Event(13, 3, "new-b")),  # END as a plain int
        ("raises", Event(0, 3, "new-b")),
        ("raises", Event(EventKind.LOSS, 3, "new-b", cause=7)),  # no such Cause
        ("raises", Event(EventKind.LOSS, 3, "new-b", state_kind=4)),
        ("raises", Event(EventKind.ALLOCATION, 3, "new-b", outcome=[1])),
        Event(EventKind.WAITING_ENTRY, 4, "x", chain=[1, 2], recurrent_chain=iter([3])),
        Event(EventKind.WAITING_ENTRY, 5, "huge", chain=big_chain),
        Event(EventKind.WAITING_ENTRY, 6, "ü-ß-中", chain=(), recurrent_chain=(U64,)),
        ("raises", Event(13, 3, "never-defined")),  # END as int with a new string: refused
        ("raises", Event(13, 3, "new-b", chain=(1,))),
        ("raises", Event(EventKind.END)),
        ("raises", Event(EventKind.PUBLICATION, hash=U64 + 1, request_id="never-defined")),
        ("raises", Event(EventKind.PUBLICATION, page=2**63)),
        ("raises", Event(EventKind.PUBLICATION, preemption_count=2**31)),
        ("raises", Event(EventKind.PUBLICATION, outcome=256)),
        ("raises", Event(EventKind.PUBLICATION, depth=1.5)),
        ("raises", Event(EventKind.WAITING_ENTRY, chain=(1, -1), request_id="never-defined")),
        ("raises", Event(EventKind.PUBLICATION, request_id="bad-\udc80")),  # not UTF-8
        Event(EventKind.FINISH, 99, "new-b", outcome=Outcome.OK),
    ]
    # ints around one CPython digit (2**30), which the compiled path reads directly
    for v in (0, 1, -1, 2**30 - 1, 2**30, -(2**30 - 1), -(2**30), 2**31 - 1, -(2**31), 2**60):
        out.append(Event(EventKind.PUBLICATION, v, "new-b", hash=abs(v), depth=v, page=-v,
                         line=v, need=v, free=-v))
        if -(2**31) <= v < 2**31:
            out.append(Event(EventKind.LOSS, 1, "new-b", preemption_count=v))
        else:
            out.append(("raises", Event(EventKind.LOSS, 1, "new-b", preemption_count=v)))
    out.append(("raises", Event(EventKind.PUBLICATION, hash=-1, request_id="never-defined")))
    out.append(("raises", Event(EventKind.PUBLICATION, hash=-(2**30), request_id="never-def")))
    return out


FIELDS = [f.name for f in dataclasses.fields(Event)]


def emit(w: TraceWriter, e: Event, via: str) -> None:
    """``w.on_event(e)``, or the same fields through ``w.record`` (positional or keywords)."""
    values = [getattr(e, name) for name in FIELDS]
    if via == "on_event":
        w.on_event(e)
    elif via == "record":
        w.record(*values)
    else:
        w.record(values[0], **dict(zip(FIELDS[1:], values[1:], strict=True)))


def write(cls: type, path, events, after_close: int = 2,
          via: str = "on_event") -> tuple[tuple, list[str], str]:
    """Write ``events`` through ``cls`` with a clock derived from the sequence number (so two
    writers stamp the same ts whatever number of times each reads the clock)."""
    holder: list[TraceWriter] = []

    def clock() -> int:
        return 1_000_003 * holder[0]._seq + 7

    saved = writer_mod._mono
    writer_mod._mono = clock
    accel.set_test_clock(clock)
    refused = []
    try:
        w = cls(path, dict(META), packet_records=8, buffer_records=32, flush_interval_s=3600,
                fsync="none", handle_signals=False)
        holder.append(w)
        for item in events:
            if isinstance(item, tuple):
                with pytest.raises((ValueError, UnicodeEncodeError)) as exc:
                    emit(w, item[1], via)
                refused.append(type(exc.value).__name__)
            else:
                emit(w, item, via)
        w.close()
        for _ in range(after_close):
            w.on_event(Event(EventKind.FINISH, 1, "late"))
        return tuple(w.stats()), refused, w.implementation
    finally:
        writer_mod._mono = saved
        accel.set_test_clock(None)


def body(path) -> tuple[dict, bytes]:
    data = path.read_bytes()
    reader = TraceReader(path)
    meta = {k: v for k, v in reader.meta.items() if k not in VOLATILE_META}
    return meta, data[reader.header_len:]


@needs_c
@pytest.mark.parametrize("via", ["on_event", "record", "record_kw"])
def test_both_paths_write_byte_identical_traces(tmp_path, via):
    """Compiled on_event or record(...) (positional, keywords) against the pure-Python
    writer's on_event: the same bytes."""
    c_stats, c_refused, c_impl = write(accel.ACCELERATED, tmp_path / "c.hmtrace",
                                       tricky_events(), via=via)
    py_stats, py_refused, py_impl = write(accel.PureTraceWriter, tmp_path / "py.hmtrace",
                                         tricky_events())
    assert c_stats == py_stats and c_refused == py_refused
    assert len(c_refused) == sum(isinstance(e, tuple) for e in tricky_events())
    assert "UnicodeEncodeError" in c_refused
    assert c_impl == "c" and py_impl == "python"
    c_meta, c_body = body(tmp_path / "c.hmtrace")
    py_meta, py_body = body(tmp_path / "py.hmtrace")
    assert c_meta == py_meta
    assert c_body == py_body
    assert len(c_body) > 150_000
    assert verify(tmp_path / "c.hmtrace").accepted

    # negative control: one field of one event changed (C path) changes the bytes
    changed = tricky_events()
    i = next(i for i, e in enumerate(changed) if isinstance(e, Event) and not e.chain and i > 500)
    e = changed[i]
    assert isinstance(e, Event)
    changed[i] = Event(e.kind, e.step, e.request_id, e.preemption_count, e.hash, e.depth + 1,
                       e.state_kind, e.page, e.line, e.cause, e.requester, e.need, e.free,
                       e.outcome)
    write(accel.ACCELERATED, tmp_path / "c2.hmtrace", changed, via=via)
    assert body(tmp_path / "c2.hmtrace")[1] != py_body
    a = [r for _, _, r in read_events(tmp_path / "c2.hmtrace")]
    b = [r for _, _, r in read_events(tmp_path / "py.hmtrace")]
    assert [k for k, (x, y) in enumerate(zip(a, b, strict=True)) if x != y] == [i]


@needs_c
def test_fast_path_covers_new_strings_and_chains(tmp_path):
    slow_calls = []

    class Counting(accel.ACCELERATED):  # type: ignore[misc,valid-type]
        def _on_event_slow(self, event):
            slow_calls.append(event)
            return super()._on_event_slow(event)

    events = list(synthetic_events(3000))
    assert sum(1 for e in events if e.chain) > 100
    w = Counting(tmp_path / "t.hmtrace", META, packet_records=8192, handle_signals=False)
    for e in events:
        w.on_event(e)
    assert slow_calls == []  # every record, strings and chains included, packed in C
    w.on_event(Event(EventKind.PUBLICATION, np.int64(1)))  # not an int: Python decides
    assert len(slow_calls) == 1
    record_py = []
    w._record_py = lambda *a, **k: record_py.append((a, k))  # what record() hands to Python
    w.record(EventKind.PUBLICATION, 1, "new-string", hash=7, chain=(1, 2))
    w.record(EventKind.PUBLICATION, np.int64(1))
    w.record(EventKind.PUBLICATION, 1, step=2)
    w.record(kind=EventKind.PUBLICATION, bogus=3)
    assert record_py == [((EventKind.PUBLICATION, np.int64(1)), {}),
                         ((EventKind.PUBLICATION, 1), {"step": 2}),
                         ((), {"kind": EventKind.PUBLICATION, "bogus": 3})]
    w.close()
    assert verify(tmp_path / "t.hmtrace").accepted


@needs_c
def test_threads_on_the_compiled_path_stay_contiguous(tmp_path):
    """The GIL is the C path's synchronization: threads switching every microsecond, mixing
    compiled records, new strings, chains and Python slow paths (full buffers, numpy ints),
    with the flusher sealing every millisecond."""
    path = tmp_path / "t.hmtrace"
    n_threads, per_thread = 4, 3000
    # two buffers and a 1 ms periodic seal: emitters often wait for a buffer (the token given
    # back meanwhile) while the flusher takes the token to seal a partly filled one
    w = accel.ACCELERATED(path, META, packet_records=16, buffer_records=32,
                          flush_interval_s=0.001, fsync="none", handle_signals=False)
    barrier = threading.Barrier(n_threads)

    def emit(t: int) -> None:
        barrier.wait()
        for i in range(per_thread):
            rid = f"t{t}-{i // 10}"  # a new string every 10 events
            if i % 7 == 0:
                w.on_event(Event(EventKind.WAITING_ENTRY, i, rid, chain=(t, i), depth=t))
            elif i % 13 == 0:
                w.on_event(Event(EventKind.LOSS, np.int64(i), rid, depth=t))
            else:
                w.on_event(Event(EventKind.PUBLICATION, i, rid, 0, U64 - i, t))

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=emit, args=(t,)) for t in range(n_threads)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(old)
    stats = w.close()
    assert stats.packets > n_threads * per_thread // 16 + 1  # some sealed partly filled
    got = list(read_events(path))
    assert [s for s, _, _ in got] == list(range(n_threads * per_thread + 1))
    for t in range(n_threads):
        mine = [e for _, _, e in got if e.request_id.startswith(f"t{t}-")]
        assert [e.step for e in mine] == list(range(per_thread))
        assert all(e.request_id == f"t{t}-{e.step // 10}" and e.depth == t for e in mine)
    assert verify(path).accepted


@needs_c
def test_compiled_timestamps_are_clock_monotonic_in_seq_order(tmp_path):
    w = accel.ACCELERATED(tmp_path / "t.hmtrace", META, handle_signals=False)
    t0 = time.monotonic_ns()
    for e in synthetic_events(500):
        w.on_event(e)
    t1 = time.monotonic_ns()
    w.close()
    ts = [t for _, t, e in read_events(tmp_path / "t.hmtrace") if e.kind != EventKind.END]
    assert len(ts) == 500 and ts == sorted(ts) and t0 <= ts[0] and ts[-1] <= t1


def test_selection_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(accel.PURE_ENV, "1")
    w = TraceWriter(tmp_path / "a", META, handle_signals=False)
    assert type(w) is PyTraceWriter and w.implementation == "python"
    w.close()
    monkeypatch.setenv(accel.PURE_ENV, "0")
    w = TraceWriter(tmp_path / "b", META, handle_signals=False)
    expected = "python" if accel.ACCELERATED is None else "c"
    assert isinstance(w, PyTraceWriter) and w.implementation == expected
    w.close()
    monkeypatch.setattr(accel, "ACCELERATED", None)  # as if the compile had failed
    w = TraceWriter(tmp_path / "c", META, handle_signals=False)
    assert type(w) is PyTraceWriter
    w.close()


@pytest.mark.parametrize("fake", ["None", "types.SimpleNamespace(API_VERSION=0)"])
def test_without_a_usable_extension_the_pure_writer_runs(tmp_path, fake):
    """Not built (the import fails) or a stale build of another API version: pure Python."""
    path = str(tmp_path / "t")
    code = (
        f"import sys, types; sys.modules['tracer._ctrace'] = {fake}\n"
        "from tracer import TraceWriter, accel, verify\n"
        "from tracer.synthetic import synthetic_events\n"
        f"w = TraceWriter({path!r}, {{}}, handle_signals=False)\n"
        "[w.on_event(e) for e in synthetic_events(100)]\n"
        f"w.close(); print(w.implementation, verify({path!r}).accepted)\n"
        "print(accel.UNAVAILABLE)\n"
    )
    env_free = {k: v for k, v in __import__("os").environ.items() if k != accel.PURE_ENV}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env_free, check=True, timeout=60)
    first, why = out.stdout.splitlines()
    assert first.split() == ["python", "True"]
    assert ("not importable" if fake == "None" else "stale build") in why


@needs_c
def test_bind_refuses_a_class_without_slots():
    class Plain:
        pass

    with pytest.raises((TypeError, AttributeError)):
        accel._ctrace.bind(Plain, EventKind.END)


@pytest.mark.writer_paths("c", "python")
@pytest.mark.parametrize("bad", [{"kind": 13}, {"kind": 0}, {"kind": 200}, {"state_kind": 9},
                                 {"cause": 7}, {"outcome": 6}])
def test_an_enum_value_outside_its_enum_is_refused_and_its_packet_survives(tmp_path, bad):
    """Before: the writer packed any u8, and the reader then refused the whole packet (every
    record beside the bad one lost). Runs on both paths (conftest)."""
    path = tmp_path / "t.hmtrace"
    w = TraceWriter(path, META, handle_signals=False)
    w.on_event(Event(EventKind.PUBLICATION, 1, "r"))
    fields = {"kind": EventKind.PUBLICATION, "step": 2, "request_id": "r", **bad}
    with pytest.raises(ValueError, match="out of range|END"):
        w.on_event(Event(**fields))
    with pytest.raises(ValueError, match="out of range|END"):
        w.record(**fields)
    w.on_event(Event(EventKind.FINISH, 3, "r"))
    w.close()
    assert [e.step for _, _, e in read_events(path)][:2] == [1, 3]
    assert verify(path).accepted


@pytest.mark.parametrize("pure", ["1", ""])
def test_the_disabled_writer_does_nothing_on_either_base(pure):
    """NULL_WRITER.on_event is a C no-op (tracer._ctrace.NullCore) when the extension is built
    and HYBRIDMEM_TRACER_PURE was not set at import, else a Python method; both do nothing."""
    code = ("from hybridmem.events import Event, EventKind\n"
            "from tracer.writer import NULL_WRITER, NullTraceWriter\n"
            "print(NullTraceWriter.__mro__[1].__name__,"
            " NULL_WRITER.on_event(Event(EventKind.PUBLICATION)),"
            " NULL_WRITER.record(EventKind.PUBLICATION, step=1), NULL_WRITER.enabled)\n")
    env = dict(__import__("os").environ, **{accel.PURE_ENV: pure})
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True, timeout=60)
    base = "NullCore" if accel.ACCELERATED is not None and not pure else "_PyNullBase"
    assert out.stdout.split() == [base, "None", "None", "False"]


_EDGES = st.sampled_from([0, -1, 2**31 - 1, -(2**31), 2**31, 2**63 - 1, -(2**63), 2**63,
                          2**64 - 1, 2**64, -(2**65)])
_ANY_INT = st.one_of(st.integers(-1000, 1000), _EDGES)  # maybe past an edge of its struct code
_I64 = st.one_of(st.integers(-1000, 1000), st.sampled_from([-(2**63), 2**63 - 1, -1]))
_U64 = st.one_of(st.integers(0, 1000), st.sampled_from([2**63, 2**64 - 1]))
_I32 = st.one_of(st.integers(0, 5), st.sampled_from([2**31 - 1, -(2**31)]))
_STR = st.one_of(st.sampled_from(["", "r1", "r2", "α"]), st.text("abü中", max_size=6))
_ANY_STR = st.one_of(_STR, st.just("bad-\udc80"))
_CHAIN = st.one_of(st.just(()), st.lists(_U64, max_size=12).map(tuple),
                   # longer than a packet of 8 records: the Python slow path's one-off buffer
                   st.integers(90, 120).map(lambda n: tuple(range(2**64 - n, 2**64))))
_ANY_CHAIN = st.one_of(_CHAIN, st.lists(_ANY_INT, max_size=12).map(tuple))


def _enum(lo: int, hi: int, wild: bool) -> st.SearchStrategy[object]:
    """A member's value (or a float or bool equal to one); wild: maybe outside the enum."""
    valid = st.one_of(st.integers(lo, hi), st.sampled_from([float(lo), float(hi)]))
    return st.one_of(valid, st.sampled_from([lo - 1, hi + 1, 255, 256])) if wild else valid


# strategies built once (building them per draw dominated the test's time)
_FIELDS = {wild: (_ANY_INT if wild else _I64, _ANY_INT if wild else _U64,
                  _ANY_INT if wild else _I32, _ANY_STR if wild else _STR,
                  _ANY_CHAIN if wild else _CHAIN,
                  [_enum(lo, hi, wild) for lo, hi in ((1, 12), (0, 3), (0, 6), (0, 5))])
           for wild in (False, True)}


@st.composite
def _events(draw: st.DrawFn) -> list[Event]:
    """Up to 40 events; one in five may hold anything (then usually refused), the others only
    values both paths must accept."""
    out = []
    for _ in range(draw(st.integers(1, 40))):
        i64, u64, i32, text, chain, (kind, state, cause, outcome) = _FIELDS[
            draw(st.integers(0, 4)) == 0]
        rid = draw(text)
        requester = rid if draw(st.booleans()) else draw(text)
        out.append(Event(draw(kind), draw(i64), rid, draw(i32), draw(u64), draw(i64),
                         draw(state), draw(i64), draw(i64), draw(cause), requester, draw(i64),
                         draw(i64), draw(outcome), draw(chain), draw(chain)))
    return out


def _write_any(cls: type, path, events: list[Event]) -> tuple[tuple, list[str], bytes]:
    """Like write(), for events that may or may not be refused: record each outcome. Events go
    through on_event, record(...) and record(kind, **fields) in turn."""
    holder: list[TraceWriter] = []

    def clock() -> int:
        return 977 * holder[0]._seq + 3

    saved = writer_mod._mono
    writer_mod._mono = clock
    accel.set_test_clock(clock)
    outcomes = []
    try:
        w = cls(path, dict(META), packet_records=8, buffer_records=32, flush_interval_s=3600,
                fsync="none", handle_signals=False)
        holder.append(w)
        for i, e in enumerate(events):
            try:
                emit(w, e, ("on_event", "record", "record_kw")[i % 3])
                outcomes.append("ok")
            except (ValueError, UnicodeEncodeError) as exc:
                outcomes.append(type(exc).__name__)
        w.close()
    finally:
        writer_mod._mono = saved
        accel.set_test_clock(None)
    return tuple(w.stats()), outcomes, body(path)[1]


@needs_c
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=_events())
def test_random_events_give_the_same_bytes_and_refusals_on_both_paths(tmp_path_factory, events):
    d = tmp_path_factory.mktemp("fuzz")
    c = _write_any(accel.ACCELERATED, d / "c", events)
    py = _write_any(accel.PureTraceWriter, d / "py", events)
    assert c == py
    assert verify(d / "c").accepted  # refused events leave no trace; the rest is intact
