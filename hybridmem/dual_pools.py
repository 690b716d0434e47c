"""D0's two static pools: native attention units and native recurrent composites (§3.5).

Both pools are sized at start-up from the plan and never change::

    attention pool   A units of 16 a bytes  (16 tokens each; 16,384 B for Falcon-H1-7B)
    recurrent pool   R units of r bytes     (one complete checkpoint each; 1,594,368 B)

An allocation of one state kind is served only by that kind's pool; a full attention pool is not
relieved by free recurrent capacity, and vice versa. :meth:`pool_for` is the one place that maps a
state kind to its pool.
"""

from __future__ import annotations

from hybridmem.events import StateKind
from hybridmem.page_pool import PagePool

# the state kinds as module globals (the same objects; cached_org says why)
_ATTENTION, _RECURRENT = StateKind.ATTENTION, StateKind.RECURRENT


class DualPools:
    def __init__(self, attention_units: int, recurrent_units: int) -> None:
        self.attention = PagePool("attention", attention_units)
        self.recurrent = PagePool("recurrent", recurrent_units)
        self._totals = (attention_units, recurrent_units)  # fixed at start-up
        # pool_for's answers, asked once (the organization's per-call lookup reads them)
        self.by_kind = {kind: self.pool_for(kind) for kind in (StateKind.ATTENTION,
                                                                 StateKind.RECURRENT)}

    def pool_for(self, kind: StateKind, need: int = 0) -> PagePool:
        """The pool that serves ``kind``; ``need`` is unused: no capacity moves between pools."""
        if kind == _ATTENTION:
            return self.attention
        if kind == _RECURRENT:
            return self.recurrent
        raise ValueError(f"D0 has no pool for state kind {kind.name}")

    def check_integrity(self) -> None:
        totals = (self.attention.total, self.recurrent.total)
        if totals != self._totals:
            raise AssertionError(f"D0 pool sizes changed from {self._totals} to {totals}; "
                                 "capacity must not move between the static pools")
        self.attention.check_integrity()
        self.recurrent.check_integrity()
