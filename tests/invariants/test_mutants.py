"""Seeded bugs (a)-(f) of issue 3: each is applied with monkeypatch and the property suite (the
state machines with the D.2 checkers) must fail on every organization the bug can affect."""

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from hybridmem import checkpoint, conv_slab
from hybridmem.cached_org import CachedOrganization
from hybridmem.checkpoint import Checkpoint
from hybridmem.conv_slab import NO_LINE, SlotRef
from hybridmem.dual_pools import DualPools
from invariants.stateful import MACHINES

# No shrinking: a kill only needs one failing program, and its first report is enough.
MUTANT_SETTINGS = settings(max_examples=300, stateful_step_count=50, derandomize=True,
                           deadline=None, database=None, report_multiple_bugs=False,
                           phases=[Phase.explicit, Phase.generate],
                           suppress_health_check=list(HealthCheck))


def slab_reclaim_keeps_other_checkpoints(mp):
    """(a) reclaiming a slab invalidates only its first checkpoint."""
    orig = CachedOrganization._detach

    def detach(self, pool, page):
        if self.slabs is not None and self.owner[pool.name][page] == "slab":
            held = self.slabs.remove_slab(page)
            ck = self.live_ckpts[held[0][1]]
            ck.conv = NO_LINE
            return [ck]
        return orig(self, pool, page)

    mp.setattr(CachedOrganization, "_detach", detach)


def partial_checkpoint_is_a_hit(mp):
    """(b) a checkpoint with a missing member counts as complete (lookup hit, no invalidation)."""
    mp.setattr(checkpoint, "is_complete",
               lambda ck, members: len(ck.members) == members and ck.conv >= 0)


def sentinel_decoded(mp):
    """(c) the sentinel line is decoded like any other line (-1 -> page -1, slot 15)."""
    mp.setattr(conv_slab, "decode_line",
               lambda line, slots_per_slab=16: SlotRef(*divmod(line, slots_per_slab)))


def pins_released_before_adoption(mp):
    """(d) resume drops its pins before the adoption has taken execution references."""
    orig = CachedOrganization.adopt

    def adopt(self, request_id, hit):
        self._unpin_owned(request_id)
        orig(self, request_id, hit)

    mp.setattr(CachedOrganization, "adopt", adopt)


def member_reassigned_silently(mp):
    """(e) a reclaimed member page is reassigned without invalidating its checkpoint."""
    orig = CachedOrganization._detach

    def detach(self, pool, page):
        if isinstance(self.owner[pool.name][page], Checkpoint):
            return []
        return orig(self, pool, page)

    mp.setattr(CachedOrganization, "_detach", detach)


def d0_borrows_capacity(mp):
    """(f) D0 serves an allocation from the other pool when its own pool is short."""
    orig = DualPools.pool_for

    def pool_for(self, kind, need=0):
        own = orig(self, kind, need)
        other = self.recurrent if own is self.attention else self.attention
        if need and own.num_available < need <= other.num_available:
            return other
        return own

    mp.setattr(DualPools, "pool_for", pool_for)


MUTANTS: list[tuple] = [
    ("a-slab-reclaim", slab_reclaim_keeps_other_checkpoints, ["S2"]),
    ("b-partial-hit", partial_checkpoint_is_a_hit, ["S1", "S2"]),
    ("c-sentinel-decoded", sentinel_decoded, ["S2"]),
    ("d-pins-before-adoption", pins_released_before_adoption, ["S0", "S1", "S2", "D0"], (1,)),
    ("e-member-reassigned", member_reassigned_silently, ["S0", "S1", "S2", "D0"]),
    ("f-d0-borrows", d0_borrows_capacity, ["D0"]),
]
CASES = [(m[0], m[1], org, m[3] if len(m) > 3 else None) for m in MUTANTS for org in m[2]]


@pytest.mark.parametrize("name,mutate,org,pins", CASES, ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_mutant_is_killed(name, mutate, org, pins, monkeypatch):
    """``pins``: the pinning thresholds the programs draw from (pinning on for (d))."""
    machine = MACHINES[org]
    if pins is not None:
        machine = type(f"{org}Pinned", (machine,), {"PIN_CHOICES": pins})
    mutate(monkeypatch)
    with pytest.raises(AssertionError) as info:
        run_state_machine_as_test(machine, settings=MUTANT_SETTINGS)
    print(f"{name} on {org}: killed by {type(info.value).__name__}: {info.value}")
