"""The acceptance verdict of a trace (SPEC §6, App. D.4): :func:`verify` reads the whole trace
(:mod:`tracer.reader`) and judges it by the rules in :mod:`tracer.judge`::

    judge  <-  reader  <-  verdict.verify        (no cycle: the rules import neither)
"""

from __future__ import annotations

from tracer.errors import TraceError
from tracer.judge import VERDICT_KEYS, ScanCounters, Verdict, judge
from tracer.reader import TraceReader


def verify(path: str) -> Verdict:
    """Read the whole trace and judge it. Raises :class:`TraceError` if it cannot be read at all
    (missing file, wrong magic or version, truncated or damaged header)."""
    from tracer.columnar import tally

    reader = TraceReader(path)
    tally(reader)  # the packet walk of reader.events(), no Event objects built
    verdict = reader.verdict()
    assert verdict is not None, "verdict missing after a full read: this indicates a reader bug"
    return verdict


__all__ = ["Verdict", "ScanCounters", "judge", "verify", "VERDICT_KEYS", "TraceError"]
