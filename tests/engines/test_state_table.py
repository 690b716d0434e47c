"""The state table alone: the worker-side contract's refusals, drops and exports.

Each assertion is the negative control of a mutant in ``invariants/serving_mutants.py``
(``state-table`` cluster)."""

from __future__ import annotations

import pytest

from hybridmem.vllm_plugin.state_table import (
    Export,
    StateAddress,
    StateLayout,
    StateTable,
    UnregisteredBlock,
)

LAYOUT = StateLayout("S1", "page", 8, 4096, 2, 0, 0, 32)


def table() -> StateTable:
    return StateTable(LAYOUT)


def test_set_resolve_and_drop() -> None:
    t = table()
    a = StateAddress((3, 4), 5)
    t.set(1, a)
    assert t.resolve(1) == a and t.peek(1) == a and len(t) == 1
    t.drop(1)
    assert t.peek(1) is None and len(t) == 0  # [state-table-keeps-dropped-mapping]
    with pytest.raises(UnregisteredBlock, match="block id 1"):
        t.resolve(1)
    t.drop(7)  # an id never set: nothing to drop, no error


@pytest.mark.parametrize("block_id", [0, -1])
def test_the_null_block_and_negative_ids_are_refused(block_id: int) -> None:
    t = table()
    with pytest.raises(ValueError, match="null block"):
        t.set(block_id, StateAddress((1, 2), 3))  # [null-block-accepted]
    with pytest.raises(ValueError, match="null block"):
        t.set_export(block_id, Export("a", 0, 64, ((32, 2),)))
    assert len(t) == 0 and not t.exports


def test_an_address_with_the_wrong_member_count_is_refused() -> None:
    with pytest.raises(ValueError, match="1 members, the layout 2"):
        table().set(1, StateAddress((1,), 3))


def test_one_destination_per_step_and_request() -> None:
    t = table()
    e = Export("a", 0, 64, ((32, 2),))
    t.set_export(4, e)
    t.set_export(4, e._replace(end=70))  # the same request may re-register its row
    assert t.exports[4].end == 70
    with pytest.raises(AssertionError, match="block table bug"):
        t.set_export(4, Export("b", 0, 64, ((32, 3),)))  # [export-collision-allowed]
    assert t.exports[4].request_id == "a"


def test_drop_exports_drops_only_that_requests() -> None:
    t = table()
    t.set_export(4, Export("a", 0, 64, ((32, 2),)))
    t.set_export(5, Export("b", 0, 64, ((32, 3),)))
    t.set_export(6, Export("a", 64, 128, ((96, 7),)))
    t.drop_exports("a")
    assert set(t.exports) == {5}  # [drop-exports-drops-the-others]
