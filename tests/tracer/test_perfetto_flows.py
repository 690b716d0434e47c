"""The Perfetto export's occupancy counters and loss-to-victim flows: the file loads as JSON, has
a counter track per pool whose values partition the pool, and one flow per loss with a victim
(checked against the victims found independently from the event table)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tracer
from hybridmem.events import Cause, Event, EventKind, Outcome, StateKind
from tracer import perfetto
from tracer.occupancy import occupancy
from tracer.perfetto import AVAILABLE, IN_USE, write_perfetto
from tracer.writer import TraceWriter

pytestmark = pytest.mark.writer_paths("default")  # reader side: one writer path

META = {"organization": "S2", "attention_grid_tokens": 512, "recurrent_grid_tokens": 512,
        "capacity": {"pages": 10}}


def write(path: Path, events: list[Event], meta: dict = META) -> Path:
    with TraceWriter(path, dict(meta), handle_signals=False) as w:
        for e in events:
            w.on_event(e)
    return path


def exported(trace: Path, out: Path) -> dict:
    write_perfetto(trace, out)
    return json.loads(out.read_text(encoding="utf-8"))


def flows(doc: dict) -> set[tuple[int, str]]:
    """(loss seq, victim) of every flow, after checking each has both ends on two tracks."""
    ends: dict[int, dict[str, dict]] = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "X" and "bind_id" in e:
            ends.setdefault(e["bind_id"], {})["out" if e.get("flow_out") else "in"] = e
    got = set()
    for pair in ends.values():
        assert set(pair) == {"out", "in"} and pair["out"]["tid"] != pair["in"]["tid"]
        assert pair["out"]["ts"] == pair["in"]["ts"]
        got.add((pair["out"]["args"]["seq"], pair["out"]["args"]["victim"]))
    return got


def victims(trace: str) -> set[tuple[int, str]]:
    """Independently: each loss whose entry some other track's request published last."""
    rows = tracer.events_table(trace).to_pylist()
    last: dict[tuple[str, int], str] = {}
    out = set()
    for r in rows:
        if r["kind"] == "publication" and r["request_id"]:
            last[(r["state_kind"], r["hash"])] = r["request_id"]
        elif r["kind"] == "loss":
            v = last.get((r["state_kind"], r["hash"]))
            if v and v != (r["request_id"] or r["requester"]):
                out.add((r["seq"], v))
    return out


def test_hand_built_losses(tmp_path):
    pub = EventKind.PUBLICATION
    events = [
        Event(EventKind.ALLOCATION, 1, "a", need=3, free=10, outcome=Outcome.OK, requester="a"),
        Event(pub, 1, "a", hash=7, depth=512, state_kind=StateKind.ATTENTION, page=1),
        Event(pub, 1, "a", hash=8, depth=512, state_kind=StateKind.RECURRENT, page=2),
        Event(EventKind.ALLOCATION, 2, "b", need=9, free=7, outcome=Outcome.REJECTED,
              requester="b"),  # an admission refusal: no counter point under an organization
        Event(EventKind.LOSS, 3, "", hash=7, depth=512, state_kind=StateKind.ATTENTION,
              cause=Cause.ALLOCATION, requester="b"),  # seq 4: a's block, b's allocation
        Event(EventKind.LOSS, 3, "", hash=8, depth=512, state_kind=StateKind.RECURRENT,
              cause=Cause.ALLOCATION, requester="a"),  # its own: no flow
        Event(EventKind.LOSS, 3, "", hash=99, state_kind=StateKind.ATTENTION,
              cause=Cause.EVICTION, requester="b"),  # never published: no victim
        Event(EventKind.ALLOCATION, 3, "b", need=4, free=8, outcome=Outcome.OK, requester="b"),
    ]
    trace = write(tmp_path / "t.hmt", events)
    doc = exported(trace, tmp_path / "t.json")
    assert flows(doc) == {(4, "a")} == victims(str(trace))
    counters = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    assert [(c["name"], c["args"][IN_USE], c["args"][AVAILABLE]) for c in counters] == \
        [("pages pool (units)", 0, 10), ("pages pool (units)", 2, 8)]
    assert doc["otherData"]["flows"] == 1


def test_no_pool_size_no_counters(tmp_path):
    meta = {k: v for k, v in META.items() if k != "capacity"}
    trace = write(tmp_path / "t.hmt", [Event(EventKind.ALLOCATION, 1, "a", need=1, free=3,
                                             outcome=Outcome.OK, requester="a")], meta)
    doc = exported(trace, tmp_path / "t.json")
    assert not [e for e in doc["traceEvents"] if e["ph"] == "C"]
    assert doc["otherData"]["counters"].startswith("none: ")


@pytest.mark.vllm
@pytest.mark.parametrize("org", ["S2", "D0"])
def test_simulated_runs(sim_traces, tmp_path, org, monkeypatch):
    trace = sim_traces[org]
    doc = exported(Path(trace), tmp_path / "t.json")
    want = victims(trace)
    assert len(want) > 5
    assert flows(doc) == want
    # counter tracks: one per pool, each point the occupancy module's, summing to the pool size
    table = tracer.events_table(trace)
    series = occupancy(table, json.loads(table.schema.metadata[b"hybridmem.meta"]))
    for s in series:
        pts = [c["args"] for c in doc["traceEvents"]
               if c["ph"] == "C" and c["name"] == f"{s.pool} pool (units)"]
        assert [p[IN_USE] for p in pts] == s.in_use and [p[AVAILABLE] for p in pts] == s.available
        assert all(p[IN_USE] + p[AVAILABLE] == s.size for p in pts)
    # negative control: an exporter that drops one loss's flow fails the same check
    real, dropped = perfetto.Timeline._flow, []

    def lossy(self, out, ts, tid, state, key, evictor, seq):  # type: ignore[no-untyped-def]
        if not dropped and (seq, self.publisher.get((state, key))) in want:
            dropped.append(seq)
            return
        real(self, out, ts, tid, state, key, evictor, seq)

    monkeypatch.setattr(perfetto.Timeline, "_flow", lossy)
    assert flows(exported(Path(trace), tmp_path / "bad.json")) != want
