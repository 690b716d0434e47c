"""Every event kind survives writer -> file -> reader -> Arrow/Parquet/Perfetto unchanged."""

import json

import pyarrow.parquet as pq
import pytest

from hybridmem.events import Event, EventKind
from tests.tracer.helpers import META, every_kind, write_trace
from tracer import (
    NULL_WRITER,
    TraceError,
    TraceWriter,
    events_table,
    read_events,
    verify,
    write_parquet,
    write_perfetto,
)
from tracer.reader import TraceReader
from tracer.schema import META_KEY, arrow_schema
from tracer.synthetic import synthetic_events


def assert_same_events(got, want):
    """got: (seq, ts, Event) incl. END; want: the emitted events, in order."""
    assert [s for s, _, _ in got] == list(range(len(want) + 1)), "seqs must be 0..n (END = n)"
    assert [e for _, _, e in got[:-1]] == want
    assert got[-1][2] == Event(EventKind.END)
    ts = [t for _, t, _ in got]
    assert ts == sorted(ts), "timestamps must follow sequence order"


@pytest.mark.parametrize("packet_records", [1, 3, 1024], ids=lambda n: f"packet{n}")
def test_every_kind_round_trips(tmp_path, packet_records):
    events = every_kind()
    assert {e.kind for e in events} == set(EventKind) - {EventKind.END}
    path = tmp_path / "t.hmtrace"
    w = write_trace(path, events, packet_records=packet_records)
    got = list(read_events(path))
    assert_same_events(got, events)
    v = verify(path)
    assert v.accepted and v.reason == "accepted"
    assert (v.records, v.recovered_records, v.end_present) == (len(events), len(events), True)
    assert w.stats().records == len(events) and w.stats().closed


def test_header_metadata(tmp_path):
    path = tmp_path / "t.hmtrace"
    write_trace(path, every_kind(), fsync="packet")
    meta = TraceReader(path).meta
    for key, value in META.items():
        assert meta[key] == value
    assert len(meta["incarnation_id"]) == 32 and "monotonic" in meta["clock_source"].lower()
    assert meta["format_version"] == 1 and meta["fsync"] == "packet"


def test_long_chain_gets_its_own_packet(tmp_path):
    # a 5,000-entry chain (40 KB) does not fit a 2-record packet (200 B): one-off buffer
    long = Event(EventKind.WAITING_ENTRY, 1, "r", depth=5000 * 512, chain=tuple(range(5000)),
                 recurrent_chain=tuple(range(7)))
    events = [every_kind()[1], long, every_kind()[2], long]
    path = tmp_path / "t.hmtrace"
    write_trace(path, events, packet_records=2, buffer_records=4)
    assert_same_events(list(read_events(path)), events)
    assert verify(path).accepted


def test_synthetic_stream_round_trips_with_many_packets(tmp_path):
    events = list(synthetic_events(3000, seed=3))
    path = tmp_path / "t.hmtrace"
    write_trace(path, events, packet_records=64, buffer_records=256)
    assert_same_events(list(read_events(path)), events)
    assert verify(path).accepted


def test_bad_fields_raise_and_leave_the_trace_intact(tmp_path):
    path = tmp_path / "t.hmtrace"
    with TraceWriter(path, META, handle_signals=False) as w:
        w.on_event(every_kind()[1])
        with pytest.raises(ValueError, match="out of range"):
            w.on_event(Event(EventKind.PUBLICATION, hash=1 << 64))
        with pytest.raises(ValueError, match="out of range"):
            w.on_event(Event(EventKind.WAITING_ENTRY, request_id="new", chain=(-1,)))
        with pytest.raises(ValueError, match="END is written by the tracer"):
            w.on_event(Event(EventKind.END))
        w.on_event(every_kind()[2])
    assert_same_events(list(read_events(path)), [every_kind()[1], every_kind()[2]])
    assert verify(path).accepted


def test_writer_refuses_bad_options(tmp_path):
    with pytest.raises(TraceError, match="policy"):
        TraceWriter(tmp_path / "a", META, policy="spill")
    with pytest.raises(TraceError, match="fsync"):
        TraceWriter(tmp_path / "a", META, fsync="always")
    with pytest.raises(TraceError, match="JSON"):
        TraceWriter(tmp_path / "a", {"x": object()})
    with pytest.raises(TraceError, match="cannot create"):
        TraceWriter(tmp_path / "missing-dir" / "a", META)


def test_events_after_close_are_counted_not_written(tmp_path):
    path = tmp_path / "t.hmtrace"
    w = write_trace(path, every_kind()[:3])
    w.on_event(every_kind()[3])
    w.record(EventKind.FINISH, 1, "req-α")
    assert w.stats().dropped_after_close == 2 and w.close().records == 3
    assert verify(path).accepted and verify(path).records == 3


def test_record_fast_path_matches_on_event(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    write_trace(a, every_kind())
    with TraceWriter(b, META, handle_signals=False) as w:
        for e in every_kind():
            w.record(e.kind, e.step, e.request_id, e.preemption_count, e.hash, e.depth,
                     e.state_kind, e.page, e.line, e.cause, e.requester, e.need, e.free,
                     e.outcome, e.chain, e.recurrent_chain)
    assert [e for _, _, e in read_events(a)] == [e for _, _, e in read_events(b)]


def test_null_writer_is_a_no_op():
    assert TraceWriter.disabled() is NULL_WRITER and not NULL_WRITER.enabled
    with NULL_WRITER as w:
        assert w.on_event(every_kind()[0]) is None
        assert w.record(EventKind.FINISH) is None


def test_events_table_schema_and_metadata(tmp_path):
    events = every_kind()
    path = tmp_path / "t.hmtrace"
    write_trace(path, events)
    table = events_table(path)
    assert table.schema.remove_metadata() == arrow_schema()
    assert table.num_rows == len(events) + 1
    meta = json.loads(table.schema.metadata[META_KEY])
    assert meta["organization"] == "S2" and meta["attention_grid_tokens"] == 512
    assert meta["verdict"]["accepted"] is True
    rows = table.to_pylist()
    # row 3 is the slab-reclaim loss of a conv line, reported for requester req-β
    assert {k: rows[3][k] for k in ("seq", "kind", "state_kind", "cause", "requester", "line",
                                    "request_id")} == {
        "seq": 3, "kind": "loss", "state_kind": "conv", "cause": "slab_reclaim",
        "requester": "req-β", "line": 48, "request_id": ""}
    assert rows[0]["chain"] == [1, (1 << 64) - 1, 2**63] and rows[-1]["kind"] == "end"
    out = tmp_path / "t.parquet"
    assert write_parquet(path, out).accepted
    assert pq.read_table(out).equals(table)


def test_perfetto_timeline(tmp_path):
    events = every_kind()
    path = tmp_path / "t.hmtrace"
    write_trace(path, events)
    out = tmp_path / "t.json"
    assert write_perfetto(path, out).accepted
    doc = json.loads(out.read_text())
    evs = doc["traceEvents"]
    tracks = {e["args"]["name"] for e in evs if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"request req-α", "request req-β", "request req-γ"} <= tracks
    names = [e["name"] for e in evs if e["ph"] == "i"]
    assert "publication attention" in names and "loss conv (slab_reclaim)" in names
    assert names.count("END") == 1
    begins = sum(e["ph"] == "B" for e in evs)
    assert begins == sum(e["ph"] == "E" for e in evs) and begins >= 3
    assert doc["otherData"]["verdict"]["accepted"] is True


def test_format_md_documents_every_column_and_verdict_key():
    from pathlib import Path

    from tracer import VERDICT_KEYS
    from tracer.schema import EVENT_COLUMNS

    doc = (Path(__file__).resolve().parents[2] / "tracer" / "FORMAT.md").read_text()
    for name, arrow_type, _ in EVENT_COLUMNS:
        assert f"| `{name}` | {arrow_type} |" in doc, f"FORMAT.md lacks column {name}"
    for key in VERDICT_KEYS:
        assert f"| `{key}` |" in doc, f"FORMAT.md lacks verdict key {key}"


def test_writers_implement_the_observer_protocol(tmp_path):
    from hybridmem.events import Observer

    w = TraceWriter(tmp_path / "t", META, handle_signals=False)
    assert isinstance(w, Observer) and isinstance(NULL_WRITER, Observer)
    w.close()


def test_parquet_export_streams_row_groups_and_keeps_the_verdict(tmp_path, monkeypatch):
    import tracer.export as export

    events = list(synthetic_events(100, seed=1))
    path = tmp_path / "t.hmtrace"
    write_trace(path, events)
    monkeypatch.setattr(export, "BATCH_ROWS", 7)  # 101 rows (END included) -> 15 row groups
    out = tmp_path / "t.parquet"
    assert write_parquet(path, out).accepted
    f = pq.ParquetFile(out)
    assert f.metadata.num_row_groups == 15 and f.metadata.num_rows == 101
    table = pq.read_table(out)
    assert table.equals(events_table(path))
    meta = json.loads(table.schema.metadata[META_KEY])
    assert meta["verdict"]["accepted"] is True and meta["organization"] == "S2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.hmtrace", "t.parquet"]  # no tmp
    assert table.schema.remove_metadata() == arrow_schema()  # types survive the round trip
