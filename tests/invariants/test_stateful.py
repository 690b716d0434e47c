"""Every organization survives its state machine with zero invariant violations, and the
generated programs reach the situations the reference model exists to check.

The number of examples comes from the Hypothesis profile (``ci`` by default, ``thorough`` with
``HYPOTHESIS_PROFILE=thorough``); the test counts the programs actually run and the situations
(``machine.cases``: event kinds with cause/outcome, and named generator situations) they reached.
"""

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from invariants.stateful import GEOMETRIES, MACHINES, machine_for

REACHED = {
    "ADOPTION hit", "ADOPTION miss",  # an ADOPTION at j = 0 too
    "RELEASE NONE PREEMPTION", "RELEASE NONE FINISH", "RELEASE NONE NONE",
    "PIN NONE OK", "PIN NONE BELOW_THRESHOLD", "PIN NONE SKIPPED",  # SKIPPED: the pin budget
    "RETENTION NONE OK", "RETENTION NONE BELOW_THRESHOLD", "UNPIN",
    "LOSS ALLOCATION NONE", "LOSS EVICTION NONE", "LOSS INVALIDATION NONE",
    "pins released by their owner at adoption", "pins released at finish",
    "prompt ends on a block boundary", "salt team", "salt mate", "stale hit refused",
    "entry lost while two requests hold it",
}
REACHED_BY = {"S0": REACHED | {"checkpoint at L resident, not adopted"},
              "S1": REACHED | {"checkpoint at L resident, not adopted"},
              "S2": REACHED | {"checkpoint at L resident, not adopted", "LOSS SLAB_RECLAIM NONE"},
              # D0: 16-token blocks never end a prompt on its 1,792 grid, and with 1,792-token
              # checkpoints a demand of 2 (retention kept, a pin skipped) is rare in 30 steps
              "D0": REACHED - {"PIN NONE SKIPPED", "RETENTION NONE OK"}}


@pytest.mark.parametrize("org", sorted(MACHINES))
def test_state_machine(org):
    runs = []
    cases: set[str] = set()

    class Counted(MACHINES[org]):
        def teardown(self):
            runs.append(len(self.obs.events))
            cases.update(self.cases)

    run_state_machine_as_test(Counted, settings=settings.default)
    # every program ran to the end with all checks passing; hypothesis ran >= max_examples
    assert len(runs) >= settings.default.max_examples >= 200, (len(runs), settings.default)
    print(f"{org}: {len(runs)} programs, {sum(runs)} events")
    missing = REACHED_BY[org] - cases
    assert not missing, f"{org}: the programs never reached {sorted(missing)}"


def test_small_slabs_fill():
    """On a 2-slot geometry the S2 machine fills slabs (and reclaims them whole)."""
    cases: set[str] = set()

    class Counted(machine_for("S2", GEOMETRIES["syn-slots2-members1"])):
        def teardown(self):
            cases.update(self.cases)

    run_state_machine_as_test(Counted, settings=settings(
        max_examples=20, deadline=None, derandomize=True, database=None,
        phases=[Phase.generate], suppress_health_check=list(HealthCheck)))
    assert {"slab full", "LOSS SLAB_RECLAIM NONE"} <= cases, sorted(cases)
