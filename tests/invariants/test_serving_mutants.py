"""The serving path's behaviour-anchored mutants (``invariants/serving_mutants.py``).

Fast (default suite): every mutant's seam and operator site still exist; the engine rewrites
only the site it names, installs and restores (aliases included), and a moved seam fails
loudly; a few mutants with cheap tests are killed in-process by the test that names them.
Slow: the whole set, each mutant's test files in a pytest run of their own, must score >= 95%
of the non-equivalent mutants killed (``PYTHONPATH=. python -m invariants.serving_mutants`` prints
the same score and the survivors).
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from invariants.seams import (
    DropCall,
    FlipCompare,
    ReplaceConst,
    Seam,
    SeamGone,
    SeamMutant,
    applied,
    skip,
)
from invariants.serving_mutants import BY_NAME, MUTANTS, ROOT, check_seams


def test_the_set_names_behaviours_and_every_seam_resolves() -> None:
    assert len(MUTANTS) >= 60 and len(BY_NAME) == len(MUTANTS)
    assert all(m.why and m.tests for m in MUTANTS)
    check_seams(MUTANTS)  # SeamGone names the mutant whose function or site moved


def test_a_moved_seam_or_site_fails_loudly() -> None:
    gone = SeamMutant("x", "c", Seam("continuation_checks.compare", "no_such_function"), skip(),
                      "")
    with pytest.raises(SeamGone, match="no function 'no_such_function'"):
        gone.replacement()
    nothing = SeamMutant("x", "c", Seam("continuation_checks.compare", "margins"),
                         FlipCompare("<", "<="), "")
    with pytest.raises(SeamGone, match="matches 0 sites"):
        nothing.replacement()
    many = SeamMutant("x", "c", Seam("continuation_checks.compare", "state_diff"),
                      ReplaceConst(0.0, 1.0), "")
    with pytest.raises(SeamGone, match="matches 3 sites"):
        many.replacement()


def test_a_mutant_is_installed_everywhere_and_restored() -> None:
    """A module function is rebound in its module and in every module that imported it by
    name (verdict.py's ``first_divergence``); methods on their class; all restored after."""
    compare = importlib.import_module("continuation_checks.compare")
    verdict = importlib.import_module("continuation_checks.verdict")
    original = compare.first_divergence
    m = SeamMutant("x", "c", Seam("continuation_checks.compare", "first_divergence"),
                   FlipCompare("!=", "=="), "")
    with applied(m):
        assert compare.first_divergence is verdict.first_divergence is not original
        assert compare.first_divergence([1, 2], [1, 3]) == 0  # the flipped comparison
    assert compare.first_divergence is verdict.first_divergence is original
    assert original([1, 2], [1, 3]) == 1


def test_only_the_named_site_changes() -> None:
    """``DropCall("drop")`` in ``_sync_state`` drops the table's ``drop`` call and keeps the
    ``del`` beside it; the recompiled method keeps its name, defaults and line numbers."""
    from hybridmem.vllm_plugin.org_manager import OrgKVCacheManager

    m = SeamMutant("x", "c", Seam("hybridmem.vllm_plugin.org_manager",
                                  "OrgKVCacheManager._sync_state"), DropCall("drop"), "")
    owner, attr, raw, new = m.replacement()
    assert owner is OrgKVCacheManager and attr == "_sync_state" and raw is not new
    assert new.__qualname__ == raw.__qualname__
    assert new.__code__.co_firstlineno == raw.__code__.co_firstlineno
    assert "drop" not in new.__code__.co_names and "drop" in raw.__code__.co_names


# -- the fast subset: one cheap kill per cluster, in-process ------------------------------------
def _call(module: str, name: str, *args: Any) -> Callable[[], None]:
    return lambda: getattr(importlib.import_module(module), name)(*args)


def _manager_program() -> None:
    from tests.engines.test_org_manager_model import Driver

    d = Driver("S1", 0, 16, headroom=0.1)
    for _ in range(40):
        d.step()


FAST: dict[str, Callable[[], None]] = {
    "adopted-blocks-zeroed": _manager_program,
    "state-table-keeps-dropped-mapping": _call("tests.engines.test_state_table",
                                               "test_set_resolve_and_drop"),
    "write-back-keeps-remapped-row": _call(
        "tests.engines.test_resident",
        "test_a_remapped_row_is_dropped_not_written_to_its_old_address"),
    "arms-run-without-their-salts": _call("tests.continuation_checks.test_run_units",
                                          "test_every_arm_of_every_case_has_its_own_salt"),
    "boundary-state-read-one-position-late": _call(
        "tests.continuation_checks.test_run_units",
        "test_the_state_at_b_is_the_block_at_position_b_over_g_minus_one"),
    "margin-from-ascending-logprobs": _call(
        "tests.continuation_checks.test_run_units",
        "test_top2_are_the_two_largest_log_probabilities_whatever_the_order"),
    "depth-class-swapped": lambda: _depth_classes(),
}


def _depth_classes() -> None:
    from lineage.replay import depth_class

    assert depth_class(512, 1024) == "deeper" and depth_class(1024, 512) == "shallower"


@pytest.mark.parametrize("name", sorted(FAST))
def test_fast_mutant_is_killed(name: str) -> None:
    """The test passes on the shipped code (the suite runs it) and fails with the mutant."""
    if name == "adopted-blocks-zeroed":
        pytest.importorskip("vllm")
    FAST[name]()  # control: passes unmutated
    with applied(BY_NAME[name]), pytest.raises(AssertionError):
        FAST[name]()
    FAST[name]()  # restored


@pytest.mark.slow  # every mutant's test files, each in a forked pytest run: ~5-10 min
def test_serving_mutation_score() -> None:
    """The script in a fresh interpreter (its forked children must not inherit this session's
    test modules); its last two lines are the score and the survivors."""
    proc = subprocess.run([sys.executable, "-m", "invariants.serving_mutants"], cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True,
                          text=True, timeout=3600, check=False)
    lines = proc.stdout.strip().splitlines()
    got = re.search(r"score: (\d+)/(\d+) non-equivalent", "\n".join(lines[-2:]))
    assert got, proc.stdout[-2000:] + proc.stderr[-2000:]
    killed, scored = int(got[1]), int(got[2])
    print("\n" + "\n".join(lines[-2:]))
    assert scored >= 60 and killed >= 0.95 * scored, lines[-1]


def test_core_mutants_resolve() -> None:
    """The memory core's set (``invariants/mutants.py``) is built by the same engine: its
    seams exist (when the core moves, its seams move; the operators stay)."""
    from invariants.mutants import MUTANTS as CORE_MUTANTS

    check_seams(CORE_MUTANTS)
