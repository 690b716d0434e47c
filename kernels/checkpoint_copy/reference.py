"""Torch reference for moving a whole checkpoint between member pages / a conv line and an arena.

Plain advanced indexing over the address formula of ``kernels/paging.py``; rows whose ids are
negative (the sentinel) are skipped: the arena row (gather) or the pool (scatter) is untouched.
"""

from __future__ import annotations

import torch


def _addresses(table: torch.Tensor, n_elems: int, elems_per_page: int):
    """(page ids, offsets) of every logical element, each ``[batch, n_elems]``."""
    u = torch.arange(n_elems, device=table.device)
    member = u // elems_per_page
    pages = table.to(torch.int64)[:, member]
    return pages, (u % elems_per_page).expand_as(pages)


def gather_pages_ref(pool: torch.Tensor, table: torch.Tensor, arena: torch.Tensor) -> None:
    """``arena[b, u] = pool[table[b, u // E], u % E]`` for rows with real ids (E = pool width)."""
    pages, offs = _addresses(table, arena.shape[1], pool.shape[1])
    live = (table >= 0).all(dim=1)
    arena[live] = pool[pages[live], offs[live]]


def scatter_pages_ref(pool: torch.Tensor, table: torch.Tensor, arena: torch.Tensor) -> None:
    """``pool[table[b, u // E], u % E] = arena[b, u]`` for rows with real ids."""
    pages, offs = _addresses(table, arena.shape[1], pool.shape[1])
    live = (table >= 0).all(dim=1)
    pool[pages[live], offs[live]] = arena[live]


def gather_checkpoint_ref(
    ssm_pool: torch.Tensor,
    member_pages: torch.Tensor,
    line_pool: torch.Tensor,
    lines: torch.Tensor,
    ssm_arena: torch.Tensor,
    conv_arena: torch.Tensor,
) -> None:
    gather_pages_ref(ssm_pool, member_pages, ssm_arena)
    gather_pages_ref(line_pool, lines[:, None], conv_arena)


def scatter_checkpoint_ref(
    ssm_pool: torch.Tensor,
    member_pages: torch.Tensor,
    line_pool: torch.Tensor,
    lines: torch.Tensor,
    ssm_arena: torch.Tensor,
    conv_arena: torch.Tensor,
) -> None:
    scatter_pages_ref(ssm_pool, member_pages, ssm_arena)
    scatter_pages_ref(line_pool, lines[:, None], conv_arena)
