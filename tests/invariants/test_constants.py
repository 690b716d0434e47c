"""The state machines' programs do not depend on which project modules earlier tests loaded
(``conftest.fixed_constants``)."""

import importlib
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.invariants.conftest import _fixed_pool, _providers

PROBE = 123_456_789  # the literal of the module loaded mid-run below


def _draws():
    got = []

    @settings(max_examples=300, derandomize=True, database=None)
    @given(st.integers(0, 10**9))
    def draw(i):
        got.append(i)

    draw()
    return got


def test_local_constants_are_fixed(fixed_constants, monkeypatch, tmp_path):
    providers = _providers()
    assert fixed_constants and providers is not None, \
        "this Hypothesis has no _get_local_constants: check the state machines' programs " \
        "for order dependence again and adapt conftest.fixed_constants"
    before = _draws()
    # a local module with an integer literal Hypothesis has not seen, loaded mid-run (as a CLI
    # test loads lineage.report): the pool stays the fixed one, so the draws stay the same
    (tmp_path / "hm_constants_probe.py").write_text(f"VALUE = {PROBE}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    probe = importlib.import_module("hm_constants_probe")
    assert probe.VALUE == PROBE
    pool = providers._get_local_constants()
    assert pool is _fixed_pool() and PROBE not in pool.integers
    assert 512 in pool.integers  # the organizations' literals (the 512-token grid) are in it
    assert _draws() == before
    # negative control: Hypothesis's own pool takes the module's literal, and draws differ
    monkeypatch.undo()
    sys.modules["hm_constants_probe"] = probe  # (undo restored sys.path, not the module)
    try:
        providers.CONSTANTS_CACHE.cache.clear()
        assert PROBE in providers._get_local_constants().integers
        assert _draws() != before
    finally:
        del sys.modules["hm_constants_probe"]
        providers.CONSTANTS_CACHE.cache.clear()
