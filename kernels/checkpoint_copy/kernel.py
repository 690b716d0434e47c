"""Triton gather/scatter of whole checkpoints between member pages (or conv lines) and an arena.

One program copies ``BLOCK`` consecutive logical elements of one sequence. When ``BLOCK``
divides ``elems_per_page`` the block sits inside one member, so the page id is one scalar load;
otherwise each element looks up its own member. A row whose first id is negative is skipped
before any other load, so a sentinel is never decoded into an address.

Conv lines use the same kernel: a line pool ``[num_lines, slot_elems]`` is a page pool whose
"pages" are slots, and ``lines[:, None]`` is a one-member table (``addr = base + l * slot_stride
+ o``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hybridmem.kernels.paging import (
    check_index,
    check_pool,
    check_table_values,
    check_writes_safe,
    num_members,
)

COPY_BLOCK = 1024


@triton.jit
def _copy_pages_kernel(
    pool_ptr,
    table_ptr,
    arena_ptr,
    n_elems,
    elems_per_page,
    page_stride,
    stride_table_b,
    stride_table_m,
    stride_arena_b,
    TO_ARENA: tl.constexpr,
    BLOCK_IN_PAGE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid_e = tl.program_id(0)
    pid_b = tl.program_id(1).to(tl.int64)
    row = table_ptr + pid_b * stride_table_b
    first = tl.load(row).to(tl.int64)
    if first < 0:  # sentinel row: nothing read, nothing written
        return
    start = pid_e.to(tl.int64) * BLOCK
    u = start + tl.arange(0, BLOCK)
    mask = u < n_elems
    if BLOCK_IN_PAGE:
        page = tl.load(row + (start // elems_per_page) * stride_table_m).to(tl.int64)
        paddr = page * page_stride + (u % elems_per_page)
    else:
        member = u // elems_per_page
        page = tl.load(row + member * stride_table_m, mask=mask, other=0).to(tl.int64)
        paddr = page * page_stride + (u % elems_per_page)
    aaddr = pid_b * stride_arena_b + u
    if TO_ARENA:
        v = tl.load(pool_ptr + paddr, mask=mask)
        tl.store(arena_ptr + aaddr, v, mask=mask)
    else:
        v = tl.load(arena_ptr + aaddr, mask=mask)
        tl.store(pool_ptr + paddr, v, mask=mask)


def _launch(
    pool: torch.Tensor, table: torch.Tensor, arena: torch.Tensor, to_arena: bool, validate: bool
) -> None:
    check_pool(pool, "pool")
    if arena.dim() != 2 or arena.stride(1) != 1:
        raise ValueError(f"arena must be 2-D [batch, n_elems] with unit inner stride, "
                         f"got shape {tuple(arena.shape)} strides {arena.stride()}")
    if arena.dtype != pool.dtype:
        raise ValueError(f"arena dtype {arena.dtype} != pool dtype {pool.dtype}: copies are "
                         "byte-exact, convert separately")
    if arena.device != pool.device or table.device != pool.device:
        raise ValueError(f"pool {pool.device}, table {table.device} and arena {arena.device} "
                         "must share a device")
    batch, n_elems = arena.shape
    epp = pool.shape[1]
    width = num_members(n_elems, epp)
    check_index(table, (batch, width), "table")
    if validate:
        check_table_values(table, pool.shape[0], "table")
        if not to_arena:
            check_writes_safe(table, table, "table")
    if batch == 0:
        return
    grid = (triton.cdiv(n_elems, COPY_BLOCK), batch)
    _copy_pages_kernel[grid](
        pool, table, arena, n_elems, epp, pool.stride(0),
        table.stride(0), table.stride(1), arena.stride(0),
        TO_ARENA=to_arena, BLOCK_IN_PAGE=(epp % COPY_BLOCK == 0), BLOCK=COPY_BLOCK,
    )


def gather_pages(
    pool: torch.Tensor, table: torch.Tensor, arena: torch.Tensor, validate: bool = True
) -> None:
    """``arena[b, u] = pool[table[b, u // E], u % E]``; rows with negative ids are left as is.

    ``pool`` is ``[num_pages, E]`` (E elements per page, any page stride), ``table`` is
    ``[batch, ceil(n_elems / E)]`` int32/int64 real page ids, ``arena`` is ``[batch, n_elems]``.
    ``validate`` checks ids on the host (one device sync); pass False on hot paths.
    """
    _launch(pool, table, arena, to_arena=True, validate=validate)


def scatter_pages(
    pool: torch.Tensor, table: torch.Tensor, arena: torch.Tensor, validate: bool = True
) -> None:
    """``pool[table[b, u // E], u % E] = arena[b, u]``; rows with negative ids write nothing."""
    _launch(pool, table, arena, to_arena=False, validate=validate)


def gather_checkpoint(
    ssm_pool: torch.Tensor,
    member_pages: torch.Tensor,
    line_pool: torch.Tensor,
    lines: torch.Tensor,
    ssm_arena: torch.Tensor,
    conv_arena: torch.Tensor,
    validate: bool = True,
) -> None:
    """Copy each sequence's SSM members and conv line into contiguous arena rows.

    ``ssm_pool`` ``[num_pages, E]``, ``member_pages`` ``[batch, members]``; ``line_pool``
    ``[num_lines, slot_elems]`` (see :func:`hybridmem.kernels.paging.slab_lines`), ``lines``
    ``[batch]``;
    ``ssm_arena`` ``[batch, heads * head_dim * d_state]``, ``conv_arena``
    ``[batch, conv_dim * (d_conv - 1)]``. A negative line skips only that conv copy; a negative
    page row skips only the SSM copy.
    """
    _check_lines(lines, ssm_arena.shape[0], line_pool, conv_arena)
    gather_pages(ssm_pool, member_pages, ssm_arena, validate)
    gather_pages(line_pool, lines[:, None], conv_arena, validate)


def scatter_checkpoint(
    ssm_pool: torch.Tensor,
    member_pages: torch.Tensor,
    line_pool: torch.Tensor,
    lines: torch.Tensor,
    ssm_arena: torch.Tensor,
    conv_arena: torch.Tensor,
    validate: bool = True,
) -> None:
    """Inverse of :func:`gather_checkpoint`: arena rows into member pages and conv lines."""
    _check_lines(lines, ssm_arena.shape[0], line_pool, conv_arena)
    scatter_pages(ssm_pool, member_pages, ssm_arena, validate)
    scatter_pages(line_pool, lines[:, None], conv_arena, validate)


def _check_lines(lines: torch.Tensor, batch: int, line_pool: torch.Tensor,
                 conv_arena: torch.Tensor) -> None:
    check_index(lines, (batch,), "lines")
    if line_pool.dim() == 2 and conv_arena.dim() == 2 and conv_arena.shape[1] > line_pool.shape[1]:
        raise ValueError(f"conv state of {conv_arena.shape[1]} elements does not fit a "
                         f"{line_pool.shape[1]}-element slot line")
