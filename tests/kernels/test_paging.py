"""Page and slot arithmetic for the Falcon-H1-7B geometry (SPEC §1-2)."""

import pytest
import torch

from hybridmem.geometry import PRESETS
from hybridmem.kernels.paging import elems_per_page, num_members, slot_elems
from hybridmem.units import derive_units


def test_falcon_member_pages_and_slot_lines():
    geo = PRESETS["falcon-h1-7b"]
    units = derive_units(geo)
    n = geo.mamba_heads * geo.mamba_head_dim * geo.d_state  # 24 x 128 x 256 = 786,432
    assert n == 786_432
    # 512-KiB pages: 262,144 bf16 elements (3 members) or 131,072 fp32 elements (6 members)
    assert elems_per_page(units, torch.bfloat16) == 262_144
    assert num_members(n, elems_per_page(units, torch.bfloat16)) == 3
    assert elems_per_page(units, torch.float32) == 131_072
    assert num_members(n, elems_per_page(units, torch.float32)) == 6
    # conv state 3,584 x 3 bf16 = 10,752 elements fits a 32-KiB slot of 16,384 elements
    assert slot_elems(units, torch.bfloat16) == 16_384
    assert units.slots_per_slab == 16


def test_num_members_rounds_up_and_rejects_zero():
    assert num_members(512, 96) == 6
    assert num_members(512, 128) == 4
    with pytest.raises(ValueError):
        num_members(0, 128)
