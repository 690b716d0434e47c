"""Conv slot line ids: the ONE definition (ground layer; imports nothing of the project).

A slab page ``p`` of the shared pool holds ``slots_per_slab`` conv slots; slot ``s`` of page
``p`` has line id ``l = slots_per_slab * p + s`` (App. A.3). ``slots_per_slab`` is the
geometry's (page bytes / conv slot bytes): 16 for Falcon-H1-7B, 32 for granite-4.0-h-micro. It
is always passed explicitly: a default of 16 decoded granite's lines to the wrong page::

    slots 16, page 7:  | s0 | s1 | ... | s15 |   lines 112 .. 127
    slots 32, page 7:  | s0 | s1 | ... | s31 |   lines 224 .. 255

Line 0 (page 0, slot 0) is valid. Absence is :data:`NO_LINE` (any negative line means the same):
:func:`decode_line` refuses it, so it never aliases page 0. :func:`decode_line_or_none` is the
organizations' form: None for the sentinel.
"""

from __future__ import annotations

from typing import NamedTuple

NO_LINE = -1  # absent conv state; never decoded


# ``_tuple_new(LineAddress, (page, slot))`` is ``LineAddress(page, slot)`` without the Python
# frame of the generated ``__new__`` (what ``NamedTuple._make`` does): for the decoders that run
# on every checkpoint release and reclaim.
_tuple_new = tuple.__new__


class LineAddress(NamedTuple):
    page: int
    slot: int


def _check_slots(slots_per_slab: int) -> None:
    if isinstance(slots_per_slab, bool) or not isinstance(slots_per_slab, int) \
            or slots_per_slab < 1:
        raise ValueError(f"slots_per_slab must be a positive integer, got {slots_per_slab!r}")


def encode_line(page: int, slot: int, slots_per_slab: int) -> int:
    """Line id ``slots_per_slab * page + slot``."""
    _check_slots(slots_per_slab)
    if page < 0:
        raise ValueError(f"page id must be >= 0 to encode a line, got {page}")
    if not 0 <= slot < slots_per_slab:
        raise ValueError(f"slot must satisfy 0 <= slot < {slots_per_slab}, got {slot}")
    return slots_per_slab * page + slot


def decode_line(line: int, slots_per_slab: int) -> LineAddress:
    """``(page, slot)`` of a line id; the sentinel (any negative line) is refused."""
    _check_slots(slots_per_slab)
    if line < 0:
        raise ValueError(f"line {line} is the no-state sentinel and has no page/slot")
    page, slot = divmod(line, slots_per_slab)
    return LineAddress(page, slot)


def decode_line_or_none(line: int, slots_per_slab: int) -> LineAddress | None:
    """``(page, slot)`` of a line, or None for the sentinel (or any negative line)."""
    if line < 0:
        return None
    if slots_per_slab.__class__ is not int or slots_per_slab < 1:  # fast path: a plain int
        _check_slots(slots_per_slab)  # raises what decode_line raises (bool, str, 0, ...)
    return _tuple_new(LineAddress, divmod(line, slots_per_slab))  # LineAddress(page, slot)
