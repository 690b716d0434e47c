"""Hypothesis profiles for the organization state machines.

``ci`` (default): at least 200 examples per organization, short programs, derandomized so CI is
repeatable. ``thorough``: at least 2,000 examples with longer programs; select it with
``HYPOTHESIS_PROFILE=thorough``.

The derandomized programs do not depend on which project modules earlier tests loaded: the
machines draw every integer whose range could hold one of Hypothesis's module constants through
:func:`invariants.draws.integers` (``test_constants.py`` proves it), so no Hypothesis internal is
patched here.
"""

import os

from hypothesis import HealthCheck, settings

_COMMON = {"deadline": None, "database": None,
           "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.filter_too_much]}

settings.register_profile("ci", max_examples=200, stateful_step_count=30, derandomize=True,
                          **_COMMON)
settings.register_profile("thorough", max_examples=2000, stateful_step_count=40, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
