"""The trace writer's compiled fast path, chosen automatically (``tracer/_ctrace.c``).

``TraceWriter(...)`` returns an :class:`AcceleratedTraceWriter` when the extension
``tracer._ctrace`` was built (``pip install -e .`` compiles it; a failed compile is tolerated and
leaves the pure-Python writer) and ``HYBRIDMEM_TRACER_PURE`` is unset, empty or ``0``; with
``HYBRIDMEM_TRACER_PURE=1`` (read at each construction) it returns the pure-Python
:class:`~tracer.writer.TraceWriter`, which stays the reference::

    class AcceleratedTraceWriter(_ctrace.WriterCore, TraceWriter)
          |                        |
          |                        +-- every other method: slow path, seal, flusher, close,
          |                            fork (pure Python, unchanged)
          +-- _buf _off _seq _ids _tok: the emitting state, in C, under the attribute names
          |   the Python methods use (member descriptors)
          +-- on_event(event): packs new request strings, the 100 B record and its chains
              (room in the buffer, token free, every field an int in range), or calls
              _on_event_slow = TraceWriter.on_event, which decides everything else
          +-- record(kind, step, ...): the same from the fields as arguments, or
              _record_py = TraceWriter.record

Both paths write the same bytes for the same events (``tests/tracer/test_accel.py``); every
tracer test runs on both (``tests/tracer/conftest.py``). Synchronization: the GIL, see the C
file's header comment.
"""

from __future__ import annotations

from typing import Any

from hybridmem.events import Event
from tracer import cext
from tracer.cext import PURE_ENV as PURE_ENV  # re-exported: tests, trace bench
from tracer.writer import _CAUSES, _KINDS, _OUTCOMES, _STATE_KINDS, TraceWriter

# The compiled path checks enum fields as ranges (kinds 1.., the others 0..): they must be.
assert sorted(_KINDS) == list(range(1, len(_KINDS) + 1)), "EventKind values are not 1..n"
assert all(sorted(t) == list(range(len(t))) for t in (_STATE_KINDS, _CAUSES, _OUTCOMES))

_ctrace: Any
UNAVAILABLE: str | None
_ctrace, UNAVAILABLE = cext.load()
if _ctrace is not None:
    _ctrace.bind(Event, *(max(table) for table in (_KINDS, _STATE_KINDS, _CAUSES, _OUTCOMES)))
pure_forced = cext.pure_forced


if _ctrace is not None:

    class AcceleratedTraceWriter(_ctrace.WriterCore, TraceWriter):
        """:class:`TraceWriter` with the compiled ``on_event`` (see the module docstring)."""

        implementation = "c"
        _on_event_slow = TraceWriter.on_event
        _record_py = TraceWriter.record

    ACCELERATED: type[TraceWriter] | None = AcceleratedTraceWriter
else:
    ACCELERATED = None


class PureTraceWriter(TraceWriter):
    """The pure-Python writer whatever the environment (``TraceWriter(...)`` itself chooses):
    the reference the compiled one is compared with, in tests and in ``trace bench``."""


def writer_class() -> type[TraceWriter]:
    """The class ``TraceWriter(...)`` instantiates now."""
    if ACCELERATED is None or pure_forced():
        return TraceWriter
    return ACCELERATED


def set_test_clock(clock: Any) -> None:
    """Tests only: the compiled path stamps ``clock()`` instead of CLOCK_MONOTONIC (None:
    back to the real clock). The pure path reads ``tracer.writer._mono``; patch both."""
    if _ctrace is not None:
        _ctrace.set_clock(clock)
