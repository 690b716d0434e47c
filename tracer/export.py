"""Exports of a binary trace: the Arrow/Parquet event table (columns in :mod:`tracer.schema`,
documented in ``tracer/FORMAT.md``) and a Perfetto/Chrome JSON timeline.

Both read only intact packets and carry the verdict with them (table metadata ``hybridmem.meta``
key ``verdict``; timeline ``otherData.verdict``), so a consumer can refuse a damaged run without
re-reading the binary file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, Any

from hybridmem.events import Event, EventKind
from hybridmem.outputs import atomic_output, check_output
from tracer.reader import TraceReader
from tracer.schema import EVENT_COLUMNS, META_KEY, arrow_schema
from tracer.verdict import Verdict

if TYPE_CHECKING:
    import pyarrow as pa

_ENUM_COLUMNS = ("kind", "state_kind", "cause", "outcome")


def _finish(reader: TraceReader) -> Verdict:
    verdict = reader.verdict()
    assert verdict is not None, "export before the reader finished: this indicates an export bug"
    return verdict


def table_metadata(meta: dict[str, Any], verdict: Verdict) -> dict[bytes, bytes]:
    return {META_KEY: json.dumps({**meta, "verdict": verdict.as_dict()},
                                 sort_keys=True).encode()}


BATCH_ROWS = 65_536  # events per Arrow record batch (and Parquet row group) when streaming


def _batches(reader: TraceReader, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The recovered events as record batches of :data:`BATCH_ROWS` rows (the last one
    shorter), decoded a packet at a time into columns (:mod:`tracer.columnar`)."""
    from tracer.columnar import record_batches

    return record_batches(reader, schema, BATCH_ROWS)


def row_batches(reader: TraceReader, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The same batches from ``reader.events()``, one ``Event`` at a time: the reference the
    columnar decoder is tested against (8-9x slower)."""
    import pyarrow as pa

    rows = BATCH_ROWS
    names = [name for name, _, _ in EVENT_COLUMNS]
    fields = names[2:]
    cols: dict[str, list[Any]] = {name: [] for name in names}
    n = 0
    for seq, ts, e in reader.events():
        cols["seq"].append(seq)
        cols["ts_ns"].append(ts)
        for name in fields:
            value = getattr(e, name)
            cols[name].append(value.name.lower() if name in _ENUM_COLUMNS else value)
        n += 1
        if n == rows:
            yield pa.RecordBatch.from_pydict(cols, schema=schema)
            cols = {name: [] for name in names}
            n = 0
    if n:
        yield pa.RecordBatch.from_pydict(cols, schema=schema)


def events_table(path: str | os.PathLike[str]) -> pa.Table:
    """Every recovered event (END included when present) as one Arrow table."""
    import pyarrow as pa

    reader = TraceReader(path)
    schema = arrow_schema()
    batches = list(_batches(reader, schema))
    meta = table_metadata(reader.meta, _finish(reader))
    if not batches:
        return schema.with_metadata(meta).empty_table()
    return pa.Table.from_batches(batches).replace_schema_metadata(meta)


def write_parquet(path: str | os.PathLike[str], out: str | os.PathLike[str]) -> Verdict:
    """Write the event table to ``out`` (Parquet), streaming: one record batch (row group) of
    :data:`BATCH_ROWS` events in memory at a time; the run metadata with the verdict, known
    only at the end, goes into the file footer. Written to a temporary file beside ``out`` and
    renamed (never over ``path``), so ``out`` is never left half written. Returns the trace's
    verdict."""
    import pyarrow.parquet as pq

    check_output(out, (path,), "--parquet")
    reader = TraceReader(path)
    schema = arrow_schema()
    with atomic_output(out, (path,), "--parquet") as tmp:
        # no stored Arrow schema: readers take the schema metadata from the footer key-value
        # pairs, which can still be added after the last batch (the verdict); the Parquet
        # types map back to exactly tracer.schema's Arrow types (tested)
        with pq.ParquetWriter(os.fspath(tmp), schema, store_schema=False) as writer:
            for batch in _batches(reader, schema):
                writer.write_batch(batch)
            verdict = _finish(reader)
            writer.add_key_value_metadata(table_metadata(reader.meta, verdict))
    return verdict


# ---------------------------------------------------------------------- Perfetto / Chrome JSON
_PID = 1
_GLOBAL_TID = 0
_INSTANT_FIELDS = ("step", "preemption_count", "hash", "depth", "state_kind", "page", "line",
                   "cause", "requester", "need", "free", "outcome")
_DEFAULTS = Event(EventKind.END)


def _args(e: Event) -> dict[str, Any]:
    args: dict[str, Any] = {}
    for name in _INSTANT_FIELDS:
        value = getattr(e, name)
        if value != getattr(_DEFAULTS, name):
            args[name] = value.name.lower() if name in _ENUM_COLUMNS else value
    if e.hash:
        args["hash"] = f"{e.hash:016x}"
    if e.chain or e.recurrent_chain:
        args["chain_len"] = len(e.chain)
        args["recurrent_chain_len"] = len(e.recurrent_chain)
    return args


class _Timeline:
    """Writes trace events as they come: one thread track per request, B/E slices for the
    ``waiting`` (entry -> adoption) and ``running`` (adoption/resume -> preemption/finish) phases
    of each episode, and an instant event for every state event."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self.first = True
        self.tids: dict[str, int] = {}
        self.open: dict[int, str] = {}  # tid -> name of the open slice
        self.t0: int | None = None
        self.last_us = 0.0

    def emit(self, obj: dict[str, Any]) -> None:
        self.out.write(("" if self.first else ",\n") + json.dumps(obj, separators=(",", ":")))
        self.first = False

    def tid(self, request: str) -> int:
        if not request:
            return _GLOBAL_TID
        tid = self.tids.get(request)
        if tid is None:
            tid = self.tids[request] = len(self.tids) + 1
            self.emit({"ph": "M", "name": "thread_name", "pid": _PID, "tid": tid,
                       "args": {"name": f"request {request}"}})
            self.emit({"ph": "M", "name": "thread_sort_index", "pid": _PID, "tid": tid,
                       "args": {"sort_index": tid}})
        return tid

    def slice(self, tid: int, ts: float, name: str | None) -> None:
        """Close the open slice on ``tid`` (if any) and open ``name`` (if given)."""
        if tid in self.open:
            self.emit({"ph": "E", "pid": _PID, "tid": tid, "ts": ts})
            del self.open[tid]
        if name is not None:
            self.open[tid] = name
            self.emit({"ph": "B", "pid": _PID, "tid": tid, "ts": ts, "name": name,
                       "cat": "episode"})

    def event(self, seq: int, ts_ns: int, e: Event) -> None:
        if self.t0 is None:
            self.t0 = ts_ns
        ts = round((ts_ns - self.t0) / 1000.0, 3)
        self.last_us = max(self.last_us, ts)
        kind = e.kind.name.lower()
        if e.kind is EventKind.END:
            self.emit({"ph": "i", "s": "g", "pid": _PID, "tid": _GLOBAL_TID, "ts": ts,
                       "name": "END", "args": {"seq": seq}})
            return
        tid = self.tid(e.request_id or e.requester)
        episode = f"episode {e.preemption_count}"
        if e.kind is EventKind.WAITING_ENTRY:
            self.slice(tid, ts, f"waiting ({episode})")
        elif e.kind in (EventKind.ADOPTION, EventKind.RESUME):
            self.slice(tid, ts, f"running ({episode})")
        elif e.kind in (EventKind.PREEMPTION, EventKind.FINISH):
            self.slice(tid, ts, None)
        name = kind
        if e.kind in (EventKind.PUBLICATION, EventKind.LOSS):
            name = f"{kind} {e.state_kind.name.lower()}"
            if e.kind is EventKind.LOSS:
                name += f" ({e.cause.name.lower()})"
        self.emit({"ph": "i", "s": "t", "pid": _PID, "tid": tid, "ts": ts, "name": name,
                   "cat": kind, "args": {"seq": seq, **_args(e)}})

    def close_slices(self) -> None:
        for tid in list(self.open):
            self.slice(tid, self.last_us, None)


def write_perfetto(path: str | os.PathLike[str], out: str | os.PathLike[str]) -> Verdict:
    """Write a Chrome JSON trace (opens in ui.perfetto.dev and chrome://tracing); returns the
    verdict, which is also stored under ``otherData``."""
    check_output(out, (path,), "--perfetto")
    reader = TraceReader(path)
    with atomic_output(out, (path,), "--perfetto") as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write('{"displayTimeUnit":"ns","traceEvents":[\n')
        tl = _Timeline(f)
        org = reader.meta.get("organization")
        tl.emit({"ph": "M", "name": "process_name", "pid": _PID, "tid": _GLOBAL_TID,
                 "args": {"name": f"hybridmem {org or 'trace'}"}})
        tl.emit({"ph": "M", "name": "thread_name", "pid": _PID, "tid": _GLOBAL_TID,
                 "args": {"name": "global (no request)"}})
        for seq, ts, e in reader.events():
            tl.event(seq, ts, e)
        tl.close_slices()
        verdict = _finish(reader)
        other = {"meta": reader.meta, "verdict": verdict.as_dict()}
        f.write('\n],"otherData":' + json.dumps(other, sort_keys=True) + "}\n")
    return verdict
