"""Storage model: Table A-1, the capacities under it, and Table A-2, digit for digit."""

import pytest

from hybridmem.errors import HybridMemError
from hybridmem.geometry import PRESETS
from hybridmem.storage_cost import (
    bytes_s0,
    bytes_s1,
    bytes_s2,
    capacity_d0,
    capacity_shared,
    d0_attention_units,
    d0_feasibility,
    ideal_slabs,
)
from hybridmem.units import derive_units

U = derive_units(PRESETS["falcon-h1-7b"])
MiB = 2**20

# Table A-1: (attention objects, recurrent objects, ideal S2 slabs, S0 MiB, S1 MiB, S2 MiB)
TABLE_A1 = [
    (1, 1, 1, "3.041016", "2.500000", "2.500000"),
    (16, 16, 1, "48.656250", "40.000000", "32.500000"),
    (4, 16, 1, "30.410156", "34.000000", "26.500000"),
    (0, 16, 1, "24.328125", "32.000000", "24.500000"),
]


@pytest.mark.parametrize("xa,xr,slabs,s0,s1,s2", TABLE_A1,
                         ids=[f"xA{r[0]}-xR{r[1]}" for r in TABLE_A1])
def test_table_a1(xa, xr, slabs, s0, s1, s2):
    assert ideal_slabs(U, xr) == slabs
    assert f"{bytes_s0(U, xa, xr) / MiB:.6f}" == s0
    assert f"{bytes_s1(U, xa, xr) / MiB:.6f}" == s1
    assert f"{bytes_s2(U, xa, xr) / MiB:.6f}" == s2


def test_kib_formulas():
    # B_S0 = 1557 (xA + xR), B_S1 = 512 xA + 2048 xR, B_S2 = 512 xA + 1536 xR + 512 m  [KiB]
    for xa, xr, m in ((3, 5, 1), (0, 17, 2), (9, 0, 0), (7, 33, 5)):
        assert bytes_s0(U, xa, xr) == 1557 * 1024 * (xa + xr)
        assert bytes_s1(U, xa, xr) == (512 * xa + 2048 * xr) * 1024
        assert bytes_s2(U, xa, xr, m) == (512 * xa + 1536 * xr + 512 * m) * 1024


def test_s2_rejects_too_few_slabs():
    with pytest.raises(HybridMemError, match=r"ceil\(17 / 16\) = 2 slabs.*--slabs 1"):
        bytes_s2(U, 0, 17, 1)


def test_capacities_under_table_a1():
    cap = {org: capacity_shared(org, U, 100 * MiB, (1, 1)) for org in ("S0", "S1", "S2")}
    assert cap == {"S0": 32, "S1": 40, "S2": 49}


def test_table_a2():
    # D0: 50 MiB + 50 MiB pools; 3840 native attention objects, 16 checkpoints.
    assert d0_attention_units(U, 120) == 3840
    d0 = d0_feasibility(U, 3840, 16, 50 * MiB, 50 * MiB)
    assert d0.attention_bytes == 60 * MiB
    assert f"{d0.recurrent_bytes / MiB:.6f}" == "24.328125"
    assert f"{d0.total_bytes / MiB:.6f}" == "84.328125"
    assert not d0.feasible and not d0.attention_ok and d0.recurrent_ok
    assert d0.verdict().startswith("fails attention limit")
    # S2: 100 MiB shared; 120 attention objects, 16 checkpoints, 1 slab.
    s2 = bytes_s2(U, 120, 16, 1)
    assert 120 * U.page_bytes == 60 * MiB
    assert (s2 - 60 * MiB) / MiB == 24.5
    assert s2 / MiB == 84.5
    assert s2 <= 100 * MiB


def test_d0_capacity_eq_d2():
    # min(floor(M_A / (16 KiB aA16)), floor(M_R / (1557 KiB aR)))
    assert capacity_d0(U, 50 * MiB, 50 * MiB, (1, 1)) == min(
        (50 * MiB) // (16 * 1024 * 32), (50 * MiB) // (1557 * 1024))
    assert capacity_d0(U, 50 * MiB, 0, (1, 0)) == (50 * MiB) // (16 * 1024 * 32)
    assert capacity_d0(U, 0, 0, (0, 0)) is None
