"""Triton Mamba2 single-token selective state update reading/writing state through member pages.

Grid ``(cdiv(head_dim, BLOCK_M), batch, heads)``: one program owns ``BLOCK_M`` rows of one
head of one sequence, i.e. the ``[BLOCK_M, d_state]`` tile of logical elements
``u = (h * head_dim + m) * d_state + n``. Each element is read at
``pool + src[b, u // E] * page_stride + u % E`` and written at the same offset in page
``dst[b, u // E]`` (``E`` = elements per page). When ``E % d_state == 0`` a row never straddles
a page, so the page id is loaded once per row (``ROW_IN_PAGE``); otherwise once per element.

A row whose first source id is negative is a padded / absent sequence: the program returns
before any other load, so nothing is read or written and the output row is left as it was.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hybridmem.kernels.paged_ssm_update.reference import SsmParams, expand_params
from hybridmem.kernels.paging import (
    check_index,
    check_pool,
    check_table_values,
    check_writes_safe,
    num_members,
)
from hybridmem.kernels.triton_utils import NATIVE_CAST, cast_rtne

FLOAT_DTYPES = (torch.float32, torch.bfloat16)  # state and output dtypes (cast_rtne covers both)


@triton.jit
def _softplus(dt):
    return tl.where(dt <= 20.0, tl.log(tl.exp(dt) + 1.0), dt)


@triton.jit
def _paged_ssm_update_kernel(
    pool_ptr,
    src_ptr,
    dst_ptr,
    x_ptr,
    dt_ptr,
    dt_bias_ptr,
    A_ptr,
    B_ptr,
    C_ptr,
    D_ptr,
    z_ptr,
    out_ptr,
    dim,
    dstate,
    heads_per_group,
    elems_per_page,
    page_stride,
    s_src_b, s_src_m,
    s_dst_b, s_dst_m,
    s_x_b, s_x_h, s_x_m,
    s_dt_b, s_dt_h, s_dt_m,
    s_dtb_h, s_dtb_m,
    s_A_h, s_A_m, s_A_n,
    s_B_b, s_B_g, s_B_n,
    s_C_b, s_C_g, s_C_n,
    s_D_h, s_D_m,
    s_z_b, s_z_h, s_z_m,
    s_o_b, s_o_h, s_o_m,
    DT_SOFTPLUS: tl.constexpr,
    HAS_DT_BIAS: tl.constexpr,
    HAS_D: tl.constexpr,
    HAS_Z: tl.constexpr,
    ROW_IN_PAGE: tl.constexpr,
    TIE_HDIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NATIVE: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_b = tl.program_id(1).to(tl.int64)
    pid_h = tl.program_id(2).to(tl.int64)

    src_row = src_ptr + pid_b * s_src_b
    dst_row = dst_ptr + pid_b * s_dst_b
    first = tl.load(src_row).to(tl.int64)
    if first < 0:  # sentinel row: no read, no write, output untouched
        return

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    mask_m = offs_m < dim
    mask = mask_m[:, None] & (offs_n[None, :] < dstate)

    # logical element index of each tile element, u = (h * dim + m) * dstate + n
    row_u = (pid_h * dim + offs_m.to(tl.int64)) * dstate  # [BLOCK_M]
    if ROW_IN_PAGE:
        member = row_u // elems_per_page
        src_pg = tl.load(src_row + member * s_src_m, mask=mask_m, other=0).to(tl.int64)
        dst_pg = tl.load(dst_row + member * s_dst_m, mask=mask_m, other=0).to(tl.int64)
        off = row_u % elems_per_page
        src_addr = (src_pg * page_stride + off)[:, None] + offs_n[None, :]
        dst_addr = (dst_pg * page_stride + off)[:, None] + offs_n[None, :]
    else:
        u = row_u[:, None] + offs_n[None, :]
        member = u // elems_per_page
        src_pg = tl.load(src_row + member * s_src_m, mask=mask, other=0).to(tl.int64)
        dst_pg = tl.load(dst_row + member * s_dst_m, mask=mask, other=0).to(tl.int64)
        off = u % elems_per_page
        src_addr = src_pg * page_stride + off
        dst_addr = dst_pg * page_stride + off

    state = tl.load(pool_ptr + src_addr, mask=mask, other=0.0).to(tl.float32)

    x = tl.load(x_ptr + pid_b * s_x_b + pid_h * s_x_h + offs_m * s_x_m, mask=mask_m, other=0.0)
    x = x.to(tl.float32)
    g = pid_h // heads_per_group
    B = tl.load(B_ptr + pid_b * s_B_b + g * s_B_g + offs_n * s_B_n, mask=offs_n < dstate,
                other=0.0).to(tl.float32)
    C = tl.load(C_ptr + pid_b * s_C_b + g * s_C_g + offs_n * s_C_n, mask=offs_n < dstate,
                other=0.0).to(tl.float32)
    if TIE_HDIM:
        # Mamba2: dt, dt_bias and A are one number per head; same values as the general
        # path (dA is exp of the same product), with one load instead of a tile of loads
        dt_h = tl.load(dt_ptr + pid_b * s_dt_b + pid_h * s_dt_h).to(tl.float32)
        if HAS_DT_BIAS:
            dt_h += tl.load(dt_bias_ptr + pid_h * s_dtb_h).to(tl.float32)
        if DT_SOFTPLUS:
            dt_h = _softplus(dt_h)
        dA = tl.exp(tl.load(A_ptr + pid_h * s_A_h).to(tl.float32) * dt_h)
        dB = B * dt_h
        state = state * dA + dB[None, :] * x[:, None]
    else:
        dt = tl.load(dt_ptr + pid_b * s_dt_b + pid_h * s_dt_h + offs_m * s_dt_m, mask=mask_m,
                     other=0.0).to(tl.float32)
        if HAS_DT_BIAS:
            dt += tl.load(dt_bias_ptr + pid_h * s_dtb_h + offs_m * s_dtb_m, mask=mask_m,
                          other=0.0).to(tl.float32)
        if DT_SOFTPLUS:
            dt = _softplus(dt)
        A = tl.load(A_ptr + pid_h * s_A_h + offs_m[:, None] * s_A_m + offs_n[None, :] * s_A_n,
                    mask=mask, other=0.0).to(tl.float32)
        dA = tl.exp(A * dt[:, None])
        dB = B[None, :] * dt[:, None]
        state = state * dA + dB * x[:, None]
    tl.store(pool_ptr + dst_addr, cast_rtne(state, pool_ptr.dtype.element_ty, NATIVE), mask=mask)

    out = tl.sum(state * C[None, :], axis=1)
    if HAS_D:
        D = tl.load(D_ptr + pid_h * s_D_h + offs_m * s_D_m, mask=mask_m, other=0.0)
        out += x * D.to(tl.float32)
    if HAS_Z:
        z = tl.load(z_ptr + pid_b * s_z_b + pid_h * s_z_h + offs_m * s_z_m, mask=mask_m,
                    other=0.0).to(tl.float32)
        out *= z * tl.sigmoid(z)
    tl.store(out_ptr + pid_b * s_o_b + pid_h * s_o_h + offs_m * s_o_m,
             cast_rtne(out, out_ptr.dtype.element_ty, NATIVE), mask=mask_m)


def default_block_m(d_state: int) -> int:
    """Rows per program: 32/16/8 rows for d_state <= 16/32/larger (tiles of 512-2048 elements;
    the 8-row tile for d_state > 64 is the H200 measurement in :func:`default_num_warps`)."""
    if d_state <= 16:
        return 32
    if d_state <= 32:
        return 16
    return 8


def default_num_warps(d_state: int) -> int:
    """Warps per program. For d_state > 64 (Falcon-H1-7B: 256) an [8, d_state] tile on 2 warps
    measured fastest on an H200 (``benchmarks/sweep_ssm_tiles.py``; 0.66-0.68x the time of
    [4, 256] on 4 warps with bf16 state, 0.85x with fp32). Smaller d_state: Triton's 4."""
    return 2 if d_state > 64 else 4


def _tied(p: SsmParams) -> bool:
    """dt, dt_bias and A constant over head_dim and d_state (stride-0 views of per-head values)."""
    return (p.A.stride(1) == 0 and p.A.stride(2) == 0 and p.dt.stride(2) == 0
            and (p.dt_bias is None or p.dt_bias.stride(1) == 0))


def _s(t: torch.Tensor | None, n: int) -> tuple[int, ...]:
    return tuple(t.stride()) if t is not None else (0,) * n


def paged_selective_state_update(
    pool: torch.Tensor,
    src_pages: torch.Tensor,
    dst_pages: torch.Tensor | None,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    out: torch.Tensor | None = None,
    d_state: int | None = None,
    validate: bool = True,
    block_m: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """One Mamba2 decode step with the state read from / written to member pages of ``pool``.

    pool: ``[num_pages, E]`` fp32 or bf16 (E elements per page, any page stride; e.g. a
        512-KiB shared page pool viewed in the state dtype).
    src_pages / dst_pages: ``[batch, ceil(heads * head_dim * d_state / E)]`` int32/int64 real page
        ids. ``dst_pages`` None or equal to ``src_pages``: in place. Different: the new state goes
        to ``dst_pages`` and the source checkpoint is left intact. A row of negative ids skips that
        sequence (no read, no write, ``out`` row untouched).
    x, dt, A, B, C, D, z, dt_bias: see :func:`expand_params` (per-head Mamba2 shapes accepted);
        B/C are grouped: head ``h`` uses group ``h // (heads / groups)``.
    out: ``[batch, heads, head_dim]``; allocated as zeros of ``x.dtype`` when None.
    d_state: needed only when A is given per head (``[heads]``); else read from A / B.
    validate: check page ids on the host (one device sync) for range, all-or-nothing rows and
        write races; pass False on a hot path whose tables are known good.
    block_m, num_warps: tile rows per program and warps per program (powers of two); None picks
        the measured defaults (``default_block_m``, ``default_num_warps``). For tuning sweeps.
    Returns ``out``.
    """
    check_pool(pool, "pool")
    if pool.dtype not in FLOAT_DTYPES:
        raise ValueError(f"state pool dtype must be fp32 or bf16, got {pool.dtype}")
    n = d_state if d_state is not None else B.shape[-1]
    p: SsmParams = expand_params(x, dt, A, B, C, D, z, dt_bias, n)
    batch, heads, dim = x.shape
    groups = B.shape[1]
    epp = pool.shape[1]
    width = num_members(heads * dim * n, epp)
    dst = src_pages if dst_pages is None else dst_pages
    check_index(src_pages, (batch, width), "src_pages")
    check_index(dst, (batch, width), "dst_pages")
    for name, t in (("x", x), ("src_pages", src_pages), ("dst_pages", dst), ("B", B)):
        if t.device != pool.device:
            raise ValueError(f"{name} is on {t.device} but the pool is on {pool.device}")
    if validate:
        check_table_values(src_pages, pool.shape[0], "src_pages")
        check_table_values(dst, pool.shape[0], "dst_pages")
        check_writes_safe(src_pages, dst, "dst_pages")
    if out is None:
        out = torch.zeros_like(x)
    if out.dtype not in FLOAT_DTYPES:
        raise ValueError(f"out dtype must be fp32 or bf16, got {out.dtype}")
    if tuple(out.shape) != (batch, heads, dim):
        raise ValueError(f"out must have shape {(batch, heads, dim)}, got {tuple(out.shape)}")
    if batch == 0:
        return out
    for name, v in (("block_m", block_m), ("num_warps", num_warps)):
        if v is not None and (v < 1 or v & (v - 1)):
            raise ValueError(f"{name} must be a power of two >= 1, got {v}")
    block_m = min(block_m or default_block_m(n), triton.next_power_of_2(dim))
    grid = (triton.cdiv(dim, block_m), batch, heads)
    _paged_ssm_update_kernel[grid](
        pool, src_pages, dst,
        p.x, p.dt, p.dt_bias, p.A, p.B, p.C, p.D, p.z, out,
        dim, n, heads // groups, epp, pool.stride(0),
        *src_pages.stride(), *dst.stride(),
        *p.x.stride(), *p.dt.stride(), *_s(p.dt_bias, 2), *p.A.stride(),
        *p.B.stride(), *p.C.stride(), *_s(p.D, 2), *_s(p.z, 3), *out.stride(),
        DT_SOFTPLUS=dt_softplus,
        HAS_DT_BIAS=p.dt_bias is not None,
        HAS_D=p.D is not None,
        HAS_Z=p.z is not None,
        ROW_IN_PAGE=(epp % n == 0),
        TIE_HDIM=_tied(p),
        BLOCK_M=block_m,
        BLOCK_N=triton.next_power_of_2(n),
        NATIVE=NATIVE_CAST,
        num_warps=num_warps or default_num_warps(n),
    )
    return out
