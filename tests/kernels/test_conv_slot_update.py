"""Conv-slot causal conv1d update: tri paged (slot lines) vs tri contiguous (identity lines), tri vs
ref, sentinel lines, moving updates, and vLLM where installed.

Tolerances (kernel vs reference; both accumulate in fp32 in the same order, so on the
interpreter they agree exactly, but a GPU may fuse multiply-adds):
    fp32 output / state: atol 1e-5, rtol 1e-5;  bf16: atol 1e-2, rtol 1e-2.
The new state is x and a shift of old state values, so it must be bit-exact everywhere.
"""

from __future__ import annotations

import pytest
import torch

from hybridmem.kernels.conv_slot_update import (
    conv_slot_update,
    conv_slot_update_ref,
    conv_update_ref,
)
from hybridmem.kernels.paging import NO_LINE, decode_line, encode_line, slab_lines
from tests.kernels.helpers import DEVICE, assert_close, assert_equal, random_page_ids

CONV_DIM, D_CONV = 40, 4
STATE_ELEMS = CONV_DIM * (D_CONV - 1)  # 120 of a 128-element slot
SLOTS, SLOT_ELEMS = 16, 128
TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (1e-2, 1e-2)}
DTYPES = [torch.bfloat16, torch.float32]


class Slabs:
    """Conv state of ``batch`` sequences in random slots of random slab pages.

    Every line of the pool holds live random data, line 0 included, and only the chosen lines
    are referenced.
    """

    def __init__(self, batch: int, dtype: torch.dtype, gen: torch.Generator, num_pages: int = 9):
        self.pages = torch.randn(num_pages, SLOTS * SLOT_ELEMS, generator=gen).to(dtype)
        self.pages = self.pages.to(DEVICE)
        self.lines_pool = slab_lines(self.pages, SLOTS)
        ids = random_page_ids(num_pages * SLOTS, 2 * batch, gen, exclude=(0,)).to(torch.int32)
        self.src = ids[:batch].to(DEVICE)
        self.dst = ids[batch:].to(DEVICE)
        self.state = self.lines_pool[self.src.long(), :STATE_ELEMS].clone()

    def contiguous(self) -> tuple[torch.Tensor, torch.Tensor]:
        batch = self.src.shape[0]
        pool = torch.zeros(batch, STATE_ELEMS, dtype=self.pages.dtype, device=DEVICE)
        pool[:] = self.state
        return pool, torch.arange(batch, dtype=torch.int32, device=DEVICE)


def make_inputs(batch: int, dtype: torch.dtype, gen: torch.Generator):
    x = torch.randn(batch, CONV_DIM, generator=gen).to(dtype).to(DEVICE)
    w = torch.randn(CONV_DIM, D_CONV, generator=gen).to(dtype).to(DEVICE)
    bias = torch.randn(CONV_DIM, generator=gen).to(dtype).to(DEVICE)
    return x, w, bias


def test_line_ids_encode_page_and_slot():
    # page 2, slot 3 -> 16 * 2 + 3 = 35; page ids are real ids, 0 is a valid page
    assert encode_line(2, 3, 16) == 35
    assert decode_line(35, 16) == (2, 3)
    assert encode_line(0, 0, 16) == 0 and decode_line(0, 16) == (0, 0)
    with pytest.raises(ValueError, match="sentinel"):
        decode_line(NO_LINE, 16)
    with pytest.raises(ValueError, match="0 <= slot < 16"):
        encode_line(1, 16, 16)
    pages = torch.arange(3 * 64, dtype=torch.float32).view(3, 64)
    lines = slab_lines(pages, 16)
    # line 35 = page 2 slot 3 = elements [2 * 64 + 3 * 4, ... + 4)
    assert lines.shape == (48, 4) and lines.stride(0) == 4
    assert lines[35].tolist() == [140.0, 141.0, 142.0, 143.0]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("batch", [8, 32, 53], ids=lambda b: f"batch{b}")
def test_tri_paged_equals_tri_contiguous(batch: int, dtype: torch.dtype):
    gen = torch.Generator().manual_seed(100 + batch)
    world = Slabs(batch, dtype, gen, num_pages=8)
    x, w, bias = make_inputs(batch, dtype, gen)
    pool_c, ident = world.contiguous()
    before = world.pages.clone()

    out_c = conv_slot_update(pool_c, ident, None, x, w, bias)
    out_p = conv_slot_update(world.lines_pool, world.src, None, x, w, bias)

    assert_equal("output paged vs contiguous", out_p, out_c)
    assert_equal("new state paged vs contiguous",
                 world.lines_pool[world.src.long(), :STATE_ELEMS], pool_c)
    keep = torch.ones(world.lines_pool.shape[0], dtype=torch.bool, device=DEVICE)
    keep[world.src.long()] = False
    assert_equal("lines outside the batch (line 0 included)",
                 world.lines_pool[keep], slab_lines(before, SLOTS)[keep])
    # the tail of each used slot beyond conv_dim x (d_conv - 1) is not written either
    assert_equal("slot tails", world.lines_pool[:, STATE_ELEMS:],
                 slab_lines(before, SLOTS)[:, STATE_ELEMS:])


@pytest.mark.parametrize("silu", [True, False], ids=["silu", "linear"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_tri_matches_ref(dtype: torch.dtype, silu: bool):
    gen = torch.Generator().manual_seed(200)
    batch = 53
    world = Slabs(batch, dtype, gen)
    x, w, bias = make_inputs(batch, dtype, gen)
    pool_ref = world.lines_pool.clone()

    out_tri = conv_slot_update(world.lines_pool, world.src, None, x, w, bias, silu=silu)
    out_ref = conv_slot_update_ref(pool_ref, world.src, None, x, w, bias, silu=silu)

    atol, rtol = TOL[dtype]
    assert_close("output tri vs ref", out_tri, out_ref, atol, rtol)
    assert_equal("state tri vs ref", world.lines_pool, pool_ref)


def test_ref_window_shift_by_hand():
    # state rows [s0 s1 s2], x -> new state [s1 s2 x]; out = b + s0 w0 + s1 w1 + s2 w2 + x w3
    state = torch.tensor([[[1.0, 2.0, 3.0]]])
    x = torch.tensor([[4.0]])
    w = torch.tensor([[1.0, 10.0, 100.0, 1000.0]])
    out, new = conv_update_ref(state, x, w, torch.tensor([0.5]), silu=False)
    assert out.tolist() == [[0.5 + 1 + 20 + 300 + 4000]]
    assert new.tolist() == [[[2.0, 3.0, 4.0]]]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_tri_out_of_place_leaves_source_line(dtype: torch.dtype):
    gen = torch.Generator().manual_seed(300)
    batch = 8
    world = Slabs(batch, dtype, gen)
    x, w, bias = make_inputs(batch, dtype, gen)
    before = world.lines_pool.clone()
    inplace = world.lines_pool.clone()

    out_moved = conv_slot_update(world.lines_pool, world.src, world.dst, x, w, bias)
    out_inplace = conv_slot_update(inplace, world.src, None, x, w, bias)

    src, dst = world.src.long(), world.dst.long()
    assert_equal("source lines after a moving update", world.lines_pool[src], before[src])
    assert_equal("destination vs in-place state", world.lines_pool[dst, :STATE_ELEMS],
                 inplace[src, :STATE_ELEMS])
    assert_equal("output moving vs in place", out_moved, out_inplace)


def test_tri_sentinel_lines_read_and_write_nothing():
    gen = torch.Generator().manual_seed(400)
    batch = 8
    world = Slabs(batch, torch.bfloat16, gen)
    x, w, bias = make_inputs(batch, torch.bfloat16, gen)
    skipped = torch.tensor([0, 5], device=DEVICE)
    src = world.src.clone()
    src[skipped] = NO_LINE
    dst = world.dst.clone()
    dst[skipped] = NO_LINE
    # line 0 (page 0, slot 0) holds live data that no sequence references
    assert not bool((src == 0).any()) and bool(world.lines_pool[0].abs().sum() > 0)
    before = world.lines_pool.clone()
    marker = torch.full_like(x, 7.0)

    out = conv_slot_update(world.lines_pool, src, dst, x, w, bias, out=marker.clone())

    assert_equal("output rows of skipped sequences", out[skipped], marker[skipped])
    assert_equal("line 0", world.lines_pool[0], before[0])
    written = dst[dst >= 0].long()
    keep = torch.ones(before.shape[0], dtype=torch.bool, device=DEVICE)
    keep[written] = False
    assert_equal("every line but the live destinations", world.lines_pool[keep], before[keep])
    live = src >= 0
    pool2 = before.clone()
    out2 = conv_slot_update(pool2, src[live], dst[live], x[live], w, bias)
    assert_equal("live rows vs a batch without the skipped rows", out[live], out2)
    assert_equal("pool vs a batch without the skipped rows", world.lines_pool, pool2)


def test_bad_lines_raise_with_numbers():
    gen = torch.Generator().manual_seed(500)
    world = Slabs(4, torch.float32, gen)
    x, w, bias = make_inputs(4, torch.float32, gen)
    n = world.lines_pool.shape[0]
    big = world.src.clone()
    big[1] = n
    with pytest.raises(ValueError, match=f"id {n} but the pool has {n}"):
        conv_slot_update(world.lines_pool, big, None, x, w, bias)
    half = world.dst.clone()
    half[2] = NO_LINE  # a live source with no destination
    with pytest.raises(ValueError, match="row 2 is skipped in one table"):
        conv_slot_update(world.lines_pool, world.src, half, x, w, bias)
    wide = torch.randn(60, D_CONV)
    with pytest.raises(ValueError, match="180 elements does not fit a 128-element slot"):
        conv_slot_update(world.lines_pool, world.src, None, torch.randn(4, 60), wide)


def test_vllm_cross_check():
    """Our kernel against vLLM's causal_conv1d_update on the state gathered contiguously.

    vLLM's cache gets a pad line first and indices 1..batch (valid for both -1 and 0 padding).
    """
    conv_mod = pytest.importorskip(
        "vllm.model_executor.layers.mamba.ops.causal_conv1d",
        reason="vllm is not installed here; this cross-check runs where it is",
    )
    gen = torch.Generator().manual_seed(600)
    batch = 8
    world = Slabs(batch, torch.bfloat16, gen)
    x, w, bias = make_inputs(batch, torch.bfloat16, gen)
    # vLLM wants conv_state [cache_lines, dim, state_len], contiguous along dim
    cache = torch.zeros(batch + 1, D_CONV - 1, CONV_DIM, dtype=torch.bfloat16, device=DEVICE)
    cache = cache.transpose(1, 2)
    cache[1:] = world.state.view(batch, CONV_DIM, D_CONV - 1)
    idx = torch.arange(1, batch + 1, dtype=torch.int32, device=DEVICE)
    out_vllm = conv_mod.causal_conv1d_update(x.clone(), cache, w, bias, activation="silu",
                                             conv_state_indices=idx)
    out_tri = conv_slot_update(world.lines_pool, world.src, None, x, w, bias)
    # vLLM multiplies in bf16 before accumulating in fp32: allow two bf16 ulps
    assert_close("output tri vs vLLM", out_tri, out_vllm, 2e-2, 2e-2)
    assert_equal("state tri vs vLLM", world.lines_pool[world.src.long(), :STATE_ELEMS],
                 cache[1:].reshape(batch, -1))
    assert bool((cache[0] == 0).all()), "vLLM wrote its pad line"
