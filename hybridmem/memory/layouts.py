"""The four layouts (SPEC §2, Table 1) in one registry: how blocks and checkpoints map onto
storage, and how each is built from units and a budget plan (SPEC §4).

=====  ============================  ==============================  ==================  ========
org    attention unit                checkpoint                      conv state          grid
=====  ============================  ==============================  ==================  ========
S0     one S0 page (1,557 KiB)       one S0 page                     inside that page    512/512
S1     one 512-KiB page              3 member pages                  its own page        512/512
S2     one 512-KiB page              3 member pages                  slot of a slab      512/512
D0     16-token unit (attn pool)     one composite (recurrent pool)  inside composite    16/1,792
=====  ============================  ==============================  ==================  ========

S0-S2 draw everything from one shared pool; D0 from two static pools (no capacity moves)::

    org = make_organization("S2", units, plan, observer=RecordingObserver(), pin_k=2)

``LAYOUTS`` names them; :func:`builder` gives each one's ``(units, capacity, observer,
**policy) -> org``.
Policy keywords: ``pin_k`` (preemption-time pinning threshold K, None = off;
``PIN_THRESHOLDS`` names R0/R1/R2/Roff), ``pin_budget`` (most simultaneous pins, None =
unlimited), ``retention`` (producer-side retention with the K = 2 demand threshold).
"""

from __future__ import annotations

from collections.abc import Callable

from hybridmem.budget import Plan
from hybridmem.errors import HybridMemError
from hybridmem.events import Observer, StateKind
from hybridmem.memory.organization import MemoryOrganization
from hybridmem.memory.placement import OwnPage, Placement, SlabSlot
from hybridmem.memory.pool import DualPools, PagePool
from hybridmem.units import Units


class SharedPoolOrganization(MemoryOrganization):
    """S0-S2: one pool of equal pages serves attention blocks and checkpoints."""

    def __init__(self, name: str, num_pages: int, page_bytes: int, grid_tokens: int,
                 members: int, placement: Placement, observer: Observer | None = None,
                 pin_k: int | None = None, pin_budget: int | None = None,
                 retention: bool = False) -> None:
        super().__init__(grid_tokens, grid_tokens, observer, pin_k, pin_budget, retention)
        self.name = name
        self.members = members
        self.placement = placement
        self.pool = PagePool("shared", num_pages)
        self.page_bytes = page_bytes
        self.owner = {"shared": [None] * num_pages}

    def pool_for(self, kind: StateKind, need: int = 0) -> PagePool:
        return self.pool

    def ckpt_pool(self) -> PagePool:
        return self.pool

    def pools(self) -> list[PagePool]:
        return [self.pool]

    def _unit_bytes(self, pool: PagePool) -> int:
        return self.page_bytes


class DualPoolOrganization(MemoryOrganization):
    """D0: native static dual pools, 16-token attention units and native recurrent composites
    (one composite per checkpoint, conv state inside)."""

    name = "D0"

    def __init__(self, attention_units: int, recurrent_units: int, attention_unit_bytes: int,
                 recurrent_unit_bytes: int, attention_tokens: int, interval_tokens: int,
                 observer: Observer | None = None, pin_k: int | None = None,
                 pin_budget: int | None = None, retention: bool = False) -> None:
        super().__init__(attention_tokens, interval_tokens, observer, pin_k, pin_budget,
                         retention)
        self.dual = DualPools(attention_units, recurrent_units)
        self.bytes_per_unit = {"attention": attention_unit_bytes,
                               "recurrent": recurrent_unit_bytes}
        self.owner = {"attention": [None] * attention_units,
                      "recurrent": [None] * recurrent_units}

    def pool_for(self, kind: StateKind, need: int = 0) -> PagePool:
        return self.dual.pool_for(kind, need)

    def ckpt_pool(self) -> PagePool:
        return self.dual.recurrent

    def pools(self) -> list[PagePool]:
        return [self.dual.attention, self.dual.recurrent]

    def _unit_bytes(self, pool: PagePool) -> int:
        return self.bytes_per_unit[pool.name]

    def check_integrity(self) -> None:
        self.dual.check_integrity()
        super().check_integrity()


Builder = Callable[..., MemoryOrganization]


def _s0(units: Units, pages: int, observer: Observer | None,
        **policy: object) -> SharedPoolOrganization:
    """Coarse shared pages: every block and every checkpoint takes one S0 page."""
    return SharedPoolOrganization("S0", pages, units.s0_page_bytes, units.grid_tokens, 1,
                                  Placement(), observer, **policy)  # type: ignore[arg-type]


def _s1(units: Units, pages: int, observer: Observer | None,
        **policy: object) -> SharedPoolOrganization:
    """Recurrent paging: a checkpoint is the SSM member pages plus one dedicated conv page."""
    return SharedPoolOrganization("S1", pages, units.page_bytes, units.grid_tokens,
                                  units.ssm_members, OwnPage(), observer,
                                  **policy)  # type: ignore[arg-type]


def _s2(units: Units, pages: int, observer: Observer | None,
        **policy: object) -> SharedPoolOrganization:
    """Paging + conv slots: the SSM member pages plus one slot of a slab page."""
    return SharedPoolOrganization("S2", pages, units.page_bytes, units.grid_tokens,
                                  units.ssm_members, SlabSlot(pages, units.slots_per_slab),
                                  observer, **policy)  # type: ignore[arg-type]


def _d0(units: Units, pools: tuple[int, int], observer: Observer | None,
        **policy: object) -> DualPoolOrganization:
    """The one place D0 is built: ``units`` gives its native unit, interval and unit bytes."""
    return DualPoolOrganization(pools[0], pools[1], units.d0_attn_unit_bytes,
                                units.d0_recurrent_unit_bytes, units.d0_attn_tokens,
                                units.d0_interval_tokens, observer,
                                **policy)  # type: ignore[arg-type]


LAYOUTS = ("S0", "S1", "S2", "D0")


def builder(name: str) -> Builder:
    """``name``'s builder ``(units, capacity, observer, **policy)``; capacity: pages (S0-S2) or
    (attention units, recurrent units) for D0. Looked up per call, so a builder patched in this
    module (the mutant runner's seam) is the one that runs."""
    builders: dict[str, Builder] = {"S0": _s0, "S1": _s1, "S2": _s2, "D0": _d0}
    return builders[name]


def build(name: str, units: Units, capacity: int | tuple[int, int],
          observer: Observer | None = None, **policy: object) -> MemoryOrganization:
    """The layout ``name`` with explicit capacity (tests, benchmarks, small pools)."""
    if name not in LAYOUTS:
        raise HybridMemError(f"unknown organization {name!r}; expected one of "
                             f"{', '.join(LAYOUTS)}")
    return builder(name)(units, capacity, observer, **policy)


def make_organization(name: str, units: Units, plan: Plan, observer: Observer | None = None,
                      **policy: object) -> MemoryOrganization:
    """The layout ``name`` with the per-layer capacity the budget ``plan`` gives it."""
    if name not in LAYOUTS:
        raise HybridMemError(f"unknown organization {name!r}; expected one of "
                             f"{', '.join(LAYOUTS)}")
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
