"""Seeded bugs (a)-(f) of issue 3 and (g)-(h) of issue 14: each is applied with monkeypatch and
the property suite (the state machines with the D.2 checkers) must fail on every organization the
bug can affect; (g) and (h) run on the geometry that exposes them. The last test prints the
mutation score of this set."""

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from hybridmem import checkpoint, conv_slab
from hybridmem.cached_org import CachedOrganization
from hybridmem.checkpoint import Checkpoint
from hybridmem.conv_slab import NO_LINE, SlotRef
from hybridmem.dual_pools import DualPools
from invariants.stateful import GEOMETRIES, MACHINES, machine_for

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


def decode_assumes_16_slots(mp):
    """(g) S2 decodes conv lines with 16 slots per slab whatever the geometry (issue 14)."""
    mp.setattr(conv_slab, "decode_line",
               lambda line, slots_per_slab: None if line < 0 else SlotRef(*divmod(line, 16)))


def member_reclaim_compares_line_with_page(mp):
    """(h) reclaiming a member page drops a conv LINE that equals the page id (issue 14)."""
    orig = CachedOrganization._detach

    def detach(self, pool, page):
        entry = self.owner[pool.name][page]
        out = orig(self, pool, page)
        if isinstance(entry, Checkpoint) and entry.conv == page:
            entry.conv = NO_LINE
        return out

    mp.setattr(CachedOrganization, "_detach", detach)


MUTANTS: list[tuple] = [
    ("a-slab-reclaim", slab_reclaim_keeps_other_checkpoints, ["S2"]),
    ("b-partial-hit", partial_checkpoint_is_a_hit, ["S1", "S2"]),
    ("c-sentinel-decoded", sentinel_decoded, ["S2"]),
    ("d-pins-before-adoption", pins_released_before_adoption, ["S0", "S1", "S2", "D0"], (1,)),
    ("e-member-reassigned", member_reassigned_silently, ["S0", "S1", "S2", "D0"]),
    ("f-d0-borrows", d0_borrows_capacity, ["D0"]),
    ("g-decode-16-slots", decode_assumes_16_slots, ["S2"], None, "granite-4.0-h-micro"),
    ("h-line-vs-page", member_reclaim_compares_line_with_page, ["S2"], None,
     "syn-slots2-members1"),
]
CASES = [(m[0], m[1], org, m[3] if len(m) > 3 else None, m[4] if len(m) > 4 else None)
         for m in MUTANTS for org in m[2]]
KILLED: dict[str, bool] = {}


@pytest.mark.parametrize("name,mutate,org,pins,geo", CASES,
                         ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_mutant_is_killed(name, mutate, org, pins, geo, monkeypatch):
    """``pins``: the pinning thresholds the programs draw from (pinning on for (d)); ``geo``:
    the geometry the machine runs on (default Falcon-H1-7B)."""
    machine = MACHINES[org] if geo is None else machine_for(org, GEOMETRIES[geo])
    if pins is not None:
        machine = type(f"{org}Pinned", (machine,), {"PIN_CHOICES": pins})
    mutate(monkeypatch)
    KILLED[f"{name}-{org}"] = False
    with pytest.raises(AssertionError) as info:
        run_state_machine_as_test(machine, settings=MUTANT_SETTINGS)
    KILLED[f"{name}-{org}"] = True
    print(f"{name} on {org}: killed by {type(info.value).__name__}: {info.value}")


def test_mutation_score(capsys):
    """Prints the score of the cases run above (all of them when the file runs whole)."""
    if not KILLED:
        pytest.skip("no mutant ran in this session")
    with capsys.disabled():
        print(f"\nmutation score: {sum(KILLED.values())}/{len(KILLED)} mutant cases killed "
              f"({100 * sum(KILLED.values()) / len(KILLED):.1f}%); survivors: "
              f"{sorted(k for k, v in KILLED.items() if not v) or 'none'}")
    assert all(KILLED.values())
