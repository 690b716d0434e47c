"""Pick a memory organization by name and build it from units and a budget plan (SPEC §2, §4).

    org = make_organization("S2", units, plan, observer=RecordingObserver(), pin_k=2)

``ORGANIZATIONS`` maps each name to a builder ``(units, plan, observer, **policy) -> org``; the
interface and typed results live in :mod:`hybridmem.org_interface`. Policy keywords: ``pin_k``
(preemption-time pinning threshold K, None = off; ``PIN_THRESHOLDS`` names R0/R1/R2/Roff),
``pin_budget`` (most simultaneous pins, None = unlimited), ``retention`` (producer-side retention
with the K = 2 demand threshold).
"""

from __future__ import annotations

from collections.abc import Callable

from hybridmem.budget import Plan
from hybridmem.cached_org import PIN_THRESHOLDS, RETENTION_K, CachedOrganization
from hybridmem.errors import HybridMemError
from hybridmem.events import Observer
from hybridmem.org_interface import (
    AllocationResult,
    CheckpointHit,
    Held,
    LookupResult,
    Need,
    Organization,
    PinDecision,
)
from hybridmem.orgs import D0, S0, S1, S2
from hybridmem.units import Units

__all__ = [
    "ORGANIZATIONS", "PIN_THRESHOLDS", "RETENTION_K", "AllocationResult", "CachedOrganization",
    "CheckpointHit", "Held", "LookupResult", "Need", "Organization", "PinDecision",
    "make_organization", "build",
]

Builder = Callable[..., CachedOrganization]


def _s0(units: Units, pages: int, observer: Observer | None, **policy: object) -> S0:
    return S0(pages, units.s0_page_bytes, units.grid_tokens, observer, **policy)


def _s1(units: Units, pages: int, observer: Observer | None, **policy: object) -> S1:
    return S1(pages, units.page_bytes, units.grid_tokens, units.ssm_members, observer, **policy)


def _s2(units: Units, pages: int, observer: Observer | None, **policy: object) -> S2:
    return S2(pages, units.page_bytes, units.grid_tokens, units.ssm_members,
              units.slots_per_slab, observer, **policy)


def _d0(units: Units, pools: tuple[int, int], observer: Observer | None,
        **policy: object) -> D0:
    return D0(pools[0], pools[1], units.d0_attn_unit_bytes, units.d0_recurrent_unit_bytes,
              units.d0_attn_tokens, units.d0_interval_tokens, observer, **policy)


# name -> builder(units, capacity, observer, **policy); capacity: pages (S0-S2) or
# (attention units, recurrent units) for D0.
ORGANIZATIONS: dict[str, Builder] = {"S0": _s0, "S1": _s1, "S2": _s2, "D0": _d0}


def build(name: str, units: Units, capacity: int | tuple[int, int],
          observer: Observer | None = None, **policy: object) -> CachedOrganization:
    """An organization with explicit capacity (tests, benchmarks, small pools)."""
    if name not in ORGANIZATIONS:
        raise HybridMemError(f"unknown organization {name!r}; expected one of "
                             f"{', '.join(ORGANIZATIONS)}")
    return ORGANIZATIONS[name](units, capacity, observer, **policy)


def make_organization(name: str, units: Units, plan: Plan, observer: Observer | None = None,
                      **policy: object) -> CachedOrganization:
    """The organization ``name`` with the per-layer capacity the budget ``plan`` gives it."""
    if name not in ORGANIZATIONS:
        raise HybridMemError(f"unknown organization {name!r}; expected one of "
                             f"{', '.join(ORGANIZATIONS)}")
    capacity: int | tuple[int, int]
    if name == "D0":
        if plan.d0 is None:
            raise HybridMemError(f"{units.geometry.model}: D0 needs an attention fraction; "
                                 "the plan has none")
        capacity = (plan.d0.attention_units, plan.d0.recurrent_units)
    else:
        sp = plan.org(name)
        assert sp is not None and not isinstance(sp, tuple)
        capacity = sp.pages  # type: ignore[union-attr]
    return build(name, units, capacity, observer, **policy)
