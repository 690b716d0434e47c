"""Conv slabs: line ids 16p + s with the real page id, the sentinel, slot occupancy."""

import pytest

from hybridmem.memory.placement import NO_LINE, SlabTable, SlotRef, decode_line, encode_line


def test_line_ids_use_the_real_page_id():
    # page 7 as a slab: lines 112 .. 127; line 0 (page 0 slot 0) is a valid location
    assert encode_line(7, 0, 16) == 112 and encode_line(7, 15, 16) == 127
    assert decode_line(127, 16) == SlotRef(7, 15)
    assert decode_line(0, 16) == SlotRef(0, 0)


def test_sentinel_is_never_decoded():
    assert NO_LINE < 0
    assert decode_line(NO_LINE, 16) is None
    with pytest.raises(ValueError, match="page id must be >= 0"):
        encode_line(-1, 0, 16)
    with pytest.raises(ValueError, match="0 <= slot < 16"):
        encode_line(0, 16, 16)


def test_slab_table_places_and_clears():
    table = SlabTable(num_pages=10, slots_per_slab=16)
    table.add_slab(7)
    lines = [table.place(7, ident) for ident in range(16)]
    assert lines == list(range(112, 128)) and table.slab_with_room() is None
    assert table.occupant(113) == 1
    assert table.clear(113) == SlotRef(7, 1) and table.free_slots() == 1
    assert table.clear(NO_LINE) is None  # clearing absence is a no-op
    assert table.place(7, 99) == 113  # the freed slot is reused
    held = table.remove_slab(7)
    assert len(held) == 16 and table.num_slabs == 0 and not table.is_slab(7)
    table.check_integrity()


def test_clearing_an_empty_slot_is_a_bug():
    table = SlabTable(num_pages=2, slots_per_slab=16)
    table.add_slab(1)
    with pytest.raises(AssertionError, match="not an occupied slot"):
        table.clear(16)
