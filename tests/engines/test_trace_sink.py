"""The trace sink writes the binary trace through the tracer; read back and verdict."""

from __future__ import annotations

from pathlib import Path

from hybridmem.engines.trace_sink import open_sink, read_trace, verify_trace
from hybridmem.events import Cause, Event, EventKind, StateKind


def test_binary_round_trip_and_verdict(tmp_path: Path) -> None:
    sink = open_sink(tmp_path / "sub" / "t.hmt", {"organization": "vllm"})
    sink.on_event(Event(EventKind.WAITING_ENTRY, request_id="r", depth=300, chain=(2**64 - 1, 5)))
    sink.on_event(Event(EventKind.LOSS, hash=7, depth=128, state_kind=StateKind.RECURRENT,
                        cause=Cause.ALLOCATION, requester="q", page=3))
    sink.close()
    meta, events = read_trace(sink.path)
    assert meta["organization"] == "vllm"
    # [WAITING_ENTRY seq 0, LOSS seq 1, END seq 2]
    assert [e["kind"] for e in events] == [1, 3, 13]
    assert [e["seq"] for e in events] == [0, 1, 2]
    assert events[0]["chain"] == [2**64 - 1, 5]
    assert (events[1]["cause"], events[1]["requester"], events[1]["state_kind"]) == (1, "q", 2)
    v = verify_trace(sink.path)
    assert v["accepted"] is True and v["format"] == "binary"


def test_truncated_trace_is_not_accepted(tmp_path: Path) -> None:
    sink = open_sink(tmp_path / "t.hmt", {})
    sink.on_event(Event(EventKind.FINISH, request_id="a"))
    sink.close()
    data = sink.path.read_bytes()
    sink.path.write_bytes(data[:-10])
    assert verify_trace(sink.path)["accepted"] is False
