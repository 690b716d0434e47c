"""The Perfetto exporter (``tracer.perfetto``, columnar decoder, ``json`` writer) writes the
objects of the ``Event``-at-a-time ``json.dumps`` reference (``perfetto_reference.py``), in
order, besides its counters and loss flows: on whole traces, across batch edges, with strings
that need escaping, on damaged files (lost strings, torn tail without END, so slices left
open), and on the fallback path for forged clocks. Deliberate faults (a wrong default, hashes in
decimal) must make them differ."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hybridmem.events import Cause, Event, EventKind, StateKind
from hybridmem.outputs import OutputError
from tests.tracer.helpers import every_kind, write_trace
from tests.tracer.perfetto_reference import reference_timeline
from tests.tracer.test_columnar import forged, use_before_definition
from tracer import perfetto
from tracer.perfetto import write_perfetto
from tracer.synthetic import synthetic_events

pytestmark = pytest.mark.writer_paths("default")  # reader side: one writer path is enough

ODD = ['q"uote', "back\\slash", "new\nline", "tab\t", "ünï", "💾", "</script>", "\x01"]


def odd_strings() -> list[Event]:
    """Requests and requesters whose names JSON must escape."""
    out = []
    for i, name in enumerate(ODD):
        out.append(Event(EventKind.WAITING_ENTRY, i, name, 0, depth=600, chain=(i + 1,)))
        out.append(Event(EventKind.LOSS, i, "", 0, 9 + i, 512, StateKind.ATTENTION, i,
                         cause=Cause.EVICTION, requester=name))
        out.append(Event(EventKind.ADOPTION, i, name, 0, depth=512))
    return out


def export(path: Path, out: Path, rows: int) -> str:
    assert write_perfetto(path, out, rows=rows) is not None
    return out.read_text(encoding="utf-8")


def reference_objects(text: str) -> dict:
    """The document without what the reference never wrote (counters, the loss slices that
    carry flows, and their notes in otherData)."""
    doc = json.loads(text)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e["ph"] not in ("C", "X")]
    for key in ("counters", "flows"):
        doc["otherData"].pop(key, None)
    return doc


def same_as_reference(text: str, path: Path) -> bool:
    return reference_objects(text) == json.loads(reference_timeline(str(path)))


@pytest.fixture
def whole(tmp_path: Path) -> Path:
    path = tmp_path / "t.hmtrace"
    write_trace(path, every_kind() + odd_strings() + list(synthetic_events(2_000, seed=5)),
                packet_records=64)
    return path


@pytest.mark.parametrize("rows", [29, 500, 65_536])
def test_whole_trace_equals_the_reference(whole: Path, tmp_path: Path, rows: int) -> None:
    text = export(whole, tmp_path / "t.json", rows)
    assert same_as_reference(text, whole)
    doc = json.loads(text)
    names = {e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "thread_name"}
    assert {f"request {n}" for n in ODD} <= names, "escaped names read back as written"
    assert doc["otherData"]["verdict"]["accepted"]


def test_torn_tail_and_lost_strings_equal_the_reference(whole: Path, tmp_path: Path) -> None:
    torn = tmp_path / "torn.hmtrace"
    data = whole.read_bytes()
    torn.write_bytes(data[:len(data) * 2 // 3])  # no END: slices stay open to the last record
    text = export(torn, tmp_path / "torn.json", 100)
    assert same_as_reference(text, torn)
    doc = json.loads(text)
    assert not doc["otherData"]["verdict"]["accepted"]
    assert sum(e["ph"] == "B" for e in doc["traceEvents"]) == sum(
        e["ph"] == "E" for e in doc["traceEvents"]), "close_slices closes what is open"
    lost = forged(tmp_path, use_before_definition())
    assert same_as_reference(export(lost, tmp_path / "lost.json", 1), lost)


def test_forged_clock_path_equals_the_reference(whole: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-record ``round`` taken when ``ts`` is too far from the first record for the
    vectorized formula (forced here on a normal trace)."""
    monkeypatch.setattr(perfetto, "_EXACT_NS", 0)
    assert same_as_reference(export(whole, tmp_path / "t.json", 300), whole)


@given(st.integers(-perfetto._EXACT_NS + 1, perfetto._EXACT_NS - 1))
def test_rounding_to_nanoseconds_is_exact_below_the_bound(d: int) -> None:
    assert round(d / 1000.0, 3) == d / 1000.0


@pytest.mark.parametrize("fault", ["default", "hash"])
def test_negative_control_a_fault_differs(whole: Path, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch, fault: str) -> None:
    if fault == "default":  # "line" taken as default at 0 instead of -1
        monkeypatch.setattr(perfetto, "ARG_COLUMNS", tuple(
            (n, 0 if n == "line" else d) for n, d in perfetto.ARG_COLUMNS))
    else:  # hashes written in decimal, through the same code path
        monkeypatch.setattr(perfetto, "ARG_COLUMNS", tuple(
            (n if n != "hash" else "hash_", d) for n, d in perfetto.ARG_COLUMNS))
        real = perfetto.record_args

        def renamed(batch):  # type: ignore[no-untyped-def]
            return real(batch.rename_columns([c if c != "hash" else "hash_"
                                              for c in batch.schema.names]))

        monkeypatch.setattr(perfetto, "record_args", renamed)
    assert not same_as_reference(export(whole, tmp_path / "t.json", 500), whole)


def test_verdict_and_never_over_the_input(whole: Path, tmp_path: Path) -> None:
    v = write_perfetto(whole, tmp_path / "t.json")
    assert v.accepted and v.recovered_records == len(every_kind()) + len(odd_strings()) + 2_000
    before = whole.read_bytes()
    with pytest.raises(OutputError, match="--perfetto .* an input"):
        write_perfetto(whole, whole)
    assert whole.read_bytes() == before
