"""Every organization's state machine on every geometry: both presets and synthetic geometries
with 2..64 conv slots per slab and 1..4 SSM member pages (a conv line decoded with a fixed 16
slots, whatever the geometry, fails granite-4.0-h-micro's 32-slot slabs at the first
publish). Examples per case: ``GEOMETRY_EXAMPLES`` (default 8; the thorough profile runs 100).
"""

import os

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from invariants.stateful import GEOMETRIES, MACHINES, machine_for

EXAMPLES = int(os.environ.get("GEOMETRY_EXAMPLES",
                              "100" if os.environ.get("HYPOTHESIS_PROFILE") == "thorough" else "8"))
CASES = [(org, geo) for geo in sorted(GEOMETRIES) for org in sorted(MACHINES)
         if org != "D0" or GEOMETRIES[geo].geometry.attention_fraction is not None
         or geo.startswith("syn")]


def test_geometries_cover_slots_and_members():
    slots = {u.slots_per_slab for u in GEOMETRIES.values()}
    members = {u.ssm_members for u in GEOMETRIES.values()}
    assert slots >= {2, 4, 8, 16, 32, 64} and members >= {1, 2, 3, 4}
    assert GEOMETRIES["granite-4.0-h-micro"].slots_per_slab == 32


@pytest.mark.parametrize("org,geo", CASES, ids=[f"{o}-{g}" for o, g in CASES])
def test_state_machine_on_geometry(org, geo):
    run_state_machine_as_test(
        machine_for(org, GEOMETRIES[geo]),
        settings=settings(settings.default, max_examples=EXAMPLES, deadline=None,
                          suppress_health_check=list(HealthCheck)))


def test_s2_on_granite_catches_a_decoder_that_assumes_16_slots(monkeypatch):
    """Negative control: with the old decoder (16 slots whatever the geometry) the S2 machine on
    granite-4.0-h-micro (32 slots per slab) fails; on Falcon-H1-7B (16) it cannot tell."""
    from hybridmem.memory import placement

    def decode16(line, slots_per_slab):
        return None if line < 0 else placement.SlotRef(*divmod(line, 16))

    monkeypatch.setattr(placement, "decode_line", decode16)
    with pytest.raises(Exception):  # noqa: B017 - any failure of the machine will do
        run_state_machine_as_test(
            machine_for("S2", GEOMETRIES["granite-4.0-h-micro"]),
            settings=settings(settings.default, max_examples=50, deadline=None,
                              phases=[Phase.explicit, Phase.generate],  # no shrinking: any
                              suppress_health_check=list(HealthCheck)))  # failure will do


def test_s2_reclaim_of_a_member_page_keeps_the_conv_line():
    """Regression: reclaiming a member page compared the checkpoint's conv LINE id
    with the page id (an S1 rule); when they happened to be equal the line was dropped and the
    slot stayed occupied by a forgotten checkpoint. Two slots per slab make line ids as small as
    page ids, so the derandomized machine meets the collision within 15 programs (it failed
    there before the fix: "slot occupied by a checkpoint that does not point back to it")."""
    run_state_machine_as_test(
        machine_for("S2", GEOMETRIES["syn-slots2-members1"]),
        settings=settings(max_examples=15, deadline=None, stateful_step_count=50,
                          derandomize=True, database=None, phases=[Phase.generate],
                          suppress_health_check=list(HealthCheck)))
