"""Where traced engine events go: the binary tracer (``tracer/FORMAT.md``).

The vLLM plugin talks only to :func:`open_sink`, which returns an object with ``on_event(Event)``
and ``close()`` (the writer writes the END record itself on ``close()``). Readers of a finished
trace: :func:`read_trace` (meta and event dicts) and :func:`verify_trace` (the verdict as a
JSON-able dict). The serving layer imports the tracer directly (LAYERS.md: tracer is a
mechanism, layer 2; this module is serving, layer 4).
"""

from __future__ import annotations

import os
from dataclasses import fields
from pathlib import Path
from typing import Any, Protocol

from hybridmem.events import Event
from tracer import TraceReader, TraceWriter, verify


class Sink(Protocol):
    path: Path

    def on_event(self, event: Event) -> None: ...

    def close(self) -> None: ...


_FIELDS = tuple(f.name for f in fields(Event))
_ENUMS = frozenset(("kind", "state_kind", "cause", "outcome"))


def event_dict(event: Event) -> dict[str, Any]:
    """Every Event field by name; enums as ints, chains as lists (no deep copy: hot path)."""
    d: dict[str, Any] = {}
    for name in _FIELDS:
        v = getattr(event, name)
        d[name] = int(v) if name in _ENUMS else (list(v) if isinstance(v, tuple) else v)
    return d


class _BinarySink:
    def __init__(self, path: Path, meta: dict[str, Any]) -> None:
        self.path = path
        self._writer = TraceWriter(str(path), meta)

    def on_event(self, event: Event) -> None:
        self._writer.on_event(event)

    def close(self) -> None:
        self._writer.close()


def open_sink(path: str | os.PathLike[str], meta: dict[str, Any]) -> Sink:
    """Open a binary trace at ``path`` (parent folders created)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    return _BinarySink(p, meta)


def read_trace(path: str | os.PathLike[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(meta, event dicts with ``seq``, END included) of a binary trace."""
    reader = TraceReader(str(path))
    events = [event_dict(e) | {"seq": seq} for seq, _, e in reader.events()]
    return dict(reader.meta), events


def verify_trace(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Verdict of a finished trace as a JSON-able dict (``tracer.verify``), format "binary"."""
    out: dict[str, Any] = dict(verify(str(path)).as_dict())
    out["format"] = "binary"
    return {k: (v if isinstance(v, bool | int | float | str | type(None)) else str(v))
            for k, v in out.items()}
