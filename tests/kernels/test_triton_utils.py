"""fp32 -> bf16 in the kernels: the hand rounding (interpreter and GPU) and the hardware
conversion (GPU only) give torch's bits, ties, NaN, infinities and subnormals included."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from hybridmem.kernels.triton_utils import cast_rtne
from tests.kernels.helpers import DEVICE


@triton.jit
def _cast_kernel(x_ptr, y_ptr, n, NATIVE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, cast_rtne(x, tl.bfloat16, NATIVE), mask=mask)


def _inputs() -> torch.Tensor:
    gen = torch.Generator().manual_seed(5)
    rnd = torch.randint(-(2**31), 2**31 - 1, (4096,), generator=gen, dtype=torch.int64)
    # exact ties (low half 0x8000) with even and odd upper halves, and their neighbours
    upper = torch.randint(0, 2**15, (256,), generator=gen, dtype=torch.int64) << 16
    ties = torch.cat([upper | 0x8000, upper | 0x18000, upper | 0x7FFF, upper | 0x8001])
    special = torch.tensor([0x7F800000, 0xFF800000, 0x7FC00000, 0x7FFFFFFF, 0x7F7FFFFF,
                            0x00000001, 0x00008000, 0x00018000, 0x80000000, 0x3F808000],
                           dtype=torch.int64)
    return _as_float(torch.cat([rnd, ties, special]) & 0xFFFFFFFF)


def _as_float(bits: torch.Tensor) -> torch.Tensor:
    signed = torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32)
    return signed.view(torch.float32)


def _check(native: bool) -> None:
    x = _inputs().to(DEVICE)
    y = torch.empty(x.shape, dtype=torch.bfloat16, device=DEVICE)
    _cast_kernel[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), NATIVE=native, BLOCK=256)
    want = x.to(torch.bfloat16)
    nan = want.isnan()
    assert torch.equal(y.isnan(), nan)
    got_bits, want_bits = y.view(torch.int16)[~nan], want.view(torch.int16)[~nan]
    bad = (got_bits != want_bits).nonzero()
    assert bad.numel() == 0, (f"native={native}: {bad.numel()} elements differ, first input bits "
                              f"{int(x.view(torch.int32)[~nan][bad[0]]) & 0xFFFFFFFF:#010x}")


def test_hand_rounding_matches_torch() -> None:
    _check(native=False)


@pytest.mark.gpu
def test_hardware_conversion_matches_torch() -> None:
    _check(native=True)
