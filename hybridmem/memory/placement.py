"""Where a checkpoint's conv state lives (§3.3-3.4, App. A.3): three small strategies, and S2's
slab table with its line ids.

=========================  ======================  ==================================  ======
strategy                   layouts                 conv state                          units
=========================  ======================  ==================================  ======
:class:`InsideMember`      S0, D0                  inside member 0                     m
:class:`OwnPage`           S1                      one dedicated page                  m + 1
:class:`SlabSlot`          S2                      one slot of a shared slab page      m + new slabs
=========================  ======================  ==================================  ======

A strategy answers the questions the organization asks of a conv state: how many units ``k`` new
checkpoints take, which pages carry a checkpoint's conv references, in which order a batch of
released pages reaches the LRU, where a new checkpoint's conv state goes, and what is left to
clear when a checkpoint is forgotten or loses a page.

S2 slabs. A slot is named by its line id ``l = slots_per_slab p + s`` where ``p`` is the REAL
page id of the slab in the shared pool (not the slab's position in any list) and
``0 <= s < slots_per_slab``; the arithmetic is :mod:`hybridmem.addressing`'s, the one definition
the kernels and the vLLM plugin also use::

    page 7 as a slab:  | s=0 | s=1 | ... | s=15 |     lines 112 .. 127
    addr_conv(l, o) = base_conv + l * 32 KiB + o      (in the units of the access path)

Line 0 (page 0, slot 0) is a valid location. Absence is :data:`NO_LINE`, a negative sentinel that
:func:`decode_line` refuses: it is never decoded, stored through, or aliased to page 0.

A slab holds the checkpoints of up to ``slots_per_slab`` slots. The page's execution references
are the sum of its slots' references, so a slab with an active slot is in use and never
reclaimed; a slab whose slots are all inactive but some discoverable is cached; an empty slab is
returned to the free pages.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, NamedTuple

from hybridmem import addressing
from hybridmem.addressing import NO_LINE
from hybridmem.geometry import ceil_div

if TYPE_CHECKING:
    from hybridmem.memory.checkpoints import Checkpoint
    from hybridmem.memory.pool import PagePool

__all__ = ["NO_LINE", "ConvPlacement", "InsideMember", "OwnPage", "Placement", "SlabSlot",
           "SlabTable", "SlotRef", "decode_line", "encode_line"]

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
        spp = self.slots_per_slab
        return [(encode_line(page, s, spp), c) for s, c in enumerate(slab) if c is not None]

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
        return encode_line(page, slot, self.slots_per_slab)

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


class ConvPlacement(Enum):
    INSIDE = "inside"  # conv state lives in member 0 (S0 page, D0 composite)
    PAGE = "page"  # one dedicated page (S1)
    SLOT = "slot"  # one slot of a shared slab, addressed by its line id (S2)


Owners = list[object | None]  # page -> the entry stored on it ("slab" for a slab page)


class Placement:
    """Conv state inside member 0: no unit and no page of its own (S0, D0)."""

    kind = ConvPlacement.INSIDE
    slabs: SlabTable | None = None

    def units(self, count: int, members: int, pool: PagePool) -> int:
        """Recurrent units ``count`` new checkpoints of ``members`` member pages take."""
        return count * members

    def units_each(self, members: int) -> int:
        """Units one checkpoint holds, slabs not counted (the integrity equation's term)."""
        return members

    def conv_pages(self, ck: Checkpoint) -> list[int]:
        """The pages carrying ``ck``'s conv references when they are not its members."""
        return []

    def release_order(self, members: list[int], conv: list[int]) -> list[int]:
        """The order a batch of released checkpoints' pages reaches the LRU of cached pages."""
        return members

    def place(self, ck: Checkpoint, pool: PagePool, owners: Owners) -> None:
        """Put the new ``ck``'s conv state (its members are taken) and set its home."""
        ck.conv = ck.members[0]

    def release_slot(self, ck: Checkpoint, owners: Owners) -> None:
        """The forgotten ``ck`` gives up a conv slot it occupies (S2 only)."""

    def forget(self, ck: Checkpoint, owners: Owners) -> None:
        """Clear the owner record of the conv page of the forgotten ``ck`` (S1 only)."""

    def detach(self, ck: Checkpoint, page: int) -> None:
        """``page``, reclaimed, was ``ck``'s: cut its conv state off if it lived there."""


InsideMember = Placement


class OwnPage(Placement):
    """Conv state on one dedicated page (S1): a checkpoint is ``m + 1`` pages."""

    kind = ConvPlacement.PAGE

    def units(self, count: int, members: int, pool: PagePool) -> int:
        return count * (members + 1)

    def units_each(self, members: int) -> int:
        return members + 1

    def conv_pages(self, ck: Checkpoint) -> list[int]:
        return [ck.conv] if ck.conv >= 0 else []

    def release_order(self, members: list[int], conv: list[int]) -> list[int]:
        # a member page is reclaimed before its dedicated conv page
        return members + conv

    def place(self, ck: Checkpoint, pool: PagePool, owners: Owners) -> None:
        ck.conv = pool.take()
        owners[ck.conv] = ck

    def forget(self, ck: Checkpoint, owners: Owners) -> None:
        if ck.conv >= 0:
            owners[ck.conv] = None

    def detach(self, ck: Checkpoint, page: int) -> None:
        if ck.conv == page:  # (a page id here; S2's conv is a line id, never compared)
            ck.conv = NO_LINE


class SlabSlot(Placement):
    """Conv state in one slot of a slab page shared by up to ``slots_per_slab`` checkpoints (S2)."""

    kind = ConvPlacement.SLOT

    def __init__(self, num_pages: int, slots_per_slab: int) -> None:
        self.slabs: SlabTable = SlabTable(num_pages, slots_per_slab)

    def units(self, count: int, members: int, pool: PagePool) -> int:
        """``m k`` member pages plus the slabs the slots need beyond the free slots of slabs in
        use (a cached slab may be reclaimed during the same allocation, so its room is not
        counted: the estimate is exact or one slab high)."""
        room = self.slabs.free_slots(pool.refs)  # slabs with an active slot only
        return count * members + ceil_div(max(0, count - room), self.slabs.slots_per_slab)

    def conv_pages(self, ck: Checkpoint) -> list[int]:
        return [ck.conv_page] if ck.conv >= 0 else []  # the line's page, decoded at placement

    def release_order(self, members: list[int], conv: list[int]) -> list[int]:
        # a slab ages with the checkpoints released with it, so reclaiming it takes them all
        return conv + members

    def place(self, ck: Checkpoint, pool: PagePool, owners: Owners) -> None:
        slabs = self.slabs
        slab = slabs.slab_with_room()
        if slab is None:
            slab = pool.take()  # the new slab's first reference is this slot's
            owners[slab] = "slab"
            slabs.add_slab(slab)
        else:
            pool.incref(slab)
        ck.conv = ck.home_line = slabs.place(slab, ck.ident)
        ref = decode_line(ck.conv, slabs.slots_per_slab)
        assert ref is not None, f"slab {slab} placed checkpoint {ck.ident} at no line"
        ck.conv_page = ref.page

    def detach(self, ck: Checkpoint, page: int) -> None:
        return  # conv is a line id here, never compared with a page id

    def release_slot(self, ck: Checkpoint, owners: Owners) -> None:
        ref = self.slabs.clear(ck.conv)  # the sentinel (slab already gone) clears nothing
        if ref is not None and self.slabs.used(ref.page) == 0:
            self.slabs.remove_slab(ref.page)
            owners[ref.page] = None
