"""The Perfetto / Chrome JSON timeline of a binary trace (``tracer/FORMAT.md``), written from the
columnar decoder's record batches (:mod:`tracer.columnar`), a batch at a time.

Layout of the file::

    {"displayTimeUnit":"ns","traceEvents":[
    {"ph":"M","name":"process_name",...}            process "hybridmem <org>"
    {"ph":"M","name":"thread_name",...,"tid":0,...} track "global (no request)"
    {"ph":"M",...,"tid":t,...}  x2                  first event of a request: its track t
    {"ph":"E",...} / {"ph":"B",...,"cat":"episode"} episode slices: waiting -> running -> closed
    {"ph":"i","s":"t",...,"args":{"seq":..,...}}    every record (non-default fields in args)
    {"ph":"C","name":"<pool> pool (units)",...}     occupancy counters at allocation attempts
    {"ph":"X","dur":0,...,"bind_id":n,"flow_out":true}  a loss, on the evicting request's track,
    {"ph":"X","dur":0,...,"bind_id":n,"flow_in":true}   and on its victim's: a flow arrow
    {"ph":"i","s":"g",...,"name":"END",...}         END, a global instant
    ],"otherData":{"meta":...,"verdict":...,"counters":...,"flows":...}}

Counters (:mod:`tracer.occupancy`): per pool, ``in use`` and ``available (free or cached)``
units at each allocation attempt that observes the pool (their sum is the pool's size); the
trace does not say which available units are cached, so no cached counter is drawn. A run
whose metadata names no pool size gets no counters (``otherData.counters`` says why).

Flows: the victim of a loss is the request that published the lost entry (the latest
publication of the same state kind and key before the loss). Each loss whose victim's track
differs from the loss's own track (the evicting request, or the global track when no request
caused it) gets a zero-length slice on each of the two tracks, bound by a flow (Perfetto's
``bind_id`` / ``flow_out`` / ``flow_in``, which its JSON importer reads on slices; it draws no
flow on an instant).

Writer: every object is a dict serialized by the standard :mod:`json` module (one encode per
batch's list, compact separators); the writer only streams the encoded batches into the
enclosing ``traceEvents`` array (its brackets and the commas between batches), so no object's
text is assembled by hand. It costs more than the
column-at-a-time text builder it replaced: over the same 1M-event synthetic trace, interleaved
runs on a loaded 2-core box, 18.9-27.0 CPU-s and 310-317 MiB peak against 5.1-6.6 CPU-s and
170-174 MiB (``benchmarks/RESULTS.md``). The export is not on a serving path and a timeline
that size is about what the Perfetto UI opens, so the one implementation a reader can check
against the format (``json``) was kept over the speed.
"""

from __future__ import annotations

import json
import os
from typing import IO, Any

from hybridmem.outputs import atomic_output, check_output
from tracer.occupancy import OccupancyError, pool_label, pool_sizes, successful_only
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
# kinds that move an episode's slice: the phase they open (None: they only close)
_PHASE: dict[str, str | None] = {"waiting_entry": "waiting", "adoption": "running",
                                 "resume": "running", "preemption": None, "finish": None}
# |ts - t0| below this many ns: the int64 difference and its float are exact and
# round(d / 1000.0, 3) == d / 1000.0 (the float's distance to d/1000 is under 5e-4 us)
_EXACT_NS = 8 * 10**15
_DUMP = json.JSONEncoder(separators=(",", ":")).encode
IN_USE, AVAILABLE = "in use", "available (free or cached)"


class Timeline:
    """Turns record batches into timeline objects: one thread track per request, B/E slices
    for the ``waiting`` (entry -> adoption) and ``running`` (adoption/resume ->
    preemption/finish) phases of each episode, an instant for every record, the pools'
    occupancy counters and a flow from each loss to its victim."""

    def __init__(self, meta: dict[str, Any] | None = None) -> None:
        meta = meta or {}
        self.tids: dict[str, int] = {}
        self.open: dict[int, None] = {}  # tracks with an open slice, in the order opened
        self.t0: int | None = None
        self.last_us = 0.0
        try:
            self.pools: dict[str, int] = pool_sizes(meta)
            self.counters = "in use and available units per pool at allocation attempts"
        except OccupancyError as exc:
            self.pools, self.counters = {}, f"none: {exc}"
        self.labels = {k: pool_label(meta, k) for k in self.pools}
        self.ok_only = successful_only(meta)
        self.publisher: dict[tuple[str, int], str] = {}  # (state kind, key) -> request
        self.flows = 0

    def _new_track(self, request: str, out: list[dict[str, Any]]) -> int:
        tid = self.tids[request] = len(self.tids) + 1
        out.append({"ph": "M", "name": "thread_name", "pid": PID, "tid": tid,
                    "args": {"name": f"request {request}"}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": PID, "tid": tid,
                    "args": {"sort_index": tid}})
        return tid

    def _track(self, request: str, out: list[dict[str, Any]]) -> int:
        if not request:
            return GLOBAL_TID
        tid = self.tids.get(request)
        return tid if tid is not None else self._new_track(request, out)

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

    def batch(self, batch: Any) -> list[dict[str, Any]]:
        """The timeline objects of one record batch (columns of :mod:`tracer.schema`)."""
        if batch.num_rows == 0:
            return []
        us = self._times(batch)
        col = {name: batch.column(name).to_pylist()
               for name in ("seq", "kind", "request_id", "requester", "hash", "state_kind",
                            "outcome", "free", "preemption_count", "cause")}
        args = record_args(batch)
        out: list[dict[str, Any]] = []
        for i, (ts, kind) in enumerate(zip(us, col["kind"], strict=True)):
            if kind == "end":
                out.append({"ph": "i", "s": "g", "pid": PID, "tid": GLOBAL_TID, "ts": ts,
                            "name": "END", "args": {"seq": col["seq"][i]}})
                continue
            tid = self._track(col["request_id"][i] or col["requester"][i], out)
            if kind in _PHASE:
                if tid in self.open:
                    out.append({"ph": "E", "pid": PID, "tid": tid, "ts": ts})
                    del self.open[tid]
                phase = _PHASE[kind]
                if phase is not None:
                    self.open[tid] = None
                    out.append({"ph": "B", "pid": PID, "tid": tid, "ts": ts,
                                "name": f"{phase} (episode {col['preemption_count'][i]})",
                                "cat": "episode"})
            state = col["state_kind"][i]
            name = kind
            if kind == "publication":
                name = f"publication {state}"
                if col["request_id"][i]:
                    self.publisher[(state, col["hash"][i])] = col["request_id"][i]
            elif kind == "loss":
                name = f"loss {state} ({col['cause'][i]})"
            out.append({"ph": "i", "s": "t", "pid": PID, "tid": tid, "ts": ts, "name": name,
                        "cat": kind, "args": args[i]})
            if kind == "loss":
                self._flow(out, ts, tid, state, col["hash"][i], col["requester"][i],
                           col["seq"][i])
            elif kind == "allocation" and state in self.pools and (
                    not self.ok_only or col["outcome"][i] == "ok"):
                size, free = self.pools[state], col["free"][i]
                out.append({"ph": "C", "pid": PID, "tid": GLOBAL_TID, "ts": ts,
                            "name": f"{self.labels[state]} pool (units)",
                            "args": {IN_USE: size - free, AVAILABLE: free}})
        return out

    def _flow(self, out: list[dict[str, Any]], ts: float, tid: int, state: str, key: int,
              evictor: str, seq: int) -> None:
        victim = self.publisher.get((state, key))
        if not victim or self.tids.get(victim, -1) == tid:
            return
        vtid = self._track(victim, out)
        self.flows += 1
        by = evictor or "no request"
        out.append({"ph": "X", "pid": PID, "tid": tid, "ts": ts, "dur": 0,
                    "name": f"evicts {state} of {victim}", "cat": "loss",
                    "args": {"seq": seq, "victim": victim},
                    "bind_id": self.flows, "flow_out": True})
        out.append({"ph": "X", "pid": PID, "tid": vtid, "ts": ts, "dur": 0,
                    "name": f"loses {state} to {by}", "cat": "loss",
                    "args": {"seq": seq, "evictor": by},
                    "bind_id": self.flows, "flow_in": True})

    def close_slices(self) -> list[dict[str, Any]]:
        """E events at the last record's time for every slice still open."""
        ts = self.last_us
        out = [{"ph": "E", "pid": PID, "tid": tid, "ts": ts} for tid in self.open]
        self.open.clear()
        return out


def record_args(batch: Any) -> list[dict[str, Any]]:
    """Per record, its instant's ``args``: ``seq``, then every column of :data:`ARG_COLUMNS`
    off its default (the hash in 16 hex digits), then ``chain_len`` and
    ``recurrent_chain_len`` when either chain is non-empty. A column at a time: only the
    records off a column's default are visited for it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    out: list[dict[str, Any]] = [{"seq": s} for s in batch.column("seq").to_pylist()]
    for name, default in ARG_COLUMNS:
        col = batch.column(name)
        idx = pc.indices_nonzero(pc.not_equal(col, pa.scalar(default, col.type)))
        values = col.take(idx).to_pylist()
        if name == "hash":
            values = [f"{v:016x}" for v in values]
        for i, v in zip(idx.to_pylist(), values, strict=True):
            out[i][name] = v
    clen = pc.list_value_length(batch.column("chain"))
    rlen = pc.list_value_length(batch.column("recurrent_chain"))
    idx = pc.indices_nonzero(pc.or_(pc.greater(clen, 0), pc.greater(rlen, 0)))
    for i, c, r in zip(idx.to_pylist(), clen.take(idx).to_pylist(), rlen.take(idx).to_pylist(),
                       strict=True):
        out[i]["chain_len"] = c
        out[i]["recurrent_chain_len"] = r
    return out


def write_timeline(reader: TraceReader, f: IO[str], rows: int) -> Verdict:
    from tracer.columnar import record_batches
    from tracer.schema import arrow_schema

    tl = Timeline(reader.meta)
    process = f"hybridmem {reader.meta.get('organization') or 'trace'}"
    head = [{"ph": "M", "name": "process_name", "pid": PID, "tid": GLOBAL_TID,
             "args": {"name": process}},
            {"ph": "M", "name": "thread_name", "pid": PID, "tid": GLOBAL_TID,
             "args": {"name": "global (no request)"}}]
    f.write('{"displayTimeUnit":"ns","traceEvents":[\n')
    f.write(_DUMP(head)[1:-1])
    for batch in record_batches(reader, arrow_schema(), rows):
        objs = tl.batch(batch)
        if objs:
            f.write(",\n" + _DUMP(objs)[1:-1])
    tail = tl.close_slices()
    if tail:
        f.write(",\n" + _DUMP(tail)[1:-1])
    verdict = reader.verdict()
    assert verdict is not None, "timeline before the reader finished: an export bug"
    other = {"meta": reader.meta, "verdict": verdict.as_dict(), "counters": tl.counters,
             "flows": tl.flows}
    f.write('\n],"otherData":' + json.dumps(other, sort_keys=True) + "}\n")
    return verdict


# records decoded and formatted at a time
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
