"""LayerStore: checkpoints scattered into S0/S1/S2/D0 arenas and gathered back (no vLLM).

vLLM ``selective_state_update`` test style: the arena starts full of random bytes, a few
checkpoints are written at scattered addresses, and every byte outside them must stay
bit-identical. Where each byte lands is checked against the address formula written out here,
not through the code under test.
"""

from __future__ import annotations

import random

import pytest
import torch

from hybridmem.vllm_plugin.layer_store import LayerStore, StateSizes, check_layout, word_bytes
from hybridmem.vllm_plugin.state_table import NO_ADDRESS_LINE, StateAddress, StateLayout

NUM_PAGES = 40


def _layout(org: str, members: int, spp: int, page: int) -> StateLayout:
    conv = {"S0": "inside", "D0": "inside", "S1": "page", "S2": "slot"}[org]
    slot = page // spp if org == "S2" else 0
    return StateLayout(org, conv, NUM_PAGES, page, members, slot, spp if org == "S2" else 0, 64)


def _case(org: str, members: int, spp: int) -> tuple[StateLayout, StateSizes]:
    page = 64 * spp  # S2 slots of 64 B; other orgs ignore spp
    if org in ("S0", "D0"):
        return _layout(org, 1, spp, page), StateSizes(page - 40, 36)
    ssm = (members - 1) * page + page // 2 + 4 if members > 1 else page // 2  # last one partial
    return _layout(org, members, spp, page), StateSizes(ssm, 36 if org == "S2" else 60)


def _addresses(layout: StateLayout, n: int, rng: random.Random) -> list[StateAddress]:
    """n checkpoints on distinct pages (and lines), members in scrambled order."""
    m = layout.members
    pages = rng.sample(range(NUM_PAGES), n * m + (n if layout.conv == "page" else 0))
    slabs = pages[n * m:] if layout.conv == "page" else []
    out = []
    for i in range(n):
        mem = tuple(pages[i * m:(i + 1) * m])
        if layout.conv == "inside":
            conv = mem[0]
        elif layout.conv == "page":
            conv = slabs[i]
        else:  # S2: lines in slab pages not used as members
            free = sorted(set(range(NUM_PAGES)) - set(pages[: n * m]))
            slab = free[i % len(free)]
            conv = layout.slots_per_slab * slab + (i * 7) % layout.slots_per_slab
        out.append(StateAddress(mem, conv))
    return out


def _expected_regions(layout: StateLayout, sizes: StateSizes, a: StateAddress):
    """(page, start byte, end byte, state part, start in part) of every piece of ``a``."""
    s, c, p = sizes.ssm_bytes, sizes.conv_bytes, layout.page_bytes
    if layout.conv == "inside":
        return [(a.members[0], 0, s, "ssm", 0), (a.members[0], s, s + c, "conv", 0)]
    out = [(pg, 0, min(p, s - j * p), "ssm", j * p) for j, pg in enumerate(a.members)]
    if layout.conv == "page":
        out.append((a.conv, 0, c, "conv", 0))
    else:
        pg, k = divmod(a.conv, layout.slots_per_slab)
        out.append((pg, k * layout.slot_bytes, k * layout.slot_bytes + c, "conv", 0))
    return out


CASES = [("S0", 1, 2), ("D0", 1, 2)] + [
    (org, m, spp) for org in ("S1", "S2") for m in (1, 2, 3, 4) for spp in (2, 16, 64)
]


@pytest.mark.parametrize(("org", "members", "spp"), CASES,
                         ids=[f"{o}-m{m}-spp{s}" for o, m, s in CASES])
def test_scatter_gather_round_trip_and_untouched_bytes(org: str, members: int, spp: int) -> None:
    layout, sizes = _case(org, members, spp)
    rng = random.Random(f"{org}{members}{spp}")
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    before = torch.randint(0, 256, (NUM_PAGES, layout.page_bytes), dtype=torch.uint8,
                           generator=gen)
    store = LayerStore(layout, sizes, pages=before.clone())
    n = 3 if layout.conv != "page" or members < 4 else 2
    addrs = _addresses(layout, n, rng)
    s, c = sizes
    ssm = torch.randint(0, 256, (n, s), dtype=torch.uint8, generator=gen)
    conv = torch.randint(0, 256, (n, c), dtype=torch.uint8, generator=gen)
    t = store.tables(addrs)
    store.scatter(t, store.words(ssm), store.words(conv))

    # Expected: each piece at its formula address; every other byte as before.
    want = before.clone()
    for i, a in enumerate(addrs):
        for page, lo, hi, part, off in _expected_regions(layout, sizes, a):
            src = ssm[i] if part == "ssm" else conv[i]
            want[page, lo:hi] = src[off:off + hi - lo]
    assert torch.equal(store.pages, want), "bytes outside the written checkpoints changed"

    ssm_back = torch.zeros_like(ssm)
    conv_back = torch.zeros_like(conv)
    store.gather(t, store.words(ssm_back), store.words(conv_back))
    assert torch.equal(ssm_back, ssm) and torch.equal(conv_back, conv)


def test_gather_into_strided_scratch_columns() -> None:
    """The forward's scratch holds conv then SSM in one row; gathers land in column slices."""
    layout, sizes = _case("S2", 3, 4)
    store = LayerStore(layout, sizes)
    s, c = sizes
    addrs = _addresses(layout, 2, random.Random(1))
    state = torch.arange(2 * (s + c), dtype=torch.int64).remainder(251).to(torch.uint8)
    state = state.view(2, s + c)
    w = store.words(state)
    cw = c // store.word
    store.scatter(store.tables(addrs), w[:, cw:], w[:, :cw])
    scratch = torch.zeros(3, s + c, dtype=torch.uint8)  # row 0 padding, as on CPU
    sw = store.words(scratch)
    store.gather(store.tables(addrs), sw[1:, cw:], sw[1:, :cw])
    assert torch.equal(scratch[1:], state) and not scratch[0].any()


def test_copy_moves_one_checkpoint_and_nothing_else() -> None:
    layout, sizes = _case("S1", 3, 2)
    store = LayerStore(layout, sizes, pages=torch.randint(0, 256, (NUM_PAGES, layout.page_bytes),
                                                          dtype=torch.uint8))
    src, dst = _addresses(layout, 2, random.Random(2))
    before = store.pages.clone()
    store.copy(src, dst)
    after = store.pages.clone()
    for snap in (before, after):  # compare dst separately; its member pages are wholly its own
        for page, lo, hi, part, _ in _expected_regions(layout, sizes, dst):
            snap[page, 0 if part == "ssm" else lo:layout.page_bytes if part == "ssm" else hi] = 0
    assert torch.equal(after, before)
    s, c = sizes
    a, b = torch.zeros(1, s + c, dtype=torch.uint8), torch.zeros(1, s + c, dtype=torch.uint8)
    cw = c // store.word
    store.gather(store.tables([src]), store.words(a)[:, cw:], store.words(a)[:, :cw])
    store.gather(store.tables([dst]), store.words(b)[:, cw:], store.words(b)[:, :cw])
    assert torch.equal(a, b)


@pytest.mark.parametrize("org", ["S1", "S2"])
def test_swap_members_fault_reads_the_wrong_order(org: str) -> None:
    """Negative control for the round trip: the fault's reads differ, its writes do not."""
    layout, sizes = _case(org, 3, 4)
    pages = torch.randint(0, 256, (NUM_PAGES, layout.page_bytes), dtype=torch.uint8)
    good = LayerStore(layout, sizes, pages=pages)
    bad = LayerStore(layout, sizes, pages=pages, swap_members=True)
    t = good.tables(_addresses(layout, 2, random.Random(3)))
    s, c = sizes
    rows = [torch.zeros(2, s, dtype=torch.uint8) for _ in range(2)]
    conv = torch.zeros(2, c, dtype=torch.uint8)
    good.gather(t, good.words(rows[0]), good.words(conv))
    bad.gather(t, bad.words(rows[1]), bad.words(conv))
    p = layout.page_bytes
    assert not torch.equal(rows[0], rows[1])
    assert torch.equal(rows[1][:, :p], rows[0][:, p:2 * p])  # member 1 read as member 0


def test_sentinel_and_out_of_range_ids_are_refused() -> None:
    layout, sizes = _case("S2", 3, 16)
    store = LayerStore(layout, sizes)
    with pytest.raises(ValueError, match="sentinel"):
        store.tables([StateAddress((1, 2, 3), NO_ADDRESS_LINE)])
    with pytest.raises(ValueError, match=r"outside \[0, 640\)"):
        store.tables([StateAddress((1, 2, 3), 16 * NUM_PAGES)])
    with pytest.raises(ValueError, match="member ids"):
        store.tables([StateAddress((1, 2, NUM_PAGES), 5)])
    s0, s0_sizes = _case("S0", 1, 2)
    with pytest.raises(ValueError, match="must equal members"):
        LayerStore(s0, s0_sizes).tables([StateAddress((4,), 5)])


def test_layouts_that_do_not_fit_are_refused_with_numbers() -> None:
    layout, sizes = _case("S1", 3, 2)
    with pytest.raises(ValueError, match=r"ceil\(\d+ / 128\) = 3 member pages, the layout says 2"):
        check_layout(layout._replace(members=2), sizes)
    s2, s2_sizes = _case("S2", 2, 4)
    with pytest.raises(ValueError, match="slot x slots per slab"):
        check_layout(s2._replace(slots_per_slab=3), s2_sizes)
    s0, s0_sizes = _case("S0", 1, 2)
    with pytest.raises(ValueError, match="must hold ssm"):
        check_layout(s0, StateSizes(s0.page_bytes, 8))
    assert word_bytes(12, 8, 64) == 4 and word_bytes(6, 8) == 2 and word_bytes(7, 64) == 1


@pytest.mark.parametrize(("org", "members", "spp"), CASES,
                         ids=[f"{o}-m{m}-spp{s}" for o, m, s in CASES])
def test_cpu_page_copies_equal_the_kernel_reference(org: str, members: int, spp: int) -> None:
    """layer_store's CPU copies against kernels/checkpoint_copy's reference, on every pool."""
    from hybridmem.kernels.checkpoint_copy.reference import gather_pages_ref, scatter_pages_ref
    from hybridmem.vllm_plugin.layer_store import gather_pages_cpu, scatter_pages_cpu

    layout, sizes = _case(org, members, spp)
    gen = torch.Generator().manual_seed(members * 100 + spp)
    base = torch.randint(0, 256, (NUM_PAGES, layout.page_bytes), dtype=torch.uint8,
                         generator=gen)
    stores = [LayerStore(layout, sizes, pages=base.clone()) for _ in range(2)]
    t = stores[0].tables(_addresses(layout, 2, random.Random(members + spp)))
    s, c = sizes
    for table, n, pools in ((t.members, s, [x.ssm_pool for x in stores]),
                            (t.conv[:, None], c, [x.conv_pool for x in stores])):
        rows = torch.randint(0, 256, (2, n), dtype=torch.uint8, generator=gen)
        words = stores[0].words(rows)
        scatter_pages_cpu(pools[0], table, words)
        scatter_pages_ref(pools[1], table, words)
        assert torch.equal(stores[0].pages, stores[1].pages)
        got, want = torch.zeros_like(words), torch.zeros_like(words)
        gather_pages_cpu(pools[0], table, got)
        gather_pages_ref(pools[1], table, want)
        assert torch.equal(got, want) and torch.equal(got, words)


@pytest.mark.parametrize(("org", "members", "spp"), CASES,
                         ids=[f"{o}-m{m}-spp{s}" for o, m, s in CASES])
def test_padded_rows_equal_gather_and_scatter(org: str, members: int, spp: int) -> None:
    """The serving path (read_rows / write_rows on member-padded scratch rows) stores and
    loads the same bytes as scatter / gather, and leaves every other byte as it was."""
    layout, sizes = _case(org, members, spp)
    gen = torch.Generator().manual_seed(7 * members + spp)
    base = torch.randint(0, 256, (NUM_PAGES, layout.page_bytes), dtype=torch.uint8,
                         generator=gen)
    ref, fast = (LayerStore(layout, sizes, pages=base.clone()) for _ in range(2))
    t = ref.tables(_addresses(layout, 3, random.Random(members * spp)))
    s, c = sizes
    state = torch.randint(0, 256, (3, s + c), dtype=torch.uint8, generator=gen)
    ref.scatter(t, ref.words(state[:, :s]), ref.words(state[:, s:]))
    ssm, conv = fast.new_rows(3)
    fast.read_rows(t, ssm, conv)  # the padding holds the member tails as they are
    ssm[:, :s], conv[:] = state[:, :s], state[:, s:]
    fast.write_rows(t, ssm, conv)
    assert torch.equal(fast.pages, ref.pages)
    back_ssm, back_conv = fast.new_rows(3)
    fast.read_rows(t, back_ssm, back_conv)
    assert torch.equal(back_ssm[:, :s], state[:, :s]) and torch.equal(back_conv, state[:, s:])


def test_copy_many_equals_one_copy_per_pair() -> None:
    layout, sizes = _case("S2", 3, 4)
    gen = torch.Generator().manual_seed(11)
    base = torch.randint(0, 256, (NUM_PAGES, layout.page_bytes), dtype=torch.uint8,
                         generator=gen)
    one, many = (LayerStore(layout, sizes, pages=base.clone()) for _ in range(2))
    a = _addresses(layout, 4, random.Random(5))
    pairs = [(a[0], a[2]), (a[1], a[3])]  # sources and destinations disjoint
    for src, dst in pairs:
        one.copy(src, dst)
    many.copy_many(many.tables([p[0] for p in pairs]), many.tables([p[1] for p in pairs]))
    assert torch.equal(one.pages, many.pages)
    assert not torch.equal(one.pages, base)  # negative control: the copies did move bytes


@pytest.mark.parametrize("org", ["S1", "S2"])
def test_swap_members_fault_reads_padded_rows_in_the_wrong_order(org: str) -> None:
    layout, sizes = _case(org, 3, 4)
    pages = torch.randint(0, 256, (NUM_PAGES, layout.page_bytes), dtype=torch.uint8)
    good = LayerStore(layout, sizes, pages=pages)
    bad = LayerStore(layout, sizes, pages=pages, swap_members=True)
    t = good.tables(_addresses(layout, 2, random.Random(3)))
    (g_ssm, g_conv), (b_ssm, b_conv) = good.new_rows(2), bad.new_rows(2)
    good.read_rows(t, g_ssm, g_conv)
    bad.read_rows(t, b_ssm, b_conv)
    p = layout.page_bytes
    assert not torch.equal(g_ssm, b_ssm) and torch.equal(g_conv, b_conv)
    assert torch.equal(b_ssm[:, :p], g_ssm[:, p:2 * p])
