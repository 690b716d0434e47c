"""The organization-backed KV-cache manager, model-free: no weights, no engine.

The manager is driven the way vLLM's Scheduler drives it (lookup, allocate_slots, free) with
stand-in requests, on a hand-made geometry (a = 512 B/token, 8 KiB SSM state, grid 32 tokens:
16-KiB pages, one SSM member, 8 conv slots per slab) so nothing depends on the tiny model.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

from vllm.v1.core.kv_cache_manager import KVCacheBlocks  # noqa: E402
from vllm.v1.core.kv_cache_utils import KVCacheBlock  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402

from hybridmem.errors import HybridMemError  # noqa: E402
from hybridmem.events import EventKind, Outcome, RecordingObserver, StateKind  # noqa: E402
from hybridmem.geometry import Geometry  # noqa: E402
from hybridmem.vllm_plugin.org_manager import OrgKVCacheManager  # noqa: E402
from hybridmem.vllm_plugin.org_settings import (  # noqa: E402
    OrgSettings,
    build_org,
    plan_org,
    settings_from,
)

G = 32
GEO = Geometry(model="unit", layers=2, kv_heads=2, head_dim=32, dtype="float32", mamba_heads=8,
               mamba_head_dim=16, d_state=16, n_groups=1, d_conv=4, ssm_dtype="float32")
PAGE = G * GEO.attn_bytes_per_token  # 16,384 B


class Req:
    """What the manager reads on vLLM's Request."""

    def __init__(self, rid: str, tokens: list[int]) -> None:
        self.request_id = rid
        self.all_token_ids = list(tokens)
        self.num_computed_tokens = 0
        self.status = RequestStatus.WAITING
        self.cache_salt = None
        self.skip_reading_prefix_cache = False
        self.num_preemptions = 0
        self.done = False

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    def is_finished(self) -> bool:
        return self.done


def manager(org: str = "S2", pages: int = 12, **settings: Any) -> tuple[OrgKVCacheManager,
                                                                        RecordingObserver]:
    s = OrgSettings(org=org, budget=str(pages * PAGE), **settings).check()
    plan = plan_org(s, GEO, G)
    obs = RecordingObserver()
    org_ = build_org(plan, obs)
    attn = FullAttentionSpec(block_size=G, num_kv_heads=2, head_size=32, dtype=torch.float32)
    mamba = MambaSpec(block_size=G, shapes=((3, 160), (8, 16, 16)),
                      dtypes=(torch.float32, torch.float32), mamba_cache_mode="align")
    blocks = [KVCacheBlock(i) for i in range(plan.num_block_ids)]
    blocks[0].is_null = True
    stock = SimpleNamespace(
        coordinator=None, block_pool=SimpleNamespace(blocks=blocks),
        kv_cache_config=SimpleNamespace(
            num_blocks=plan.num_block_ids,
            kv_cache_groups=[SimpleNamespace(kv_cache_spec=attn),
                             SimpleNamespace(kv_cache_spec=mamba)]),
        max_model_len=4096, enable_caching=True, log_stats=False,
        empty_kv_cache_blocks=KVCacheBlocks(((), ())))
    return OrgKVCacheManager(stock, plan, org_, sink=obs), obs


def step(m: OrgKVCacheManager, r: Req, n: int) -> Any:
    """Schedule ``n`` tokens of ``r`` the way the Scheduler does; the step then 'executes'."""
    if r.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
        hit_blocks, hit, _ = m.get_computed_blocks(r)
        out = m.allocate_slots(r, n, num_new_computed_tokens=hit,
                               new_computed_blocks=hit_blocks)
        if out is None:
            return None
        out = m.get_blocks(r.request_id)
        r.status = RequestStatus.RUNNING
        r.num_computed_tokens = hit
    else:
        out = m.allocate_slots(r, n)
        if out is None:
            return None
    r.num_computed_tokens += n
    return out.get_block_ids()


def prefill(m: OrgKVCacheManager, r: Req) -> list[tuple[list[int], ...]]:
    """Chunks stop at every grid boundary (as OrgScheduler splits them)."""
    tables = []
    while r.num_computed_tokens < r.num_tokens:
        start = r.num_computed_tokens
        if r.status != RequestStatus.RUNNING:
            _, hit, _ = m.get_computed_blocks(r)
            start = hit
        n = min(r.num_tokens, (start // G + 1) * G) - start
        ids = step(m, r, n)
        assert ids is not None
        tables.append(ids)
    return tables


def finish(m: OrgKVCacheManager, r: Req) -> None:
    r.done = True
    m.free(r)


def of(obs: RecordingObserver, kind: EventKind, rid: str | None = None) -> list[Any]:
    return [e for e in obs.of_kind(kind) if rid is None or e.request_id == rid]


def test_block_ids_are_page_plus_one_and_the_mamba_table_is_positional() -> None:
    m, _ = manager("S2")
    r = Req("a", list(range(100)))
    tables = prefill(m, r)
    full = m.get_block_ids("a")
    attn, mamba = full
    req = m.org.requests["a"]
    assert attn == [b.page + 1 for b in req.blocks] and len(attn) == 4  # ceil(100 / 32)
    # append-only: the suffixes sent per step concatenate to the first tables sent
    assert sum((t[0] for t in tables[1:]), tables[0][0]) == attn
    # position i = the checkpoint after (i + 1) * 32 tokens while held, else 0 (released)
    newest = {b: ck for b, ck in req.ckpts.items()}
    for i, block_id in enumerate(mamba):
        ck = newest.get((i + 1) * G)
        assert block_id == (ck.home_page + 1 if ck is not None else 0)
    assert all(0 < i <= m.plan.capacity for i in attn)  # type: ignore[operator]
    sent = [t[1] for t in tables]
    assert [len(s) for s in sent] == [1, 1, 1, 1]  # one new position per chunk


def test_only_computed_state_is_published() -> None:
    m, obs = manager("S1")
    r = Req("a", list(range(80)))
    step(m, r, 32)  # tokens [0, 32) scheduled, not yet executed from the manager's view
    assert not of(obs, EventKind.PUBLICATION)
    step(m, r, 32)  # the next allocate sees 32 computed: block 0 and the checkpoint at 32
    pubs = of(obs, EventKind.PUBLICATION)
    assert sorted((e.state_kind, e.depth) for e in pubs) == [
        (StateKind.ATTENTION, 32), (StateKind.RECURRENT, 32)]
    assert all(e.page >= 0 for e in pubs)
    finish(m, r)  # 64 computed at finish: the 64 boundary now, never the running one at 96
    depths = sorted(e.depth for e in of(obs, EventKind.PUBLICATION)
                    if e.state_kind == StateKind.RECURRENT)
    assert depths == [32, 64]


def test_a_hit_is_adopted_at_its_depth_and_capped_below_the_prompt() -> None:
    m, obs = manager("S2")
    a = Req("a", list(range(96)))
    prefill(m, a)
    finish(m, a)
    b = Req("b", list(range(96)))  # identical prompt: the hit stops at 64 (<= len - 1 = 95)
    blocks, hit, _ = m.get_computed_blocks(b)
    assert hit == 64
    attn, mamba = blocks.get_block_ids()
    ck = m.org.rec_index[m.org.hash_chains("b")[1][1]]
    assert mamba == [0, ck.home_page + 1] and len(attn) == 2
    step(m, b, 32)
    adoption = of(obs, EventKind.ADOPTION, "b")
    assert [(e.depth, e.page) for e in adoption] == [(64, ck.home_page)]
    assert m.estimate_cached_tokens(b) == 64


def test_a_failed_admission_adopts_nothing() -> None:
    m, obs = manager("S0", pages=6, headroom=0.5)  # H = 3 pages
    a = Req("a", list(range(64)))
    prefill(m, a)
    finish(m, a)  # its 2 blocks and checkpoints stay cached (4 pages)
    running = Req("r", [7] * 40)
    prefill(m, running)  # holds 2 blocks + 2 checkpoints: 4 of 6 pages in use
    b = Req("b", list(range(64)) + [9] * 30)
    pool = m.org.pools()[0]
    refs = [pool.refs(p) for p in range(pool.total)]
    assert step(m, b, 32) is None  # need + 3 > available: rejected
    assert not of(obs, EventKind.ADOPTION, "b")
    rejected = [e for e in of(obs, EventKind.ALLOCATION, "b") if e.outcome == Outcome.REJECTED]
    assert len(rejected) == 1
    assert [pool.refs(p) for p in range(pool.total)] == refs
    assert not m.org.requests["b"].holds_storage


def test_a_request_that_can_never_fit_stops_the_run() -> None:
    m, _ = manager("S1", pages=2)
    with pytest.raises(HybridMemError, match="too small"):
        step(m, Req("a", list(range(40))), 32)


def test_state_table_follows_checkpoint_storage() -> None:
    m, _ = manager("S2", pages=8)
    a = Req("a", list(range(70)))
    prefill(m, a)
    table = m.state_table
    live = {ck.home_page + 1: ck for ck in m.org.live_ckpts.values()}
    assert set(m._state) == set(live)
    for block_id, ck in live.items():
        addr = table.resolve(block_id)
        assert addr.members == tuple(ck.members) and addr.conv == ck.conv
        assert addr.conv // m.org.slabs.slots_per_slab < m.plan.num_block_ids  # type: ignore[union-attr]
    finish(m, a)
    before = set(m._state)
    filler = Req("f", [5] * 100)  # reclaims a's cached storage
    prefill(m, filler)
    assert set(m._state) != before
    assert set(m._state) == {ck.home_page + 1 for ck in m.org.live_ckpts.values()}


def test_d0_recurrent_ids_follow_the_attention_pool() -> None:
    m, _ = manager("D0", pages=40, attention_fraction=0.5)
    assert isinstance(m.plan.capacity, tuple)
    n_attn = m.plan.capacity[0]
    r = Req("a", list(range(300)))
    prefill(m, r)
    attn, mamba = m.get_block_ids("a")
    assert all(1 <= i <= n_attn for i in attn)
    assert all(i == 0 or n_attn < i <= n_attn + m.plan.capacity[1] for i in mamba)
    assert m.plan.interval % G == 0 and m.plan.interval >= G


def test_stale_checkpoint_fault_hands_a_shallower_state() -> None:
    m, _ = manager("S2", pages=16, fault="stale-checkpoint")
    a = Req("a", list(range(130)))
    prefill(m, a)
    finish(m, a)
    b = Req("b", list(range(130)))
    blocks, hit, _ = m.get_computed_blocks(b)
    assert hit == 128
    right = blocks.get_block_ids()[1][-1]
    step(m, b, 2)
    mamba = m.get_block_ids("b")[1]
    assert m.fault_count == 1 and mamba[hit // G - 1] != right
    chain = m.org.hash_chains("b")[1]
    assert mamba[hit // G - 1] == m.org.rec_index[chain[2]].home_page + 1  # the one at 96


def test_settings_come_from_the_engine_config() -> None:
    assert settings_from(None) is None and settings_from({}) is None
    s = settings_from({"hybridmem": {"org": "S1", "budget": "b40", "pin_k": 2}})
    assert s is not None and s.org == "S1" and s.pin_k == 2
    for bad in ({"org": "S9", "budget": "b1"}, {"org": "S1", "budget": "b1", "pin_k": 4},
                {"org": "S1", "budget": "b1", "headroom": 1.5},
                {"org": "S1", "budget": "b1", "fault": "nope"}, {"org": "S1", "extra": 1}):
        with pytest.raises(HybridMemError):
            settings_from({"hybridmem": bad})


@pytest.mark.parametrize("whole", [True, False])
def test_full_sequence_gate_counts_the_whole_prompt(whole: bool) -> None:
    """vLLM's ``full_sequence_must_fit`` (``scheduler_reserve_full_isl``, on by default) admits a
    request only if its whole sequence fits; without it only the first chunk must fit. Here the
    first 32-token chunk fits (3 pages) and the 128-token prompt does not (12 pages > 8 free):
    the gate rejects, its absence (the control) admits."""
    m, _ = manager("S1", pages=12)
    running = Req("r", [7] * 40)
    prefill(m, running)  # holds 2 blocks + 1 checkpoint (2 pages): 4 of 12 pages
    b = Req("b", list(range(128)))
    blocks, hit, _ = m.get_computed_blocks(b)
    out = m.allocate_slots(b, 32, num_new_computed_tokens=hit, new_computed_blocks=blocks,
                           full_sequence_must_fit=whole)
    assert (out is None) is whole
    assert m.org.requests["b"].holds_storage is not whole
    assert m.counters["admission_rejections"] == int(whole)
