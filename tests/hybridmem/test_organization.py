"""The four organizations: registry, grids, joint reuse, lifetime rules, events, accounting."""

import random

import pytest

from hybridmem.budget import parse_budget, plan_budget
from hybridmem.errors import HybridMemError
from hybridmem.events import Cause, EventKind, Outcome, RecordingObserver, StateKind
from hybridmem.geometry import PRESETS
from hybridmem.memory.layouts import LAYOUTS, build, make_organization
from hybridmem.memory.placement import NO_LINE
from hybridmem.units import derive_units
from invariants.stateful import expected_bytes

U = derive_units(PRESETS["falcon-h1-7b"])
CTX = list(range(1, 10_000))


def org_with(name, capacity, **policy):
    obs = RecordingObserver()
    return build(name, U, capacity, obs, **policy), obs


def serve(org, rid, tokens, salt=None, finish=True):
    """Register, look up, adopt, allocate everything, compute and publish."""
    org.add_request(rid, tokens, salt)
    hit = org.lookup(rid)
    org.adopt(rid, hit)
    assert org.allocate(rid, len(tokens)).ok
    org.publish(rid, len(tokens))
    if finish:
        org.finish(rid)
    return hit


def kinds(obs, kind):
    return [e for e in obs.events if e.kind == kind]


def test_registry_and_plan_capacities():
    plan = plan_budget(U, parse_budget("b63", U))
    assert sorted(LAYOUTS) == ["D0", "S0", "S1", "S2"]
    sizes = {n: make_organization(n, U, plan).available() for n in LAYOUTS}
    # Table B-2 at b63: S0 63 pages, S1/S2 193 pages, D0 3,256 + 29 units
    assert sizes["S0"].attention == 63 and sizes["S1"].attention == sizes["S2"].attention == 193
    assert tuple(sizes["D0"]) == (3256, 29)
    with pytest.raises(HybridMemError, match="unknown organization 'S3'"):
        make_organization("S3", U, plan)


@pytest.mark.parametrize("name,grids", [("S0", (512, 512)), ("S1", (512, 512)),
                                        ("S2", (512, 512)), ("D0", (16, 1792))])
def test_grids(name, grids):
    org, _ = org_with(name, (4000, 8) if name == "D0" else 64)
    assert (org.attention_grid, org.recurrent_grid) == grids


@pytest.mark.parametrize("name,units", [("S0", (3, 3)), ("S1", (3, 12)), ("S2", (3, 10))])
def test_pages_needed_is_pure(name, units):
    org, obs = org_with(name, 64)
    org.add_request("r", CTX[:1300])
    # 1300 tokens: blocks [0,512) [512,1024) [1024,1536); checkpoints 512, 1024, 1536
    # S2: 3 x 3 member pages + 1 new slab for the three slots
    need = org.pages_needed("r", 1300)
    assert tuple(need) == units and org.can_allocate("r", 1300)
    assert org.available().attention == 64 and not obs.events  # nothing changed
    with pytest.raises(ValueError, match="cannot allocate 1301 tokens, only 1300 are known"):
        org.pages_needed("r", 1301)


@pytest.mark.parametrize("name", ["S0", "S1", "S2"])
def test_joint_reuse_rule(name):
    org, _ = org_with(name, 200)
    serve(org, "a", CTX[:2100])  # publishes blocks and checkpoints 512 .. 2048
    org.add_request("b", CTX[:3000])
    attn, rec = org.hash_chains("b")
    org.invalidate(attn[2])  # attention block [1024, 1536) lost
    org.invalidate(rec[0])  # checkpoint at 512 lost
    hit = org.lookup("b")
    # attention valid for [0, 1024) -> A_max 1024; checkpoints 1024, 1536, 2048 complete
    # -> R_max 2048; joint: 1024 (512 lacks its checkpoint)
    assert (hit.a_max, hit.r_max, hit.j, hit.gap_r) == (1024, 2048, 1024, 1024)
    assert len(hit.blocks) == 2 and hit.checkpoint is not None
    assert hit.checkpoint.boundary == 1024 and hit.checkpoint.key == rec[1]


def test_lookup_leaves_one_token_to_compute():
    org, _ = org_with("S1", 64)
    serve(org, "a", CTX[:1024])
    org.add_request("b", CTX[:1024])  # the 1024 boundary would leave nothing to compute
    assert org.lookup("b").j == 512


@pytest.mark.parametrize("name", ["S1", "S2"])
def test_partial_checkpoint_is_never_a_hit(name):
    # 600 tokens: 2 blocks + checkpoints 512, 1024 = S1 2 + 8 pages, S2 2 + 6 + 1 slab
    org, obs = org_with(name, 10 if name == "S1" else 9)
    serve(org, "a", CTX[:600])  # block 0 and checkpoint 512 stay cached
    org.add_request("b", CTX[:600])
    assert org.lookup("b").j == 512
    org.evict(1)  # the oldest cached unit: S1 member 0, S2 the slab of checkpoint 512
    losses = kinds(obs, EventKind.LOSS)
    assert losses and losses[-1].state_kind == StateKind.RECURRENT
    hit = org.lookup("b")
    assert hit.r_max == 0 and hit.j == 0
    org.check_integrity()


def test_slab_reclaim_invalidates_every_checkpoint_in_the_slab():
    org, obs = org_with("S2", 30)
    org.add_request("a", CTX[:1600])
    org.adopt("a", org.lookup("a"))
    assert org.allocate("a", 1600).ok  # 4 blocks + 4 checkpoints (12 members + 1 slab)
    org.publish("a", 1600)  # checkpoints 512, 1024, 1536 published; 2048 is the destination
    slab = org.slabs.slab_pages()[0]
    lines = sorted(ck.conv for ck in org.rec_index.values())
    # all three checkpoints share slab `slab`: lines 16 slab + 0, 1, 2
    assert lines == [16 * slab, 16 * slab + 1, 16 * slab + 2]
    lost_ckpts = list(org.rec_index.values())
    org.preempt("a")  # releases the slab first, then the members: the slab is oldest
    assert org.pool.oldest_cached() == slab and org.pool.num_free == 17
    org.add_request("b", list(range(50_000, 60_000)))
    org.adopt("b", org.lookup("b"))
    assert org.allocate("b", 2049).ok  # 5 blocks + 15 members + 1 slab = 21 > 17 free
    lost = [e for e in kinds(obs, EventKind.LOSS) if e.cause == Cause.SLAB_RECLAIM]
    assert sorted(e.depth for e in lost) == [512, 1024, 1536]
    assert {e.requester for e in lost} == {"b"} and sorted(e.line for e in lost) == lines
    assert not org.rec_index
    # absence is the named sentinel, never a decodable line (nor page 0)
    assert all(ck.conv == NO_LINE and ck.ident not in org.live_ckpts for ck in lost_ckpts)
    org.check_integrity()


def test_slab_with_an_active_slot_is_never_reclaimed():
    org, _ = org_with("S2", 10)
    serve(org, "a", CTX[:600], finish=False)  # "a" keeps its slab active
    slab = org.slabs.slab_pages()[0]
    org.add_request("b", list(range(70_000, 75_000)))
    org.adopt("b", org.lookup("b"))
    while org.can_allocate("b", org.requests["b"].ckpt_top + 512):
        org.allocate("b", org.requests["b"].ckpt_top + 512)
    assert org.slabs.is_slab(slab) and org.pool.refs(slab) > 0
    assert org.requests["a"].ckpts[512].conv // 16 == slab


def test_d0_pools_do_not_lend_capacity():
    org, obs = org_with("D0", (40, 8))  # 40 attention units = 640 tokens
    org.add_request("r", CTX[:1000])
    need = org.pages_needed("r", 1000)
    assert tuple(need) == (63, 1)  # 63 native units, one composite
    res = org.allocate("r", 1000)
    assert not res.ok and tuple(res.available) == (40, 8)
    events = kinds(obs, EventKind.ALLOCATION)
    assert [(e.state_kind, e.need, e.free, e.outcome) for e in events] == [
        (StateKind.ATTENTION, 63, 40, Outcome.REJECTED),
        (StateKind.RECURRENT, 1, 8, Outcome.REJECTED)]


def test_cache_salt_isolates_requests():
    org, _ = org_with("S2", 64)
    serve(org, "a", CTX[:2000], salt="alice")
    org.add_request("b", CTX[:2000], "bob")
    org.add_request("c", CTX[:2000], "alice")
    org.add_request("d", CTX[:2000])
    assert org.lookup("b").j == 0 and org.lookup("d").j == 0
    assert org.lookup("c").j == 1536


@pytest.mark.parametrize("k,pinned", [(None, None), (1, True), (2, False), (3, False)])
def test_preemption_pinning_threshold(k, pinned):
    org, obs = org_with("S1", 64, pin_k=k)
    serve(org, "a", CTX[:1100], finish=False)  # producer of checkpoints 512 and 1024
    decision = org.preempt("a")
    # requesters of the 1024 checkpoint: the producer only (owner registration)
    if k is None:
        assert decision is None and not kinds(obs, EventKind.PIN)
        return
    assert decision.boundary == 1024 and decision.demand == 1 and decision.pinned is pinned
    assert kinds(obs, EventKind.PIN)[-1].outcome == (
        Outcome.OK if pinned else Outcome.BELOW_THRESHOLD)
    if pinned:
        org.evict(1000)  # a pinned checkpoint survives eviction
        hit = org.lookup("a")
        assert hit.r_max == 1024
        org.adopt("a", hit)  # references first, then the pin is released
        assert not org.pins and kinds(obs, EventKind.UNPIN)


def test_second_requester_reaches_k2():
    org, _ = org_with("S1", 64, pin_k=2)
    serve(org, "a", CTX[:1100], finish=False)
    org.add_request("b", CTX[:1100])
    org.lookup("b")  # resident hit evidence for 512 and 1024
    assert org.preempt("a").pinned


def test_producer_side_retention():
    org, obs = org_with("S2", 64, retention=True)
    org.add_request("p", CTX[:2000])
    org.adopt("p", org.lookup("p"))
    org.allocate("p", 1100)
    org.publish("p", 1100)  # checkpoints 512, 1024 published
    org.add_request("q", CTX[:2000])
    org.lookup("q")  # a second distinct requester for 512 and 1024
    org.allocate("p", 1600)
    org.publish("p", 1600)
    kept = org.release_superseded("p")  # 512 and 1024 are superseded by 1536
    events = kinds(obs, EventKind.RETENTION)
    assert len(kept) == 2 and all(e.outcome == Outcome.OK for e in events)
    assert set(org.requests["p"].ckpts) == {512, 1024, 1536, 2048}
    org.finish("p")  # retention ends with the producer: the checkpoints stay only cached
    assert all(not ck.holders for ck in org.rec_index.values()) and len(org.rec_index) == 3


def test_retention_below_threshold_releases():
    org, obs = org_with("S2", 64, retention=True)
    org.add_request("p", CTX[:2000])
    org.adopt("p", org.lookup("p"))
    org.allocate("p", 1600)
    org.publish("p", 1600)
    assert org.release_superseded("p") == []
    assert {e.outcome for e in kinds(obs, EventKind.RETENTION)} == {Outcome.BELOW_THRESHOLD}
    assert set(org.requests["p"].ckpts) == {1536, 2048}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_events_carry_keys_depths_and_ids(name):
    org, obs = org_with(name, (4000, 8) if name == "D0" else 64)
    serve(org, "a", CTX[:4000])
    pubs = kinds(obs, EventKind.PUBLICATION)
    rec = [e for e in pubs if e.state_kind == StateKind.RECURRENT]
    attn = [e for e in pubs if e.state_kind == StateKind.ATTENTION]
    assert [e.depth for e in rec] == list(range(org.recurrent_grid, 4000, org.recurrent_grid))
    assert [e.depth for e in attn] == list(range(org.attention_grid, 4001, org.attention_grid))
    assert all(e.hash and e.page >= 0 and e.request_id == "a" for e in pubs)
    assert all((e.line >= 0) == (name == "S2") for e in rec)
    org.evict(10_000)
    lost = {e.hash for e in kinds(obs, EventKind.LOSS)}
    assert lost == {e.hash for e in pubs}  # every discoverable key lost exactly once


def test_release_is_not_reassignment():
    org, obs = org_with("S0", 8)
    serve(org, "a", CTX[:600])
    assert kinds(obs, EventKind.RELEASE) and not kinds(obs, EventKind.LOSS)
    assert org.held().attention == 1 and org.held().recurrent == 1  # still cached


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_accounting_matches_storage_formula(name):
    """After a random operation mix, allocated bytes equal the SPEC §3 formula for held()."""
    rng = random.Random(7)
    org, _ = org_with(name, (600, 6) if name == "D0" else 40, pin_k=1, retention=True)
    g = org.recurrent_grid
    live = []
    for step in range(300):
        op = rng.random()
        if op < 0.3 or not live:
            rid = f"r{step}"
            ctx = rng.randrange(2)
            toks = CTX[ctx * 4000: ctx * 4000 + rng.randrange(1, 3) * g] + \
                [90_000 + step * 100 + i for i in range(rng.randrange(1, g))]
            org.add_request(rid, toks)
            org.adopt(rid, org.lookup(rid))
            if org.allocate(rid, min(len(toks), org.requests[rid].computed + g)).ok:
                live.append(rid)
            else:
                org.finish(rid)
        elif op < 0.7:
            rid = rng.choice(live)
            req = org.requests[rid]
            top = max([b.depth for b in req.blocks] + [req.computed])
            org.publish(rid, min(top, len(req.tokens)))
            org.release_superseded(rid)
            org.allocate(rid, min(len(req.tokens), top + g // 2))
        elif op < 0.8:
            rid = live.pop(rng.randrange(len(live)))
            org.preempt(rid)
            org.finish(rid)
        elif op < 0.9:
            org.finish(live.pop(rng.randrange(len(live))))
        else:
            org.evict(rng.randrange(1, 4))
        assert org.allocated_bytes() == expected_bytes(org, U), (step, org.held())
        org.check_integrity()
    xa, xr, m = org.held()
    assert xa and xr and (m > 0) == (name == "S2")


@pytest.mark.parametrize("name", ["S0", "S2", "D0"])
def test_publish_republishes_a_held_block_after_invalidation(name):
    """publish skips the leading blocks that carry their key (``RequestState.keyed``); an
    invalidation of a block a running request holds must make the next publish offer it
    again, as the full scan did. Negative control: with the skip count left stale, the block
    would stay unpublished."""
    org, obs = org_with(name, (4000, 8) if name == "D0" else 64)
    tokens = CTX[:2000]
    serve(org, "a", tokens, finish=False)
    attn, _ = org.hash_chains("a")
    req = org.requests["a"]
    assert req.keyed == len(attn)  # every full block published and skipped from now on
    assert org.publish("a", len(tokens)) == []
    victim = attn[1]
    assert org.invalidate(victim) and victim not in org.attn_index
    assert req.keyed == 0
    stale = org_with(name, (4000, 8) if name == "D0" else 64)[0]  # negative control
    serve(stale, "a", tokens, finish=False)
    assert stale.invalidate(victim)
    stale.requests["a"].keyed = len(attn)  # the reset undone
    assert stale.publish("a", len(tokens)) == []
    assert org.publish("a", len(tokens)) == [victim]  # offered again, as the full scan did
    assert org.attn_index[victim] is req.blocks[1]
    assert kinds(obs, EventKind.PUBLICATION)[-1].hash == victim


@pytest.mark.parametrize("name", LAYOUTS)
def test_tokens_are_held_as_int64_and_a_bad_token_changes_nothing(name):
    """A request's tokens are an int64 array (``hashing.token_array``) with the keys of the same
    list; a token that is not an int64 is refused before anything is registered or appended."""
    from array import array

    from hybridmem.memory.keys import hash_chain_pair

    org, _ = org_with(name, (4000, 8) if name == "D0" else 64)
    grids = org.attention_grid, org.recurrent_grid
    org.add_request("a", CTX[:4000])
    req = org.requests["a"]
    assert type(req.tokens) is array and req.tokens == array("q", CTX[:4000])
    assert org.hash_chains("a") == tuple(map(tuple, hash_chain_pair(CTX[:4000], *grids)))
    org.append_tokens("a", CTX[4000:6000])
    assert org.hash_chains("a") == tuple(map(tuple, hash_chain_pair(CTX[:6000], *grids)))
    with pytest.raises(OverflowError):
        org.append_tokens("a", [7, 2**63])
    with pytest.raises(TypeError):
        org.add_request("b", [1, 2, "x"])
    assert len(req.tokens) == 6000 and "b" not in org.requests
    # negative control: the keys follow the tokens, so one more appended token moves them
    before = org.hash_chains("a")
    org.append_tokens("a", [7] * grids[0])
    assert org.hash_chains("a")[0] != before[0]
