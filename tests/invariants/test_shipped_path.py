"""The checks run the code that ships.

The organizations have one implementation of each operation: no compiled twin, and no loop
chosen by whether a pool watcher or an observer is attached. So:

* every line of the memory core (``hybridmem/memory/``) that an untraced run executes (no
  observer, no watcher: how serving and simulation run) is executed by the same operations
  under the watchers and the recording observer the state machines and
  ``--check-invariants`` attach;
  negative control: a twin chosen by the watcher (the shape the compiled loops had) is caught;
* a bug planted in one shipped function (allocation's reclaim keeps the reclaimed block's key
  discoverable: its invalidation skipped) breaks an untraced run, fails the state machine and
  fails ``--check-invariants``' checker; negative control: without the bug all three pass.
"""

import sys
import types
from contextlib import nullcontext

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from benchmarks import allocator_digest
from benchmarks.allocator_digest import POLICIES, random_ops
from hybridmem.events import NullObserver, RecordingObserver
from hybridmem.geometry import PRESETS
from hybridmem.memory import (
    blocks,
    checkpoints,
    integrity,
    keys,
    layouts,
    organization,
    placement,
    policy,
    pool,
    reclaim,
    tables,
)
from hybridmem.memory.organization import MemoryOrganization
from hybridmem.units import derive_units
from invariants.checkers import DebugOrganization, InvariantViolation
from invariants.stateful import MACHINES

U = derive_units(PRESETS["falcon-h1-7b"])
STEPS = 150
SOURCES = {m.__file__: m.__name__.rsplit(".", 1)[-1] for m in (
    blocks, checkpoints, integrity, keys, layouts, organization, placement, policy, pool,
    reclaim, tables)}
MACHINE_SETTINGS = settings(max_examples=60, stateful_step_count=30, derandomize=True,
                            deadline=None, database=None, report_multiple_bugs=False,
                            phases=[Phase.explicit, Phase.generate],
                            suppress_health_check=list(HealthCheck))


class Checked(DebugOrganization):
    """``DebugOrganization`` (what ``--check-invariants`` wraps the organization in) that
    answers the digest driver's reads of the organization's tables."""

    def __getattr__(self, name):
        return getattr(self.__dict__["inner"], name)


def _lines_run(name, observer, wrap=None, monkeypatch=None):
    """``(module, function, line)`` of the memory core the digest driver's operations
    execute."""
    seen = set()

    def local(frame, event, arg):
        if event == "line":
            seen.add((SOURCES[frame.f_code.co_filename], frame.f_code.co_name, frame.f_lineno))
        return local

    def tracer(frame, event, arg):
        return local if frame.f_code.co_filename in SOURCES else None

    if wrap is not None:
        build = allocator_digest.build
        monkeypatch.setattr(allocator_digest, "build", lambda *a, **kw: wrap(build(*a, **kw)))
    old = sys.gettrace()
    sys.settrace(tracer)
    try:
        random_ops(name, U, POLICIES["pin2-ret"], observer, steps=STEPS)
    finally:
        sys.settrace(old)
        if wrap is not None:
            monkeypatch.setattr(allocator_digest, "build", build)
    return seen


def _watched(org):
    """The organization with the checker's pool watchers attached (its inner organization, so
    the lines are those of the operations alone, not of the checks after them)."""
    return DebugOrganization(org).inner


def _not_run_when_checked(name, monkeypatch):
    shipped = _lines_run(name, NullObserver())
    checked = _lines_run(name, RecordingObserver(), _watched, monkeypatch)
    return shipped - checked, shipped


@pytest.mark.parametrize("name", ["S0", "S1", "S2", "D0"])
def test_checks_execute_every_line_an_untraced_run_executes(name, monkeypatch):
    missing, shipped = _not_run_when_checked(name, monkeypatch)
    assert len({fn for _, fn, _ in shipped}) >= 10  # not vacuous: the operations ran
    assert not missing, f"{name}: lines only untraced runs execute: {sorted(missing)[:10]}"


def test_a_watcher_chosen_twin_is_caught(monkeypatch):
    """Negative control: ``_blocks_unref`` takes a twin (the same steps, defined elsewhere)
    when a watcher is attached, as the compiled loops were taken only without one."""
    orig = MemoryOrganization._blocks_unref
    twin = types.FunctionType(orig.__code__.replace(co_filename="<twin>"), vars(blocks),
                              "_blocks_unref")

    def chosen(self, blks, holder):
        return (orig if blks[0].pool.watcher is None else twin)(self, blks, holder)

    monkeypatch.setattr(MemoryOrganization, "_blocks_unref", chosen)
    missing, _ = _not_run_when_checked("S0", monkeypatch)
    assert missing and {fn for _, fn, _ in missing} == {"_blocks_unref"}


def plant_skipped_invalidation(monkeypatch):
    """The bug: allocation's reclaim (``_make_free``) frees a cached block's page but leaves the
    block's key discoverable, as if the invalidation were skipped."""
    orig = MemoryOrganization._make_free

    def make_free(self, pool, need, requester):
        before = {key: blk for key, blk in self.attn_index.items() if blk.pool is pool}
        orig(self, pool, need, requester)
        for key, blk in before.items():
            if key not in self.attn_index:  # invalidated by the reclaim: undo that
                blk.key = key
                self.attn_index[key] = blk
                self.spare_blocks[pool.name][blk.page] = None  # (not reused: still "live")

    monkeypatch.setattr(MemoryOrganization, "_make_free", make_free)


def _checked_run(name):
    return random_ops(name, U, POLICIES["plain"], RecordingObserver(), steps=STEPS)


@pytest.mark.parametrize("bug", [False, True])
def test_planted_bug_fails_untraced_run_state_machine_and_checker(bug, monkeypatch):
    if bug:
        plant_skipped_invalidation(monkeypatch)
    # untraced, as serving and simulation run: the final integrity check sees it
    with pytest.raises(AssertionError) if bug else nullcontext():
        random_ops("S0", U, POLICIES["plain"], NullObserver(), steps=STEPS)
    # the state machine of S0
    with pytest.raises(Exception) if bug else nullcontext():  # noqa: B017, PT011 - any failure
        run_state_machine_as_test(MACHINES["S0"], settings=MACHINE_SETTINGS)
    # --check-invariants: the checker after every call and through the pool watchers
    with monkeypatch.context() as m:
        build = allocator_digest.build
        m.setattr(allocator_digest, "build", lambda *a, **kw: Checked(build(*a, **kw)))
        with pytest.raises(InvariantViolation) if bug else nullcontext():
            _checked_run("S0")

