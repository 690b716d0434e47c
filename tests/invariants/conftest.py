"""Hypothesis profiles for the organization state machines, and one fixture that makes their
programs independent of which tests ran before.

``ci`` (default): at least 200 examples per organization, short programs, derandomized so CI is
repeatable. ``thorough``: at least 2,000 examples with longer programs; select it with
``HYPOTHESIS_PROFILE=thorough``.

Hypothesis mixes integer literals of the project modules loaded so far into its draws (its
"local constants": ``hypothesis.internal.conjecture.providers._get_local_constants``, drawn with
probability 0.05 per integer). Which project modules are loaded depends on what ran earlier in
the process (a CLI test imports ``lineage.report``, say), so the derandomized programs changed
with the selection and order of tests: ``test_state_machine[D0]`` reached "pins released by
their owner at adoption" alone or after ``tests/invariants`` but not after ``tests/hybridmem``.
``fixed_constants`` gives every test here one fixed pool, the literals of the modules the state
machines run (``POOL_MODULES``: what ``pytest tests/invariants/test_stateful.py`` alone has
loaded, plus the mutant runner), and clears Hypothesis's cache of it, so the programs depend
only on that code. (An empty pool keeps them fixed too, but the machines then miss situations
the coverage test asks for: the organizations' own numbers, such as grids, are good draws.)
This is an internal of Hypothesis (pinned in ``pyproject.toml`` for that reason and because the
derandomized programs depend on its version): where it is missing the fixture changes nothing,
and ``test_local_constants_are_fixed`` fails.
"""

import functools
import importlib
import os

import pytest
from hypothesis import HealthCheck, settings

_COMMON = {"deadline": None, "database": None,
           "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.filter_too_much]}

settings.register_profile("ci", max_examples=200, stateful_step_count=30, derandomize=True,
                          **_COMMON)
settings.register_profile("thorough", max_examples=2000, stateful_step_count=40, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


POOL_MODULES = (
    "hybridmem", "hybridmem.addressing", "hybridmem.budget", "hybridmem.errors",
    "hybridmem.events", "hybridmem.extensions", "hybridmem.geometry", "hybridmem.memory",
    "hybridmem.memory.blocks", "hybridmem.memory.checkpoints", "hybridmem.memory.integrity",
    "hybridmem.memory.interface", "hybridmem.memory.keys", "hybridmem.memory.layouts",
    "hybridmem.memory.organization", "hybridmem.memory.placement", "hybridmem.memory.policy",
    "hybridmem.memory.pool", "hybridmem.memory.reclaim", "hybridmem.memory.tables",
    "hybridmem.names", "hybridmem.storage_cost", "hybridmem.units", "invariants",
    "invariants.checkers", "invariants.model", "invariants.mutants", "invariants.mutation",
    "invariants.stateful",
)


def _providers():
    """Hypothesis's providers module where it has the local-constants pool, else None."""
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:  # another Hypothesis: nothing to fix (test_local_constants_are_fixed)
        return None
    if not hasattr(providers, "_get_local_constants") or \
            not hasattr(providers, "CONSTANTS_CACHE"):
        return None
    return providers


@functools.cache
def _fixed_pool():
    """The literals of ``POOL_MODULES``."""
    from hypothesis.internal.constants_ast import Constants, constants_from_module

    pool = Constants()
    for name in POOL_MODULES:
        pool |= constants_from_module(importlib.import_module(name))
    return pool


@pytest.fixture(autouse=True)
def fixed_constants(monkeypatch):
    """Hypothesis's local constants are ``POOL_MODULES``' while a test here runs (see the
    module docstring)."""
    providers = _providers()
    if providers is None:
        yield False
        return
    monkeypatch.setattr(providers, "_get_local_constants", _fixed_pool)
    providers.CONSTANTS_CACHE.cache.clear()  # allowed constants computed with another pool
    yield True
    providers.CONSTANTS_CACHE.cache.clear()
