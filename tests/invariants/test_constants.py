"""The state machines' programs do not depend on which project modules earlier tests loaded.

Hypothesis mixes integer literals (``|v| >= 100``) of every local module loaded so far into its
integer draws; the machines draw wide integers through :func:`invariants.draws.integers`, which
never consults that pool. A module with new literals in every wide range the machines use is
loaded mid-run (as a CLI test loads ``lineage.report``): plain ``st.integers`` draws change (the
control: the pool is live and the literals land in range), ``draws.integers`` draws and the
machines' programs do not.
"""

import hashlib
import importlib
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import run_state_machine_as_test

from invariants import draws
from invariants.stateful import MACHINES

# new literals inside every wide range the machines draw from (none is in draws.NUMBERS)
PROBES = (137, 211, 444, 777, 1111)
RANGES = ((1, 300), (1, 600), (0, 255), (120, 1200), (48, 200))


def _draws(strategy: st.SearchStrategy[int]) -> list[int]:
    got: list[int] = []

    @settings(max_examples=200, derandomize=True, database=None)
    @given(strategy)
    def draw(i: int) -> None:
        got.append(i)

    draw()
    return got


def _programs(org: str) -> list[str]:
    """A digest of every program's event stream (what the organization was made to do)."""
    out: list[str] = []

    class Recorded(MACHINES[org]):  # type: ignore[misc,valid-type]
        def teardown(self) -> None:
            out.append(hashlib.sha256(repr(self.obs.events).encode()).hexdigest()[:16])

    run_state_machine_as_test(Recorded, settings=settings(
        settings.default, max_examples=30, stateful_step_count=20))
    return out


@pytest.fixture
def probe_module(tmp_path, monkeypatch):
    """Loads, on request, a local module whose literals are ``PROBES``; unloads it after."""
    (tmp_path / "hm_constants_probe.py").write_text(
        "".join(f"VALUE_{i} = {v}\n" for i, v in enumerate(PROBES)))
    monkeypatch.syspath_prepend(str(tmp_path))

    def load() -> None:
        assert importlib.import_module("hm_constants_probe").VALUE_2 == PROBES[2]

    yield load
    sys.modules.pop("hm_constants_probe", None)


def test_wide_draws_ignore_module_literals(probe_module) -> None:
    plain_before = {r: _draws(st.integers(*r)) for r in RANGES}
    ours_before = {r: _draws(draws.integers(*r)) for r in RANGES}
    probe_module()
    # control: Hypothesis's own draws pick the new literals up
    changed = [r for r in RANGES if _draws(st.integers(*r)) != plain_before[r]]
    assert changed, "loading new literals changed no plain draw: the check has no teeth"
    assert any(v in _draws(st.integers(*RANGES[3])) for v in PROBES)
    for r in RANGES:
        assert _draws(draws.integers(*r)) == ours_before[r], r
    assert all(lo <= v <= hi for (lo, hi), vs in ours_before.items() for v in vs)


def test_state_machine_programs_ignore_module_literals(probe_module) -> None:
    """D0: its attention pool is drawn from [120, 1200], its rules from [1, 300], [1, 600],
    [0, 255] (the machine whose programs changed with the test order)."""
    before = _programs("D0")
    probe_module()
    assert _programs("D0") == before


def test_listed_numbers_are_drawn_now_and_then() -> None:
    """The organizations' numbers replace the pool's, now and then."""
    got = _draws(draws.integers(1, 600))
    assert 0.01 < sum(v in draws.NUMBERS for v in got) / len(got) < 0.2
