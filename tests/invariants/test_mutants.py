"""Mutation checks of the property suite.

1. Seeded bugs (a)-(h), applied with monkeypatch: the state machines (reference model + D.2
   checkers) must fail on every organization the bug can affect;
   (g) and (h) run on the geometry that exposes them. ``test_mutation_score`` prints their score.
2. The memory core's mutant set of ``invariants/mutants.py`` (115 bugs named by behaviour,
   each at a function of the core with an operator matched by kind and touched names): every
   seam must resolve and every operator match its one site (fast), a fast subset (one mutant
   per cluster) must be killed in the default suite, and the whole set is scored by the slow
   test ``test_mutation_score_of_the_full_set`` (every non-equivalent mutant killed). The same
   run as a script::

       PYTHONPATH=. python -m invariants.mutants
"""

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from hybridmem.memory import checkpoints, placement
from hybridmem.memory.checkpoints import Checkpoint
from hybridmem.memory.organization import MemoryOrganization
from hybridmem.memory.placement import NO_LINE, SlotRef
from hybridmem.memory.pool import DualPools
from invariants.mutants import BY_NAME, check, run_mutant, score
from invariants.mutants import MUTANTS as CORE_MUTANTS
from invariants.seams import FlipCompare, Op, SeamGone, mutated_source
from invariants.stateful import GEOMETRIES, MACHINES, machine_for

# No shrinking: a kill only needs one failing program, and its first report is enough.
MUTANT_SETTINGS = settings(max_examples=300, stateful_step_count=50, derandomize=True,
                           deadline=None, database=None, report_multiple_bugs=False,
                           phases=[Phase.explicit, Phase.generate],
                           suppress_health_check=list(HealthCheck))


def slab_reclaim_keeps_other_checkpoints(mp):
    """(a) reclaiming a slab invalidates only its first checkpoint."""
    orig = MemoryOrganization._detach

    def detach(self, pool, page):
        if self.slabs is not None and self.owner[pool.name][page] == "slab":
            held = self.slabs.remove_slab(page)
            ck = self.live_ckpts[held[0][1]]
            ck.conv = NO_LINE
            return [ck]
        return orig(self, pool, page)

    mp.setattr(MemoryOrganization, "_detach", detach)


def partial_checkpoint_is_a_hit(mp):
    """(b) a checkpoint with a missing member counts as complete (lookup hit, no invalidation)."""
    mp.setattr(checkpoints, "is_complete",
               lambda ck, members: len(ck.members) == members and ck.conv >= 0)


def sentinel_decoded(mp):
    """(c) the sentinel line is decoded like any other line (-1 -> page -1, slot 15)."""
    mp.setattr(placement, "decode_line",
               lambda line, slots_per_slab=16: SlotRef(*divmod(line, slots_per_slab)))


def pins_released_before_adoption(mp):
    """(d) resume drops its pins before the adoption has taken execution references."""
    orig = MemoryOrganization.adopt

    def adopt(self, request_id, hit):
        self._unpin_owned(request_id)
        orig(self, request_id, hit)

    mp.setattr(MemoryOrganization, "adopt", adopt)


def member_reassigned_silently(mp):
    """(e) a reclaimed member page is reassigned without invalidating its checkpoint."""
    orig = MemoryOrganization._detach

    def detach(self, pool, page):
        if isinstance(self.owner[pool.name][page], Checkpoint):
            return []
        return orig(self, pool, page)

    mp.setattr(MemoryOrganization, "_detach", detach)


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
    """(g) S2 decodes conv lines with 16 slots per slab whatever the geometry."""
    mp.setattr(placement, "decode_line",
               lambda line, slots_per_slab: None if line < 0 else SlotRef(*divmod(line, 16)))


def member_reclaim_compares_line_with_page(mp):
    """(h) reclaiming a member page drops a conv LINE that equals the page id."""
    orig = MemoryOrganization._detach

    def detach(self, pool, page):
        entry = self.owner[pool.name][page]
        out = orig(self, pool, page)
        if isinstance(entry, Checkpoint) and entry.conv == page:
            entry.conv = NO_LINE
        return out

    mp.setattr(MemoryOrganization, "_detach", detach)


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


# ---- the memory core's mutant set (invariants/mutants.py) -------------------------------------
FAST = ["demand-evidence-when-absent", "pin-kept-after-finish", "pin-budget-off-by-one",
        "release-checkpoints-shallowest-first", "lru-reclaims-newest", "adoption-only-on-hit",
        "release-cause-dropped", "retention-threshold-strict", "adopt-stale-checkpoint",
        "lookup-recurrent-at-length", "salt-length-only", "checkpoint-one-member-short",
        "growth-one-checkpoint-short", "lookup-stops-at-first-missing-checkpoint",
        "allocate-take-without-reference", "publish-skips-closing-checkpoint",
        "make-free-inline-keeps-key", "slab-dropped-with-occupant"]
FAST_SETTINGS = settings(MUTANT_SETTINGS, max_examples=100)


def test_mutant_set_size_and_seams():
    """At least 100 mutants, each named once, with a behaviour; every seam resolves and every
    operator matches its site exactly once (a refactor that moves a rule fails here, naming
    the mutant, instead of scoring it); the fast subset covers every cluster."""
    assert len(CORE_MUTANTS) >= 100 and len(BY_NAME) == len(CORE_MUTANTS)
    assert all(m.why for m in CORE_MUTANTS)
    check(CORE_MUTANTS)
    assert {BY_NAME[n].cluster for n in FAST} == {m.cluster for m in CORE_MUTANTS}


def test_a_moved_seam_or_site_fails_loudly():
    from dataclasses import replace
    m = BY_NAME["pin-budget-off-by-one"]
    with pytest.raises(SeamGone, match="no function 'gone'"):
        replace(m, seam=replace(m.seam, qualname="Policy.gone")).replacement()
    with pytest.raises(SeamGone, match="matches 0 sites"):
        replace(m, change=FlipCompare("<", "<=", touches="no_such_name")).replacement()


def test_an_operator_rewrites_the_rule_it_names():
    """The rewritten function differs from the original at the named rule (the budget
    comparison), and only there."""
    m = BY_NAME["pin-budget-off-by-one"]
    assert isinstance(m.change, Op)
    assert "len(self.pins) <= self.pin_budget" in mutated_source(m)
    assert "len(self.pins) < self.pin_budget" not in mutated_source(m)


@pytest.mark.parametrize("name", FAST)
def test_fast_mutant_is_killed(name):
    result = run_mutant(BY_NAME[name], FAST_SETTINGS)
    assert result.killed_on is not None, f"{name} survived"


def test_mutants_are_undone():
    """After a mutant ran, the organization behaves as the original (the machine passes)."""
    run_mutant(BY_NAME["pin-kept-after-finish"], FAST_SETTINGS)
    run_state_machine_as_test(MACHINES["S0"], settings=settings(FAST_SETTINGS, max_examples=30))


@pytest.mark.slow
def test_mutation_score_of_the_full_set(capsys):
    results = [run_mutant(m) for m in CORE_MUTANTS]
    killed, total = score(results)
    survivors = [r.mutant.name for r in results if not r.mutant.equivalent and not r.killed_on]
    with capsys.disabled():
        print(f"\nmutation score: {killed}/{total} non-equivalent mutants killed "
              f"({100 * killed / total:.1f}%), {len(results) - total} equivalent; survivors: "
              f"{survivors or 'none'}")
    assert killed == total, survivors
