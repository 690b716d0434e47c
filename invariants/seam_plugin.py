"""pytest plugin: install the serving mutant named by ``HYBRIDMEM_SEAM_MUTANT`` for the session.

Loaded with ``-p invariants.seam_plugin`` (``invariants.serving_mutants`` does it): the mutant is
installed at configure time, before any test module is collected, so every test runs the mutant
in-process; a seam that is gone fails the session (exit 3) instead of passing it.
"""

from __future__ import annotations

import os

import pytest

_RESTORE = pytest.StashKey[object]()


def pytest_configure(config: pytest.Config) -> None:
    name = os.environ.get("HYBRIDMEM_SEAM_MUTANT")
    if not name:
        return
    from invariants.seams import install
    from invariants.serving_mutants import BY_NAME

    config.stash[_RESTORE] = install(BY_NAME[name])


def pytest_unconfigure(config: pytest.Config) -> None:
    restore = config.stash.get(_RESTORE, None)
    if callable(restore):
        restore()
