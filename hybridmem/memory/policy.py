"""Demand, pins and retention (App. B.2, Q8/Q9): which checkpoints outlive their request's need.

Demand counts distinct requesters per recurrent key: the producer at publication (owner
registration), the preempted owner, and every request whose lookup found the checkpoint
resident (hit evidence). The same requester never counts twice; a loss drops the key's record.

* Pinning (``pin_k`` = K, R0/R1/R2 = 3/2/1, Roff = off): at preemption, the owner's deepest
  published checkpoint is pinned (one execution reference, not reclaimable) if its demand is at
  least K and fewer than ``pin_budget`` checkpoints are pinned. The pin is dropped when its owner
  adopts again (after taking its new references) or finishes.
* Retention (``retention``): a request releasing a superseded published checkpoint keeps it
  while its demand is at least ``RETENTION_K`` = 2.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybridmem.events import Cause, EventKind, Outcome
from hybridmem.memory.interface import PinDecision

if TYPE_CHECKING:
    from hybridmem.memory.checkpoints import Checkpoints
    from hybridmem.memory.tables import RequestState

    class _Base(Checkpoints):
        pass
else:
    _Base = object

RETENTION_K = 2  # producer-side retention demand threshold (Q8/Q9)
PIN_THRESHOLDS = {"Roff": None, "R0": 3, "R1": 2, "R2": 1}  # App. B.2 distinct-requester K


class Policy(_Base):
    """Demand, pins and retention (see :class:`~hybridmem.memory.tables.Tables`)."""

    def release_superseded(self, request_id: str) -> list[int]:
        req = self._req(request_id)
        ckpts = req.ckpts
        if len(ckpts) < 2:
            return []  # nothing older than the newest (every decode step of most requests)
        # the newest boundary within ``computed`` stays; the older ones are released unless
        # retained
        older = []
        for b in ckpts:
            if b <= req.computed:
                older.append(b)
        older.sort()
        del older[-1:]  # the newest (none when no boundary is within ``computed``)
        kept = []
        for b in older:
            ck = ckpts[b]
            if ck.ident in req.retained:
                continue
            if self.retention and ck.key:
                demand = len(self.demand.get(ck.key, ()))
                keep = demand >= RETENTION_K
                self._emit(EventKind.RETENTION, request_id=request_id,
                           preemption_count=req.preemptions, hash=ck.key,
                           outcome=Outcome.OK if keep else Outcome.BELOW_THRESHOLD,
                           need=RETENTION_K, free=demand, **self._ckpt_fields(ck))
                if keep:
                    req.retained.add(ck.ident)
                    kept.append(ck.key)
                    continue
            del req.ckpts[b]
            self._ckpt_unref([ck], request_id, req, Cause.NONE)
        return kept

    def _pin_on_preemption(self, req: RequestState) -> PinDecision | None:
        """The pin decision for the preempted ``req``'s deepest published checkpoint (None when
        pinning is off or it has none); a pin takes one reference of each of its pages."""
        published = [b for b, ck in req.ckpts.items() if ck.key]
        if self.pin_k is None or not published:
            return None
        request_id = req.request_id
        ck = req.ckpts[max(published)]
        requesters = self.demand.setdefault(ck.key, set())
        requesters.add(request_id)  # owner registration at preemption
        within_budget = self.pin_budget is None or len(self.pins) < self.pin_budget
        pin = len(requesters) >= self.pin_k and within_budget \
            and ck.ident not in self.pins
        outcome = Outcome.OK if pin else (
            Outcome.BELOW_THRESHOLD if len(requesters) < self.pin_k else Outcome.SKIPPED)
        if pin:
            pool = self.ckpt_pool()
            for p in self.ckpt_pages(ck):
                pool.incref(p)
            self.pins[ck.ident] = (ck, request_id)
        self._emit(EventKind.PIN, request_id=request_id, preemption_count=req.preemptions,
                   hash=ck.key, outcome=outcome, need=self.pin_k, free=len(requesters),
                   **self._ckpt_fields(ck))
        return PinDecision(ck.key, ck.boundary, len(requesters), pin)

    def _unpin_owned(self, request_id: str) -> None:
        for ck, owner in list(self.pins.values()):
            if owner == request_id:
                req = self.requests.get(request_id)
                self._emit(EventKind.UNPIN, request_id=request_id,
                           preemption_count=req.preemptions if req else 0, hash=ck.key,
                           **self._ckpt_fields(ck))
                self._ckpt_unref([ck], None)
