"""Whether any supply row's step regresses (table_checks' ``supply_step_regressions`` > 0), from
the ``_supply_rows`` stream of lineage/bounded.py (before its split by key partition), so that
``table_checks`` need not group the spilled ``_supply`` by step (12.7M steps at 100M events:
1.3-1.4x the CPU per event of 10M).

table_checks.sql counts, for each step s whose last seq follows the first seq of a later step,
its rows after that first seq. Per step (``step >= 0``, seq not NULL):

    first[s] = min(seq), last[s] = max(seq)      (dense int32 arrays indexed by step)
    later[s] = min(first[t] for t > s)                      (a suffix minimum)
    regressing: last[s] > later[s]        steps by seq 1 1 2 1 3 -> step 1: last 4 > later 3

None regressing: the count is 0 whatever the rows, so ``table_checks``' SQL runs with no
supply rows standing for ``_supply``; else it runs over the whole ``_supply``.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lineage.entry_order import as_numpy

# steps past this are not held densely (8 bytes a step), nor seqs outside int32: the check
# gives up (at 100M events: 12.7M steps, 101 MB)
MAX_STEPS = 1 << 25
_HI = np.iinfo(np.int32).max
_LO = np.iinfo(np.int32).min

# tests set this to check that a missed regression changes table_checks (negative control):
# the check then always answers "none regressing"
_FAULT_NEVER_REGRESSES = False


class StepBounds:
    """The first and last seq of every step, gathered batch by batch (any order)."""

    def __init__(self) -> None:
        self.first = np.full(0, _HI, np.int32)
        self.last = np.full(0, _LO, np.int32)
        self.failed = False

    def add(self, rows: pa.Table | pa.RecordBatch) -> None:
        """Take ``rows``' (``_supply_rows``: step, seq) bounds."""
        if self.failed:
            return
        keep = pc.and_(pc.greater_equal(rows["step"], 0), pc.is_valid(rows["seq"]))
        keep = pc.fill_null(keep, False)
        step = as_numpy(rows["step"].filter(keep), np.int64)
        seq = as_numpy(rows["seq"].filter(keep), np.int64)
        if not len(step):
            return
        top = int(step.max()) + 1
        if top > MAX_STEPS or int(seq.min()) <= _LO or int(seq.max()) >= _HI:
            self.failed = True
            self.first = self.last = np.zeros(0, np.int32)
            return
        if top > len(self.first):
            grow = min(MAX_STEPS, max(top, len(self.first) * 5 // 4))
            self.first = np.concatenate([self.first,
                                         np.full(grow - len(self.first), _HI, np.int32)])
            self.last = np.concatenate([self.last, np.full(grow - len(self.last), _LO, np.int32)])
        # per run of one step (the stream is in seq order, so the steps come in long runs):
        # ufunc.at over the runs, not over every row (random access into 51 MB at 100M)
        starts = np.flatnonzero(np.diff(step)) + 1
        starts = np.concatenate([np.zeros(1, np.int64), starts])
        run = step[starts]
        seq32 = seq.astype(np.int32)
        np.minimum.at(self.first, run, np.minimum.reduceat(seq32, starts))
        np.maximum.at(self.last, run, np.maximum.reduceat(seq32, starts))

    def regresses(self) -> bool | None:
        """Whether some step regresses (None: not known, the steps were not held)."""
        if self.failed:
            return None
        if _FAULT_NEVER_REGRESSES or len(self.first) < 2:
            return False
        later = np.minimum.accumulate(self.first[::-1])[::-1]  # min over t >= s
        return bool(np.any(self.last[:-1] > later[1:]))
