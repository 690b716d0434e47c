"""Shared helpers for tracer tests: an event of every kind, trace writing, damaged files."""

from __future__ import annotations

import errno
import io
import threading

from hybridmem.events import Cause, Event, EventKind, Outcome, StateKind
from tracer import TraceWriter

META = {"organization": "S2", "engine": "test", "seed": 7, "budget": "b83",
        "geometry": {"name": "falcon-h1-7b"}, "attention_grid_tokens": 512,
        "recurrent_grid_tokens": 512}
U64 = (1 << 64) - 1


def every_kind() -> list[Event]:
    """One event of every kind but END, with non-default values in every field it uses."""
    return [
        Event(EventKind.WAITING_ENTRY, 3, "req-α", 0, depth=3332, chain=(1, U64, 2**63),
              recurrent_chain=(U64 - 1,)),
        Event(EventKind.PUBLICATION, 4, "req-α", 0, U64, 512, StateKind.ATTENTION, 17),
        Event(EventKind.PUBLICATION, 4, "req-α", 0, 5, 512, StateKind.RECURRENT, 9, 16 * 9 + 15),
        Event(EventKind.LOSS, 5, "", 0, 77, 1024, StateKind.CONV, 3, 48, Cause.SLAB_RECLAIM,
              "req-β"),
        Event(EventKind.LOSS, 5, "req-α", 2, 78, 1536, StateKind.RECURRENT, 4, -1,
              Cause.ALLOCATION, "req-β"),
        Event(EventKind.ADOPTION, 6, "req-β", 1, depth=1024),
        Event(EventKind.ALLOCATION, 7, "req-β", 1, requester="req-β", need=9, free=2,
              outcome=Outcome.REJECTED),
        Event(EventKind.RELEASE, 8, "req-α", 0, 99, 512, StateKind.ATTENTION, 5,
              cause=Cause.FINISH),
        Event(EventKind.PREEMPTION, 9, "req-β", 1),
        Event(EventKind.RESUME, 10, "req-β", 2, depth=512),
        Event(EventKind.FINISH, 11, "req-α", 0),
        Event(EventKind.PIN, 12, "req-β", 2, 1234, 2048, StateKind.RECURRENT, 8,
              outcome=Outcome.OK),
        Event(EventKind.UNPIN, 13, "req-β", 2, 1234, 2048, StateKind.RECURRENT, 8),
        Event(EventKind.RETENTION, 14, "req-γ", 0, 4321, 512, StateKind.RECURRENT,
              outcome=Outcome.BELOW_THRESHOLD, requester="req-α"),
        Event(EventKind.ALLOCATION, -1, "", 0, requester="", need=-5, free=-(2**63),
              outcome=Outcome.CAP, page=2**63 - 1),
    ]


def write_trace(path, events, **kw) -> TraceWriter:
    kw.setdefault("handle_signals", False)
    with TraceWriter(path, dict(META), **kw) as w:
        for e in events:
            w.on_event(e)
    return w


class FailingFile(io.BytesIO):
    """A disk that fills up: once ``budget`` bytes are written, writes store what fits and
    raise ENOSPC, until ``budget`` is raised again."""

    def __init__(self, budget: int) -> None:
        super().__init__()
        self.budget = budget
        self.failures = 0

    def write(self, data) -> int:  # type: ignore[override]
        room = self.budget - self.tell()
        data = bytes(data)
        if len(data) <= room:
            return super().write(data)
        if room > 0:
            super().write(data[:room])
        self.failures += 1
        raise OSError(errno.ENOSPC, "No space left on device (simulated)")

    def close(self) -> None:  # keep the bytes readable after the writer closes
        pass


class StallingFile(io.BytesIO):
    """A disk that hangs: packet writes wait until ``release`` is set (the header passes)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.header_done = False

    def write(self, data) -> int:  # type: ignore[override]
        if self.header_done:
            self.release.wait()
        self.header_done = True
        return super().write(bytes(data))

    def close(self) -> None:
        pass
