"""Every organization survives the state machine with zero invariant violations."""

import pytest
from hypothesis import settings

from invariants.stateful import MACHINES


@pytest.mark.parametrize("org", sorted(MACHINES))
def test_state_machine(org):
    machine = MACHINES[org]
    assert settings.default.max_examples >= 200
    machine.TestCase.settings = settings.default
    machine.TestCase("runTest").runTest()
