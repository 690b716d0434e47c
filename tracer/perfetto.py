"""The Perfetto / Chrome JSON timeline of a binary trace (``tracer/FORMAT.md``), written from the
columnar decoder's record batches (:mod:`tracer.columnar`), a batch of text at a time.

Layout of the file::

    {"displayTimeUnit":"ns","traceEvents":[
    {"ph":"M","name":"process_name",...}            process "hybridmem <org>"
    {"ph":"M","name":"thread_name",...,"tid":0,...} track "global (no request)"
    {"ph":"M",...,"tid":t,...}  x2                  first event of a request: its track t
    {"ph":"E",...} / {"ph":"B",...,"cat":"episode"} episode slices: waiting -> running -> closed
    {"ph":"i","s":"t",...,"args":{"seq":..,...}}    every record (non-default fields in args)
    {"ph":"i","s":"g",...,"name":"END",...}         END, a global instant
    ],"otherData":{"meta":...,"verdict":...}}

Each object is exactly what ``json.dumps(obj, separators=(",", ":"))`` writes for it (key order
included): strings go through :func:`json.dumps` (escapes, ``ensure_ascii``), numbers and the
enum names (lowercase ASCII identifiers) are formatted directly. ``tests/tracer/test_perfetto.py``
compares the bytes with an ``Event``-at-a-time reference built on ``json.dumps``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import IO, Any

from hybridmem.outputs import atomic_output, check_output
from tracer.reader import TraceReader
from tracer.verdict import Verdict

PID = 1
GLOBAL_TID = 0
# (column, default): an instant's args hold the columns whose value is not the default, in this
# order, after "seq"; the hash in hex
ARG_COLUMNS: tuple[tuple[str, Any], ...] = (
    ("step", -1), ("preemption_count", 0), ("hash", 0), ("depth", 0), ("state_kind", "none"),
    ("page", -1), ("line", -1), ("cause", "none"), ("requester", ""), ("need", 0), ("free", 0),
    ("outcome", "none"))
_TEXT_ARGS = frozenset(("state_kind", "cause", "outcome"))  # enum names: quoted as they are
# kinds that move an episode's slice: the phase they open (None: they only close)
_PHASE: dict[str, str | None] = {"waiting_entry": "waiting", "adoption": "running",
                                 "resume": "running", "preemption": None, "finish": None}
# |ts - t0| below this many ns: the int64 difference and its float are exact and
# round(d / 1000.0, 3) == d / 1000.0 (the float's distance to d/1000 is under 5e-4 us)
_EXACT_NS = 8 * 10**15


def _q(text: str) -> str:
    return json.dumps(text)


class Timeline:
    """Turns record batches into timeline text: one thread track per request, B/E slices for the
    ``waiting`` (entry -> adoption) and ``running`` (adoption/resume -> preemption/finish)
    phases of each episode, and an instant event for every record. The per-record text after
    ``ts`` is built a column at a time (:func:`record_tails`); the loop keeps only what depends
    on earlier records: the tracks, the open slices and ``ts`` relative to the first record."""

    def __init__(self) -> None:
        self.tids: dict[str, int] = {}
        self.open: dict[int, None] = {}  # tracks with an open slice, in the order opened
        self.t0: int | None = None
        self.last_us = 0.0

    def _new_track(self, request: str, out: list[str]) -> int:
        tid = self.tids[request] = len(self.tids) + 1
        out.append(f'{{"ph":"M","name":"thread_name","pid":{PID},"tid":{tid},'
                   f'"args":{{"name":{_q(f"request {request}")}}}}}')
        out.append(f'{{"ph":"M","name":"thread_sort_index","pid":{PID},"tid":{tid},'
                   f'"args":{{"sort_index":{tid}}}}}')
        return tid

    def _times(self, batch: Any) -> list[float]:
        """``round((ts_ns - t0) / 1000.0, 3)`` of every record: microseconds from the first."""
        ts_ns = batch.column("ts_ns").to_numpy()
        if self.t0 is None:
            self.t0 = int(ts_ns[0])
        t0 = self.t0
        if max(abs(int(ts_ns.min()) - t0), abs(int(ts_ns.max()) - t0)) < _EXACT_NS:
            us: list[float] = ((ts_ns - t0) / 1000.0).tolist()
        else:  # a forged clock: Python integers, exactly as the formula reads
            us = [round((t - t0) / 1000.0, 3) for t in ts_ns.tolist()]
        self.last_us = max(self.last_us, max(us))
        return us

    def batch(self, batch: Any) -> list[str]:
        """The timeline objects of one record batch (columns of :mod:`tracer.schema`)."""
        import pyarrow.compute as pc

        if batch.num_rows == 0:
            return []
        us = self._times(batch)
        rid = batch.column("request_id")
        tracks = pc.if_else(pc.not_equal(rid, ""), rid, batch.column("requester")).to_pylist()
        kinds = batch.column("kind").to_pylist()
        episodes = batch.column("preemption_count").to_pylist()
        tails = record_tails(batch)
        tids, open_, phases = self.tids, self.open, _PHASE
        out: list[str] = []
        for i, (ts, kind, track, tail) in enumerate(zip(us, kinds, tracks, tails, strict=True)):
            if kind == "end":
                out.append(f'{{"ph":"i","s":"g","pid":{PID},"tid":{GLOBAL_TID},"ts":{ts!r},'
                           f'"name":"END","args":{{"seq":{batch.column("seq")[i].as_py()}}}}}')
                continue
            if track:
                tid = tids.get(track)
                if tid is None:
                    tid = self._new_track(track, out)
            else:
                tid = GLOBAL_TID
            if kind in phases:
                if tid in open_:
                    out.append(f'{{"ph":"E","pid":{PID},"tid":{tid},"ts":{ts!r}}}')
                    del open_[tid]
                phase = phases[kind]
                if phase is not None:
                    open_[tid] = None
                    out.append(f'{{"ph":"B","pid":{PID},"tid":{tid},"ts":{ts!r},'
                               f'"name":"{phase} (episode {episodes[i]})","cat":"episode"}}')
            out.append(f'{{"ph":"i","s":"t","pid":{PID},"tid":{tid},"ts":{ts!r}{tail}')
        return out

    def close_slices(self) -> list[str]:
        """E events at the last record's time for every slice still open."""
        ts = self.last_us
        out = [f'{{"ph":"E","pid":{PID},"tid":{tid},"ts":{ts!r}}}' for tid in self.open]
        self.open.clear()
        return out


def record_tails(batch: Any) -> list[str]:
    """Per record, its instant's text after ``ts``:
    ``,"name":"<name>","cat":"<kind>","args":{"seq":<seq><args>}}`` (:func:`arg_text`), where
    the name is the kind, ``publication <state>`` or ``loss <state> (<cause>)``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind, state, cause = (batch.column(c) for c in ("kind", "state_kind", "cause"))
    name = pc.if_else(
        pc.equal(kind, "publication"), pc.binary_join_element_wise(kind, state, " "),
        pc.if_else(pc.equal(kind, "loss"),
                   pc.binary_join_element_wise(kind, " ", state, " (", cause, ")", ""), kind))
    seq = batch.column("seq").cast(pa.string())
    tails = pc.binary_join_element_wise(',"name":"', name, '","cat":"', kind, '","args":{"seq":',
                                        seq, arg_text(batch), "}}", "")
    out: list[str] = tails.to_pylist()
    return out


def arg_text(batch: Any) -> Any:
    """Per record (an Arrow string array), its ``args`` after ``"seq"``: ``,"name":value`` for
    every column of :data:`ARG_COLUMNS` off its default (hash in 16 hex digits, requester
    JSON-quoted), then
    ``,"chain_len":a,"recurrent_chain_len":b`` when either chain is non-empty. Built a column
    at a time (Arrow compute); the schema's columns hold no nulls."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = batch.num_rows
    empty = pa.scalar("", pa.string())
    parts: list[Any] = []
    for name, default in ARG_COLUMNS:
        col = batch.column(name)
        off = pc.not_equal(col, pa.scalar(default, col.type))
        if name == "hash":
            h = col.to_numpy(zero_copy_only=False).astype(">u8")
            hexes = np.frombuffer(h.tobytes().hex().encode("ascii"), dtype="S16")
            text: Any = pc.binary_join_element_wise(
                ',"hash":"', pa.array(hexes, pa.binary(16)).cast(pa.string()), '"', "")
        elif name in _TEXT_ARGS:
            text = pc.binary_join_element_wise(f',"{name}":"', col, '"', "")
        elif name == "requester":
            codes = col.dictionary_encode()
            quoted = pa.array([_q(t) for t in codes.dictionary.to_pylist()], pa.string())
            text = pc.binary_join_element_wise(',"requester":', quoted.take(codes.indices), "")
        else:
            text = pc.binary_join_element_wise(f',"{name}":', col.cast(pa.string()), "")
        parts.append(pc.if_else(off, text, empty))
    clen = pc.list_value_length(batch.column("chain"))
    rlen = pc.list_value_length(batch.column("recurrent_chain"))
    chains = pc.binary_join_element_wise(
        ',"chain_len":', clen.cast(pa.string()), ',"recurrent_chain_len":',
        rlen.cast(pa.string()), "")
    parts.append(pc.if_else(pc.or_(pc.greater(clen, 0), pc.greater(rlen, 0)), chains, empty))
    joined = pc.binary_join_element_wise(*parts, "")
    assert len(joined) == n
    return joined


def timeline_text(reader: TraceReader, rows: int) -> Iterator[str]:
    """The ``traceEvents`` objects of ``reader``'s recovered records, one string per batch of
    ``rows`` records (objects joined with ``",\\n"``, the first string without the leading
    separator); ``reader.verdict()`` is ready when they are read."""
    from tracer.columnar import record_batches
    from tracer.schema import arrow_schema

    process = f"hybridmem {reader.meta.get('organization') or 'trace'}"
    tl = Timeline()
    head = [f'{{"ph":"M","name":"process_name","pid":{PID},"tid":{GLOBAL_TID},'
            f'"args":{{"name":{_q(process)}}}}}',
            f'{{"ph":"M","name":"thread_name","pid":{PID},"tid":{GLOBAL_TID},'
            f'"args":{{"name":"global (no request)"}}}}']
    yield ",\n".join(head)
    for batch in record_batches(reader, arrow_schema(), rows):
        objs = tl.batch(batch)
        if objs:
            yield ",\n" + ",\n".join(objs)
    tail = tl.close_slices()
    if tail:
        yield ",\n" + ",\n".join(tail)


def write_timeline(reader: TraceReader, f: IO[str], rows: int) -> Verdict:
    f.write('{"displayTimeUnit":"ns","traceEvents":[\n')
    for text in timeline_text(reader, rows):
        f.write(text)
    verdict = reader.verdict()
    assert verdict is not None, "timeline before the reader finished: an export bug"
    other = {"meta": reader.meta, "verdict": verdict.as_dict()}
    f.write('\n],"otherData":' + json.dumps(other, sort_keys=True) + "}\n")
    return verdict


# records decoded and formatted at a time: at 1M events 16,384 gave a peak RSS of 178 MiB
# against 332 MiB at 65,536, at the same CPU time (the batch's Python strings dominate)
ROWS = 16_384


def write_perfetto(path: str | os.PathLike[str], out: str | os.PathLike[str],
                   rows: int = ROWS) -> Verdict:
    """Write a Chrome JSON trace (opens in ui.perfetto.dev and chrome://tracing) to ``out``,
    through a temporary file renamed at the end (never over ``path``); returns the verdict,
    which is also stored under ``otherData``. ``rows`` records are decoded at a time."""
    check_output(out, (path,), "--perfetto")
    reader = TraceReader(path)
    with atomic_output(out, (path,), "--perfetto") as tmp, open(tmp, "w", encoding="utf-8") as f:
        return write_timeline(reader, f, rows)
