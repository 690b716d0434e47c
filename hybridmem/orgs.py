"""The four organizations (SPEC §2, Table 1): how blocks and checkpoints map onto storage.

=====  ============================  ==============================  ==================  ========
org    attention unit                checkpoint                      conv state          grid
=====  ============================  ==============================  ==================  ========
S0     one S0 page (1,557 KiB)       one S0 page                     inside that page    512/512
S1     one 512-KiB page              3 member pages                  its own page        512/512
S2     one 512-KiB page              3 member pages                  slot of a slab      512/512
D0     16-token unit (attn pool)     one composite (recurrent pool)  inside composite    16/1,792
=====  ============================  ==============================  ==================  ========

S0-S2 draw everything from one shared pool; D0 from two static pools (no capacity moves).
"""

from __future__ import annotations

from hybridmem.cached_org import CachedOrganization
from hybridmem.checkpoint import ConvPlacement
from hybridmem.conv_slab import SlabTable
from hybridmem.dual_pools import DualPools
from hybridmem.events import Observer, StateKind
from hybridmem.geometry import ceil_div
from hybridmem.org_interface import Need
from hybridmem.page_pool import PagePool

_tuple_new = tuple.__new__  # _tuple_new(Need, (a, r)): Need(a, r) without a Python frame
# the state kinds as module globals (the same objects; cached_org says why)
_ATTENTION, _RECURRENT = StateKind.ATTENTION, StateKind.RECURRENT


class SharedPoolOrganization(CachedOrganization):
    """S0-S2: one pool of equal pages serves attention blocks and checkpoints."""

    def __init__(self, num_pages: int, page_bytes: int, grid_tokens: int,
                 observer: Observer | None = None, **policy: object) -> None:
        super().__init__(grid_tokens, grid_tokens, observer, **policy)  # type: ignore[arg-type]
        self.pool = PagePool("shared", num_pages)
        self.page_bytes = page_bytes
        self.owner = {"shared": [None] * num_pages}
        self._fixed_pools = self._admission_inline((self.pool, self.pool), _SHARED_ADMISSION)
        if type(self)._ckpt_pool is _OWN["shared _ckpt_pool"]:
            self._fixed_ckpt_pool = self.pool

    def pool_for(self, kind: StateKind, need: int = 0) -> PagePool:
        return self.pool

    def _ckpt_pool(self) -> PagePool:
        return self.pool  # pool_for(RECURRENT), without the call

    def _pools_for(self, attention: int, recurrent: int) -> tuple[PagePool, PagePool]:
        return self.pool, self.pool  # (pool_for of each kind)

    def available(self) -> Need:
        pool = self.pool  # one pool serves both kinds (pool.num_available)
        n = len(pool._free) + len(pool._cached)
        return _tuple_new(Need, (n, n))  # Need(n, n)

    def pools(self) -> list[PagePool]:
        return [self.pool]

    def _unit_bytes(self, pool: PagePool) -> int:
        return self.page_bytes


class S0(SharedPoolOrganization):
    """Coarse shared pages: every block and every checkpoint takes one 1,557-KiB page."""

    name = "S0"
    members = 1
    placement = ConvPlacement.INSIDE


class S1(SharedPoolOrganization):
    """Recurrent paging: a checkpoint is 3 SSM member pages plus one dedicated conv page."""

    name = "S1"
    placement = ConvPlacement.PAGE

    def __init__(self, num_pages: int, page_bytes: int, grid_tokens: int, ssm_members: int,
                 observer: Observer | None = None, **policy: object) -> None:
        self.members = ssm_members
        super().__init__(num_pages, page_bytes, grid_tokens, observer, **policy)


class S2(SharedPoolOrganization):
    """Paging + conv slots: 3 SSM member pages plus one slot of a 16-slot slab page."""

    name = "S2"
    placement = ConvPlacement.SLOT

    def __init__(self, num_pages: int, page_bytes: int, grid_tokens: int, ssm_members: int,
                 slots_per_slab: int, observer: Observer | None = None,
                 **policy: object) -> None:
        self.members = ssm_members
        super().__init__(num_pages, page_bytes, grid_tokens, observer, **policy)
        self.slabs = SlabTable(num_pages, slots_per_slab)

    def _ckpt_units(self, count: int) -> int:
        """``3 k`` member pages plus the slabs the slots need beyond the free slots of slabs in
        use (a cached slab may be reclaimed during the same allocation, so its room is not
        counted: the estimate is exact or one slab high)."""
        assert self.slabs is not None
        room = self.slabs.free_slots(self.pool.refs)  # slabs with an active slot only
        return count * self.members + ceil_div(max(0, count - room), self.slabs.slots_per_slab)


class D0(CachedOrganization):
    """Native static dual pools: 16-token attention units and native recurrent composites."""

    name = "D0"
    members = 1
    placement = ConvPlacement.INSIDE

    def __init__(self, attention_units: int, recurrent_units: int, attention_unit_bytes: int,
                 recurrent_unit_bytes: int, attention_tokens: int, interval_tokens: int,
                 observer: Observer | None = None, **policy: object) -> None:
        super().__init__(attention_tokens, interval_tokens, observer,
                         **policy)  # type: ignore[arg-type]
        self.dual = DualPools(attention_units, recurrent_units)
        self.unit_bytes = {"attention": attention_unit_bytes, "recurrent": recurrent_unit_bytes}
        self.owner = {"attention": [None] * attention_units,
                      "recurrent": [None] * recurrent_units}
        if type(self)._ckpt_pool is _OWN["D0 _ckpt_pool"]:
            self._fixed_ckpt_pool = self.dual.by_kind[_RECURRENT]
        # DualPools.pool_for's answer for a need is by_kind's (need unused) while it is the
        # module's own definition; a patched one (a test's borrowing pool) is asked per call
        if DualPools.pool_for is _OWN["DualPools.pool_for"]:
            by_kind = self.dual.by_kind
            self._fixed_pools = self._admission_inline(
                (by_kind[_ATTENTION], by_kind[_RECURRENT]), _D0_ADMISSION)

    def pool_for(self, kind: StateKind, need: int = 0) -> PagePool:
        if need:  # DualPools.pool_for decides (need is unused there: no capacity moves)
            return self.dual.pool_for(kind, need)
        pool = self.dual.by_kind.get(kind)  # its answer for need 0, without the call
        return pool if pool is not None else self.dual.pool_for(kind, need)

    def _ckpt_pool(self) -> PagePool:
        return self.dual.by_kind[_RECURRENT]  # pool_for(RECURRENT), without the call

    def _pools_for(self, attention: int, recurrent: int) -> tuple[PagePool, PagePool]:
        """``pool_for`` of each kind, in one frame: with a need ``DualPools.pool_for`` decides,
        without one its answer is read from ``by_kind``."""
        dual = self.dual
        by_kind = dual.by_kind
        return (dual.pool_for(_ATTENTION, attention) if attention
                else by_kind[_ATTENTION],
                dual.pool_for(_RECURRENT, recurrent) if recurrent
                else by_kind[_RECURRENT])

    def available(self) -> Need:
        by_kind = self.dual.by_kind  # (num_available of each kind's pool)
        a, r = by_kind[_ATTENTION], by_kind[_RECURRENT]
        return _tuple_new(Need, (len(a._free) + len(a._cached),  # Need(a, r)
                                 len(r._free) + len(r._cached)))

    def pools(self) -> list[PagePool]:
        return [self.dual.attention, self.dual.recurrent]

    def _unit_bytes(self, pool: PagePool) -> int:
        return self.unit_bytes[pool.name]

    def check_integrity(self) -> None:
        self.dual.check_integrity()
        super().check_integrity()


# what allocate's inline admission stands for (CachedOrganization._admission_inline)
_SHARED_ADMISSION: dict[str, object] = {
    "available": SharedPoolOrganization.available,
    "_pools_for": SharedPoolOrganization._pools_for,
    "_fits_in": CachedOrganization._fits_in}
_D0_ADMISSION: dict[str, object] = {
    "available": D0.available, "_pools_for": D0._pools_for, "_fits_in": CachedOrganization._fits_in}
# the definitions whose answers are fixed at construction (_fixed_ckpt_pool; D0's pools for a
# need); in a dict, not module-level function names, which the mutant runner would patch
_OWN: dict[str, object] = {"shared _ckpt_pool": SharedPoolOrganization._ckpt_pool,
                           "D0 _ckpt_pool": D0._ckpt_pool,
                           "DualPools.pool_for": DualPools.pool_for}
