"""Triton single-token causal conv1d update addressing conv state by slot line ids.

Grid ``(batch, cdiv(conv_dim, BLOCK_C))``. Sequence ``b`` reads its state at
``line_pool + src[b] * slot_stride + c * (K - 1) + k`` and writes the shifted window at the same
offsets of line ``dst[b]``. A negative source line is the sentinel: the program returns after
loading the line id, before forming any state address, so nothing is read or written and the
output row is untouched (a sentinel never aliases line 0 / page 0).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hybridmem.kernels.paging import check_index, check_pool, check_table_values, check_writes_safe
from hybridmem.kernels.triton_utils import NATIVE_CAST, cast_rtne

FLOAT_DTYPES = (torch.float32, torch.bfloat16)
BLOCK_C = 256


@triton.jit
def _conv_slot_update_kernel(
    line_pool_ptr,
    src_ptr,
    dst_ptr,
    x_ptr,
    w_ptr,
    bias_ptr,
    out_ptr,
    conv_dim,
    slot_stride,
    s_x_b, s_x_c,
    s_w_c, s_w_k,
    s_o_b, s_o_c,
    WIDTH: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NATIVE: tl.constexpr,
):
    pid_b = tl.program_id(0).to(tl.int64)
    pid_c = tl.program_id(1)
    src_line = tl.load(src_ptr + pid_b).to(tl.int64)
    if src_line < 0:  # NO_LINE: no state for this sequence, touch nothing
        return
    dst_line = tl.load(dst_ptr + pid_b).to(tl.int64)

    offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    offs_k = tl.arange(0, BLOCK_K)
    mask_c = offs_c < conv_dim
    in_state = offs_k < WIDTH - 1
    tile_off = offs_c[:, None].to(tl.int64) * (WIDTH - 1) + offs_k[None, :]
    src_base = line_pool_ptr + src_line * slot_stride
    mask = mask_c[:, None] & in_state[None, :]
    tile = tl.load(src_base + tile_off, mask=mask, other=0.0).to(tl.float32)
    # the shifted window, column k <- column k + 1, read before anything is stored
    mask_shift = mask_c[:, None] & (offs_k[None, :] + 1 < WIDTH - 1)
    shifted = tl.load(src_base + tile_off + 1, mask=mask_shift, other=0.0).to(tl.float32)

    x = tl.load(x_ptr + pid_b * s_x_b + offs_c * s_x_c, mask=mask_c, other=0.0).to(tl.float32)
    if HAS_BIAS:
        acc = tl.load(bias_ptr + offs_c, mask=mask_c, other=0.0).to(tl.float32)
    else:
        acc = tl.zeros([BLOCK_C], dtype=tl.float32)
    for k in tl.static_range(WIDTH - 1):
        col = tl.sum(tl.where(offs_k[None, :] == k, tile, 0.0), axis=1)  # exact: one term
        w = tl.load(w_ptr + offs_c * s_w_c + k * s_w_k, mask=mask_c, other=0.0).to(tl.float32)
        acc += col * w
    w_last = tl.load(w_ptr + offs_c * s_w_c + (WIDTH - 1) * s_w_k, mask=mask_c, other=0.0)
    acc += x * w_last.to(tl.float32)
    if SILU:
        acc = acc / (1.0 + tl.exp(-acc))

    new = tl.where(offs_k[None, :] == WIDTH - 2, x[:, None], shifted)
    tl.debug_barrier()  # in place (dst == src): every thread's loads precede any store
    dst_base = line_pool_ptr + dst_line * slot_stride
    tl.store(dst_base + tile_off, cast_rtne(new, line_pool_ptr.dtype.element_ty, NATIVE), mask=mask)
    tl.store(out_ptr + pid_b * s_o_b + offs_c * s_o_c,
             cast_rtne(acc, out_ptr.dtype.element_ty, NATIVE), mask=mask_c)


def conv_slot_update(
    line_pool: torch.Tensor,
    src_lines: torch.Tensor,
    dst_lines: torch.Tensor | None,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    silu: bool = True,
    out: torch.Tensor | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Causal conv1d decode step with conv state ``[conv_dim, d_conv - 1]`` in slot lines.

    line_pool: ``[num_lines, slot_elems]`` fp32/bf16 (a slab page pool viewed through
        :func:`hybridmem.kernels.paging.slab_lines`; line ``l = 16 p + s``); ``slot_stride`` is
        its row stride, so ``addr = base + l * slot_stride + c * (d_conv - 1) + k``.
    src_lines / dst_lines: ``[batch]`` int32/int64. ``dst_lines`` None: in place. A negative
        source line (:data:`hybridmem.kernels.paging.NO_LINE`) skips the sequence; its
        destination must then be negative too.
    x: ``[batch, conv_dim]``; weight ``[conv_dim, d_conv]``; bias ``[conv_dim]`` or None.
    silu: apply SiLU to the output. out: ``[batch, conv_dim]``, zeros of ``x.dtype`` if None.
    validate: check line ids on the host (one device sync); pass False on a hot path.
    Returns ``out``.
    """
    check_pool(line_pool, "line_pool")
    if line_pool.dtype not in FLOAT_DTYPES:
        raise ValueError(f"line pool dtype must be fp32 or bf16, got {line_pool.dtype}")
    if x.dim() != 2:
        raise ValueError(f"x must be [batch, conv_dim], got {tuple(x.shape)}")
    batch, conv_dim = x.shape
    if weight.dim() != 2 or weight.shape[0] != conv_dim or weight.shape[1] < 2:
        raise ValueError(f"weight must be [{conv_dim}, d_conv >= 2], got {tuple(weight.shape)}")
    width = weight.shape[1]
    n = conv_dim * (width - 1)
    if n > line_pool.shape[1]:
        raise ValueError(f"conv state of {conv_dim} x {width - 1} = {n} elements does not fit a "
                         f"{line_pool.shape[1]}-element slot line")
    if bias is not None and tuple(bias.shape) != (conv_dim,):
        raise ValueError(f"bias must be [{conv_dim}], got {tuple(bias.shape)}")
    if bias is not None and bias.stride(0) != 1:
        bias = bias.contiguous()
    dst = src_lines if dst_lines is None else dst_lines
    check_index(src_lines, (batch,), "src_lines")
    check_index(dst, (batch,), "dst_lines")
    for name, t in (("x", x), ("src_lines", src_lines), ("dst_lines", dst), ("weight", weight)):
        if t.device != line_pool.device:
            raise ValueError(f"{name} is on {t.device} but the line pool is on {line_pool.device}")
    if validate:
        check_table_values(src_lines[:, None], line_pool.shape[0], "src_lines")
        check_table_values(dst[:, None], line_pool.shape[0], "dst_lines")
        check_writes_safe(src_lines[:, None], dst[:, None], "dst_lines")
    if out is None:
        out = torch.zeros_like(x)
    if tuple(out.shape) != (batch, conv_dim) or out.dtype not in FLOAT_DTYPES:
        raise ValueError(f"out must be fp32/bf16 [{batch}, {conv_dim}], got {out.dtype} "
                         f"{tuple(out.shape)}")
    if batch == 0:
        return out
    grid = (batch, triton.cdiv(conv_dim, BLOCK_C))
    _conv_slot_update_kernel[grid](
        line_pool, src_lines, dst, x, weight, bias, out,
        conv_dim, line_pool.stride(0),
        *x.stride(), *weight.stride(), *out.stride(),
        WIDTH=width, HAS_BIAS=bias is not None, SILU=silu,
        BLOCK_C=BLOCK_C, BLOCK_K=triton.next_power_of_2(width - 1), NATIVE=NATIVE_CAST,
    )
    return out
