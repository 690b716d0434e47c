"""The organization state reader: a block id resolves through the StateTable to the checkpoint's
member pages and conv page / line, and reads back exactly the bytes placed there by the
documented layout (written here by hand, not through the reader); ``corrupt`` changes exactly
that checkpoint. No engine: two fake Mamba layers with private LayerStore arenas."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from continuation_checks.state_readers import OrgStore
from hybridmem.vllm_plugin.state_table import StateAddress, StateLayout, StateTable

CONV_SHAPE, SSM_SHAPE = (3, 64), (4, 16, 32)  # 768 B and 8,192 B in float32
C, S = 768, 8192
LAYOUTS = {  # org -> (layout, an address, another address)
    "S0": (StateLayout("S0", "inside", 6, 9216, 1, 0, 0, 64),
           StateAddress((4,), 4), StateAddress((1,), 1)),
    "D0": (StateLayout("D0", "inside", 6, 8960, 1, 0, 0, 256),
           StateAddress((2,), 2), StateAddress((5,), 5)),
    "S1": (StateLayout("S1", "page", 8, 4096, 2, 0, 0, 64),
           StateAddress((5, 2), 7), StateAddress((0, 3), 1)),
    "S2": (StateLayout("S2", "slot", 8, 4096, 2, 1024, 4, 64),
           StateAddress((6, 1), 4 * 3 + 2), StateAddress((0, 4), 4 * 3 + 1)),
}


class FakeMamba:
    """What the reader and ``org_state.store_for`` use of a vLLM Mamba layer."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.kv_cache = (torch.zeros(1, 1), torch.zeros(1, 1))  # device only

    def get_state_shape(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return CONV_SHAPE, SSM_SHAPE

    def get_state_dtype(self) -> tuple[torch.dtype, torch.dtype]:
        return torch.float32, torch.float32


def place(store: Any, a: StateAddress, conv: torch.Tensor, ssm: torch.Tensor) -> None:
    """Write one checkpoint into the raw pages, following the layout docstring of layer_store."""
    pages, lay = store.pages, store.layout
    cb, sb = conv.reshape(-1).view(torch.uint8), ssm.reshape(-1).view(torch.uint8)
    if lay.conv == "inside":
        pages[a.members[0], :S] = sb
        pages[a.members[0], S:S + C] = cb
        return
    P = lay.page_bytes
    for j, m in enumerate(a.members):
        part = sb[j * P:(j + 1) * P]
        pages[m, :len(part)] = part
    if lay.conv == "page":
        pages[a.conv, :C] = cb
    else:
        p, k = divmod(a.conv, lay.slots_per_slab)
        pages[p, k * lay.slot_bytes:k * lay.slot_bytes + C] = cb


@pytest.fixture(params=sorted(LAYOUTS))
def setup(request: pytest.FixtureRequest) -> Any:
    from hybridmem.vllm_plugin.org_state import store_for

    layout, addr, other = LAYOUTS[request.param]
    table = StateTable(layout)
    table.set(5, addr)
    table.set(9, other)
    layers = [("model.layers.0.mamba", FakeMamba("l0")), ("model.layers.1.mamba", FakeMamba("l1"))]
    g = torch.Generator().manual_seed(0)
    written = {}
    for i, (_, m) in enumerate(layers):
        store = store_for(m, table)
        for block, a in ((5, addr), (9, other)):
            conv, ssm = torch.randn(CONV_SHAPE, generator=g), torch.randn(SSM_SHAPE, generator=g)
            place(store, a, conv, ssm)
            written[(i, block)] = (conv, ssm)
    return OrgStore(layers, table), written


def expected(written: dict[Any, Any], block: int) -> tuple[torch.Tensor, torch.Tensor]:
    conv = torch.cat([written[(i, block)][0].reshape(-1) for i in range(2)])
    ssm = torch.cat([written[(i, block)][1].reshape(-1) for i in range(2)])
    return conv, ssm


def test_read_returns_the_bytes_at_the_address(setup: Any):
    reader, written = setup
    for block in (5, 9):
        conv, ssm = expected(written, block)
        for got in (reader.read(block), reader.read_stored(block)):  # gather path and raw decode
            assert torch.equal(got.conv, conv) and torch.equal(got.ssm, ssm)
    assert reader.dtypes() == {"conv": "float32", "ssm": "float32"}


def test_corrupt_changes_that_checkpoint_only(setup: Any):
    reader, written = setup
    reader.corrupt(5)
    conv, ssm = expected(written, 5)
    got = reader.read_stored(5)
    assert torch.equal(got.ssm, ssm * 4.0 + 1.0) and torch.equal(got.conv, -conv)
    conv9, ssm9 = expected(written, 9)
    other = reader.read(9)  # the neighbour's member pages and conv page / line are untouched
    assert torch.equal(other.conv, conv9) and torch.equal(other.ssm, ssm9)


def test_null_and_unregistered_block_ids_are_refused(setup: Any):
    reader, _ = setup
    with pytest.raises(ValueError, match="null block"):
        reader.read(0)
    with pytest.raises(AssertionError, match="block id 7 has no recurrent address"):
        reader.read(7)


def test_no_active_table_is_an_error():
    from hybridmem.errors import HybridMemError

    with pytest.raises(HybridMemError, match="no StateTable"):
        OrgStore([], None)


@pytest.mark.parametrize("org", sorted(LAYOUTS))
def test_swap_members_shows_as_read_path_differing_from_the_stored_bytes(org: str):
    """The fault ``swap-members`` (reads take member pages 0 and 1 swapped): ``read`` (the
    worker's gather) then differs from ``read_stored`` on S1/S2 checkpoints; S0/D0 have one
    member, so nothing to swap."""
    from hybridmem.vllm_plugin import faults
    from hybridmem.vllm_plugin.org_state import store_for

    layout, addr, _ = LAYOUTS[org]
    table = StateTable(layout)
    table.set(5, addr)
    layers = [("m", FakeMamba("swap"))]
    faults.activate("swap-members")
    try:
        store = store_for(layers[0][1], table)
    finally:
        faults.activate(None)
    g = torch.Generator().manual_seed(1)
    conv, ssm = torch.randn(CONV_SHAPE, generator=g), torch.randn(SSM_SHAPE, generator=g)
    place(store, addr, conv, ssm)
    reader = OrgStore(layers, table)
    stored, read = reader.read_stored(5), reader.read(5)
    assert torch.equal(stored.ssm, ssm.reshape(-1)) and torch.equal(stored.conv, conv.reshape(-1))
    assert torch.equal(read.conv, stored.conv)
    assert torch.equal(read.ssm, stored.ssm) is (layout.members < 2)
