"""JSONL fallback of the trace sink: every field, sequence numbers, END on close."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridmem.engines.trace_sink import JsonlSink, read_jsonl, verify_jsonl
from hybridmem.events import Cause, Event, EventKind, StateKind


def test_jsonl_round_trip_and_verdict(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path / "t.jsonl", {"organization": "vllm"})
    sink.on_event(Event(EventKind.WAITING_ENTRY, request_id="r", depth=300, chain=(2**64 - 1, 5)))
    sink.on_event(Event(EventKind.LOSS, hash=7, depth=128, state_kind=StateKind.RECURRENT,
                        cause=Cause.ALLOCATION, requester="q", page=3))
    sink.flush()
    assert not verify_jsonl(sink.path).accepted, "no END yet: must not be accepted"
    sink.close()
    sink.close()  # idempotent
    meta, events = read_jsonl(sink.path)
    assert meta == {"organization": "vllm"}
    # [WAITING_ENTRY seq 0, LOSS seq 1, END seq 2]
    assert [e["kind"] for e in events] == [1, 3, 13]
    assert [e["seq"] for e in events] == [0, 1, 2]
    assert events[0]["chain"] == [2**64 - 1, 5]
    assert (events[1]["cause"], events[1]["requester"], events[1]["state_kind"]) == (1, "q", 2)
    v = verify_jsonl(sink.path)
    assert v.accepted and v.events == 2


def test_jsonl_rejects_gap_and_end_event(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path / "t.jsonl", {})
    with pytest.raises(ValueError, match="END"):
        sink.on_event(Event(EventKind.END))
    sink.on_event(Event(EventKind.FINISH, request_id="a"))
    sink.close()
    lines = (tmp_path / "t.jsonl").read_text().splitlines()
    (tmp_path / "gap.jsonl").write_text("\n".join([lines[0], lines[2]]) + "\n")  # drop seq 0
    v = verify_jsonl(tmp_path / "gap.jsonl")
    assert not v.accepted and "gap" in v.reason
