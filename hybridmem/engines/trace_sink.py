"""Where traced engine events go: the binary tracer when present, JSON lines otherwise.

The vLLM plugin talks only to :func:`open_sink`, which returns an object with ``on_event(Event)``
and ``close()``. When ``tracer.TraceWriter(path, meta)`` is importable it is used as is (it writes
the END record itself on ``close()``). Until then -- or when ``HYBRIDMEM_TRACE_FORMAT=jsonl`` --
events go to a ``.jsonl`` file beside the requested path:

* line 1: ``{"meta": {...}}``
* one line per event: ``{"seq": n, <every Event field by name>}``, enums as integers,
  ``chain``/``recurrent_chain`` as lists of unsigned 64-bit integers;
* last line, on ``close()`` only: the END event (``"kind": 13``) with ``"seq"`` = number of events.

A JSONL trace is accepted (:func:`verify_jsonl`) when its END line is present and the sequence
numbers run 0..n-1 without a gap.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, fields, is_dataclass
from pathlib import Path
from typing import IO, Any, NamedTuple, Protocol

from hybridmem.events import Event, EventKind

FORMAT_ENV = "HYBRIDMEM_TRACE_FORMAT"  # "jsonl" forces the fallback even with the tracer present


class Sink(Protocol):
    path: Path

    def on_event(self, event: Event) -> None: ...

    def close(self) -> None: ...


def _binary_writer_class() -> Any | None:
    if os.environ.get(FORMAT_ENV, "").lower() == "jsonl":
        return None
    import importlib

    try:
        module = importlib.import_module("tracer")
    except ImportError:
        return None
    return getattr(module, "TraceWriter", None)


_FIELDS = tuple(f.name for f in fields(Event))
_ENUMS = frozenset(("kind", "state_kind", "cause", "outcome"))


def event_dict(event: Event) -> dict[str, Any]:
    """Every Event field by name; enums as ints, chains as lists (no deep copy: hot path)."""
    d: dict[str, Any] = {}
    for name in _FIELDS:
        v = getattr(event, name)
        d[name] = int(v) if name in _ENUMS else (list(v) if isinstance(v, tuple) else v)
    return d


class JsonlSink:
    """Fallback sink: one JSON object per line, END written by :meth:`close`. Thread-safe."""

    def __init__(self, path: Path, meta: dict[str, Any]) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._seq = 0
        self._closed = False
        self._fh: IO[str] = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._fh.write(json.dumps({"meta": meta}, sort_keys=True) + "\n")

    def on_event(self, event: Event) -> None:
        if event.kind is EventKind.END:
            raise ValueError("END is written by the sink itself on close(), not emitted")
        line = event_dict(event)
        with self._lock:
            if self._closed:
                raise RuntimeError(f"event after close of trace {self.path}: {event.kind.name}")
            line["seq"] = self._seq
            self._seq += 1
            self._fh.write(json.dumps(line) + "\n")

    def flush(self) -> None:
        with self._lock:
            if not self._closed:
                self._fh.flush()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            end = event_dict(Event(EventKind.END))
            end["seq"] = self._seq
            self._fh.write(json.dumps(end) + "\n")
            self._fh.close()
            self._closed = True


class _BinarySink:
    def __init__(self, writer_cls: Any, path: Path, meta: dict[str, Any]) -> None:
        self.path = path
        self._writer = writer_cls(str(path), meta)

    def on_event(self, event: Event) -> None:
        self._writer.on_event(event)

    def close(self) -> None:
        self._writer.close()


def open_sink(path: str | os.PathLike[str], meta: dict[str, Any]) -> Sink:
    """Open a trace at ``path`` (``.hmt`` binary via the tracer, else ``<stem>.jsonl``)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    writer_cls = _binary_writer_class()
    if writer_cls is not None:
        return _BinarySink(writer_cls, p, meta)
    return JsonlSink(p.with_suffix(".jsonl"), meta)


class JsonlVerdict(NamedTuple):
    accepted: bool
    events: int
    has_end: bool
    reason: str


def read_jsonl(path: str | os.PathLike[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(meta, event dicts including END) of a JSONL trace."""
    with open(path, encoding="utf-8") as fh:
        lines = [json.loads(line) for line in fh if line.strip()]
    if not lines or "meta" not in lines[0]:
        raise ValueError(f"{path}: no meta line; not a hybridmem JSONL trace")
    return lines[0]["meta"], lines[1:]


def read_trace(path: str | os.PathLike[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(meta, event dicts with ``seq``, END included) of a JSONL or binary trace.

    Binary traces are read with ``tracer.reader.TraceReader`` (its ``meta`` and ``events()``
    yielding ``(seq, ts_ns, Event)``); a ValueError when that reader is not importable.
    """
    p = Path(path)
    if p.suffix == ".jsonl":
        return read_jsonl(p)
    import importlib

    try:
        reader = importlib.import_module("tracer.reader").TraceReader(str(p))
    except (ImportError, AttributeError):
        raise ValueError(f"{p}: a binary trace needs tracer.reader (not importable)") from None
    events = [event_dict(e) | {"seq": seq} for seq, _, e in reader.events()]
    return dict(reader.meta), events


def verify_jsonl(path: str | os.PathLike[str]) -> JsonlVerdict:
    """Accept iff END is the last record and sequence numbers run 0..n without a gap."""
    _, events = read_jsonl(path)
    has_end = bool(events) and events[-1]["kind"] == int(EventKind.END)
    for i, e in enumerate(events):
        if e.get("seq") != i:
            return JsonlVerdict(False, len(events), has_end, f"sequence gap at record {i}")
    if not has_end:
        return JsonlVerdict(False, len(events), False, "no END record")
    return JsonlVerdict(True, len(events) - 1, True, "ok")


def verify_trace(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """Verdict of a finished trace as a JSON-able dict; ``None`` when no checker is available.

    JSONL traces are checked here; binary traces by ``tracer.verdict.verify`` once it exists.
    """
    p = Path(path)
    if p.suffix == ".jsonl":
        v = verify_jsonl(p)
        return {"accepted": v.accepted, "events": v.events, "reason": v.reason, "format": "jsonl"}
    import importlib

    try:
        verify = importlib.import_module("tracer.verdict").verify
    except (ImportError, AttributeError):
        return None
    verdict = verify(str(p))
    if is_dataclass(verdict) and not isinstance(verdict, type):
        out = dict(asdict(verdict))
    else:
        out = dict(verdict._asdict())
    out["format"] = "binary"
    return {k: (v if isinstance(v, (bool, int, float, str, type(None))) else str(v))
            for k, v in out.items()}
