"""S2 conv slabs: shared pages cut into conv slots (16 of 32 KiB for Falcon-H1-7B), by line id.

A slot is named by its line id ``l = 16 p + s`` where ``p`` is the REAL page id of the slab in the
shared pool (not the slab's position in any list) and ``0 <= s < 16``::

    page 7 as a slab:  | s=0 | s=1 | ... | s=15 |     lines 112 .. 127
    addr_conv(l, o) = base_conv + l * 32 KiB + o      (in the units of the access path)

Line 0 (page 0, slot 0) is a valid location. Absence is :data:`NO_LINE`, a negative sentinel that
:func:`decode_line` refuses: it is never decoded, stored through, or aliased to page 0.

A slab holds the checkpoints of up to 16 slots. The page's execution references are the sum of its
slots' references, so a slab with an active slot is in use and never reclaimed; a slab whose slots
are all inactive but some discoverable is cached; an empty slab is returned to the free pages.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from hybridmem import addressing
from hybridmem.addressing import NO_LINE

__all__ = ["NO_LINE", "SlabTable", "SlotRef", "decode_line", "encode_line"]

_tuple_new = tuple.__new__  # _tuple_new(SlotRef, (page, slot)): SlotRef without a Python frame


class SlotRef(NamedTuple):  # the same fields as hybridmem.addressing.LineAddress
    page: int
    slot: int


def encode_line(page: int, slot: int, slots_per_slab: int) -> int:
    """Line id of ``slot`` in slab ``page`` (:func:`hybridmem.addressing.encode_line`)."""
    return addressing.encode_line(page, slot, slots_per_slab)


def decode_line(line: int, slots_per_slab: int) -> SlotRef | None:
    """``(page, slot)`` of a line, or None for the sentinel (or any negative line). The slab
    geometry is required: there is no default of 16 slots."""
    ref = addressing.decode_line_or_none(line, slots_per_slab)
    return None if ref is None else _tuple_new(SlotRef, ref)  # SlotRef(ref.page, ref.slot)


class SlabTable:
    """Which pages are slabs and which checkpoint occupies each slot.

    Indexed by real page id (a list as long as the pool), so line ``16 p + s`` finds its slab
    without any search. Pool reference and hold counts are the organization's job.
    """

    def __init__(self, num_pages: int, slots_per_slab: int) -> None:
        self.slots_per_slab = slots_per_slab
        # page id -> per-slot checkpoint ident (None when the slot is empty); None: not a slab
        self._slabs: list[list[int | None] | None] = [None] * num_pages
        self._used = [0] * num_pages  # occupied slots per slab page
        self.num_slabs = 0
        self._with_room: dict[int, None] = {}  # slab pages with a free slot, insertion order

    def is_slab(self, page: int) -> bool:
        return self._slabs[page] is not None

    def slab_pages(self) -> list[int]:
        return [p for p, s in enumerate(self._slabs) if s is not None]

    def free_slots(self, include: Callable[[int], object] | None = None) -> int:
        """Empty slots in existing slabs (only slabs whose page passes ``include``)."""
        spp, used, room = self.slots_per_slab, self._used, 0
        for p in self._with_room:
            if include is None or include(p):
                room += spp - used[p]
        return room

    def occupant(self, line: int) -> int | None:
        ref = decode_line(line, self.slots_per_slab)
        if ref is None or ref.page >= len(self._slabs):
            return None
        slab = self._slabs[ref.page]
        return None if slab is None else slab[ref.slot]

    def occupants(self, page: int) -> list[tuple[int, int]]:
        """``(line, checkpoint ident)`` of every occupied slot of slab ``page``."""
        slab = self._slabs[page]
        assert slab is not None, f"page {page} is not a slab"
        return [(self.slots_per_slab * page + s, c) for s, c in enumerate(slab) if c is not None]

    def add_slab(self, page: int) -> None:
        assert self._slabs[page] is None, f"page {page} is already a slab; this indicates a " \
            "page taken twice from the pool"
        self._slabs[page] = [None] * self.slots_per_slab
        self._used[page] = 0
        self._with_room[page] = None
        self.num_slabs += 1

    def slab_with_room(self) -> int | None:
        return next(iter(self._with_room), None)

    def place(self, page: int, ckpt: int) -> int:
        """Put checkpoint ``ckpt`` into the first empty slot of slab ``page``; return its line."""
        slab = self._slabs[page]
        assert slab is not None and self._used[page] < self.slots_per_slab, \
            f"page {page} is not a slab with room"
        slot = slab.index(None)
        slab[slot] = ckpt
        self._used[page] += 1
        if self._used[page] == self.slots_per_slab:
            del self._with_room[page]
        return self.slots_per_slab * page + slot

    def clear(self, line: int) -> SlotRef | None:
        """Empty the slot of ``line``; return it, or None for the sentinel. The caller drops the
        slab with :meth:`remove_slab` once it is empty."""
        ref = decode_line(line, self.slots_per_slab)
        if ref is None:
            return None
        slab = self._slabs[ref.page]
        assert slab is not None and slab[ref.slot] is not None, \
            f"line {line} (page {ref.page} slot {ref.slot}) is not an occupied slot; this " \
            "indicates a stale or sentinel line being decoded"
        slab[ref.slot] = None
        self._used[ref.page] -= 1
        self._with_room[ref.page] = None
        return ref

    def used(self, page: int) -> int:
        return self._used[page]

    def remove_slab(self, page: int) -> list[tuple[int, int]]:
        """Stop using ``page`` as a slab; return the ``(line, ident)`` it still held."""
        held = self.occupants(page)
        self._slabs[page] = None
        self._used[page] = 0
        self._with_room.pop(page, None)
        self.num_slabs -= 1
        return held

    def check_integrity(self) -> None:
        for p, slab in enumerate(self._slabs):
            if slab is None:
                continue
            used = sum(c is not None for c in slab)
            if used != self._used[p] or (used < self.slots_per_slab) != (p in self._with_room):
                raise AssertionError(f"slab {p}: {used} occupied slots, counter {self._used[p]}, "
                                     f"in room list {p in self._with_room}")
        n = sum(s is not None for s in self._slabs)
        if n != self.num_slabs:
            raise AssertionError(f"slab count {self.num_slabs} != {n} slab pages")
