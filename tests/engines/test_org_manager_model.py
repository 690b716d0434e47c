"""The KV manager's decisions checked step by step against a small reference model.

Seeded programs drive :class:`OrgKVCacheManager` the way vLLM's scheduler does (lookup, admission
with vLLM's whole-sequence gate, chunked prefill fitted with ``fit_chunk``, decode, finish,
preemption) over shared prompt prefixes on a small pool, so hits, cached pages, pressure,
rejections and reclaim all occur. After every call the model states what the manager must have
done, independently of how it does it::

    admission    need + H <= available per pool (one pool: on the sum), need = new blocks +
                 units of the checkpoints in (J, ceil(check / g_r) g_r], available minus the
                 cached pages the hit would take; a rejection adopts nothing
    block ids    attention: page + 1; Mamba position i: checkpoint at ceil((i+1) G / g_r) g_r,
                 id = home page + 1 (+ attention pages for D0), 0 where not held
    tables       admission: the full tables; growth: only what was not sent yet
    zeroing      new attention ids only: never the adopted ones, each once
    state table  the live complete checkpoints, each at its address, and nothing else, after
                 every call (a decode step that grows nothing drops the checkpoints it released)
    exports      every boundary strictly inside this step's chunk, under the chunk end's
                 position; none left from an earlier step or a freed request
    publication  nothing past the computed tokens; a finished request's computed state is
                 published
    fit_chunk    the longest prefix whose checkpoints the pool could hold at once (own pins
                 not deducted), else the next boundary

Each rule is the negative control of a mutant in ``invariants/serving_mutants.py`` (named in
the assertion messages' tags).
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

pytest.importorskip("vllm")

from vllm.v1.request import RequestStatus  # noqa: E402

from hybridmem.errors import HybridMemError  # noqa: E402
from hybridmem.events import StateKind  # noqa: E402
from hybridmem.memory.interface import LookupResult  # noqa: E402
from hybridmem.vllm_plugin.org_manager import OrgKVCacheManager  # noqa: E402
from hybridmem.vllm_plugin.state_table import StateAddress  # noqa: E402
from tests.engines.test_org_manager import G, Req, manager  # noqa: E402

ADMITTING = (RequestStatus.WAITING, RequestStatus.PREEMPTED)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Model:
    """What the manager must have done, recomputed from the organization's state."""

    def __init__(self, m: OrgKVCacheManager) -> None:
        self.m = m
        self.org = m.org
        self.sent: dict[str, int] = {}  # attention ids sent per running request
        plan = m.plan
        self.d0 = isinstance(plan.capacity, tuple)
        self.attn_pages = plan.capacity[0] if isinstance(plan.capacity, tuple) else 0
        f = plan.settings.headroom
        caps = plan.capacity if isinstance(plan.capacity, tuple) else (plan.capacity,) * 2
        self.headroom = (math.floor(f * caps[0]), math.floor(f * caps[1]))
        self.shared = self.org.pool_for(StateKind.ATTENTION) is \
            self.org.pool_for(StateKind.RECURRENT)

    # -- ids -------------------------------------------------------------------------------
    def rec_id(self, home_page: int) -> int:
        return home_page + 1 + self.attn_pages

    def attn_ids(self, rid: str) -> list[int]:
        return [b.page + 1 for b in self.org.requests[rid].blocks]

    def mamba_ids(self, rid: str, start: int, stop: int) -> list[int]:
        req, gr = self.org.requests[rid], self.org.recurrent_grid
        out = []
        for i in range(start, stop):
            ck = req.ckpts.get(cdiv((i + 1) * G, gr) * gr)
            out.append(0 if ck is None else self.rec_id(ck.home_page))
        return out

    # -- admission -------------------------------------------------------------------------
    def admits(self, hit: Any, check: int) -> bool:
        org = self.org
        ga, gr = org.attention_grid, org.recurrent_grid
        blocks = max(0, cdiv(check, ga) - len(hit.blocks))
        ckpts = sum(1 for b in range(gr, cdiv(check, gr) * gr + 1, gr) if b > hit.j)
        units = org.ckpt_units(ckpts)
        apool, rpool = org.pool_for(StateKind.ATTENTION), org.pool_for(StateKind.RECURRENT)
        taken_a = len({p for p in hit.blocks if apool.refs(p) == 0})
        taken_r = 0
        if hit.checkpoint is not None:
            ck = org.rec_index.get(hit.checkpoint.key)
            if ck is not None:
                taken_r = len({p for p in org.ckpt_pages(ck) if rpool.refs(p) == 0})
        ha, hr = self.headroom
        if self.shared:
            return blocks + units + ha <= apool.num_available - taken_a - taken_r
        return blocks + ha <= apool.num_available - taken_a and \
            units + hr <= rpool.num_available - taken_r

    # -- fit_chunk --------------------------------------------------------------------------
    def fit(self, rid: str, start: int, end: int) -> int:
        org = self.org
        ga, gr = org.attention_grid, org.recurrent_grid
        others = sum(len(set(org.ckpt_pages(ck))) for ck, owner in org.pins.values()
                     if owner != rid)
        a_tot = org.pool_for(StateKind.ATTENTION).total
        r_tot = org.pool_for(StateKind.RECURRENT).total
        base = start // gr * gr
        ha, hr = self.headroom

        def fits(e: int) -> bool:
            n = sum(1 for b in range(gr, cdiv(e, gr) * gr + 1, gr) if b > base) + (base > 0)
            units = org.ckpt_units(n)
            if self.shared:
                return cdiv(e, ga) + units + ha <= a_tot - others
            return cdiv(e, ga) + ha <= a_tot and units + hr <= r_tot - others

        if fits(end):
            return end
        for e in range((end - 1) // gr * gr, start, -gr):
            if fits(e):
                return e
        return min(end, (start // gr + 1) * gr)

    # -- checks after every call -----------------------------------------------------------
    def check_state_table(self, tag: str) -> None:
        """Every live complete checkpoint mapped at its address, and nothing else."""
        want = {self.rec_id(ck.home_page): StateAddress(tuple(ck.members), ck.conv)
                for ck in self.org.live_ckpts.values()
                if ck.conv >= 0 and all(p >= 0 for p in ck.members)}
        table = self.m.state_table
        assert len(table) == len(want), f"{tag}: state table has {len(table)} ids, " \
            f"live complete checkpoints {len(want)} [manager-never-drops-mappings]"
        for block_id, addr in want.items():
            assert table.peek(block_id) == addr, f"{tag}: block {block_id}"

    def check_exports(self, rid: str, start: int, end: int) -> None:
        gr = self.org.recurrent_grid
        inner = [b for b in range(start + 1, end) if b % gr == 0]
        mine = {d: e for d, e in self.m.state_table.exports.items() if e.request_id == rid}
        if not inner:
            assert not mine, f"{rid} [{start}, {end}): no interior boundary, exports {mine}"
            return
        req = self.org.requests[rid]
        dst = self.mamba_ids(rid, cdiv(end, G) - 1, cdiv(end, G))[0]
        want = tuple((b, self.rec_id(req.ckpts[b].home_page)) for b in inner)
        assert list(mine) == [dst], f"{rid} [{start}, {end}): export under {list(mine)}, " \
            f"the chunk end's position holds {dst}"
        assert mine[dst].boundaries == want and (mine[dst].start, mine[dst].end) == (start, end)

    def check_published(self, rid: str, computed: int) -> None:
        req = self.org.requests.get(rid)
        if req is None:
            return
        deep = [b for b, ck in req.ckpts.items() if ck.published and b > computed]
        assert not deep, f"{rid}: published {deep} past {computed} computed tokens"


def ids(blocks: Any) -> tuple[list[int], list[int]]:
    a, b = blocks.get_block_ids()
    return list(a), list(b)


class Driver:
    """A seeded program of scheduler calls, each checked against :class:`Model`."""

    def __init__(self, org: str, seed: int, pages: int, max_len: int = 150, chunk: int = 64,
                 **settings: Any) -> None:
        self.m, _ = manager(org, pages=pages, **settings)
        self.max_len, self.max_chunk = max_len, chunk
        self.model = Model(self.m)
        self.rng = random.Random(seed)
        self.prefixes = [[self.rng.randrange(1000) for _ in range(max_len)] for _ in range(3)]
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.n = 0
        self.admissions = self.rejections = self.hits = 0

    def new_request(self) -> None:
        rng = self.rng
        n = rng.randrange(20, self.max_len)
        shared = rng.randrange(0, n)
        tokens = self.prefixes[rng.randrange(3)][:shared] + \
            [rng.randrange(1000, 2000) for _ in range(n - shared)]
        r = Req(f"r{self.n}", tokens)
        r.skip_reading_prefix_cache = rng.random() < 0.1
        self.n += 1
        self.waiting.append(r)

    def chunk(self, r: Req, start: int) -> int:
        """vLLM's chunk (up to ``max_chunk`` tokens), fitted as the scheduler fits it."""
        end = min(r.num_tokens, start + self.max_chunk)
        if end - start > 1:
            fitted = self.m.fit_chunk(r, start, end)
            assert fitted == self.model.fit(r.request_id, start, end), \
                f"fit_chunk({r.request_id}, {start}, {end}) = {fitted} [fit-chunk-*]"
            end = fitted
        return end - start

    def admit(self, r: Req) -> None:
        m, model = self.m, self.model
        rid = r.request_id
        blocks, j, _ = m.get_computed_blocks(r)
        kept = m._hits.get(rid)
        if r.skip_reading_prefix_cache:
            assert j == 0, f"{rid}: skips the prefix cache, hit {j} [prefix-skip-flag-ignored]"
        if j:
            self.hits += 1
            assert kept is not None and kept.j == j
            attn, mamba = ids(blocks)
            assert attn == [p + 1 for p in kept.blocks], "hit attention ids are pages + 1"
            assert kept.checkpoint is not None
            assert mamba == [0] * (j // G - 1) + [self.model.rec_id(kept.checkpoint.members[0])]
        n = self.chunk(r, j)
        check = max(j + n, r.num_tokens)  # vLLM's whole-sequence gate
        hit = kept if kept is not None and kept.j == j else LookupResult(rid, 0, 0, 0, (), (),
                                                                         None)
        expect = model.admits(hit, check)
        holders = any(q.holds_storage for q in m.org.requests.values())
        if not expect and not holders:
            with pytest.raises(HybridMemError, match="too small"):
                m.allocate_slots(r, n, num_new_computed_tokens=j, new_computed_blocks=blocks,
                                 full_sequence_must_fit=True)
            self.waiting.remove(r)  # the run would stop; the program drops the request
            return
        out = m.allocate_slots(r, n, num_new_computed_tokens=j, new_computed_blocks=blocks,
                               full_sequence_must_fit=True)
        assert (out is not None) == expect, \
            f"{rid}: admission {'admitted' if out is not None else 'rejected'}, the model " \
            f"says {'admit' if expect else 'reject'} (check {check} tokens, hit {j}) [admission-*]"
        if out is None:
            self.rejections += 1
            assert not m.org.requests[rid].holds_storage, "a rejection adopts nothing"
            assert m.take_new_block_ids() == [], "a rejection queues nothing for zeroing"
            return
        self.admissions += 1
        attn, mamba = ids(out)
        n_blocks = len(m.org.requests[rid].blocks)
        assert attn == model.attn_ids(rid), f"{rid}: admission's attention table"
        assert mamba == model.mamba_ids(rid, 0, n_blocks), f"{rid}: admission's Mamba table"
        adopted = len(hit.blocks)
        zero = m.take_new_block_ids()
        assert zero == attn[adopted:], f"{rid}: queued for zeroing {zero}, new blocks " \
            f"{attn[adopted:]} (adopted {attn[:adopted]}) [adopted-blocks-zeroed]"
        assert m.estimate_cached_tokens(r) == j
        model.sent[rid] = len(attn)
        r.status = RequestStatus.RUNNING
        r.num_computed_tokens = j
        model.check_exports(rid, j, j + n)
        self.waiting.remove(r)
        self.running.append(r)
        r.num_computed_tokens += n

    def grow(self, r: Req) -> None:
        m, model = self.m, self.model
        rid = r.request_id
        start = r.num_computed_tokens
        if start >= r.num_tokens:  # decode: the sampled token joins the sequence
            r.all_token_ids.append(self.rng.randrange(2000, 3000))
        n = self.chunk(r, start) if start < r.num_tokens - 1 else r.num_tokens - start
        before = model.sent[rid]
        out = m.allocate_slots(r, n)
        model.check_published(rid, start)
        assert len(m.org.requests[rid].tokens) == r.num_tokens, \
            f"{rid}: the organization knows {len(m.org.requests[rid].tokens)} tokens, the " \
            f"request has {r.num_tokens} [decode-tokens-not-appended]"
        if out is None:
            self.preempt(r)
            return
        attn, mamba = ids(out)
        n_blocks = len(m.org.requests[rid].blocks)
        assert attn == model.attn_ids(rid)[before:], f"{rid}: growth sends only new blocks"
        assert len(mamba) == len(attn) and mamba == model.mamba_ids(rid, before, n_blocks)
        zero = m.take_new_block_ids()
        assert zero == attn, f"{rid}: new blocks {attn}, queued for zeroing {zero}"
        model.sent[rid] = n_blocks
        model.check_exports(rid, start, start + n)
        r.num_computed_tokens += n
        # vLLM's own cap: a running request never exceeds its budget of decode tokens here
        if r.num_computed_tokens >= r.num_tokens + 8 or self.rng.random() < 0.05:
            self.finish(r)

    def finish(self, r: Req) -> None:
        m = self.m
        rid = r.request_id
        computed = r.num_computed_tokens
        gr = m.org.recurrent_grid
        last = m.org.requests[rid].ckpts.get(computed // gr * gr)
        rec_chain = m.org.hash_chains(rid)[1]
        r.done = True
        m.free(r)
        self.running.remove(r)
        assert rid not in m.org.requests, f"{rid}: finished but still registered " \
            "[finish-treated-as-preemption]"
        if last is not None and last.conv >= 0 and min(last.members) >= 0:
            # published, or another request's copy of the same key is discoverable
            assert rec_chain[last.boundary // gr - 1] in m.org.rec_index, \
                f"{rid}: its state at {last.boundary} was computed but is not discoverable " \
                "after finish [finish-publishes-nothing]"
        assert not [e for e in m.state_table.exports.values() if e.request_id == rid], \
            f"{rid}: exports kept after free [exports-kept-after-free]"

    def preempt(self, r: Req) -> None:
        m = self.m
        rid = r.request_id
        if r in self.running:
            m.free(r)
            self.running.remove(r)
        assert rid in m.org.requests and not m.org.requests[rid].holds_storage, \
            f"{rid}: preempted but still holds storage or was dropped"
        r.status = RequestStatus.PREEMPTED
        r.num_computed_tokens = 0
        r.num_preemptions += 1
        self.waiting.insert(0, r)

    def step(self) -> None:
        m, rng = self.m, self.rng
        m.new_step_starts()
        assert not m.state_table.exports, "exports survive a new step [exports-kept-across-steps]"
        if rng.random() < 0.4 or not (self.waiting or self.running):
            self.new_request()
        running = list(self.running)  # one chunk per request and step
        for r in running:
            if r in self.running:
                self.grow(r)
        if self.waiting and rng.random() < 0.7:
            self.admit(self.waiting[0])
        if self.running and rng.random() < 0.05:
            self.preempt(rng.choice(self.running))
        self.model.check_state_table(f"step with {self.n} requests")


# D0's checkpoints are 256 tokens apart on this geometry: longer prompts and chunks
CASES = [("S0", 14, {}), ("S1", 16, {}), ("S2", 14, {}),
         ("D0", 60, {"attention_fraction": 0.5, "max_len": 700, "chunk": 256})]


@pytest.mark.parametrize(("org", "pages", "extra"), CASES, ids=[c[0] for c in CASES])
def test_manager_decisions_follow_the_model(org: str, pages: int, extra: dict[str, Any]) -> None:
    totals = [0, 0, 0]
    for seed in range(10):
        pins = {"pin_k": 1} if seed % 2 else {}  # preemption pins: fit_chunk and admission
        d = Driver(org, seed, pages, headroom=0.1, **pins, **extra)
        for _ in range(80):
            d.step()
        totals[0] += d.admissions
        totals[1] += d.rejections
        totals[2] += d.hits
    admissions, rejections, hits = totals
    # the programs reach what the rules are about (a program that never rejects or hits
    # would check nothing)
    assert admissions >= 20 and rejections >= 5 and hits >= 5, totals


def test_fit_chunk_deducts_other_owners_pins_and_shortens_to_a_boundary() -> None:
    """``a`` is preempted with its checkpoint at 96 pinned (pin_k = 1); ``b`` is new. The pin
    counts against ``b``'s chunks, not against its owner's; a chunk the pool could not hold is
    cut at the largest boundary that it could."""
    m, _ = manager("S1", pages=14, pin_k=1)
    model = Model(m)
    a = Req("a", list(range(200)))
    for _ in range(3):
        m.allocate_slots(a, 32, full_sequence_must_fit=False)
        a.status = RequestStatus.RUNNING
        a.num_computed_tokens += 32
    m.free(a)  # preemption: the deepest published checkpoint is pinned for a
    assert [(ck.boundary, owner) for ck, owner in m.org.pins.values()] == [(96, "a")]
    b = Req("b", [9] * 200)
    assert m.fit_chunk(a, 96, 190) == 190  # [fit-chunk-counts-own-pins]
    assert m.fit_chunk(b, 0, 197) == 128  # [fit-chunk-never-shortens]
    for end in range(97, 201, 3):
        assert m.fit_chunk(a, 96, end) == model.fit("a", 96, end), end
    for end in range(1, 201, 3):
        assert m.fit_chunk(b, 0, end) == model.fit("b", 0, end), end
