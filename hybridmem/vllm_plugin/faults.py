"""Fault injection for organization mode (issue 11, item 5): named, deliberate mistakes.

A fault is active when its name is in ``HYBRIDMEM_FAULT`` (comma-separated) or was passed to
:func:`activate`. Code that injects a fault resolves :func:`is_active` once, when it is built
or installed, never per element, so a run without faults pays nothing.

=================  =====================================================================
stale-checkpoint   an adopter gets a checkpoint other than the one at its depth (scheduler)
swap-members       S1/S2 read two SSM member pages in the wrong order (worker, org_state)
skip-invalidate    a reclaimed unit is reused before its entries are invalidated (scheduler)
=================  =====================================================================
"""

from __future__ import annotations

import os

FAULT_ENV = "HYBRIDMEM_FAULT"
FAULTS = frozenset({"stale-checkpoint", "swap-members", "skip-invalidate"})

_active: set[str] = set()


def parse(spec: str | None) -> frozenset[str]:
    """Fault names from ``"a,b"``; an unknown name raises ``ValueError`` naming it."""
    names = frozenset(n.strip() for n in (spec or "").split(",") if n.strip())
    unknown = names - FAULTS
    if unknown:
        known = ", ".join(sorted(FAULTS))
        raise ValueError(f"unknown fault {sorted(unknown)[0]!r}; known: {known}")
    return names


def activate(names: set[str] | frozenset[str] | None) -> None:
    """Replace the process's explicitly activated faults (None or empty: none)."""
    _active.clear()
    _active.update(parse(",".join(sorted(names or ()))))


def active() -> frozenset[str]:
    return frozenset(_active) | parse(os.environ.get(FAULT_ENV))


def is_active(name: str) -> bool:
    if name not in FAULTS:
        raise ValueError(f"unknown fault {name!r}; known: {', '.join(sorted(FAULTS))}")
    return name in active()
