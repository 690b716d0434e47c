"""The mutant set of the organizations: plausible one-line bugs, and the script that scores it.

Each :class:`~invariants.mutation.Mutant` replaces one exact line (or a unique part of one) of
the memory core (``hybridmem/memory/{blocks,checkpoints,organization,reclaim,policy,pool,
placement,layouts}.py``);
the seams are methods and module functions that exist on main (listed by ``--seams``).
Clusters: the properties earlier suites let through (demand, pins, release order, events,
completeness, stale adoption, boundary prompts, salts) and the rest of the lifetime rules
(lookup, publication, allocation, reclaim, slabs, pools). Run::

    PYTHONPATH=. python -m invariants.mutants            # the score and the survivors
    PYTHONPATH=. python -m invariants.mutants --only pin  # mutants whose name contains "pin"

(about 2-4 minutes on one core). The slow test ``tests/invariants/test_mutants.py::
test_mutation_score_of_the_full_set`` runs the same set and requires >= 95%.
"""

from __future__ import annotations

import argparse
import sys
import time
import types

from invariants.mutation import Mutant, MutantResult, run_mutant

BLK = "hybridmem.memory.blocks"
CKP = "hybridmem.memory.checkpoints"
ORG = "hybridmem.memory.organization"
REC = "hybridmem.memory.reclaim"
POL = "hybridmem.memory.policy"
POOL = "hybridmem.memory.pool"
PLC = "hybridmem.memory.placement"
LAY = "hybridmem.memory.layouts"
SHARED = ("S0", "S1", "S2")


def _m(name: str, cluster: str, module: str, old: str, new: str, **kw: object) -> Mutant:
    return Mutant(name, cluster, module, old, new, **kw)  # type: ignore[arg-type]


MUTANTS: list[Mutant] = [
    # -- demand counting (distinct requesters, resident evidence, dropped with the entry) ----
    _m("demand-no-hit-evidence", "demand", ORG,
       "self.demand.setdefault(key, set()).add(request_id)  # resident hit evidence",
       "pass  # resident hit evidence"),
    _m("demand-evidence-when-absent", "demand", ORG,
       "            ck = self.rec_index.get(key)\n            if ck is None",
       "            ck = self.rec_index.get(key); self.demand.setdefault(key, set()).add("
       "request_id)\n            if ck is None"),
    _m("demand-no-owner-at-publication", "demand", CKP,
       "self.demand.setdefault(key, set()).add(req.request_id)  # owner registration",
       "pass  # owner registration"),
    _m("demand-no-owner-at-preemption", "demand", POL,
       "requesters.add(request_id)  # owner registration at preemption",
       "pass  # owner registration at preemption"),
    _m("demand-kept-after-loss", "demand", REC,
       "        self.demand.pop(key, None)\n", "        pass\n"),
    _m("demand-counts-pins-not-requesters", "demand", POL,
       "need=self.pin_k, free=len(requesters),", "need=self.pin_k, free=len(self.pins),"),
    # -- pin lifecycle -----------------------------------------------------------------------
    _m("pin-budget-off-by-one", "pins", POL,
       "len(self.pins) < self.pin_budget", "len(self.pins) <= self.pin_budget"),
    _m("pin-threshold-strict", "pins", POL,
       "pin = len(requesters) >= self.pin_k", "pin = len(requesters) > self.pin_k"),
    _m("pin-twice", "pins", POL,
       "            and ck.ident not in self.pins\n", "            and True\n"),
    _m("pin-shallowest", "pins", POL,
       "ck = req.ckpts[max(published)]", "ck = req.ckpts[min(published)]"),
    _m("pin-unpublished", "pins", POL,
       "published = [b for b, ck in req.ckpts.items() if ck.key]",
       "published = [b for b, ck in req.ckpts.items()]"),
    _m("pin-outcomes-swapped", "pins", POL,
       "Outcome.BELOW_THRESHOLD if len(requesters) < self.pin_k else Outcome.SKIPPED",
       "Outcome.SKIPPED if len(requesters) < self.pin_k else Outcome.BELOW_THRESHOLD"),
    _m("pin-kept-after-adoption", "pins", ORG,
       "        self._unpin_owned(request_id)\n        self._emit(EventKind.ADOPTION",
       "        pass\n        self._emit(EventKind.ADOPTION"),
    _m("pin-kept-after-finish", "pins", ORG,
       "        self._release_all(req, Cause.FINISH)\n        self._unpin_owned(request_id)",
       "        self._release_all(req, Cause.FINISH)\n        pass"),
    _m("unpin-others", "pins", POL, "            if owner == request_id:",
       "            if owner != request_id:"),
    _m("pinned-checkpoint-forgotten-on-loss", "pins", REC,
       "held = bool(ck.holders) or ck.ident in self.pins", "held = bool(ck.holders)"),
    _m("pinned-checkpoint-freed-on-release", "pins", CKP,
       "if not ck.holders and ck.ident not in self.pins and not ck.key:",
       "if not ck.holders and not ck.key:"),
    # -- release order (deepest first) and LRU -----------------------------------------------
    _m("release-checkpoints-shallowest-first", "release order", ORG,
       "map(ckpts.pop, sorted(ckpts, reverse=True))", "map(ckpts.pop, sorted(ckpts))"),
    _m("release-blocks-shallowest-first", "release order", ORG,
       "gone = blocks[::-1]  # deepest first", "gone = blocks[:]  # deepest first"),
    _m("lru-released-page-is-oldest", "release order", POOL,
       "cached[page] = None  # most recently used end",
       "cached[page] = None; cached.move_to_end(page, last=False)"),
    _m("lru-reclaims-newest", "release order", POOL,
       "return next(iter(self._cached), None)", "return next(reversed(self._cached), None)"),
    _m("make-free-reclaims-newest", "release order", REC,
       "head = pool.oldest_cached()", "head = next(reversed(pool.cached_pages()), None)"),
    _m("make-free-run-from-newest", "release order", REC,
       "self._reclaim(pool, head, Cause.ALLOCATION, requester)",
       "self._reclaim(pool, head if need - pool.num_free < 2 else "
       "pool.cached_pages()[-1], Cause.ALLOCATION, requester)"),
    _m("s2-members-age-before-slabs", "release order", PLC,
       "        return conv + members\n", "        return members + conv\n", orgs=("S2",)),
    _m("s1-conv-ages-before-members", "release order", PLC,
       "        return members + conv\n", "        return conv + members\n", orgs=("S1",),
       equivalent="S1 releases all pages of a checkpoint in one batch; reclaiming its conv page "
                  "or a member page first invalidates the same checkpoint and frees the same "
                  "pages, so only page ids differ"),
    # -- event contents ----------------------------------------------------------------------
    _m("release-cause-dropped", "events", CKP,
       "preemption_count=req.preemptions, hash=ck.key, cause=cause,",
       "preemption_count=req.preemptions, hash=ck.key, cause=Cause.NONE,"),
    _m("block-release-cause-fixed", "events", ORG,
       "page=blk.page, cause=cause)", "page=blk.page, cause=Cause.PREEMPTION)"),
    _m("adoption-only-on-hit", "events", ORG,
       "        self._emit(EventKind.ADOPTION,",
       "        if hit.j: self._emit(EventKind.ADOPTION,"),
    _m("adoption-depth-a-max", "events", ORG,
       "hash=ck.key if ck is not None else 0, depth=hit.j,",
       "hash=ck.key if ck is not None else 0, depth=hit.a_max,"),
    _m("preemption-count-not-incremented", "events", ORG,
       "        req.preemptions += 1\n", "        pass\n"),
    _m("finish-cause-none", "events", ORG,
       "self._release_all(req, Cause.FINISH)", "self._release_all(req, Cause.NONE)"),
    _m("preempt-cause-none", "events", ORG,
       "self._release_all(req, Cause.PREEMPTION)", "self._release_all(req, Cause.NONE)"),
    _m("unpin-hash-zero", "events", POL,
       "preemption_count=req.preemptions if req else 0, hash=ck.key,",
       "preemption_count=req.preemptions if req else 0, hash=0,"),
    _m("retention-outcome-always-ok", "events", POL,
       "outcome=Outcome.OK if keep else Outcome.BELOW_THRESHOLD,", "outcome=Outcome.OK,"),
    _m("allocation-outcome-always-ok", "events", ORG,
       "outcome = Outcome.OK if ok else Outcome.REJECTED", "outcome = Outcome.OK"),
    _m("allocation-free-after-need", "events", ORG,
       "need=need.total, free=avail.attention, **common",
       "need=need.total, free=avail.attention - need.total, **common"),
    _m("slab-reclaim-cause-lost", "events", REC,
       "Cause.SLAB_RECLAIM if slab else cause", "cause", orgs=("S2",)),
    _m("block-loss-without-requester", "events", REC,
       "page=blk.page, cause=cause, requester=requester)", "page=blk.page, cause=cause, "
       "requester=\"\")"),
    _m("eviction-cause-allocation", "events", REC,
       "self._reclaim(pool, page, Cause.EVICTION, \"\")",
       "self._reclaim(pool, page, Cause.ALLOCATION, \"\")"),
    _m("invalidation-cause-eviction", "events", REC,
       "self._lose_ckpt(self.rec_index[key], Cause.INVALIDATION, \"\")",
       "self._lose_ckpt(self.rec_index[key], Cause.EVICTION, \"\")"),
    _m("checkpoint-home-page-last-member", "events", CKP,
       "ck.home_page = ck.members[0]", "ck.home_page = ck.members[-1]", orgs=("S1", "S2")),
    # -- retention ---------------------------------------------------------------------------
    _m("retention-threshold-strict", "retention", POL,
       "keep = demand >= RETENTION_K", "keep = demand > RETENTION_K"),
    _m("retention-k-3", "retention", POL, "RETENTION_K = 2  #", "RETENTION_K = 3  #"),
    _m("retention-of-unpublished", "retention", POL,
       "if self.retention and ck.key:", "if self.retention:"),
    _m("retention-not-remembered", "retention", POL,
       "                    req.retained.add(ck.ident)\n", "                    pass\n"),
    _m("superseded-releases-newest", "retention", POL,
       "        del older[-1:]  # the newest", "        pass  # the newest"),
    _m("superseded-ignores-last-computed", "retention", POL,
       "            if b <= req.computed:\n", "            if b < req.computed:\n"),
    # -- checkpoint completeness -------------------------------------------------------------
    _m("checkpoint-one-member-short", "completeness", CKP,
       "ck.members = pool.take_many(self.members)", "ck.members = pool.take_many(self.members - 1)",
       orgs=("S1", "S2")),
    _m("complete-presence-only", "completeness", CKP,
       "return len(ckpt.members) == members and min(",
       "return len(ckpt.members) >= 1 and min(",
       equivalent="members lists never change length: a reclaimed member becomes "
                  "MISSING_PAGE in place, so the length test never decides (the machine "
                  "checks every hit's length itself)"),
    _m("complete-page-zero-missing", "completeness", CKP,
       "min(ckpt.members, default=0) >= 0", "min(ckpt.members, default=0) > 0"),
    _m("complete-conv-line-zero-missing", "completeness", CKP,
       "and ckpt.conv >= 0", "and ckpt.conv > 0"),
    _m("missing-member-marked-page-zero", "completeness", REC,
       "entry.members = [MISSING_PAGE if p == page else p for p in entry.members]",
       "entry.members = [0 if p == page else p for p in entry.members]"),
    _m("member-reclaim-keeps-checkpoint", "completeness", REC,
       "entry.members = [MISSING_PAGE if p == page else p for p in entry.members]",
       "entry.members = [p for p in entry.members]"),
    _m("s1-conv-reclaim-keeps-checkpoint", "completeness", PLC,
       "            ck.conv = NO_LINE\n", "            pass\n", orgs=("S1",),
       equivalent="S1 decrefs a checkpoint's members before its conv page in the same batch, "
                  "so a member page is always older in the LRU and its reclaim invalidates "
                  "the checkpoint first; the conv-page branch of detach is unreachable"),
    _m("slab-reclaim-keeps-conv", "completeness", REC,
       "                ck.conv = NO_LINE\n", "                pass\n", orgs=("S2",)),
    _m("member-reclaim-compares-line-with-page", "completeness", PLC,
       "        return  # conv is a line id here",
       "        ck.conv = NO_LINE if ck.conv == page else ck.conv  # conv is a line id here",
       orgs=("S2",), geometry="syn-slots2-members1"),
    # -- stale adoption ----------------------------------------------------------------------
    _m("adopt-stale-block", "stale adoption", ORG,
       "if blk is None or blk.page != page:", "if False:"),
    _m("adopt-stale-checkpoint", "stale adoption", ORG,
       "if ck is None or tuple(ck.members) != hit.checkpoint.members \\",
       "if ck is not None and tuple(ck.members) != hit.checkpoint.members \\"),
    _m("adopt-pins-first", "stale adoption", ORG,
       "        # 1. execution references on everything the request will read ...\n",
       "        self._unpin_owned(request_id)\n"),
    # -- lookup: boundary prompts, joint reuse -----------------------------------------------
    _m("lookup-limit-is-length", "boundary", ORG,
       "limit = len(req.tokens) - 1", "limit = len(req.tokens)"),
    _m("lookup-attention-at-length", "boundary", ORG,
       "req.attn_chain[:max(limit, 0) // ga]", "req.attn_chain[:max(limit + 1, 0) // ga]"),
    _m("lookup-recurrent-at-length", "boundary", ORG,
       "            if b > limit:\n                break\n            ck = self.rec_index",
       "            if b > limit + 1:\n                break\n            ck = self.rec_index"),
    _m("lookup-j-strictly-below-a-max", "lookup", ORG,
       "if b <= a_max:", "if b < a_max:"),
    _m("lookup-a-max-not-on-recurrent-grid", "lookup", ORG,
       "a_max = (n_attn * ga) // gr * gr", "a_max = n_attn * ga", orgs=("D0",)),
    _m("lookup-stops-at-first-missing-checkpoint", "lookup", ORG,
       "            if ck is None or not self._complete(ck):\n                continue",
       "            if ck is None or not self._complete(ck):\n                break"),
    _m("lookup-adopts-a-max-blocks", "lookup", ORG, "n_blocks = j // ga", "n_blocks = a_max // ga"),
    # -- salts -------------------------------------------------------------------------------
    _m("salt-ignored-at-registration", "salts", ORG,
       "        extra = extra_keys(cache_salt)\n", "        extra = extra_keys(None)\n"),
    _m("salt-ignored-when-appending", "salts", ORG,
       "        extra = extra_keys(req.salt)\n", "        extra = extra_keys(None)\n"),
    _m("salt-length-only", "salts", ORG,
       "        extra = extra_keys(cache_salt)\n",
       "        extra = extra_keys(None if cache_salt is None else str(len(cache_salt)))\n"),
    # -- publication -------------------------------------------------------------------------
    _m("publish-skips-closing-block", "publication", BLK,
       "stop = req.computed // self.attention_grid",
       "stop = (req.computed - 1) // self.attention_grid"),
    _m("publish-block-without-hold", "publication", BLK,
       "            blocks[0].pool.hold_many(pages)\n", "            pass\n"),
    _m("publish-skips-closing-checkpoint", "publication", CKP,
       "if b > req.computed:", "if b >= req.computed:"),
    _m("publish-duplicate-checkpoint", "publication", CKP,
       "if ck.key or key in rec_index:", "if ck.key:"),
    _m("adopt-does-not-set-top", "publication", ORG,
       "req.ckpt_top = req.computed = hit.j", "req.computed = hit.j"),
    # -- allocation --------------------------------------------------------------------------
    _m("growth-one-checkpoint-short", "allocation", ORG,
       "ceil_div(num_tokens, gr) * gr + 1, gr))", "ceil_div(num_tokens, gr) * gr, gr))"),
    _m("growth-floor-checkpoint", "allocation", ORG,
       "list(range(req.ckpt_top + gr, ceil_div(num_tokens, gr)",
       "list(range(req.ckpt_top + gr, (num_tokens // gr)"),
    _m("growth-floor-blocks", "allocation", ORG,
       "n_blocks = max(0, ceil_div(num_tokens, self.attention_grid) - len(req.blocks))",
       "n_blocks = max(0, num_tokens // self.attention_grid - len(req.blocks))"),
    _m("fits-strict", "allocation", ORG,
       "return need.total <= apool.num_available", "return need.total < apool.num_available",
       orgs=SHARED),
    _m("d0-fits-either-pool", "allocation", ORG,
       "and need.recurrent <= rpool.num_available", "or need.recurrent <= rpool.num_available",
       orgs=("D0",)),
    _m("s1-conv-page-not-counted", "allocation", PLC,
       "return count * (members + 1)", "return count * members", orgs=("S1",)),
    # a name is a stable identifier: an "-inline" mutant attacks the same operation as its
    # twin above, through a different text (each is scored on its own)
    _m("fits-strict-inline", "allocation", ORG,
       "return need.total <= apool.num_available", "return need.total + 1 <= apool.num_available",
       orgs=SHARED),
    _m("d0-fits-either-pool-inline", "allocation", ORG,
       "return need.attention <= apool.num_available \\\n            and",
       "return need.attention <= apool.num_available \\\n            or", orgs=("D0",)),
    _m("s1-conv-page-not-counted-inline", "allocation", PLC,
       "return count * (members + 1)", "return count * (members + 0)", orgs=("S1",)),
    _m("d0-inline-checkpoints-from-attention-pool", "pools", LAY,
       "        return self.dual.recurrent\n", "        return self.dual.attention\n",
       orgs=("D0",)),
    _m("d0-fixed-checkpoint-pool-attention", "pools", LAY,
       "        return self.dual.recurrent\n",
       "        return self.dual.pool_for(StateKind.ATTENTION)\n", orgs=("D0",)),
    _m("s2-counts-room-of-cached-slabs", "allocation", PLC,
       "room = self.slabs.free_slots(pool.refs)", "room = self.slabs.free_slots()",
       orgs=("S2",)),
    # allocation's reclaim of a cached block's page (_make_free -> _reclaim -> _lose_block)
    _m("make-free-inline-keeps-key", "reclaim", REC,
       "        del self.attn_index[key]\n", "        self.attn_index.get(key)\n"),
    _m("make-free-inline-waiters-kept", "reclaim", REC,
       "for waiter in self.key_waiters.pop(key):",
       "for waiter in self.key_waiters.get(key, ()):"),
    _m("make-free-inline-waiters-not-woken", "reclaim", REC,
       "                if held_by is not None:\n                    held_by.keyed = 0",
       "                if held_by is None:\n                    held_by.keyed = 0"),
    _m("make-free-inline-loss-without-requester", "events", REC,
       "self._reclaim(pool, head, Cause.ALLOCATION, requester)",
       "self._reclaim(pool, head, Cause.ALLOCATION, \"\")"),
    _m("make-free-inline-hold-kept", "reclaim", REC,
       "        blk.pool.unhold(blk.page)\n", "        pass\n"),
    _m("make-free-inline-block-stays-live", "reclaim", BLK,
       "        self.num_blocks -= 1\n", "        pass\n"),
    _m("make-free-inline-owner-kept", "reclaim", REC,
       "        pool.reclaim(page)\n        self.owner[pool.name][page] = None\n",
       "        pool.reclaim(page)\n        pass\n"),
    _m("make-free-inline-no-watcher", "reclaim", POOL,
       "self.watcher(self.name, page, \"reclaim\")", "pass",
       equivalent="the watcher is a debug hook (None in production) that changes nothing; "
                  "its 'take' call for the same page, when it is handed out, runs the same "
                  "invalidate-before-reuse check"),
    # a forgotten block's object reused by the next block on its page
    _m("spare-reuse-keeps-depth", "allocation", BLK,
       "                blk.depth = depth\n", "                pass\n"),
    # a block release drops its pages' references (_blocks_unref -> PagePool.decref_many)
    _m("unref-released-page-is-oldest", "release order", BLK,
       "pool.decref_many([blk.page for blk in blks])",
       "pool.decref_many([blk.page for blk in blks][::-1])"),
    _m("unref-in-use-not-counted", "pools", POOL,
       "                unused += 1\n", "                pass\n"),
    _m("unref-unpublished-page-cached", "pools", POOL,
       "                if holds[page]:\n                    cached[page] = None",
       "                if True:\n                    cached[page] = None"),
    # allocate takes its pages (PagePool.take_many)
    _m("allocate-take-not-counted", "pools", POOL,
       "        self.num_in_use += count\n", "        pass\n"),
    _m("allocate-take-without-reference", "pools", POOL,
       "            refs[page] = 1\n", "            refs[page] = 0\n"),
    _m("make-free-one-short", "allocation", REC,
       "        while pool.num_free < need:\n", "        while pool.num_free < need - 1:\n"),
    _m("evict-one-more", "allocation", REC,
       "while done < num_units and pool.num_cached:",
       "while done <= num_units and pool.num_cached:"),
    # -- slabs -------------------------------------------------------------------------------
    _m("slab-full-one-early", "slabs", PLC,
       "if self._used[page] == self.slots_per_slab:",
       "if self._used[page] == self.slots_per_slab - 1:", orgs=("S2",),
       geometry="syn-slots4-members2"),
    _m("slab-room-not-restored", "slabs", PLC,
       "        self._with_room[ref.page] = None\n", "        pass\n", orgs=("S2",),
       geometry="syn-slots4-members2"),
    _m("slab-never-reused", "slabs", PLC,
       "return next(iter(self._with_room), None)", "return None", orgs=("S2",)),
    _m("slab-dropped-with-occupant", "slabs", PLC,
       "if ref is not None and self.slabs.used(ref.page) == 0:",
       "if ref is not None and self.slabs.used(ref.page) <= 1:", orgs=("S2",)),
    _m("slab-slot-not-referenced", "slabs", PLC, "            pool.incref(slab)\n",
       "            pass\n", orgs=("S2",)),
    _m("sentinel-decoded", "slabs", PLC,
       "return None if ref is None else _tuple_new(SlotRef, ref)",
       "return SlotRef(*divmod(line, slots_per_slab))", orgs=("S2",)),
    _m("decode-16-slots", "slabs", PLC,
       "return None if ref is None else _tuple_new(SlotRef, ref)",
       "return None if ref is None else SlotRef(*divmod(line, 16))", orgs=("S2",),
       geometry="granite-4.0-h-micro"),
    _m("s2-built-with-16-slots", "slabs", LAY,
       "SlabSlot(pages, units.slots_per_slab)", "SlabSlot(pages, 16)", orgs=("S2",),
       geometry="granite-4.0-h-micro"),
    # -- pools -------------------------------------------------------------------------------
    _m("incref-many-keeps-page-cached", "pools", POOL,
       "del cached[page]  # cached -> in use", "pass  # cached -> in use", orgs=SHARED),
    _m("decref-many-in-use-not-counted", "pools", POOL,
       "        self.num_in_use -= unused\n", "        pass\n"),
    _m("unhold-many-frees-page-in-use", "pools", POOL,
       "if left == 0 and refs[page] == 0:", "if left == 0:"),
    _m("d0-checkpoints-in-attention-pool", "pools", POOL,
       "        if kind == StateKind.RECURRENT:\n            return self.recurrent",
       "        if kind == StateKind.RECURRENT:\n            return self.attention",
       orgs=("D0",)),
    _m("s1-built-with-3-members", "pools", LAY,
       "units.ssm_members, OwnPage(), observer", "3, OwnPage(), observer", orgs=("S1",),
       geometry="syn-slots4-members2"),
]


def score(results: list[MutantResult]) -> tuple[int, int]:
    """(killed, non-equivalent) over ``results``."""
    scored = [r for r in results if not r.mutant.equivalent]
    return sum(r.killed_on is not None for r in scored), len(scored)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Run the organization mutants against the state "
                                 "machines; print the score and the survivors.")
    ap.add_argument("--only", default="",
                    help="run only mutants whose name contains one of these (a,b,...)")
    ap.add_argument("--seams", action="store_true", help="list the patched functions and exit")
    args = ap.parse_args(argv)
    chosen = [m for m in MUTANTS if any(s in m.name for s in args.only.split(","))]
    if not chosen:
        print(f"mutants: no mutant name contains {args.only!r}", file=sys.stderr)
        return 2
    if args.seams:
        from invariants.mutation import patched_functions
        seams = sorted({m.module + ("" if isinstance(o, types.ModuleType) else
                                    f".{getattr(o, '__name__', '?')}") + f".{a}"
                        for m in chosen for o, a, _ in patched_functions(m)})
        print("\n".join(seams))
        return 0
    results = []
    t0 = time.monotonic()
    for k, m in enumerate(chosen, 1):
        r = run_mutant(m)
        results.append(r)
        status = "equivalent" if m.equivalent else ("killed" if r.killed_on else "SURVIVED")
        print(f"[{k}/{len(chosen)} {time.monotonic() - t0:6.1f}s] {m.name}: {status}"
              + (f" on {r.killed_on} ({r.error})" if r.killed_on else ""), file=sys.stderr)
    killed, total = score(results)
    print(f"mutation score: {killed}/{total} non-equivalent mutants killed "
          f"({100 * killed / max(total, 1):.1f}%), {len(results) - total} equivalent")
    for r in results:
        if r.mutant.equivalent:
            print(f"  equivalent {r.mutant.name}: {r.mutant.equivalent}"
                  + (" (but killed!)" if r.killed_on else ""))
        elif r.killed_on is None:
            print(f"  SURVIVOR {r.mutant.name} [{r.mutant.cluster}]")
    return 0 if total and killed >= 0.95 * total else 1


if __name__ == "__main__":
    sys.exit(main())
