"""Memory-core mutants of ``invariants/mutants.py`` expressed as seam mutants (a demonstration).

The memory-core set patches exact source text, so any edit of the text breaks it. The same bugs
named by behaviour at a seam -- a method of the organization and an operator identified by what
it touches -- survive edits of the surrounding code and a move of the method to another module
(only the :class:`~invariants.seams.Seam` changes: the pin rules moved from the old core's
``preempt`` to ``Policy._pin_on_preemption`` with every operator intact). Six of them, run on
the same state machines and settings as the text set; both forms must be killed::

    PYTHONPATH=. python -m invariants.core_seam_mutants
"""

from __future__ import annotations

import sys
import time

from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from invariants.mutation import MUTANT_SETTINGS
from invariants.seams import (
    AlwaysTrue,
    DropCall,
    FlipCompare,
    Op,
    ReplaceName,
    Seam,
    SeamMutant,
    applied,
)
from invariants.stateful import MACHINES

POLICY = "hybridmem.memory.policy"
RECLAIM = "hybridmem.memory.reclaim"


def _m(name: str, module: str, qualname: str, change: Op, why: str) -> SeamMutant:
    return SeamMutant(name, "memory-core", Seam(module, qualname), change, why)


# each name is the text mutant's in invariants/mutants.py
CORE_MUTANTS = [
    _m("pin-budget-off-by-one", POLICY, "Policy._pin_on_preemption",
       FlipCompare("<", "<=", touches="pin_budget"),
       "one pin more than the budget"),
    _m("pin-threshold-strict", POLICY, "Policy._pin_on_preemption",
       FlipCompare(">=", ">", touches="pin_k"),
       "a checkpoint with exactly pin_k requesters is not pinned"),
    _m("pin-shallowest", POLICY, "Policy._pin_on_preemption",
       ReplaceName("max", "min"),
       "the shallowest published checkpoint is pinned instead of the deepest"),
    _m("unpin-others", POLICY, "Policy._unpin_owned",
       FlipCompare("==", "!=", touches="owner"),
       "a request releases every pin but its own"),
    _m("demand-kept-after-loss", RECLAIM, "Reclaim._lose_ckpt",
       DropCall("pop", touches="demand"),
       "a lost checkpoint's requesters still count towards the next one with its key"),
    _m("pinned-checkpoint-forgotten-on-loss", RECLAIM, "Reclaim._lose_ckpt",
       AlwaysTrue("pins", value=False), "a pinned checkpoint that loses its key is freed"),
]


def run_core(m: SeamMutant, run_settings: settings = MUTANT_SETTINGS,
             orgs: tuple[str, ...] = ("S0", "S1", "S2", "D0")) -> str | None:
    """The organization whose machine failed first with ``m`` installed, or None."""
    with applied(m):
        for org in orgs:
            try:
                run_state_machine_as_test(MACHINES[org], settings=run_settings)
            except Exception:  # noqa: BLE001 - any failure kills the mutant
                return org
    return None


def main() -> int:
    from invariants.mutants import MUTANTS
    from invariants.mutation import run_mutant

    text = {m.name: m for m in MUTANTS}
    ok = True
    for m in CORE_MUTANTS:
        t = time.perf_counter()
        seam_kill = run_core(m)
        text_kill = run_mutant(text[m.name]).killed_on
        ok &= seam_kill is not None and text_kill is not None
        print(f"{m.name}: seam form killed on {seam_kill}, text form on {text_kill} "
              f"[{time.perf_counter() - t:.0f} s]", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
