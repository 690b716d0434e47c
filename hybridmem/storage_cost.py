"""Storage cost of a logical state mix under each organization (SPEC §3, paper §3.2-3.5, App. A).

For ``xA`` 512-token attention objects, ``xR`` recurrent checkpoints and ``m`` S2 slabs
(Falcon-H1-7B numbers in KiB; the code works in bytes from the geometry)::

    B_S0 = 1557 (xA + xR)                       one S0 page per object
    B_S1 = 512 xA + 2048 xR                     3 SSM members + 1 conv page per checkpoint
    B_S2 = 512 xA + 1536 xR + 512 m             m >= ceil(xR / 16)
    B_D0 = 16 xA16 + 1557 xR                    xA16 = 32 xA native 16-token units

D0 is feasible only if each pool holds its own demand (``16 xA16 <= M_A`` and ``1557 xR <= M_R``).
Ideal capacities: eq. (D2) for D0, eq. (A8) for the shared pools with ideal slabs
``m = ceil(z aR / 16)``.

All of these are per layer. :func:`model_bytes` gives the whole model: an attention object's bytes
on every attention layer, a checkpoint's (and S2's slabs) on every Mamba layer, so a sequential
hybrid (Granite-4.0-H, Nemotron-H) is not priced as if every layer held both.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridmem.errors import HybridMemError
from hybridmem.geometry import ceil_div
from hybridmem.units import Units

SHARED_ORGS = ("S0", "S1", "S2")
ORGS = ("S0", "S1", "S2", "D0")


def _check_counts(**counts: int) -> None:
    for name, value in counts.items():
        if not isinstance(value, int) or value < 0:
            raise HybridMemError(f"{name} must be a non-negative integer, got {value!r}")


def ideal_slabs(units: Units, recurrent: int) -> int:
    return ceil_div(recurrent, units.slots_per_slab)


def d0_attention_units(units: Units, attention_objects: int) -> int:
    """Native 16-token units covering the tokens of ``attention_objects`` grid blocks."""
    return attention_objects * (units.grid_tokens // units.d0_attn_tokens)


def bytes_s0(units: Units, attention: int, recurrent: int) -> int:
    _check_counts(attention=attention, recurrent=recurrent)
    return units.s0_page_bytes * (attention + recurrent)


def bytes_s1(units: Units, attention: int, recurrent: int) -> int:
    _check_counts(attention=attention, recurrent=recurrent)
    return units.page_bytes * attention + units.s1_checkpoint_bytes * recurrent


def bytes_s2(units: Units, attention: int, recurrent: int, slabs: int | None = None) -> int:
    _check_counts(attention=attention, recurrent=recurrent)
    need = ideal_slabs(units, recurrent)
    m = need if slabs is None else slabs
    _check_counts(slabs=m)
    if m < need:
        raise HybridMemError(
            f"S2 needs at least ceil({recurrent} / {units.slots_per_slab}) = {need} slabs for "
            f"{recurrent} checkpoints, got --slabs {m}"
        )
    return (units.page_bytes * attention + units.s2_checkpoint_bytes_without_slab * recurrent
            + units.page_bytes * m)


def bytes_d0_pools(units: Units, attention_units: int, recurrent: int) -> tuple[int, int]:
    """(attention pool bytes, recurrent pool bytes) D0 needs for native units."""
    _check_counts(attention_units=attention_units, recurrent=recurrent)
    return (units.d0_attn_unit_bytes * attention_units,
            units.d0_recurrent_unit_bytes * recurrent)


@dataclass(frozen=True)
class D0Feasibility:
    attention_bytes: int
    recurrent_bytes: int
    attention_pool: int
    recurrent_pool: int

    @property
    def attention_ok(self) -> bool:
        return self.attention_bytes <= self.attention_pool

    @property
    def recurrent_ok(self) -> bool:
        return self.recurrent_bytes <= self.recurrent_pool

    @property
    def feasible(self) -> bool:
        return self.attention_ok and self.recurrent_ok

    @property
    def total_bytes(self) -> int:
        return self.attention_bytes + self.recurrent_bytes

    def verdict(self) -> str:
        if self.feasible:
            return "feasible"
        failed = []
        if not self.attention_ok:
            failed.append(f"attention limit: {self.attention_bytes} > {self.attention_pool} B")
        if not self.recurrent_ok:
            failed.append(f"recurrent limit: {self.recurrent_bytes} > {self.recurrent_pool} B")
        return "fails " + "; ".join(failed)


def d0_feasibility(units: Units, attention_units: int, recurrent: int,
                   attention_pool: int, recurrent_pool: int) -> D0Feasibility:
    """Each D0 pool must hold its own demand; no capacity moves between them (§3.5)."""
    a_bytes, r_bytes = bytes_d0_pools(units, attention_units, recurrent)
    return D0Feasibility(a_bytes, r_bytes, attention_pool, recurrent_pool)


def shared_bytes(org: str, units: Units, attention: int, recurrent: int) -> int:
    """Ideal-packing bytes of a shared organization (S2 with ``ceil(xR / 16)`` slabs)."""
    if org == "S0":
        return bytes_s0(units, attention, recurrent)
    if org == "S1":
        return bytes_s1(units, attention, recurrent)
    if org == "S2":
        return bytes_s2(units, attention, recurrent)
    raise HybridMemError(f"unknown shared organization {org!r}; expected one of {SHARED_ORGS}")


def model_bytes(org: str, units: Units, attention: int, recurrent: int,
                slabs: int | None = None) -> int:
    """Whole-model bytes of ``attention`` objects and ``recurrent`` checkpoints under ``org``."""
    geo = units.geometry
    if org == "D0":
        a, r = bytes_d0_pools(units, d0_attention_units(units, attention), recurrent)
    elif org == "S2":
        a = bytes_s2(units, attention, 0, 0)
        r = bytes_s2(units, 0, recurrent, slabs)
    else:
        a = shared_bytes(org, units, attention, 0)
        r = shared_bytes(org, units, 0, recurrent)
    return a * geo.n_attention_layers + r * geo.n_mamba_layers


def capacity_shared(org: str, units: Units, budget: int, mix: tuple[int, int]) -> int:
    """Eq. (A8): the largest z with ``B_org(z aA, z aR) <= budget`` under ideal packing."""
    a_mix, r_mix = mix
    _check_counts(mix_attention=a_mix, mix_recurrent=r_mix)
    if a_mix == 0 and r_mix == 0:
        raise HybridMemError("mix (0, 0) has no state; capacity is unbounded")
    # Cost is monotone in z, so bracket then bisect.
    lo, hi = 0, 1
    while shared_bytes(org, units, hi * a_mix, hi * r_mix) <= budget:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if shared_bytes(org, units, mid * a_mix, mid * r_mix) <= budget:
            lo = mid
        else:
            hi = mid
    return lo


def capacity_d0(units: Units, attention_pool: int, recurrent_pool: int,
                mix: tuple[int, int]) -> int | None:
    """Eq. (D2): ``min(floor(M_A / (16a aA16)), floor(M_R / (r aR)))``; a zero-demand state type
    imposes no limit. ``mix`` counts grid attention objects (converted to native units) and
    checkpoints. ``None`` when the mix is empty (unbounded)."""
    a_mix, r_mix = mix
    _check_counts(mix_attention=a_mix, mix_recurrent=r_mix)
    limits = []
    if a_mix:
        limits.append(attention_pool // (units.d0_attn_unit_bytes
                                         * d0_attention_units(units, a_mix)))
    if r_mix:
        limits.append(recurrent_pool // (units.d0_recurrent_unit_bytes * r_mix))
    return min(limits) if limits else None
