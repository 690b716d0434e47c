"""The mutant set of the organizations: plausible one-line bugs, and the script that scores it.

Each :class:`~invariants.mutation.Mutant` replaces one exact line (or a unique part of one) of
``hybridmem/{cached_org,checkpoint,conv_slab,page_pool,dual_pools,orgs,organization}.py``;
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

CO = "hybridmem.cached_org"
SHARED = ("S0", "S1", "S2")


def _m(name: str, cluster: str, module: str, old: str, new: str, **kw: object) -> Mutant:
    return Mutant(name, cluster, module, old, new, **kw)  # type: ignore[arg-type]


MUTANTS: list[Mutant] = [
    # -- demand counting (distinct requesters, resident evidence, dropped with the entry) ----
    _m("demand-no-hit-evidence", "demand", CO,
       "self.demand.setdefault(key, set()).add(request_id)  # resident hit evidence",
       "pass  # resident hit evidence"),
    _m("demand-evidence-when-absent", "demand", CO,
       "            ck = self.rec_index.get(key)\n            if ck is None",
       "            ck = self.rec_index.get(key); self.demand.setdefault(key, set()).add("
       "request_id)\n            if ck is None"),
    _m("demand-no-owner-at-publication", "demand", CO,
       "self.demand.setdefault(key, set()).add(request_id)  # owner registration",
       "pass  # owner registration"),
    _m("demand-no-owner-at-preemption", "demand", CO,
       "requesters.add(request_id)  # owner registration at preemption",
       "pass  # owner registration at preemption"),
    _m("demand-kept-after-loss", "demand", CO,
       "        self.demand.pop(key, None)\n", "        pass\n"),
    _m("demand-counts-pins-not-requesters", "demand", CO,
       "need=self.pin_k, free=len(requesters),", "need=self.pin_k, free=len(self.pins),"),
    # -- pin lifecycle -----------------------------------------------------------------------
    _m("pin-budget-off-by-one", "pins", CO,
       "len(self.pins) < self.pin_budget", "len(self.pins) <= self.pin_budget"),
    _m("pin-threshold-strict", "pins", CO,
       "pin = len(requesters) >= self.pin_k", "pin = len(requesters) > self.pin_k"),
    _m("pin-twice", "pins", CO,
       "                and ck.ident not in self.pins\n", "                and True\n"),
    _m("pin-shallowest", "pins", CO,
       "ck = req.ckpts[max(published)]", "ck = req.ckpts[min(published)]"),
    _m("pin-unpublished", "pins", CO,
       "published = [b for b, ck in req.ckpts.items() if ck.key]",
       "published = [b for b, ck in req.ckpts.items()]"),
    _m("pin-outcomes-swapped", "pins", CO,
       "Outcome.BELOW_THRESHOLD if len(requesters) < self.pin_k else Outcome.SKIPPED",
       "Outcome.SKIPPED if len(requesters) < self.pin_k else Outcome.BELOW_THRESHOLD"),
    _m("pin-kept-after-adoption", "pins", CO,
       "            self._unpin_owned(request_id)\n        if self._emitting:",
       "            pass\n        if self._emitting:"),
    _m("pin-kept-after-finish", "pins", CO,
       "        self._release_all(req, _FINISH)\n        if self.pins:"
       "  # (none: _unpin_owned finds nothing to unpin)\n            self._unpin_owned(request_id)",
       "        self._release_all(req, _FINISH)\n        if self.pins:"
       "  # (none: _unpin_owned finds nothing to unpin)\n            pass"),
    _m("unpin-others", "pins", CO, "            if owner == request_id:",
       "            if owner != request_id:"),
    _m("pinned-checkpoint-forgotten-on-loss", "pins", CO,
       "held = bool(ck.holders) or ck.ident in self.pins", "held = bool(ck.holders)"),
    _m("pinned-checkpoint-freed-on-release", "pins", CO,
       "if not ck.holders and ck.ident not in self.pins and not ck.key:",
       "if not ck.holders and not ck.key:"),
    # -- release order (deepest first) and LRU -----------------------------------------------
    _m("release-checkpoints-shallowest-first", "release order", CO,
       "map(ckpts.pop, sorted(ckpts, reverse=True))", "map(ckpts.pop, sorted(ckpts))"),
    _m("release-blocks-shallowest-first", "release order", CO,
       "gone = blocks[::-1]  # deepest first", "gone = blocks[:]  # deepest first"),
    _m("lru-released-page-is-oldest", "release order", "hybridmem.page_pool",
       "cached[page] = None  # most recently used end",
       "cached[page] = None; cached.move_to_end(page, last=False)"),
    _m("lru-reclaims-newest", "release order", "hybridmem.page_pool",
       "return next(iter(self._cached), None)", "return next(reversed(self._cached), None)"),
    _m("make-free-reclaims-newest", "release order", CO,
       "head = next(iter(cached), None)  # pool.oldest_cached()",
       "head = next(reversed(cached), None)  # pool.oldest_cached()"),
    _m("make-free-run-from-newest", "release order", CO,
       "list(islice(cached, short))", "list(islice(reversed(cached), short))"),
    _m("s2-members-age-before-slabs", "release order", CO,
       "(conv + members if self.placement", "(members + conv if self.placement",
       orgs=("S2",)),
    _m("s1-conv-ages-before-members", "release order", CO,
       "else members + conv)", "else conv + members)", orgs=("S1",),
       equivalent="S1 releases all pages of a checkpoint in one batch; reclaiming its conv page "
                  "or a member page first invalidates the same checkpoint and frees the same "
                  "pages, so only page ids differ"),
    # -- event contents ----------------------------------------------------------------------
    _m("release-cause-dropped", "events", CO,
       "preemption_count=req.preemptions, hash=ck.key, cause=cause,",
       "preemption_count=req.preemptions, hash=ck.key, cause=Cause.NONE,"),
    _m("block-release-cause-fixed", "events", CO,
       "                           page=blk.page, cause=cause)",
       "                           page=blk.page, cause=Cause.PREEMPTION)"),
    _m("adoption-only-on-hit", "events", CO,
       "        self._emit(EventKind.ADOPTION,",
       "        if hit.j: self._emit(EventKind.ADOPTION,"),
    _m("adoption-depth-a-max", "events", CO,
       "hash=ck.key if ck is not None else 0, depth=hit.j,",
       "hash=ck.key if ck is not None else 0, depth=hit.a_max,"),
    _m("preemption-count-not-incremented", "events", CO,
       "        req.preemptions += 1\n", "        pass\n"),
    _m("finish-cause-none", "events", CO,
       "self._release_all(req, _FINISH)", "self._release_all(req, Cause.NONE)"),
    _m("preempt-cause-none", "events", CO,
       "self._release_all(req, Cause.PREEMPTION)", "self._release_all(req, Cause.NONE)"),
    _m("unpin-hash-zero", "events", CO,
       "preemption_count=req.preemptions if req else 0, hash=ck.key,",
       "preemption_count=req.preemptions if req else 0, hash=0,"),
    _m("retention-outcome-always-ok", "events", CO,
       "outcome=Outcome.OK if keep else Outcome.BELOW_THRESHOLD,", "outcome=Outcome.OK,"),
    _m("allocation-outcome-always-ok", "events", CO,
       "outcome = Outcome.OK if ok else Outcome.REJECTED", "outcome = Outcome.OK"),
    _m("allocation-free-after-need", "events", CO,
       "need=need.total, free=avail.attention, **common",
       "need=need.total, free=avail.attention - need.total, **common"),
    _m("slab-reclaim-cause-lost", "events", CO,
       "_SLAB_RECLAIM if slab else cause", "cause", orgs=("S2",)),
    _m("block-loss-without-requester", "events", CO,
       "page=blk.page, cause=cause, requester=requester)", "page=blk.page, cause=cause, "
       "requester=\"\")",
       equivalent="_lose_block is reached with a requester only through _reclaim from "
                  "_make_free, which reclaims a cached block's page inline (see "
                  "make-free-inline-loss-without-requester); evict and invalidate pass ''"),
    _m("eviction-cause-allocation", "events", CO,
       "self._reclaim(pool, page, Cause.EVICTION, \"\")",
       "self._reclaim(pool, page, Cause.ALLOCATION, \"\")"),
    _m("invalidation-cause-eviction", "events", CO,
       "self._lose_ckpt(self.rec_index[key], Cause.INVALIDATION, \"\")",
       "self._lose_ckpt(self.rec_index[key], Cause.EVICTION, \"\")"),
    _m("checkpoint-home-page-last-member", "events", CO,
       "ck.home_page = ck.members[0]", "ck.home_page = ck.members[-1]", orgs=("S1", "S2")),
    # -- retention ---------------------------------------------------------------------------
    _m("retention-threshold-strict", "retention", CO,
       "keep = demand >= RETENTION_K", "keep = demand > RETENTION_K"),
    _m("retention-k-3", "retention", CO, "RETENTION_K = 2  #", "RETENTION_K = 3  #"),
    _m("retention-of-unpublished", "retention", CO,
       "if self.retention and ck.key:", "if self.retention:"),
    _m("retention-not-remembered", "retention", CO,
       "                    req.retained.add(ck.ident)\n", "                    pass\n"),
    _m("superseded-releases-newest", "retention", CO,
       "        del older[-1:]  # the newest", "        pass  # the newest"),
    _m("superseded-ignores-last-computed", "retention", CO,
       "            if b <= computed:\n                older.append(b)",
       "            if b < computed:\n                older.append(b)"),
    # -- checkpoint completeness -------------------------------------------------------------
    _m("checkpoint-one-member-short", "completeness", CO,
       "ck.members = pool.take_many(self.members)", "ck.members = pool.take_many(self.members - 1)",
       orgs=("S1", "S2")),
    _m("complete-presence-only", "completeness", "hybridmem.checkpoint",
       "return len(ckpt.members) == members and min(",
       "return len(ckpt.members) >= 1 and min(",
       equivalent="members lists never change length: a reclaimed member becomes "
                  "MISSING_PAGE in place, so the length test never decides (the machine "
                  "checks every hit's length itself)"),
    _m("complete-page-zero-missing", "completeness", "hybridmem.checkpoint",
       "min(ckpt.members, default=0) >= 0", "min(ckpt.members, default=0) > 0"),
    _m("complete-conv-line-zero-missing", "completeness", "hybridmem.checkpoint",
       "and ckpt.conv >= 0", "and ckpt.conv > 0"),
    _m("missing-member-marked-page-zero", "completeness", CO,
       "entry.members = [MISSING_PAGE if p == page else p for p in entry.members]",
       "entry.members = [0 if p == page else p for p in entry.members]"),
    _m("member-reclaim-keeps-checkpoint", "completeness", CO,
       "entry.members = [MISSING_PAGE if p == page else p for p in entry.members]",
       "entry.members = [p for p in entry.members]"),
    _m("s1-conv-reclaim-keeps-checkpoint", "completeness", CO,
       "            entry.conv = NO_LINE  # S2's conv", "            pass  # S2's conv",
       orgs=("S1",),
       equivalent="S1 decrefs a checkpoint's members before its conv page in the same batch, "
                  "so a member page is always older in the LRU and its reclaim invalidates "
                  "the checkpoint first; the conv-page branch of _detach is unreachable"),
    _m("slab-reclaim-keeps-conv", "completeness", CO,
       "                ck.conv = NO_LINE\n", "                pass\n", orgs=("S2",)),
    _m("member-reclaim-compares-line-with-page", "completeness", CO,
       "if self.placement == _PAGE and entry.conv == page:",
       "if entry.conv == page:", orgs=("S2",), geometry="syn-slots2-members1"),
    # -- stale adoption ----------------------------------------------------------------------
    _m("adopt-stale-block", "stale adoption", CO,
       "if blk is None or blk.page != page:", "if False:"),
    _m("adopt-stale-checkpoint", "stale adoption", CO,
       "if ck is None or tuple(ck.members) != hit.checkpoint.members \\",
       "if ck is not None and tuple(ck.members) != hit.checkpoint.members \\"),
    _m("adopt-pins-first", "stale adoption", CO,
       "        # 1. execution references on everything the request will read ...\n",
       "        self._unpin_owned(request_id)\n"),
    # -- lookup: boundary prompts, joint reuse -----------------------------------------------
    _m("lookup-limit-is-length", "boundary", CO,
       "limit = len(req.tokens) - 1", "limit = len(req.tokens)"),
    _m("lookup-attention-at-length", "boundary", CO,
       "req.attn_chain[:max(limit, 0) // ga]", "req.attn_chain[:max(limit + 1, 0) // ga]"),
    _m("lookup-recurrent-at-length", "boundary", CO,
       "            if b > limit:\n                break\n            ck = self.rec_index",
       "            if b > limit + 1:\n                break\n            ck = self.rec_index"),
    _m("lookup-j-strictly-below-a-max", "lookup", CO,
       "if b <= a_max:", "if b < a_max:"),
    _m("lookup-a-max-not-on-recurrent-grid", "lookup", CO,
       "a_max = (n_attn * ga) // gr * gr", "a_max = n_attn * ga", orgs=("D0",)),
    _m("lookup-stops-at-first-missing-checkpoint", "lookup", CO,
       "            if ck is None or not self._complete(ck):\n                continue",
       "            if ck is None or not self._complete(ck):\n                break"),
    _m("lookup-adopts-a-max-blocks", "lookup", CO, "n_blocks = j // ga", "n_blocks = a_max // ga"),
    # -- salts -------------------------------------------------------------------------------
    _m("salt-ignored-at-registration", "salts", CO,
       "        extra = extra_keys(cache_salt)\n", "        extra = extra_keys(None)\n"),
    _m("salt-ignored-when-appending", "salts", CO,
       "        extra = extra_keys(req.salt)\n", "        extra = extra_keys(None)\n"),
    _m("salt-length-only", "salts", CO,
       "        extra = extra_keys(cache_salt)\n",
       "        extra = extra_keys(None if cache_salt is None else str(len(cache_salt)))\n"),
    # -- publication -------------------------------------------------------------------------
    _m("publish-skips-closing-block", "publication", CO,
       "stop = computed // self.attention_grid", "stop = (computed - 1) // self.attention_grid"),
    _m("publish-block-without-hold", "publication", CO,
       "                holds[page] += 1\n", "                pass\n"),
    _m("publish-skips-closing-checkpoint", "publication", CO,
       "if b > req.computed:", "if b >= req.computed:"),
    _m("publish-duplicate-checkpoint", "publication", CO,
       "if ck.key or key in rec_index:", "if ck.key:"),
    _m("adopt-does-not-set-top", "publication", CO,
       "req.ckpt_top = req.computed = hit.j", "req.computed = hit.j"),
    # -- allocation --------------------------------------------------------------------------
    _m("growth-one-checkpoint-short", "allocation", CO,
       "list(range(req.ckpt_top + gr, top + 1, gr))", "list(range(req.ckpt_top + gr, top, gr))"),
    _m("growth-floor-checkpoint", "allocation", CO,
       "top = -(-num_tokens // gr) * gr", "top = num_tokens // gr * gr"),
    _m("growth-floor-blocks", "allocation", CO,
       "blocks = max(0, -(-num_tokens // self.attention_grid) - len(req.blocks))",
       "blocks = max(0, num_tokens // self.attention_grid - len(req.blocks))"),
    _m("fits-strict", "allocation", CO,
       "return need[0] + need[1] <= len(apool._free) + len(apool._cached)",
       "return need[0] + need[1] < len(apool._free) + len(apool._cached)", orgs=SHARED),
    _m("d0-fits-either-pool", "allocation", CO,
       "len(apool._free) + len(apool._cached) \\\n            and need.recurrent",
       "len(apool._free) + len(apool._cached) \\\n            or need.recurrent",
       orgs=("D0",)),
    _m("s1-conv-page-not-counted", "allocation", CO,
       "return count * (self.members + (self.placement == _PAGE))",
       "return count * self.members", orgs=("S1",)),
    # allocate's inline admission (available / _pools_for / _fits_in /
    # _ckpt_units / _ckpt_pool without their frames, where they are the organization's own)
    _m("fits-strict-inline", "allocation", CO,
       "ok = n_blocks + n_rec <= na", "ok = n_blocks + n_rec < na", orgs=SHARED),
    _m("d0-fits-either-pool-inline", "allocation", CO,
       "ok = n_blocks <= na and n_rec <= nr", "ok = n_blocks <= na or n_rec <= nr",
       orgs=("D0",)),
    _m("s1-conv-page-not-counted-inline", "allocation", CO,
       "self._units_each = (self.members + (self.placement == _PAGE)",
       "self._units_each = (self.members + 0", orgs=("S1",)),
    _m("d0-inline-checkpoints-from-attention-pool", "pools", "hybridmem.orgs",
       "(by_kind[_ATTENTION], by_kind[_RECURRENT]), _D0_ADMISSION)",
       "(by_kind[_ATTENTION], by_kind[_ATTENTION]), _D0_ADMISSION)", orgs=("D0",)),
    _m("d0-fixed-checkpoint-pool-attention", "pools", "hybridmem.orgs",
       "self._fixed_ckpt_pool = self.dual.by_kind[_RECURRENT]",
       "self._fixed_ckpt_pool = self.dual.by_kind[_ATTENTION]", orgs=("D0",)),
    _m("s2-counts-room-of-cached-slabs", "allocation", "hybridmem.orgs",
       "room = self.slabs.free_slots(self.pool.refs)", "room = self.slabs.free_slots()",
       orgs=("S2",)),
    # the inline block reclaim of _make_free (the LRU head is a cached block's page)
    _m("make-free-inline-keeps-key", "reclaim", CO,
       "            del attn_index[key]\n", "            attn_index.get(key)\n"),
    _m("make-free-inline-waiters-kept", "reclaim", CO,
       "for waiter in waiters.pop(key):", "for waiter in waiters.get(key, ()):"),
    _m("make-free-inline-waiters-not-woken", "reclaim", CO,
       "                        if held_by is not None:\n"
       "                            held_by.keyed = 0",
       "                        if held_by is None:\n"
       "                            held_by.keyed = 0"),
    _m("make-free-inline-loss-without-requester", "events", CO,
       "state_kind=StateKind.ATTENTION, page=page, cause=cause,\n"
       "                               requester=requester)",
       "state_kind=StateKind.ATTENTION, page=page, cause=cause,\n"
       "                               requester=\"\")"),
    _m("make-free-inline-hold-kept", "reclaim", CO,
       "            holds[page] = 0  # pool.unhold", "            holds[page] = 1  # pool.unhold"),
    _m("make-free-inline-block-stays-live", "reclaim", CO,
       "lost += 1  # no holder", "pass  # no holder"),
    _m("make-free-inline-owner-kept", "reclaim", CO,
       "                owners[page] = None\n                spare[page] = blk\n"
       "                if watcher is not None:  # pool.reclaim",
       "                pass\n                spare[page] = blk\n"
       "                if watcher is not None:  # pool.reclaim",
       equivalent="the organization reads a page's owner record only while the page is "
                  "cached (_detach); a page _make_free frees is cached again only after a "
                  "take, which overwrites the record"),
    _m("make-free-inline-no-watcher", "reclaim", CO,
       "watcher(pool.name, page, \"reclaim\")", "pass",
       equivalent="the watcher is a debug hook (None in production) that changes nothing; "
                  "its 'take' call for the same page, when it is handed out, runs the same "
                  "invalidate-before-reuse check"),
    # a forgotten block's object reused by the next block on its page
    _m("spare-reuse-keeps-depth", "allocation", CO,
       "                    blk.depth = depth\n", "                    pass\n"),
    # _blocks_unref drops the pages' references itself (as PagePool.decref_many)
    _m("unref-released-page-is-oldest", "release order", CO,
       "cached[page] = None  # most recently used end of the LRU",
       "cached[page] = None; cached.move_to_end(page, last=False)"),
    _m("unref-in-use-not-counted", "pools", CO,
       "        pool.num_in_use -= unused\n", "        pass\n"),
    _m("unref-unpublished-page-cached", "pools", CO,
       "                if holds[page]:\n                    cached[page] = None",
       "                if True:\n                    cached[page] = None"),
    # allocate takes its blocks' pages itself (as PagePool.take_many)
    _m("allocate-take-not-counted", "pools", CO,
       "            apool.num_in_use += n_blocks\n", "            pass\n"),
    _m("allocate-take-without-reference", "pools", CO,
       "                refs[page] = 1\n", "                refs[page] = 0\n"),
    _m("make-free-one-short", "allocation", CO,
       "        while len(free) < need:\n", "        while len(free) < need - 1:\n"),
    _m("evict-one-more", "allocation", CO,
       "while done < num_units and pool.num_cached:",
       "while done <= num_units and pool.num_cached:"),
    # -- slabs -------------------------------------------------------------------------------
    _m("slab-full-one-early", "slabs", "hybridmem.conv_slab",
       "if self._used[page] == self.slots_per_slab:",
       "if self._used[page] == self.slots_per_slab - 1:", orgs=("S2",),
       geometry="syn-slots4-members2"),
    _m("slab-room-not-restored", "slabs", "hybridmem.conv_slab",
       "        self._with_room[ref.page] = None\n", "        pass\n", orgs=("S2",),
       geometry="syn-slots4-members2"),
    _m("slab-never-reused", "slabs", "hybridmem.conv_slab",
       "return next(iter(self._with_room), None)", "return None", orgs=("S2",)),
    _m("slab-dropped-with-occupant", "slabs", CO,
       "if ref is not None and self.slabs.used(ref.page) == 0:",
       "if ref is not None and self.slabs.used(ref.page) <= 1:", orgs=("S2",)),
    _m("slab-slot-not-referenced", "slabs", CO, "                pool.incref(slab)\n",
       "                pass\n", orgs=("S2",)),
    _m("sentinel-decoded", "slabs", "hybridmem.conv_slab",
       "return None if ref is None else _tuple_new(SlotRef, ref)",
       "return SlotRef(*divmod(line, slots_per_slab))", orgs=("S2",)),
    _m("decode-16-slots", "slabs", "hybridmem.conv_slab",
       "return None if ref is None else _tuple_new(SlotRef, ref)",
       "return None if ref is None else SlotRef(*divmod(line, 16))", orgs=("S2",),
       geometry="granite-4.0-h-micro"),
    _m("s2-built-with-16-slots", "slabs", "hybridmem.orgs",
       "self.slabs = SlabTable(num_pages, slots_per_slab)",
       "self.slabs = SlabTable(num_pages, 16)", orgs=("S2",), geometry="granite-4.0-h-micro"),
    # -- pools -------------------------------------------------------------------------------
    _m("incref-many-keeps-page-cached", "pools", "hybridmem.page_pool",
       "del cached[page]  # cached -> in use", "pass  # cached -> in use", orgs=SHARED),
    _m("decref-many-in-use-not-counted", "pools", "hybridmem.page_pool",
       "        self.num_in_use -= unused\n", "        pass\n"),
    _m("unhold-many-frees-page-in-use", "pools", "hybridmem.page_pool",
       "if left == 0 and refs[page] == 0:", "if left == 0:"),
    _m("d0-checkpoints-in-attention-pool", "pools", "hybridmem.dual_pools",
       "        if kind == _RECURRENT:\n            return self.recurrent",
       "        if kind == _RECURRENT:\n            return self.attention",
       orgs=("D0",)),
    _m("s1-built-with-3-members", "pools", "hybridmem.orgs",
       "        self.members = ssm_members\n        super().__init__(num_pages, page_bytes, "
       "grid_tokens, observer, **policy)\n\n\nclass S2",
       "        self.members = 3\n        super().__init__(num_pages, page_bytes, "
       "grid_tokens, observer, **policy)\n\n\nclass S2", orgs=("S1",),
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
