"""A small serving simulator that writes realistic event tables for tests and the benchmark.

Not a model of any engine's timing: it produces the *shapes* of a traced run (ShareGPT-like
shared contexts, Poisson arrivals, a cap on running sequences, a memory pool with LRU
reclaim of cached entries, chunked prefill, decode growth, recompute preemption and resume,
S2 slab reclaims that drop several checkpoints at once, salted requests) so that the lineage
SQL and the replay meet every case the paper's traces hold, at any size.

    table = synthesize(SynthConfig(requests=300, seed=0))

Hash chains are prefix-dependent like vLLM's: a block's key is a function of its context and
position while the prompt is inside a shared context, and of the request afterwards; salted
requests mix their salt into every key (no cross-request hits).
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import OrderedDict
from dataclasses import dataclass, field

import pyarrow as pa

from hybridmem.events import Cause, Event, EventKind, Outcome, StateKind, hash64
from lineage.table import events_to_table


@dataclass(frozen=True, slots=True)
class SynthConfig:
    requests: int = 300
    seed: int = 0
    organization: str = "S2"
    attention_grid_tokens: int = 512
    recurrent_grid_tokens: int = 512
    attention_unit_cost: int = 1  # pool units per attention block
    checkpoint_unit_cost: int = 4  # pool units per checkpoint (S2: 3 SSM pages + conv share)
    pool_units: int = 254  # shared pool; for D0 the attention pool
    recurrent_pool_units: int | None = None  # D0: separate recurrent pool (None: shared pool)
    slab_checkpoints: int = 16  # S2: checkpoints whose conv slots share one slab (0: no slabs)
    slab_reclaim_probability: float = 0.25
    contexts: int = 8
    context_tokens: tuple[int, int] = (1500, 3000)
    suffix_tokens: tuple[int, int] = (50, 900)
    output_tokens: tuple[int, int] = (20, 1024)
    arrival_rate: float = 1.0  # requests per step (Poisson)
    cap: int = 63
    prefill_chunk: int = 2048
    decode_tokens_per_step: int = 16  # tokens a running request generates per step
    salted_fraction: float = 0.05
    max_model_tokens: int = 8192


@dataclass
class _Req:
    rid: str
    context: int
    prompt: int
    output: int
    salt: int
    pc: int = 0
    computed: int = 0  # tokens whose state exists (prefill + decode)
    generated: int = 0
    refs: list[tuple[str, int]] = field(default_factory=list)
    reserved: dict[str, int] = field(default_factory=dict)  # pool -> units held for prefill


def _key(*parts: object) -> int:
    """A 64-bit key of ``parts`` that is the same in every process (Python's ``hash`` of a str
    is salted per process, so the same seed gave different traces in two runs)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return hash64(int.from_bytes(digest, "little") or 1)


class _Sim:
    def __init__(self, cfg: SynthConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.events: list[Event] = []
        self.step = 0
        self.ga, self.gr = cfg.attention_grid_tokens, cfg.recurrent_grid_tokens
        self.ctx_len = [self.rng.randint(*cfg.context_tokens) for _ in range(cfg.contexts)]
        # cache: key -> refcount; LRU of evictable (valid, refcount 0) keys
        self.valid: dict[tuple[str, int], int] = {}
        self.lru: dict[str, OrderedDict[tuple[str, int], None]] = {
            "attention": OrderedDict(), "recurrent": OrderedDict()}
        self.evictable = {"attention": 0, "recurrent": 0}
        self.slab_of: dict[int, int] = {}
        self.slab_members: dict[int, set[int]] = {}
        self.next_ckpt_slot = 0
        self.used = {"attention": 0, "recurrent": 0}
        self.waiting: list[_Req] = []
        self.running: list[_Req] = []

    # -- pools -----------------------------------------------------------------------------

    def _pool(self, kind: str) -> str:
        return kind if self.cfg.recurrent_pool_units is not None else "attention"

    def _capacity(self, pool: str) -> int:
        if pool == "recurrent" and self.cfg.recurrent_pool_units is not None:
            return self.cfg.recurrent_pool_units
        return self.cfg.pool_units

    def _cost(self, kind: str) -> int:
        cfg = self.cfg
        return cfg.attention_unit_cost if kind == "attention" else cfg.checkpoint_unit_cost

    def _free(self, pool: str) -> int:
        return self._capacity(pool) - self.used[pool]

    def _evictable(self, pool: str) -> int:
        return self.evictable[pool]

    def _cache(self, key: tuple[str, int]) -> None:
        """The last reference is gone: the entry stays valid and becomes reclaimable."""
        pool = self._pool(key[0])
        self.lru[pool][key] = None
        self.evictable[pool] += self._cost(key[0])

    def _uncache(self, key: tuple[str, int]) -> None:
        pool = self._pool(key[0])
        if self.lru[pool].pop(key, 0) is None:
            self.evictable[pool] -= self._cost(key[0])

    # -- events ----------------------------------------------------------------------------

    def emit(self, kind: EventKind, **kw: object) -> None:
        self.events.append(Event(kind, step=self.step, **kw))  # type: ignore[arg-type]

    def _lose(self, key: tuple[str, int], cause: Cause, requester: str) -> None:
        kind, h = key
        self.valid.pop(key)
        self._uncache(key)
        self.used[self._pool(kind)] -= self._cost(kind)
        sk = StateKind.ATTENTION if kind == "attention" else StateKind.RECURRENT
        self.emit(EventKind.LOSS, hash=h, state_kind=sk, cause=cause, requester=requester)
        if kind == "recurrent":
            slab = self.slab_of.pop(h, None)
            if slab is not None:
                self.slab_members[slab].discard(h)

    def _reclaim(self, pool: str, units: int, requester: str) -> bool:
        """Free ``units`` in ``pool`` by dropping LRU cached entries (losses for ``requester``)."""
        while self._free(pool) < units:
            victim = next(iter(self.lru[pool]), None)
            if victim is None:
                return False
            slab = self.slab_of.get(victim[1]) if victim[0] == "recurrent" else None
            if (slab is not None and self.cfg.slab_checkpoints
                    and self.rng.random() < self.cfg.slab_reclaim_probability):
                # a slab reclaim takes every cached checkpoint with a slot in the slab
                members = [m for m in sorted(self.slab_members[slab])
                           if self.valid.get(("recurrent", m)) == 0]
                for m in members:
                    self._lose(("recurrent", m), Cause.SLAB_RECLAIM, requester)
                if members:
                    continue
            self._lose(victim, Cause.ALLOCATION, requester)
        return True

    def _publish(self, req: _Req, kind: str, h: int, depth: int) -> None:
        key = (kind, h)
        if key in self.valid:  # someone published it meanwhile: a hit, take a reference
            self.valid[key] += 1
            self._uncache(key)
            req.refs.append(key)
            return
        pool, cost = self._pool(kind), self._cost(kind)
        held = req.reserved.get(pool, 0)
        if held >= cost:  # the units reserved at admission become this entry's
            req.reserved[pool] = held - cost
        elif self._reclaim(pool, cost, req.rid):
            self.used[pool] += cost
        else:
            return  # no room: the state is computed but never published
        self.valid[key] = 1
        req.refs.append(key)
        sk = StateKind.ATTENTION if kind == "attention" else StateKind.RECURRENT
        self.emit(EventKind.PUBLICATION, request_id=req.rid, hash=h, depth=depth, state_kind=sk)
        if kind == "recurrent" and self.cfg.slab_checkpoints:
            slab = self.next_ckpt_slot // self.cfg.slab_checkpoints
            self.next_ckpt_slot += 1
            self.slab_of[h] = slab
            self.slab_members.setdefault(slab, set()).add(h)

    def _release(self, req: _Req) -> None:
        for key in req.refs:
            if key in self.valid:
                self.valid[key] -= 1
                if self.valid[key] == 0:
                    self._cache(key)
        req.refs.clear()
        for pool, units in req.reserved.items():
            self.used[pool] -= units
        req.reserved.clear()
        self.emit(EventKind.RELEASE, request_id=req.rid, preemption_count=req.pc)

    # -- chains ----------------------------------------------------------------------------

    def _attn_key(self, req: _Req, i: int) -> int:
        end = (i + 1) * self.ga
        shared = end <= self.ctx_len[req.context] and not req.salt
        return _key("a", req.context, i) if shared else _key("a", req.rid, req.salt, i)

    def _rec_key(self, req: _Req, j: int) -> int:
        end = (j + 1) * self.gr
        shared = end <= self.ctx_len[req.context] and not req.salt
        return _key("r", req.context, j) if shared else _key("r", req.rid, req.salt, j)

    def _chains(self, req: _Req, tokens: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return (tuple(self._attn_key(req, i) for i in range(tokens // self.ga)),
                tuple(self._rec_key(req, j) for j in range(tokens // self.gr)))

    def _lookup(self, req: _Req, tokens: int) -> int:
        """Joint depth J over the currently valid entries (what the scheduler adopts)."""
        chain, rchain = self._chains(req, tokens)
        n = 0
        while n < len(chain) and ("attention", chain[n]) in self.valid:
            n += 1
        best = 0
        for j, h in enumerate(rchain):
            b = (j + 1) * self.gr
            if b <= n * self.ga and ("recurrent", h) in self.valid:
                best = b
        return best

    # -- scheduler -------------------------------------------------------------------------

    def _enter(self, req: _Req) -> None:
        tokens = req.prompt + req.generated
        chain, rchain = self._chains(req, tokens)
        self.emit(EventKind.WAITING_ENTRY, request_id=req.rid, preemption_count=req.pc,
                  depth=tokens, chain=chain, recurrent_chain=rchain)
        self.waiting.append(req)

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.cfg.cap:
            req = self.waiting[0]
            tokens = req.prompt + req.generated
            j = self._lookup(req, tokens)
            blocks = math.ceil((tokens - j) / self.ga)
            ckpts = tokens // self.gr - j // self.gr
            need_a = blocks * self.cfg.attention_unit_cost
            need_r = ckpts * self.cfg.checkpoint_unit_cost
            if self.cfg.recurrent_pool_units is None:
                need_a, need_r = need_a + need_r, 0
            ok = (self._free("attention") + self._evictable("attention") >= need_a and
                  (need_r == 0 or self._free("recurrent") + self._evictable("recurrent")
                   >= need_r))
            self.emit(EventKind.ALLOCATION, request_id=req.rid, preemption_count=req.pc,
                      requester=req.rid, need=need_a + need_r,
                      free=self._free("attention") + self._evictable("attention"),
                      outcome=Outcome.OK if ok else Outcome.REJECTED)
            if not ok:
                return
            self.waiting.pop(0)
            # adopt the prefix: take references first so the reclaim below cannot drop it
            chain, rchain = self._chains(req, tokens)
            adopted = [("attention", h) for h in chain[: j // self.ga]]
            if j:
                adopted.append(("recurrent", rchain[j // self.gr - 1]))
            for key in adopted:
                self.valid[key] += 1
                self._uncache(key)
                req.refs.append(key)
            self.emit(EventKind.ADOPTION, request_id=req.rid, preemption_count=req.pc, depth=j)
            for pool, need in (("attention", need_a), ("recurrent", need_r)):
                if need and self._reclaim(pool, need, req.rid):
                    self.used[pool] += need
                    req.reserved[pool] = need
            req.computed = j
            self.running.append(req)

    def _run_step(self) -> None:
        for req in list(self.running):
            if req not in self.running:
                continue  # preempted earlier in this step
            total = req.prompt + req.generated
            if req.computed < total:  # prefill chunk
                upto = min(total, req.computed + self.cfg.prefill_chunk)
                self._materialize(req, req.computed, upto)
                req.computed = upto
                continue
            if req.generated >= req.output or total >= self.cfg.max_model_tokens:
                self.running.remove(req)
                self.emit(EventKind.FINISH, request_id=req.rid, preemption_count=req.pc)
                self._release(req)
                continue
            grow = min(self.cfg.decode_tokens_per_step, req.output - req.generated)
            before = req.computed
            after = before + grow
            if after // self.ga > before // self.ga and not self._room_for_block(req):
                self._preempt()
                if req not in self.running:
                    continue
            req.generated += grow
            self._materialize(req, before, after, checkpoints=False)
            req.computed = after

    def _room_for_block(self, req: _Req) -> bool:
        if req.reserved.get("attention", 0) >= self.cfg.attention_unit_cost:
            return True
        return self._reclaim("attention", self.cfg.attention_unit_cost, req.rid)

    def _preempt(self) -> None:
        victim = self.running.pop()  # the latest admitted, as recompute preemption does
        self.emit(EventKind.PREEMPTION, request_id=victim.rid, preemption_count=victim.pc)
        self._release(victim)
        victim.pc += 1
        victim.computed = 0
        self._enter(victim)

    def _materialize(self, req: _Req, lo: int, hi: int, checkpoints: bool = True) -> None:
        """Publish the blocks and checkpoints that tokens [lo, hi) complete."""
        for i in range(lo // self.ga, hi // self.ga):
            self._publish(req, "attention", self._attn_key(req, i), (i + 1) * self.ga)
        if checkpoints:
            for j in range(lo // self.gr, min(hi, req.prompt) // self.gr):
                self._publish(req, "recurrent", self._rec_key(req, j), (j + 1) * self.gr)

    def run(self) -> list[Event]:
        cfg = self.cfg
        arrived = 0
        while arrived < cfg.requests or self.waiting or self.running:
            self.step += 1
            if arrived < cfg.requests:
                for _ in range(self._poisson(cfg.arrival_rate)):
                    if arrived == cfg.requests:
                        break
                    self._enter(self._new_request(arrived))
                    arrived += 1
            self._admit()
            self._run_step()
            if self.step > 200 * (cfg.requests + 10):
                raise RuntimeError(f"synthetic run did not drain after {self.step} steps "
                                   f"(waiting {len(self.waiting)}, running {len(self.running)})")
        self.emit(EventKind.END)
        return self.events

    def _new_request(self, i: int) -> _Req:
        cfg = self.cfg
        ctx = self.rng.randrange(cfg.contexts)
        prompt = min(self.ctx_len[ctx] + self.rng.randint(*cfg.suffix_tokens),
                     cfg.max_model_tokens - cfg.output_tokens[1])
        salt = self.rng.getrandbits(32) | 1 if self.rng.random() < cfg.salted_fraction else 0
        return _Req(f"r{i}", ctx, prompt, self.rng.randint(*cfg.output_tokens), salt)

    def _poisson(self, lam: float) -> int:
        k, p, limit = 0, 1.0, math.exp(-lam)
        while True:
            p *= self.rng.random()
            if p <= limit:
                return k
            k += 1


def synthesize_events(cfg: SynthConfig) -> list[Event]:
    return _Sim(cfg).run()


def synthesize(cfg: SynthConfig) -> pa.Table:
    """A complete event table (with its run metadata) for ``cfg``."""
    meta = {"organization": cfg.organization, "attention_grid_tokens": cfg.attention_grid_tokens,
            "recurrent_grid_tokens": cfg.recurrent_grid_tokens, "seed": cfg.seed,
            "engine": "lineage.synth"}
    return events_to_table(synthesize_events(cfg), meta)


D0_SYNTH = dict(organization="D0", attention_grid_tokens=16, recurrent_grid_tokens=1792,
                attention_unit_cost=1, checkpoint_unit_cost=1, pool_units=3256,
                recurrent_pool_units=29, slab_checkpoints=0)
