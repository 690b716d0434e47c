"""Fault injection for organization-backed serving: one registry both sides read.

A fault makes the memory path deliberately wrong so that the checks (greedy-token equality,
``--check-invariants``) can be shown to have teeth. The name travels in the engine config
(``additional_config["hybridmem"]["fault"]``) and is recorded in the trace metadata and the
run summary. With no fault active nothing below is consulted on a hot path: the scheduler side
decides once, when its manager is built, and the worker side reads :func:`active` once per
engine.

==================  ========  ============================================================
name                side      what goes wrong
==================  ========  ============================================================
stale-checkpoint    scheduler an adopter's Mamba block table holds another checkpoint at
                              its adopted depth: a shallower one of its chain when one is
                              discoverable, else any other live one; it resumes from the
                              wrong state
skip-invalidate     scheduler reclaiming a cached unit frees it without detaching or
                              invalidating the entries stored on it: they stay discoverable
                              while the unit is handed out again
swap-members        worker    S1/S2 read two SSM member pages in the wrong order when the
                              forward reads a checkpoint (page-to-page copies stay right)
==================  ========  ============================================================
"""

from __future__ import annotations

import os
from typing import NamedTuple

FAULT_ENV = "HYBRIDMEM_FAULT"  # a fault name for engines started without the engine config


class Fault(NamedTuple):
    name: str
    side: str  # "scheduler" | "worker"
    summary: str


FAULTS: dict[str, Fault] = {f.name: f for f in (
    Fault("stale-checkpoint", "scheduler",
          "an adopter gets a checkpoint other than the one at its depth"),
    Fault("skip-invalidate", "scheduler",
          "a reclaimed unit is reused before its entries are invalidated"),
    Fault("swap-members", "worker",
          "S1/S2 read two SSM member pages in the wrong order"),
)}

_ACTIVE: str | None = None


def check(name: str | None) -> str | None:
    """``name`` if it is a known fault (None: no fault); ValueError naming the choices."""
    if name is None or name == "" or name == "none":
        return None
    if name not in FAULTS:
        raise ValueError(f"unknown fault {name!r}; expected one of {', '.join(FAULTS)}")
    return name


def activate(name: str | None) -> None:
    """Make ``name`` this process's fault (None: off). Set when an organization engine starts."""
    global _ACTIVE
    _ACTIVE = check(name)


def active() -> str | None:
    """The active fault: the one activated, else ``HYBRIDMEM_FAULT`` (None: no fault)."""
    return _ACTIVE if _ACTIVE is not None else check(os.environ.get(FAULT_ENV))


def is_active(name: str) -> bool:
    """Whether fault ``name`` is on; ValueError for an unknown name (a typo never means off)."""
    if name not in FAULTS:
        raise ValueError(f"unknown fault {name!r}; expected one of {', '.join(FAULTS)}")
    return active() == name
