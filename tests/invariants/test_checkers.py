"""Each D.2 invariant checker fires on a hand-made violation and names invariant, unit, entry."""

from collections import deque

import pytest

from hybridmem.events import RecordingObserver
from hybridmem.geometry import PRESETS
from hybridmem.memory.checkpoints import MISSING_PAGE
from hybridmem.memory.layouts import build
from hybridmem.units import derive_units
from invariants.checkers import DebugOrganization, Invariant, InvariantViolation

U = derive_units(PRESETS["falcon-h1-7b"])
TOKENS = list(range(1, 3000))


def debug_org(name, capacity=40, finish=True):
    org = build(name, U, capacity, RecordingObserver())
    dbg = DebugOrganization(org)
    dbg.add_request("a", TOKENS[:600])
    dbg.adopt("a", dbg.lookup("a"))
    assert dbg.allocate("a", 600).ok  # blocks 0, 1; checkpoints 512, 1024
    dbg.publish("a", 600)
    if finish:
        dbg.finish("a")
    return org, dbg


def violation(fn, invariant):
    with pytest.raises(InvariantViolation) as info:
        fn()
    assert info.value.invariant is invariant, str(info.value)
    assert info.value.unit and info.value.entry
    return info.value


def test_complete_checkpoint():
    org, dbg = debug_org("S1")
    ck = next(iter(org.rec_index.values()))
    ck.members[1] = MISSING_PAGE  # a member vanished without invalidation
    v = violation(dbg.check_integrity, Invariant.COMPLETE_CHECKPOINT)
    assert "member 1 = -1" in v.unit and "boundary=512" in v.entry


def test_protected_access():
    org, dbg = debug_org("S2", finish=False)
    blk = org.requests["a"].blocks[0]
    org.pool.decref(blk.page)  # "a" still reads the block, but its reference is gone
    v = violation(dbg.checker.check_all, Invariant.PROTECTED_ACCESS)
    assert f"page {blk.page}" in v.unit


def test_invalidate_before_reuse():
    org, dbg = debug_org("S1")
    ck = next(iter(org.rec_index.values()))
    page = ck.members[0]
    # reclaiming the page without first invalidating the checkpoint
    v = violation(lambda: org.pool.reclaim(page), Invariant.INVALIDATE_BEFORE_REUSE)
    assert v.unit == f"shared page {page}" and "boundary=512" in v.entry


def test_valid_location_or_absence():
    org, dbg = debug_org("S2")
    ck = next(iter(org.rec_index.values()))
    ck.conv = -5  # negative, but not the sentinel
    violation(dbg.checker.check_locations, Invariant.VALID_LOCATION)
    ck.conv = ck.home_line + 1  # a line whose slot is empty (or another checkpoint's)
    violation(dbg.checker.check_locations, Invariant.VALID_LOCATION)


def test_line_zero_is_a_valid_location():
    org = build("S2", U, 40, RecordingObserver())
    org.pool._free = deque([1, 2, 3, 4, 5, 0] + list(range(6, 40)))  # 6th take: the slab
    dbg = DebugOrganization(org)
    dbg.add_request("a", TOKENS[:600])
    dbg.adopt("a", dbg.lookup("a"))
    dbg.allocate("a", 600)
    dbg.publish("a", 600)
    assert org.requests["a"].ckpts[512].conv == 0  # page 0, slot 0
    dbg.check_integrity()


def test_adoption_in_flight_is_protected():
    org, dbg = debug_org("S0", finish=False)
    dbg.add_request("b", TOKENS[:700])
    hit = dbg.lookup("b")
    assert hit.j == 512
    page = hit.checkpoint.members[0]
    org.requests["a"].ckpts[512].holders.discard("a")
    dbg.checker.adopting = {("shared", page)}
    violation(lambda: org.pool.decref(page), Invariant.PROTECTED_ACCESS)


def test_wrapper_passes_a_clean_run():
    org, dbg = debug_org("D0", capacity=(400, 4))
    assert dbg.held() == org.held() and dbg.allocated_bytes() == org.allocated_bytes()
