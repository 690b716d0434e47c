"""The columnar decoder (``tracer.columnar``) against the row reader it replaces in exports and
``verify``: the same table and the same verdict, on whole traces and on forged packets (a CRC
that checks out around records that do not parse, strings used before they are defined, lost
and look-alike strings, duplicated and missing packets). A deliberate fault (string ids resolved
at the end of the file instead of when each record is read) must make them differ."""

from __future__ import annotations

import os
import struct
import tempfile
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.tracer.helpers import every_kind, write_trace
from tracer import columnar
from tracer import format as fmt
from tracer.export import events_table, row_batches
from tracer.judge import ScanCounters, judge
from tracer.reader import LOST_STRING_PREFIX, TraceReader
from tracer.schema import arrow_schema
from tracer.synthetic import synthetic_events

pytestmark = pytest.mark.writer_paths("default")  # reader side: one writer path is enough


def _compiled_walk() -> object:
    from tracer import cext

    mod, why = cext.load()
    return mod.walk if mod is not None else None


@pytest.fixture(params=["py", "c"], autouse=True)
def walk(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs with the Python walk and with the compiled one (when built)."""
    if request.param == "py":
        monkeypatch.setattr(columnar, "WALK", columnar.py_walk)
    else:
        fn = _compiled_walk()
        if fn is None:
            pytest.skip("tracer._ctrace not built: the compiled walk is not there to test")
        monkeypatch.setattr(columnar, "WALK", fn)
    return str(request.param)


def both(path: str | Path, rows: int = 64) -> tuple[pa.Table, pa.Table, ScanCounters,
                                                    ScanCounters]:
    """(row table, columnar table, row counters, columnar counters) of one file; the verdict
    is a function of the counters (``tracer.judge``), so equal counters mean equal verdicts."""
    schema = arrow_schema()
    r1, r2 = TraceReader(path), TraceReader(path)
    a = pa.Table.from_batches(list(row_batches(r1, schema)), schema=schema)
    b = pa.Table.from_batches(list(columnar.record_batches(r2, schema, rows)), schema=schema)
    r3 = TraceReader(path)
    columnar.tally(r3)  # verify()'s path: the same counters without building rows
    assert r3.counters == r2.counters
    return a, b, r1.counters, r2.counters


# ---------------------------------------------------------------------- forged files
_HEADER: bytes | None = None


def header() -> bytes:
    """A valid file header (magic, version, meta, CRC), taken from a writer's file."""
    global _HEADER
    if _HEADER is None:
        fd, path = tempfile.mkstemp(suffix=".hmtrace")
        os.close(fd)
        write_trace(path, [])
        reader = TraceReader(path)
        _HEADER = Path(path).read_bytes()[:reader.header_len]
        os.unlink(path)
    return _HEADER


def event(seq: int, kind: int = 2, sk: int = 1, cause: int = 0, outcome: int = 0, rid: int = 0,
          qid: int = 0, chain: tuple[int, ...] = (), rchain: tuple[int, ...] = ()) -> bytes:
    hashes = struct.pack(f"<{len(chain) + len(rchain)}Q", *chain, *rchain)
    return fmt.EVENT.pack(0, kind, sk, cause, outcome, seq, 1000 + seq, seq // 3, rid, qid,
                          seq % 2, seq * 7919, 512, seq, -1, 0, 0, len(chain),
                          len(rchain)) + hashes


def string(sid: int, text: bytes) -> bytes:
    return fmt.STRING.pack(fmt.TAG_STRING, sid, len(text)) + text


def end(seq: int) -> bytes:
    return fmt.END.pack(fmt.TAG_END, seq, 5000 + seq, seq, 0, 0)


def packet(pkt_seq: int, first_seq: int, content: bytes, count: int) -> bytes:
    head = fmt.PACKET.pack(fmt.PACKET_MAGIC, pkt_seq, first_seq, len(content), count, 0, 0, 0)
    crc = fmt.crc32(head[:fmt.PACKET_CRC_OFFSET], content)
    return head[:fmt.PACKET_CRC_OFFSET] + struct.pack("<I", crc) + content


def forged(tmp: Path, packets: list[bytes]) -> Path:
    path = tmp / "forged.hmtrace"
    path.write_bytes(header() + b"".join(packets))
    return path


def use_before_definition() -> list[bytes]:
    """Request id 1 used in packet 0 and defined only in packet 1; id 2 used before and after
    its definition inside packet 1."""
    p0 = event(0, rid=1) + event(1, rid=0, qid=1)
    p1 = event(2, rid=2) + string(1, b"req-a") + string(2, b"req-b") + event(3, rid=1, qid=2)
    return [packet(0, 0, p0, 2), packet(1, 2, p1, 2), packet(2, 4, end(4), 1)]


# ---------------------------------------------------------------------- tests
def test_whole_traces_give_the_same_table_and_verdict(tmp_path: Path) -> None:
    path = tmp_path / "t.hmtrace"
    write_trace(path, every_kind() + list(synthetic_events(3_000, seed=4)), packet_records=64)
    for rows in (1, 7, 100, 65_536):
        a, b, ca, cb = both(path, rows)
        assert a.num_rows == 3_000 + len(every_kind()) + 1 and judge(ca).accepted
        assert a.equals(b) and ca == cb, rows
    assert events_table(path).equals(a.replace_schema_metadata(events_table(path).schema.metadata))


def test_strings_resolve_as_each_record_is_read(tmp_path: Path) -> None:
    a, b, ca, cb = both(forged(tmp_path, use_before_definition()))
    assert a.equals(b) and ca == cb
    ids = b.column("request_id").to_pylist()
    assert ids[0] == f"{LOST_STRING_PREFIX}1>" and ids[2] == f"{LOST_STRING_PREFIX}2>"
    assert ids[3] == "req-a" and b.column("requester").to_pylist()[3] == "req-b"
    assert cb.unresolved_strings == 3 and not judge(cb).accepted


def test_large_string_ids_resolve_like_small_ones(tmp_path: Path) -> None:
    """Ids past the known-id mask's first size (5,000) and past its limit (2^31, looked up in
    the dictionary), used before, at and after their definitions, across packets."""
    big, huge = 5_000, 2**31
    p0 = event(0, rid=big) + string(big, b"req-big") + event(1, rid=big, qid=huge)
    p1 = event(2, rid=huge) + string(huge, b"req-huge") + event(3, rid=huge, qid=big)
    p2 = event(4, rid=huge, qid=big) + end(5)
    a, b, ca, cb = both(forged(tmp_path, [packet(0, 0, p0, 2), packet(1, 2, p1, 2),
                                          packet(2, 4, p2, 2)]))
    assert a.equals(b) and ca == cb
    ids = b.column("request_id").to_pylist()
    assert ids[0] == f"{LOST_STRING_PREFIX}{big}>" and ids[1] == "req-big"
    assert ids[2] == f"{LOST_STRING_PREFIX}{huge}>" and ids[3:5] == ["req-huge"] * 2
    assert b.column("requester").to_pylist()[1] == f"{LOST_STRING_PREFIX}{huge}>"


def test_negative_control_late_resolution_differs(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The fault the design guards against: string ids resolved per packet, not per record
    (a definition inside a packet ignored for the records after it). The comparison must see
    it."""
    codes = columnar._codes
    monkeypatch.setattr(columnar, "_codes", lambda sids, known, defined_at: codes(sids, known, {}))
    a, b, ca, cb = both(forged(tmp_path, use_before_definition()))
    assert not a.equals(b) and ca != cb


def _mostly(good: list, bad: list) -> st.SearchStrategy:
    """A well-formed value 49 times in 50, a deviation otherwise (an event draws five fields,
    a file a few dozen: most files hold both good and refused packets)."""
    return st.integers(0, 49).flatmap(
        lambda r: st.sampled_from(bad) if r == 0 else st.sampled_from(good))


_OFF = _mostly([0], [-1, 1])
_EVENT = st.tuples(st.just("event"), _OFF,  # seq offset from the expected one
                   _mostly([1, 2, 3, 4, 12], [0, 13, 14]), _mostly([0, 1, 2, 3], [4, 9]),
                   _mostly([0, 1, 6], [7]), _mostly([0, 1, 5], [6]),
                   st.integers(0, 5), st.integers(0, 5), st.integers(0, 3), st.integers(0, 2))
_STRING = st.tuples(st.just("string"), _mostly([1, 2, 3, 4, 5], [0]),
                    _mostly(["own"], [b"other", b"\xff\xfe", b"",
                                      LOST_STRING_PREFIX.encode() + b"9>"]))
# per packet: records (events, string definitions), then deviations of packet seq, first seq
# and count, an END at the end (or not), junk bytes at the end (rarely)
_PACKET = st.tuples(st.lists(st.one_of(*[_EVENT] * 4, _STRING), max_size=8), _OFF, _OFF, _OFF,
                    _mostly([False], [True]), _mostly([b""], [b"\x07", b"\x00" * 50]))


def build(spec: list[tuple]) -> list[bytes]:
    """Packets from a spec: records with small deviations from a well-formed stream, and
    deviations in the packet's seq, first_seq and count."""
    out, seq, pkt = [], 0, 0
    for records, dpkt, dfirst, dcount, with_end, junk in spec:
        first = seq
        content, n = b"", 0
        for r in records:
            if r[0] == "event":
                _, dseq, kind, sk, cause, outcome, rid, qid, nc, nr = r
                content += event(max(0, seq + dseq), kind, sk, cause, outcome, rid, qid,
                                 tuple(range(1, nc + 1)), tuple(range(9, 9 + nr)))
                seq, n = seq + 1, n + 1
            else:
                sid, text = r[1], r[2]
                content += string(sid, f"req-{sid}".encode() if text == "own" else text)
        if with_end:
            content += end(seq)
            seq, n = seq + 1, n + 1
        content += junk
        out.append(packet(max(0, pkt + dpkt), max(0, first + dfirst), content, max(0, n + dcount)))
        pkt += 1
    return out


@settings(max_examples=int(os.environ.get("HYBRIDMEM_CORRUPTION_EXAMPLES", "200")) // 2,
          deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(st.lists(_PACKET, min_size=1, max_size=6))
def test_forged_packets_give_the_same_table_and_verdict(tmp_path: Path, spec: list) -> None:
    a, b, ca, cb = both(forged(tmp_path, build(spec)), rows=3)
    assert a.equals(b), (a.to_pylist(), b.to_pylist())
    assert ca == cb


def test_forged_cases_reach_every_refusal(tmp_path: Path) -> None:
    """The forged packets above are not all refused or all accepted: each parser refuses a
    packet for each kind of fault, and both refuse the same ones."""
    cases = {
        "kind END in an event": event(0, kind=13), "kind 0": event(0, kind=0),
        "state kind 9": event(0, sk=9), "cause 7": event(0, cause=7),
        "outcome 6": event(0, outcome=6), "seq": event(1), "unknown tag": b"\x07",
        "overrun": event(0)[:60], "chain overrun": event(0, chain=(1, 2))[:-8],
        "bad utf-8": string(1, b"\xff"), "string id 0": string(0, b"x"),
        "redefined": string(1, b"a") + string(1, b"b"),
        "after END": end(0) + event(1),
    }
    for name, content in cases.items():
        n = 1 if name != "after END" else 2
        path = forged(tmp_path, [packet(0, 0, content, n)])
        a, b, ca, cb = both(path)
        assert ca.malformed_packets == 1 and a.num_rows == 0, name
        assert a.equals(b) and ca == cb, name


@settings(max_examples=int(os.environ.get("HYBRIDMEM_CORRUPTION_EXAMPLES", "200")),
          deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_PACKET, min_size=1, max_size=3), st.integers(0, 400), st.integers(0, 255))
def test_compiled_walk_equals_the_python_walk(walk: str, spec: list, at: int, xor: int) -> None:
    """The compiled walk against its reference on packet contents, also with a byte flipped
    (anywhere: a record length, a tag, a string length)."""
    fn = _compiled_walk()
    if walk == "py" or fn is None:
        pytest.skip("one comparison, run under the compiled parameter")
    for p in build(spec):
        content = bytearray(p[fmt.PACKET.size:])
        if content:
            content[at % len(content)] ^= xor
        a, b = columnar.py_walk(bytes(content)), fn(bytes(content))  # type: ignore[operator]
        assert (a[4] is None) == (b[4] is None), (a[4], b[4])
        if a[4] is None:
            import numpy as np

            assert np.frombuffer(b[0], "<i8").tolist() == list(a[0])
            assert list(map(tuple, b[1])) == a[1] and list(map(tuple, b[2])) == a[2]
            assert a[3] == b[3]


def _row_stats(path: Path) -> dict:
    """``trace stats``'s figures from the row reader, one Event at a time (the reference)."""
    by_kind: dict[str, int] = {}
    by_request: dict[str, dict[str, int]] = {}
    ts = []
    for _, t, e in TraceReader(path).events():
        ts.append(t)
        by_kind[e.kind.name.lower()] = by_kind.get(e.kind.name.lower(), 0) + 1
        if e.kind.name != "END" and e.request_id:
            r = by_request.setdefault(e.request_id, {"events": 0, "episodes": 0})
            r["events"] += 1
            r["episodes"] = max(r["episodes"], e.preemption_count + 1)
    return {"by_kind": {k: n for k, n in by_kind.items() if n},
            "by_request": list(by_request.items()), "first": min(ts, default=None),
            "last": max(ts, default=None)}


def _stats(path: Path) -> dict:
    from tracer.stats import trace_stats

    s = trace_stats(path)
    return {"by_kind": {k: n for k, n in s["by_kind"].items() if n},
            "by_request": list(s["by_request"].items()), "first": s["first_ts_ns"],
            "last": s["last_ts_ns"]}


def test_trace_stats_equal_the_row_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``trace stats`` (columnar, batch by batch) against the row reader, request order
    included, with batches small enough that requests span several; on an intact trace and on
    forged packets with lost strings. Negative control: a decoder that drops the last row of
    every batch."""
    from tracer import stats

    path = tmp_path / "t.hmtrace"
    write_trace(path, every_kind() + list(synthetic_events(2_000, seed=5)), packet_records=64)
    cases = [path, forged(tmp_path, use_before_definition())]
    monkeypatch.setattr(stats, "BATCH_ROWS", 7)
    for p in cases:
        assert _stats(p) == _row_stats(p), p
    batches = columnar.record_batches
    monkeypatch.setattr(columnar, "record_batches",
                        lambda *a: (b.slice(0, b.num_rows - 1) for b in batches(*a)))
    assert _stats(path) != _row_stats(path)


def test_a_column_subset_decodes_only_those_columns(tmp_path: Path) -> None:
    """``events_table(path, columns)`` is the whole table's selection, END row and verdict
    metadata included, whatever the order asked for."""
    path = tmp_path / "t.hmt"
    write_trace(path, every_kind() + list(synthetic_events(1_500, seed=6)), packet_records=64)
    full = events_table(path)
    wanted = ["recurrent_chain", "seq", "kind", "requester", "hash", "ts_ns"]
    part = events_table(path, wanted)
    in_order = [n for n in full.column_names if n in wanted]
    assert part.column_names == in_order
    assert part.equals(full.select(in_order)) and part.schema.metadata == full.schema.metadata
    assert part.column("kind").to_pylist()[-1] == "end"
    # negative control: the same columns of another trace are told apart
    other = tmp_path / "o.hmt"
    write_trace(other, every_kind() + list(synthetic_events(1_500, seed=7)), packet_records=64)
    assert not events_table(other, wanted).equals(part)
    with pytest.raises(ValueError, match="no event column"):
        events_table(path, ["seq", "nope"])
