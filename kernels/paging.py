"""Addressing shared by the kernels: member pages of paged recurrent state and conv slot lines.

Paged SSM state (S1/S2, paper §3.3). The logical state of one sequence is a flat run of
``n_elems = heads x head_dim x d_state`` elements, row-major over ``[heads, head_dim, d_state]``.
It is cut into members of ``elems_per_page`` elements; member ``j`` lives in pool page
``table[b, j]`` (a real page id, pages need not be adjacent)::

    u = (h * head_dim + m) * d_state + n           logical element
    j = u // elems_per_page                        member index
    addr(b, u) = base + table[b, j] * page_stride + u % elems_per_page      (element units)

    Falcon-H1-7B, bf16 state, 512-KiB pages: n_elems = 24 x 128 x 256 = 786,432,
    elems_per_page = 524,288 / 2 = 262,144, so 3 members; fp32 state: 131,072 per page, 6 members.

Conv slot lines (S2, App. A.3). A slab page ``p`` of the shared pool holds ``slots_per_slab``
slots; slot ``s`` of page ``p`` has line id ``l = slots_per_slab * p + s`` (16 p + s for
Falcon-H1-7B). Viewing the page pool ``[num_pages, page_elems]`` as lines
``[num_pages * slots_per_slab, page_elems / slots_per_slab]`` makes the address
``base + l * slot_stride + o``::

    page p=2            |s0|s1|s2|...|s15|       line(2, 3) = 16 * 2 + 3 = 35
    addr(35, o) = base + 35 * slot_stride + o,   slot_stride = 32 KiB / dtype bytes

A negative line is :data:`NO_LINE`, the sentinel for "no conv state": kernels skip that
sequence entirely (no read, no write, output row untouched). It never decodes to page 0.
The same rule holds for a page-table row whose entries are negative (a padded batch row).
"""

from __future__ import annotations

import torch

# line ids have one definition, in the ground layer (re-exported for the kernels' callers)
from hybridmem.addressing import NO_LINE, LineAddress, decode_line, encode_line
from hybridmem.units import Units

NO_PAGE = -1  # a padded batch row in a member-page table: skipped like NO_LINE
__all__ = ["NO_LINE", "NO_PAGE", "LineAddress", "encode_line", "decode_line", "elems_per_page",
           "slot_elems", "slab_lines"]

INDEX_DTYPES = (torch.int32, torch.int64)


def elems_per_page(units: Units, dtype: torch.dtype) -> int:
    """Elements of ``dtype`` in one shared page (524,288 B / dtype bytes for Falcon-H1-7B)."""
    size = torch.empty((), dtype=dtype).element_size()
    if units.page_bytes % size:
        raise ValueError(f"page of {units.page_bytes} B is not a whole number of {dtype} elements")
    return units.page_bytes // size


def slot_elems(units: Units, dtype: torch.dtype) -> int:
    """Elements of ``dtype`` in one conv slot (32,768 B / dtype bytes for Falcon-H1-7B)."""
    size = torch.empty((), dtype=dtype).element_size()
    if units.conv_slot_bytes % size:
        raise ValueError(
            f"conv slot of {units.conv_slot_bytes} B is not a whole number of {dtype} elements"
        )
    return units.conv_slot_bytes // size


def num_members(n_elems: int, elems_per_page: int) -> int:
    """Member pages holding ``n_elems`` logical elements: ``ceil(n_elems / elems_per_page)``."""
    if n_elems <= 0 or elems_per_page <= 0:
        raise ValueError(f"n_elems={n_elems} and elems_per_page={elems_per_page} must be > 0")
    return -(-n_elems // elems_per_page)


def slab_lines(page_pool: torch.Tensor, slots_per_slab: int) -> torch.Tensor:
    """View a page pool ``[num_pages, page_elems]`` as lines ``[num_pages * slots, slot_elems]``.

    Line ``l`` of the view is slot ``l % slots`` of page ``l // slots``: no copy, same storage.
    """
    if page_pool.dim() != 2 or page_pool.stride(1) != 1:
        raise ValueError(f"page pool must be 2-D with unit inner stride, got {page_pool.shape}")
    num_pages, page_elems = page_pool.shape
    if slots_per_slab <= 0 or page_elems % slots_per_slab:
        raise ValueError(f"{page_elems} elements per page do not split into {slots_per_slab} slots")
    if page_pool.stride(0) != page_elems:
        raise ValueError(
            f"page stride {page_pool.stride(0)} != page_elems {page_elems}: lines would not be "
            "l * slot_stride"
        )
    return page_pool.view(num_pages * slots_per_slab, page_elems // slots_per_slab)


def check_pool(pool: torch.Tensor, name: str) -> None:
    if pool.dim() != 2 or pool.stride(1) != 1:
        raise ValueError(
            f"{name} must be 2-D [num_pages, elems] with unit inner stride, got shape "
            f"{tuple(pool.shape)} strides {pool.stride()}"
        )


def check_index(table: torch.Tensor, shape: tuple[int, ...], name: str) -> None:
    """Shape and dtype of a page table or line vector (cheap: no device sync)."""
    if table.dtype not in INDEX_DTYPES:
        raise ValueError(f"{name} must be int32 or int64, got {table.dtype}")
    if tuple(table.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(table.shape)}")


def check_table_values(table: torch.Tensor, num_pages: int, name: str) -> torch.Tensor:
    """Raise unless every row is all-valid or all-negative and ids are < ``num_pages``.

    Returns the host copy's row-valid mask.
    """
    host = table.detach().to("cpu", torch.int64)
    neg = host < 0
    valid = ~neg.any(dim=1)
    mixed = neg.any(dim=1) & ~neg.all(dim=1)
    if bool(mixed.any()):
        row = int(mixed.nonzero()[0, 0])
        raise ValueError(f"{name} row {row} mixes real and negative ids: {host[row].tolist()}")
    if bool(valid.any()):
        top = int(host[valid].max())
        if top >= num_pages:
            raise ValueError(f"{name} holds id {top} but the pool has {num_pages} pages/lines")
    return valid


def check_writes_safe(src: torch.Tensor, dst: torch.Tensor, name: str) -> None:
    """Destinations must not race: each written id once, and never another member's source.

    A destination id equal to the source id of the same (row, member) is an in-place update;
    any other destination id must be outside the set of all source ids, so old checkpoints and
    other sequences' state stay intact while the kernel runs.
    """
    s = src.detach().to("cpu", torch.int64)
    d = dst.detach().to("cpu", torch.int64)
    if s.shape != d.shape:
        raise ValueError(f"{name}: source table {tuple(s.shape)} != destination {tuple(d.shape)}")
    src_rows = ~(s < 0).any(dim=1)
    dst_rows = ~(d < 0).any(dim=1)
    if not torch.equal(src_rows, dst_rows):
        row = int((src_rows != dst_rows).nonzero()[0, 0])
        raise ValueError(
            f"{name}: row {row} is skipped in one table but not the other "
            f"(src {s[row].tolist()}, dst {d[row].tolist()})"
        )
    dv = d[dst_rows].flatten()
    if dv.numel() != torch.unique(dv).numel():
        raise ValueError(f"{name}: a destination id is written by more than one member")
    sv = s[src_rows]
    moved = d[dst_rows] != sv
    if bool(moved.any()):
        clash = torch.isin(d[dst_rows][moved], sv.flatten())
        if bool(clash.any()):
            bad = int(d[dst_rows][moved][clash][0])
            raise ValueError(
                f"{name}: destination id {bad} is also a source id of another member; the update "
                "would overwrite state that is still being read"
            )
