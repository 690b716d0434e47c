"""Write-back residency (``resident.py``) against a write-through reference (no vLLM).

A random schedule drives one S2 store through the residency the way the worker does: each step
a batch of block ids (decodes that stay, rows that leave and come back), a "forward" that
updates every row's state in its scratch slot, align-mode copies into fresh checkpoints
(``flush(src)``, ``forget(dst)``, then the page copy) and blocks released and re-registered at
other addresses. The reference applies the same updates to a dict of states. After
``flush_all`` every live checkpoint's pages must equal the reference, and rows must have been
copied far less often than the write-through path would. Negative controls: a residency that
drops departed rows instead of writing them back, and a copy that skips ``flush(src)``, both
leave pages that differ from the reference.
"""

from __future__ import annotations

import random

import pytest
import torch

from hybridmem.vllm_plugin.layer_store import LayerStore
from hybridmem.vllm_plugin.resident import Residency
from hybridmem.vllm_plugin.state_table import StateAddress, StateTable
from tests.engines.test_org_state_storage import NUM_PAGES, _addresses, _case

STEPS = 60


def _update(ssm: torch.Tensor, conv: torch.Tensor, step: int) -> None:
    """The "forward": new state = old x 3 + step + 1 (word-wise), in place."""
    for t in (ssm, conv):
        w = t.view(torch.int32)
        w.mul_(3).add_(step + 1)


def _rows(store: LayerStore, a: StateAddress) -> tuple[torch.Tensor, torch.Tensor]:
    ssm, conv = store.new_rows(1)
    store.read_rows(store.tables([a]), ssm, conv)
    return ssm[0].clone(), conv[0].clone()


def _drive(res: Residency, *, skip_src_flush: bool = False) -> tuple[int, int, list[str]]:
    """Run the schedule; returns (rows copied by the residency, rows the write-through path
    would copy, mismatching checkpoints)."""
    rng = random.Random(7)
    layout, sizes = _case("S2", 3, 4)
    gen = torch.Generator().manual_seed(3)
    store = LayerStore(layout, sizes, pages=torch.randint(
        0, 256, (NUM_PAGES, layout.page_bytes), dtype=torch.uint8, generator=gen))
    table = StateTable(layout)
    pool = _addresses(layout, 8, rng)  # 8 disjoint checkpoints; 4 registered at a time
    live = {b: pool[b - 1] for b in range(1, 5)}
    spare = pool[4:]
    for b, a in live.items():
        table.set(b, a)
    truth = {a: _rows(store, a) for a in pool}
    res.bind(table)
    naive = 0
    for step in range(STEPS):
        if step % 7 == 6:  # a block leaves at a boundary: its state moves to a fresh checkpoint
            b = rng.choice(sorted(live))
            src, dst = live[b], spare.pop(0)
            if not skip_src_flush:
                res.flush((src,))
            res.forget((dst,))
            store.copy(src, dst)
            truth[dst] = tuple(t.clone() for t in truth[src])  # type: ignore[assignment]
            table.drop(b)
            table.set(b, dst)
            live[b] = dst
            spare.append(src)
        batch = [b for b in sorted(live) if rng.random() < 0.75]
        rng.shuffle(batch)
        keys = [(b, live[b]) for b in batch]
        plan = res.begin_step(keys)
        lay = res.scratch("layer", store)
        if plan.misses:
            res.read(lay, [plan.slots[i] for i in plan.misses],
                     store.tables([keys[i][1] for i in plan.misses]))
        for (_, a), slot in zip(keys, plan.slots, strict=True):
            _update(lay.ssm[slot], lay.conv[slot], step)
            _update(*truth[a], step)
        naive += 2 * len(keys)  # read and written back every step
    res.flush_all()
    bad = []
    s = sizes.ssm_bytes
    for b, a in live.items():
        ssm, conv = _rows(store, a)
        want_ssm, want_conv = truth[a]
        if not (torch.equal(ssm[:s], want_ssm[:s]) and torch.equal(conv, want_conv)):
            bad.append(f"block {b} at {a}")
    return res.reads + res.writes, naive, bad


def test_residency_equals_write_through_with_fewer_copies() -> None:
    copied, naive, bad = _drive(Residency())
    assert bad == []
    print(f"rows copied: {copied} resident, {naive} write-through")
    assert copied < naive / 2


class _Dropping(Residency):
    """Fault: departed rows are dropped, never written back."""

    def _write_back(self, keys: list) -> None:  # type: ignore[type-arg]
        for k in keys:
            del self.slots[k]


@pytest.mark.parametrize("fault", ["drop-departed", "copy-without-flush"])
def test_residency_faults_leave_wrong_pages(fault: str) -> None:
    if fault == "drop-departed":
        _, _, bad = _drive(_Dropping())
    else:
        _, _, bad = _drive(Residency(), skip_src_flush=True)
    print(f"CONTROL {fault}: {len(bad)} checkpoints differ")
    assert bad, f"{fault}: pages still equal the reference"


def test_unmapped_rows_are_dropped_not_written() -> None:
    """A key whose block id the table no longer maps is released without touching its pages
    (they may already belong to attention or to another checkpoint)."""
    layout, sizes = _case("S2", 3, 4)
    store = LayerStore(layout, sizes)
    table = StateTable(layout)
    a = _addresses(layout, 1, random.Random(1))[0]
    table.set(5, a)
    res = Residency()
    res.bind(table)
    plan = res.begin_step([(5, a)])
    lay = res.scratch("layer", store)
    lay.ssm[plan.slots[0]].fill_(9)
    table.drop(5)
    res.begin_step([])
    assert not store.pages.any() and res.writes == 0 and not res.slots
    table.set(5, a)  # control: the same row, still mapped, is written back
    plan = res.begin_step([(5, a)])
    res.read(lay, plan.slots, store.tables([a]))
    lay.ssm[plan.slots[0]].fill_(9)
    res.begin_step([])
    assert store.pages.any() and res.writes == 1


def test_capacity_growth_writes_back_then_reads_every_row() -> None:
    """A batch larger than the scratch: every earlier row is written back, the scratch grows
    and every row of the step is read again (the demo's cap-8 batch after 7-row steps)."""
    layout, sizes = _case("S2", 3, 4)
    gen = torch.Generator().manual_seed(5)
    store = LayerStore(layout, sizes, pages=torch.randint(
        0, 256, (NUM_PAGES, layout.page_bytes), dtype=torch.uint8, generator=gen))
    table = StateTable(layout)
    addresses = _addresses(layout, 9, random.Random(2))
    for b, a in enumerate(addresses, start=1):
        table.set(b, a)
    truth = {a: _rows(store, a) for a in addresses}
    res = Residency()
    res.bind(table)
    for step, n in enumerate((3, 9, 9)):  # 3 rows (capacity 8), then 9: growth
        keys = [(b, addresses[b - 1]) for b in range(1, n + 1)]
        plan = res.begin_step(keys)
        lay = res.scratch("layer", store)
        assert lay.ssm.shape[0] == res.capacity > n
        if plan.misses:
            res.read(lay, [plan.slots[i] for i in plan.misses],
                     store.tables([keys[i][1] for i in plan.misses]))
        if step == 1:
            assert len(plan.misses) == n  # all read again after the growth
        for (_, a), slot in zip(keys, plan.slots, strict=True):
            _update(lay.ssm[slot], lay.conv[slot], step)
            _update(*truth[a], step)
    res.flush_all()
    s = sizes.ssm_bytes
    for a in addresses:
        ssm, conv = _rows(store, a)
        assert torch.equal(ssm[:s], truth[a][0][:s]) and torch.equal(conv, truth[a][1])


def test_a_remapped_row_is_dropped_not_written_to_its_old_address() -> None:
    """The block id now maps another address (its checkpoint was released and the id reused):
    the departed row is released without writing the old address's pages."""
    layout, sizes = _case("S2", 3, 4)
    store = LayerStore(layout, sizes)
    table = StateTable(layout)
    a, b = _addresses(layout, 2, random.Random(2))
    table.set(5, a)
    res = Residency()
    res.bind(table)
    plan = res.begin_step([(5, a)])
    lay = res.scratch("layer", store)
    lay.ssm[plan.slots[0]].fill_(9)
    table.set(5, b)  # remapped
    res.begin_step([])
    assert not store.pages.any() and res.writes == 0 and not res.slots


def test_slot_zero_is_never_handed_out() -> None:
    """Slot 0 is vLLM's padding row: no key ever gets it, however many keys a step has."""
    layout, _ = _case("S2", 3, 4)
    table = StateTable(layout)
    res = Residency()
    res.bind(table)
    addrs = _addresses(layout, 7, random.Random(3))
    for n in (1, 3, 7):
        keys = [(i + 1, a) for i, a in enumerate(addrs[:n])]
        plan = res.begin_step(keys)
        assert 0 not in plan.slots and len(set(plan.slots)) == n
        assert all(0 < s < res.capacity for s in plan.slots)
