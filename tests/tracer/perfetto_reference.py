"""The Perfetto timeline an ``Event`` at a time with ``json.dumps`` per object: the reference
``tracer.perfetto`` (columnar, formatted text) is compared with byte for byte
(``test_perfetto.py``). It is the exporter as it was before the columnar one replaced it."""

from __future__ import annotations

import io
import json
from typing import IO, Any

from hybridmem.events import Event, EventKind
from tracer.reader import TraceReader

_ENUM_COLUMNS = ("kind", "state_kind", "cause", "outcome")


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


def write_reference(path: str, f: IO[str]) -> None:
    """Write the reference timeline of ``path`` to ``f``."""
    reader = TraceReader(path)
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
    verdict = reader.verdict()
    assert verdict is not None
    other = {"meta": reader.meta, "verdict": verdict.as_dict()}
    f.write('\n],"otherData":' + json.dumps(other, sort_keys=True) + "}\n")


def reference_timeline(path: str) -> str:
    """The whole JSON file the reference writes for ``path``."""
    f = io.StringIO()
    write_reference(path, f)
    return f.getvalue()
