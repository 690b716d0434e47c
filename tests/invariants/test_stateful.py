"""Every organization survives its state machine with zero invariant violations.

The number of examples comes from the Hypothesis profile (``ci`` by default, ``thorough`` with
``HYPOTHESIS_PROFILE=thorough``); the test counts the programs actually run.
"""

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from invariants.stateful import MACHINES


@pytest.mark.parametrize("org", sorted(MACHINES))
def test_state_machine(org):
    runs = []

    class Counted(MACHINES[org]):
        def teardown(self):
            runs.append(len(self.obs.events))

    run_state_machine_as_test(Counted, settings=settings.default)
    # every program ran to the end with all checks passing; hypothesis ran >= max_examples
    assert len(runs) >= settings.default.max_examples >= 200, (len(runs), settings.default)
    print(f"{org}: {len(runs)} programs, {sum(runs)} events")
