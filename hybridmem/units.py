"""Allocation units of the four organizations, derived from a :class:`Geometry` (SPEC §2).

Shared organizations use a 512-token grid for both attention blocks and recurrent checkpoints::

    tokens   0          512         1024        1536
             |--block 0--|--block 1--|--block 2--|
    ckpts               ^512        ^1024       ^1536     (a checkpoint holds state after t tokens)

    S1/S2 page  P = 512 x a                     (524,288 B = 512 KiB for Falcon-H1-7B)
    SSM members ceil(s / P)                     (3)
    conv slot   smallest power of two >= c      (32,768 B); slots per slab P / slot (16)
    S0 page     max(r, P)                       (1,594,368 B = 1,557 KiB)

D0 keeps native units: a 16-token attention unit (16 a = 16,384 B) and one r-byte composite
per checkpoint, taken every ``u`` tokens rounded up to a multiple of 256, where ``u`` is vLLM's
page-size unification ``16 ceil(r / (16 a))`` (1,568 tokens, so a 1,792-token interval for
Falcon-H1-7B).
A budget label ``bN`` means ``N x u x a`` bytes (1,605,632 B per unit for Falcon-H1-7B).

Each organization has its own grid (:func:`org_grid_tokens`): S0-S2 the shared grid (512, or a
model's declared grid), D0 its 16-token unit, checkpointed every ``d0_interval_tokens``. D0's
units do not depend on the shared grid, so they are derived without S2's slot check
(``derive_units(..., check_slots=False)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hybridmem.errors import GeometryError
from hybridmem.geometry import Geometry, ceil_div, next_pow2

GRID_TOKENS = 512  # S0-S2 attention block and recurrent checkpoint boundary
D0_ATTN_TOKENS = 16  # D0 native attention unit
D0_INTERVAL_MULTIPLE = 256  # D0 checkpoint interval rounds the uniform unit up to this
SHARED_ORGS = ("S0", "S1", "S2")


def org_grid_tokens(org: str, shared_grid: int = GRID_TOKENS) -> int:
    """THE attention block of organization ``org`` in tokens (the one rule, every driver):
    S0-S2 the shared grid ``shared_grid`` (their block and checkpoint boundary), D0 its native
    16-token unit (its checkpoint interval is its own, ``Units.d0_interval_tokens``)."""
    if org == "D0":
        return D0_ATTN_TOKENS
    if org in SHARED_ORGS:
        return shared_grid
    raise GeometryError(f"unknown organization {org!r}; expected S0, S1, S2 or D0")


@dataclass(frozen=True)
class Units:
    """Physical units of every organization for one geometry (per layer, bytes)."""

    geometry: Geometry
    grid_tokens: int
    page_bytes: int  # S1/S2 shared page P
    ssm_members: int  # SSM member pages per checkpoint
    conv_slot_bytes: int
    slots_per_slab: int
    s0_page_bytes: int
    uniform_tokens: int  # u
    label_unit_bytes: int  # bytes of one budget-label unit, u x a
    d0_attn_tokens: int
    d0_attn_unit_bytes: int
    d0_recurrent_unit_bytes: int
    d0_interval_tokens: int

    @property
    def s1_checkpoint_bytes(self) -> int:
        """S1: SSM members plus one dedicated conv page."""
        return (self.ssm_members + 1) * self.page_bytes

    @property
    def s2_checkpoint_bytes_without_slab(self) -> int:
        return self.ssm_members * self.page_bytes

    def as_dict(self) -> dict[str, Any]:
        return {
            "grid_tokens": self.grid_tokens,
            "page_bytes": self.page_bytes,
            "ssm_members": self.ssm_members,
            "conv_slot_bytes": self.conv_slot_bytes,
            "slots_per_slab": self.slots_per_slab,
            "s0_page_bytes": self.s0_page_bytes,
            "uniform_tokens": self.uniform_tokens,
            "label_unit_bytes": self.label_unit_bytes,
            "d0_attn_tokens": self.d0_attn_tokens,
            "d0_attn_unit_bytes": self.d0_attn_unit_bytes,
            "d0_recurrent_unit_bytes": self.d0_recurrent_unit_bytes,
            "d0_interval_tokens": self.d0_interval_tokens,
        }


def derive_units(geo: Geometry, grid_tokens: int = GRID_TOKENS, *,
                 check_slots: bool = True) -> Units:
    """Units of S0/S1/S2/D0 for ``geo``; raises :class:`GeometryError` if S2 cannot pack slots.

    ``check_slots=False`` (D0, whose units ignore the grid): no slot check; where S2 cannot pack
    slots ``slots_per_slab`` is 0 and S2 cannot be built from these units."""
    a = geo.attn_bytes_per_token
    s = geo.ssm_bytes
    c = geo.conv_bytes
    r = geo.composite_bytes
    page = grid_tokens * a
    slot = next_pow2(c)
    packs = slot <= page and page % slot == 0
    if not packs and check_slots:
        raise GeometryError(
            f"{geo.model}: conv slot of {slot} B (from conv state {c} B) does not divide the "
            f"{page}-B page ({grid_tokens} tokens x {a} B/token): {page} / {slot} = "
            f"{page / slot:g} slots per slab, need a whole number >= 1"
        )
    uniform = D0_ATTN_TOKENS * ceil_div(r, D0_ATTN_TOKENS * a)
    return Units(
        geometry=geo,
        grid_tokens=grid_tokens,
        page_bytes=page,
        ssm_members=ceil_div(s, page),
        conv_slot_bytes=slot,
        slots_per_slab=page // slot if packs else 0,
        s0_page_bytes=max(r, page),
        uniform_tokens=uniform,
        label_unit_bytes=uniform * a,
        d0_attn_tokens=D0_ATTN_TOKENS,
        d0_attn_unit_bytes=D0_ATTN_TOKENS * a,
        d0_recurrent_unit_bytes=r,
        d0_interval_tokens=D0_INTERVAL_MULTIPLE * ceil_div(uniform, D0_INTERVAL_MULTIPLE),
    )
