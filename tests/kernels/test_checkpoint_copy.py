"""Checkpoint gather/scatter: tri vs ref (bit-exact: it is a copy), round trips, untouched pages
and sentinel rows/lines."""

from __future__ import annotations

import pytest
import torch

from hybridmem.kernels.checkpoint_copy import (
    gather_checkpoint,
    gather_checkpoint_ref,
    gather_pages,
    gather_pages_ref,
    scatter_checkpoint,
    scatter_pages,
    scatter_pages_ref,
)
from hybridmem.kernels.paging import NO_LINE, NO_PAGE, num_members, slab_lines
from tests.kernels.helpers import DEVICE, assert_equal, random_page_ids

N_ELEMS = 5000  # logical SSM elements per checkpoint
CONV_ELEMS = 120
SLOTS, SLOT_ELEMS = 16, 128


def world(batch: int, epp: int, dtype: torch.dtype, gen: torch.Generator):
    members = num_members(N_ELEMS, epp)
    pool = torch.randn(batch * members + 5, epp, generator=gen).to(dtype).to(DEVICE)
    table = random_page_ids(pool.shape[0], batch * members, gen, exclude=(0,))
    return pool, table.view(batch, members).to(torch.int32).to(DEVICE)


# epp 2048: every 1024-element block lies in one page (scalar page lookup); epp 1500: blocks
# straddle pages (per-element lookup) and the last member is partial.
@pytest.mark.parametrize("epp", [2048, 1500], ids=lambda e: f"epp{e}")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_tri_gather_scatter_match_ref(dtype: torch.dtype, epp: int):
    gen = torch.Generator().manual_seed(epp)
    batch = 8
    pool, table = world(batch, epp, dtype, gen)
    arena_tri = torch.zeros(batch, N_ELEMS, dtype=dtype, device=DEVICE)
    arena_ref = torch.zeros_like(arena_tri)
    gather_pages(pool, table, arena_tri)
    gather_pages_ref(pool, table, arena_ref)
    assert_equal("gathered arena tri vs ref", arena_tri, arena_ref)
    assert not bool((arena_tri == 0).all()), "gather copied nothing"

    new = torch.randn(batch, N_ELEMS, generator=gen).to(dtype).to(DEVICE)
    pool_ref = pool.clone()
    before = pool.clone()
    scatter_pages(pool, table, new)
    scatter_pages_ref(pool_ref, table, new)
    assert_equal("pool after scatter tri vs ref", pool, pool_ref)
    back = torch.zeros_like(new)
    gather_pages(pool, table, back)
    assert_equal("scatter then gather round trip", back, new)
    keep = torch.ones(pool.shape[0], dtype=torch.bool, device=DEVICE)
    keep[table.flatten().long()] = False
    assert bool(keep[0])
    assert_equal("pages outside the table", pool[keep], before[keep])
    # inside a partial last member, elements past the checkpoint are untouched as well
    tail = N_ELEMS - (table.shape[1] - 1) * epp
    last = table[:, -1].long()
    assert_equal("tail of the last member", pool[last, tail:], before[last, tail:])


def test_tri_checkpoint_with_conv_line_and_sentinels():
    gen = torch.Generator().manual_seed(9)
    batch = 6
    pool, table = world(batch, 2048, torch.bfloat16, gen)
    pages = torch.randn(2, SLOTS * SLOT_ELEMS, generator=gen).bfloat16().to(DEVICE)
    lines_pool = slab_lines(pages, SLOTS)
    lines = torch.tensor([17, 3, 30, 8, 21, 12], dtype=torch.int32, device=DEVICE)
    # row 1: no SSM checkpoint; row 4: no conv state. Line 0 and page 0 hold unreferenced data.
    table[1] = NO_PAGE
    lines[4] = NO_LINE
    marker = 5.0
    ssm = torch.full((batch, N_ELEMS), marker, dtype=torch.bfloat16, device=DEVICE)
    conv = torch.full((batch, CONV_ELEMS), marker, dtype=torch.bfloat16, device=DEVICE)
    ssm_ref, conv_ref = ssm.clone(), conv.clone()

    gather_checkpoint(pool, table, lines_pool, lines, ssm, conv)
    gather_checkpoint_ref(pool, table, lines_pool, lines, ssm_ref, conv_ref)

    assert_equal("gathered SSM arena tri vs ref", ssm, ssm_ref)
    assert_equal("gathered conv arena tri vs ref", conv, conv_ref)
    assert bool((ssm[1] == marker).all()), "row with no pages must be left untouched"
    assert bool((conv[4] == marker).all()), "row with the sentinel line must be left untouched"
    assert_equal("conv row 0 = line 17", conv[0], lines_pool[17, :CONV_ELEMS])

    before_pool, before_lines = pool.clone(), lines_pool.clone()
    scatter_checkpoint(pool, table, lines_pool, lines, ssm.flip(0).contiguous(),
                       conv.flip(0).contiguous())
    keep = torch.ones(lines_pool.shape[0], dtype=torch.bool, device=DEVICE)
    keep[lines[lines >= 0].long()] = False
    assert bool(keep[0])
    assert_equal("lines not written (line 0 included)", lines_pool[keep], before_lines[keep])
    assert_equal("page 0", pool[0], before_pool[0])
    assert_equal("conv line 17 <- arena row 5 after the flip", lines_pool[17, :CONV_ELEMS],
                 conv[5])


def test_bad_arguments_raise():
    gen = torch.Generator().manual_seed(10)
    pool, table = world(2, 2048, torch.float32, gen)
    with pytest.raises(ValueError, match="dtype"):
        gather_pages(pool, table,
                     torch.zeros(2, N_ELEMS, dtype=torch.bfloat16, device=pool.device))
    dup = table.clone()
    dup[1, 0] = dup[0, 0]
    with pytest.raises(ValueError, match="more than one member"):
        scatter_pages(pool, dup, torch.zeros(2, N_ELEMS, device=pool.device))
    with pytest.raises(ValueError, match=r"shape \(2, 3\)"):
        gather_pages(pool, table[:, :2], torch.zeros(2, N_ELEMS, device=pool.device))
