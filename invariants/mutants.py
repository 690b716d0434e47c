"""The mutant set of the memory core: plausible bugs named by behaviour, and the script that
scores it.

Each mutant is a :class:`~invariants.seams.SeamMutant` at a function or method of the memory
core (``hybridmem/memory/{blocks,checkpoints,organization,reclaim,policy,pool,placement,
layouts}.py``) with an AST operator matched by its kind and the names it touches, or a wrapper
(:mod:`invariants.seams`): no line of text, so reformatting or renaming around a rule leaves the
mutant applicable, and a refactor that moves the rule raises :class:`~invariants.seams.
SeamGone` when the mutant is built (``--check`` and the default suite build every one). A
:class:`CoreMutant` also names the organizations whose state machines run it and the geometry.
Clusters: the properties earlier suites let through (demand, pins, release order, events,
completeness, stale adoption, boundary prompts, salts) and the rest of the lifetime rules
(lookup, publication, allocation, reclaim, slabs, pools). Run::

    PYTHONPATH=. python -m invariants.mutants            # the score and the survivors
    PYTHONPATH=. python -m invariants.mutants --only pin  # mutants whose name contains "pin"
    PYTHONPATH=. python -m invariants.mutants --check     # every seam and site resolves
    PYTHONPATH=. python -m invariants.mutants --show pin-twice  # the rewritten function

(about 2-4 minutes on one core). A mutant is *killed* when any state machine it runs on fails
(any exception: a model assertion, an App. D.2 checker, an internal assertion or a crash). The
slow test ``tests/invariants/test_mutants.py::test_mutation_score_of_the_full_set`` runs the
same set and requires every non-equivalent mutant killed.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from invariants.seams import (
    AlwaysTrue,
    Chain,
    DropAssign,
    DropCall,
    FlipCompare,
    GuardCall,
    InsertFirst,
    MoveCall,
    Negate,
    Op,
    ReplaceArg,
    ReplaceConst,
    ReplaceName,
    Reverse,
    Seam,
    SeamMutant,
    SwapBoolOp,
    SwapJump,
    SwapOperands,
    Wrap,
    applied,
    mutated_source,
    replaced,
    skip,
)
from invariants.stateful import GEOMETRIES, MACHINES, machine_for

# No shrinking: a kill needs one failing program.
MUTANT_SETTINGS = settings(max_examples=150, stateful_step_count=40, derandomize=True,
                           deadline=None, database=None, report_multiple_bugs=False,
                           phases=[Phase.explicit, Phase.generate],
                           suppress_health_check=list(HealthCheck))

BLK = "hybridmem.memory.blocks"
CKP = "hybridmem.memory.checkpoints"
ORG = "hybridmem.memory.organization"
REC = "hybridmem.memory.reclaim"
POL = "hybridmem.memory.policy"
POOL = "hybridmem.memory.pool"
PLC = "hybridmem.memory.placement"
LAY = "hybridmem.memory.layouts"
ALL = ("S0", "S1", "S2", "D0")
SHARED = ("S0", "S1", "S2")


@dataclass(frozen=True)
class CoreMutant(SeamMutant):
    """A seam mutant of the memory core, run on the state machines of ``orgs`` on
    ``geometry`` (a :data:`~invariants.stateful.GEOMETRIES` key; None: Falcon-H1-7B)."""

    orgs: tuple[str, ...] = field(default=ALL, kw_only=True)
    geometry: str | None = field(default=None, kw_only=True)


def _m(name: str, cluster: str, module: str, qualname: str, change: Op | Wrap,
       why: str = "", **kw: Any) -> CoreMutant:
    return CoreMutant(name, cluster, Seam(module, qualname), change, why, **kw)


def _s2_detach_like_s1() -> Wrap:
    from hybridmem.memory.placement import OwnPage
    return replaced(OwnPage.detach, "S1's detach: a conv line compared with a page id")


def _decode_sentinel_too() -> Wrap:
    from hybridmem.memory.placement import SlotRef

    def decode_line(line: int, slots_per_slab: int) -> SlotRef:
        return SlotRef(*divmod(line, slots_per_slab))
    return replaced(decode_line, "every line decoded, the sentinel -1 too")


MUTANTS: list[CoreMutant] = [
    # -- demand counting (distinct requesters, resident evidence, dropped with the entry) ----
    _m("demand-no-hit-evidence", "demand", ORG, "MemoryOrganization.lookup",
       DropCall("add", touches="demand"), "a resident hit does not count as demand"),
    _m("demand-evidence-when-absent", "demand", ORG, "MemoryOrganization.lookup",
       MoveCall("add", before="_complete", touches="demand"),
       "a lookup counts as demand for a checkpoint that is absent or incomplete"),
    _m("demand-no-owner-at-publication", "demand", CKP, "Checkpoints._publish_ckpts",
       DropCall("add", touches="demand"), "the producer is not a requester of what it publishes"),
    _m("demand-no-owner-at-preemption", "demand", POL, "Policy._pin_on_preemption",
       DropCall("add", touches="request_id"), "the preempted owner is not a requester"),
    _m("demand-kept-after-loss", "demand", REC, "Reclaim._lose_ckpt",
       DropCall("pop", touches="demand"),
       "a lost checkpoint's requesters still count towards the next one with its key"),
    _m("demand-counts-pins-not-requesters", "demand", POL, "Policy._pin_on_preemption",
       ReplaceArg("_emit", "free", "len(self.pins)"), "the PIN event reports pins as demand"),
    # -- pin lifecycle -----------------------------------------------------------------------
    _m("pin-budget-off-by-one", "pins", POL, "Policy._pin_on_preemption",
       FlipCompare("<", "<=", touches="pin_budget"), "one pin more than the budget"),
    _m("pin-threshold-strict", "pins", POL, "Policy._pin_on_preemption",
       FlipCompare(">=", ">", touches="pin_k"),
       "a checkpoint with exactly pin_k requesters is not pinned"),
    _m("pin-twice", "pins", POL, "Policy._pin_on_preemption",
       AlwaysTrue("pins", in_assign="pin"), "a pinned checkpoint is pinned again"),
    _m("pin-shallowest", "pins", POL, "Policy._pin_on_preemption", ReplaceName("max", "min"),
       "the shallowest published checkpoint is pinned instead of the deepest"),
    _m("pin-unpublished", "pins", POL, "Policy._pin_on_preemption",
       AlwaysTrue("key", in_assign="published"), "an unpublished checkpoint may be pinned"),
    _m("pin-outcomes-swapped", "pins", POL, "Policy._pin_on_preemption",
       Negate("pin_k", in_assign="outcome"), "BELOW_THRESHOLD and SKIPPED swapped"),
    _m("pin-kept-after-adoption", "pins", ORG, "MemoryOrganization.adopt",
       DropCall("_unpin_owned"), "an adopter keeps the pins that protected its checkpoint"),
    _m("pin-kept-after-finish", "pins", ORG, "MemoryOrganization.finish",
       DropCall("_unpin_owned"), "a finished request keeps its pins"),
    _m("unpin-others", "pins", POL, "Policy._unpin_owned",
       FlipCompare("==", "!=", touches="owner"), "a request releases every pin but its own"),
    _m("pinned-checkpoint-forgotten-on-loss", "pins", REC, "Reclaim._lose_ckpt",
       AlwaysTrue("pins", value=False), "a pinned checkpoint that loses its key is freed"),
    _m("pinned-checkpoint-freed-on-release", "pins", CKP, "Checkpoints._ckpt_unref",
       AlwaysTrue("pins"), "a checkpoint released by its last holder is freed although pinned"),
    # -- release order (deepest first) and LRU -----------------------------------------------
    _m("release-checkpoints-shallowest-first", "release order", ORG,
       "MemoryOrganization._release_all", ReplaceArg("sorted", "reverse", None),
       "checkpoints are released shallowest first"),
    _m("release-blocks-shallowest-first", "release order", ORG,
       "MemoryOrganization._release_all", ReplaceConst(-1, 1),
       "blocks are released shallowest first"),
    _m("lru-released-page-is-oldest", "release order", POOL, "PagePool.decref_many",
       InsertFirst("cached"), "a page that becomes cached joins the LRU at its oldest end"),
    _m("lru-reclaims-newest", "release order", POOL, "PagePool.oldest_cached",
       ReplaceName("iter", "reversed"), "the LRU hands out its newest page"),
    _m("make-free-reclaims-newest", "release order", REC, "Reclaim._make_free",
       ReplaceName("pool.oldest_cached", "(lambda: next(reversed(pool.cached_pages()), None))"),
       "allocation reclaims the newest cached page"),
    _m("make-free-run-from-newest", "release order", REC, "Reclaim._make_free",
       ReplaceArg("_reclaim", 1, "head if need - pool.num_free < 2 else pool.cached_pages()[-1]"),
       "an allocation that reclaims several pages takes all but the last from the newest end"),
    _m("s2-members-age-before-slabs", "release order", PLC, "SlabSlot.release_order",
       SwapOperands("+"), "S2's member pages age before the slab released with them",
       orgs=("S2",)),
    _m("s1-conv-ages-before-members", "release order", PLC, "OwnPage.release_order",
       SwapOperands("+"), "S1's conv page ages before the member pages", orgs=("S1",),
       equivalent="S1 releases all pages of a checkpoint in one batch; reclaiming its conv page "
                  "or a member page first invalidates the same checkpoint and frees the same "
                  "pages, so only page ids differ"),
    # -- event contents ----------------------------------------------------------------------
    _m("release-cause-dropped", "events", CKP, "Checkpoints._ckpt_unref",
       ReplaceArg("_emit", "cause", "Cause.NONE"), "a checkpoint's RELEASE carries no cause"),
    _m("block-release-cause-fixed", "events", ORG, "MemoryOrganization._release_all",
       ReplaceArg("_emit", "cause", "Cause.PREEMPTION"), "a block's RELEASE says PREEMPTION"),
    _m("adoption-only-on-hit", "events", ORG, "MemoryOrganization.adopt",
       GuardCall("_emit", "hit.j"), "no ADOPTION event at j = 0"),
    _m("adoption-depth-a-max", "events", ORG, "MemoryOrganization.adopt",
       ReplaceArg("_emit", "depth", "hit.a_max"), "ADOPTION reports A_max instead of J"),
    _m("preemption-count-not-incremented", "events", ORG, "MemoryOrganization.preempt",
       DropAssign("req.preemptions"), "events after a preemption carry the old count"),
    _m("finish-cause-none", "events", ORG, "MemoryOrganization.finish",
       ReplaceArg("_release_all", 1, "Cause.NONE"), "a finish releases with no cause"),
    _m("preempt-cause-none", "events", ORG, "MemoryOrganization.preempt",
       ReplaceArg("_release_all", 1, "Cause.NONE"), "a preemption releases with no cause"),
    _m("unpin-hash-zero", "events", POL, "Policy._unpin_owned",
       ReplaceArg("_emit", "hash", "0"), "UNPIN carries no key"),
    _m("retention-outcome-always-ok", "events", POL, "Policy.release_superseded",
       ReplaceArg("_emit", "outcome", "Outcome.OK"), "RETENTION says OK below the threshold"),
    _m("allocation-outcome-always-ok", "events", ORG, "MemoryOrganization._emit_allocation",
       ReplaceName("ok", "True"), "a rejected ALLOCATION says OK"),
    _m("allocation-free-after-need", "events", ORG, "MemoryOrganization._emit_allocation",
       ReplaceArg("_emit", "free", "avail.attention - need.total", touches="total"),
       "a shared pool's ALLOCATION reports the room left after it"),
    _m("slab-reclaim-cause-lost", "events", REC, "Reclaim._reclaim",
       ReplaceName("slab", "False", in_call="_lose_ckpt"),
       "a slab reclaim's losses carry the allocation's cause", orgs=("S2",)),
    _m("block-loss-without-requester", "events", REC, "Reclaim._lose_block",
       ReplaceArg("_emit", "requester", '""'), "a block's LOSS names no requester"),
    _m("eviction-cause-allocation", "events", REC, "Reclaim.evict",
       ReplaceArg("_reclaim", 2, "Cause.ALLOCATION"), "an eviction's losses say ALLOCATION"),
    _m("invalidation-cause-eviction", "events", REC, "Reclaim.invalidate",
       ReplaceArg("_lose_ckpt", 1, "Cause.EVICTION"),
       "an invalidated checkpoint's LOSS says EVICTION"),
    _m("checkpoint-home-page-last-member", "events", CKP, "Checkpoints._new_checkpoint",
       ReplaceConst(0, -1, in_assign="ck.home_page"),
       "a checkpoint's events name its last member page", orgs=("S1", "S2")),
    # -- retention ---------------------------------------------------------------------------
    _m("retention-threshold-strict", "retention", POL, "Policy.release_superseded",
       FlipCompare(">=", ">", touches="RETENTION_K"),
       "a checkpoint with exactly K = 2 requesters is not retained"),
    _m("retention-k-3", "retention", POL, "Policy.release_superseded",
       ReplaceName("RETENTION_K", "3", every=True), "retention needs three requesters"),
    _m("retention-of-unpublished", "retention", POL, "Policy.release_superseded",
       AlwaysTrue("key"), "an unpublished checkpoint is weighed for retention"),
    _m("retention-not-remembered", "retention", POL, "Policy.release_superseded",
       DropCall("add", touches="retained"), "a retained checkpoint is weighed again next step"),
    _m("superseded-releases-newest", "retention", POL, "Policy.release_superseded",
       DropAssign("older[]"), "the newest checkpoint within computed is released too"),
    _m("superseded-ignores-last-computed", "retention", POL, "Policy.release_superseded",
       FlipCompare("<=", "<", touches="computed"),
       "a checkpoint exactly at computed is not the newest"),
    # -- checkpoint completeness -------------------------------------------------------------
    _m("checkpoint-one-member-short", "completeness", CKP, "Checkpoints._new_checkpoint",
       ReplaceArg("take_many", 0, "self.members - 1"), "a checkpoint gets one member too few",
       orgs=("S1", "S2")),
    _m("complete-presence-only", "completeness", CKP, "is_complete", AlwaysTrue("len"),
       "completeness ignores the number of members",
       equivalent="members lists never change length: a reclaimed member becomes "
                  "MISSING_PAGE in place, so the length test never decides (the machine "
                  "checks every hit's length itself)"),
    _m("complete-page-zero-missing", "completeness", CKP, "is_complete",
       FlipCompare(">=", ">", touches="min"), "a member on page 0 counts as missing"),
    _m("complete-conv-line-zero-missing", "completeness", CKP, "is_complete",
       FlipCompare(">=", ">", touches="conv"), "conv line (or page) 0 counts as missing"),
    _m("missing-member-marked-page-zero", "completeness", REC, "Reclaim._detach",
       ReplaceName("MISSING_PAGE", "0"), "a reclaimed member is marked as page 0"),
    _m("member-reclaim-keeps-checkpoint", "completeness", REC, "Reclaim._detach",
       DropAssign("entry.members"), "a reclaimed member page stays in its checkpoint"),
    _m("s1-conv-reclaim-keeps-checkpoint", "completeness", PLC, "OwnPage.detach",
       DropAssign("ck.conv"), "a reclaimed conv page stays in its checkpoint", orgs=("S1",),
       equivalent="S1 decrefs a checkpoint's members before its conv page in the same batch, "
                  "so a member page is always older in the LRU and its reclaim invalidates "
                  "the checkpoint first; the conv-page branch of detach is unreachable"),
    _m("slab-reclaim-keeps-conv", "completeness", REC, "Reclaim._detach",
       DropAssign("ck.conv"), "a reclaimed slab's checkpoints keep their conv lines",
       orgs=("S2",)),
    _m("member-reclaim-compares-line-with-page", "completeness", PLC, "SlabSlot.detach",
       _s2_detach_like_s1(), "S2 drops a conv LINE equal to a reclaimed member's page id",
       orgs=("S2",), geometry="syn-slots2-members1"),
    # -- stale adoption ----------------------------------------------------------------------
    _m("adopt-stale-block", "stale adoption", ORG, "MemoryOrganization.adopt",
       AlwaysTrue("blk", value=False, every=True), "a block that changed since lookup is adopted"),
    _m("adopt-stale-checkpoint", "stale adoption", ORG, "MemoryOrganization.adopt",
       AlwaysTrue("ck", value=False, compare="is"),
       "a checkpoint that lost its key since lookup is adopted"),
    _m("adopt-pins-first", "stale adoption", ORG, "MemoryOrganization.adopt",
       MoveCall("_unpin_owned", before="_blocks_ref"),
       "pins are released before the adoption takes its references"),
    # -- lookup: boundary prompts, joint reuse -----------------------------------------------
    _m("lookup-limit-is-length", "boundary", ORG, "MemoryOrganization.lookup",
       ReplaceConst(1, 0, in_assign="limit"), "a whole prompt may be reused (nothing computed)"),
    _m("lookup-attention-at-length", "boundary", ORG, "MemoryOrganization.lookup",
       ReplaceArg("max", 0, "limit + 1"), "the block ending at the prompt's end may be reused"),
    _m("lookup-recurrent-at-length", "boundary", ORG, "MemoryOrganization.lookup",
       ReplaceName("limit", "limit + 1", in_test=True),
       "the checkpoint at the prompt's end may be reused"),
    _m("lookup-j-strictly-below-a-max", "lookup", ORG, "MemoryOrganization.lookup",
       FlipCompare("<=", "<", touches="a_max"), "J = A_max is never chosen"),
    _m("lookup-a-max-not-on-recurrent-grid", "lookup", ORG, "MemoryOrganization.lookup",
       ReplaceName("gr", "1", in_assign="a_max", every=True),
       "A_max is not rounded down to the recurrent grid", orgs=("D0",)),
    _m("lookup-stops-at-first-missing-checkpoint", "lookup", ORG, "MemoryOrganization.lookup",
       SwapJump("_complete"), "the scan stops at the first missing checkpoint"),
    _m("lookup-adopts-a-max-blocks", "lookup", ORG, "MemoryOrganization.lookup",
       ReplaceName("j", "a_max", in_assign="n_blocks"), "the hit offers A_max's blocks"),
    # -- salts -------------------------------------------------------------------------------
    _m("salt-ignored-at-registration", "salts", ORG, "MemoryOrganization.add_request",
       ReplaceArg("extra_keys", 0, "None"), "the cache salt does not enter the keys"),
    _m("salt-ignored-when-appending", "salts", ORG, "MemoryOrganization.append_tokens",
       ReplaceArg("extra_keys", 0, "None"), "appended chunks' keys ignore the salt"),
    _m("salt-length-only", "salts", ORG, "MemoryOrganization.add_request",
       ReplaceArg("extra_keys", 0, "None if cache_salt is None else str(len(cache_salt))"),
       "salts of equal length share keys"),
    # -- publication -------------------------------------------------------------------------
    _m("publish-skips-closing-block", "publication", BLK, "Blocks._publish_blocks",
       ReplaceName("req.computed", "req.computed - 1", in_assign="stop"),
       "the block that ends exactly at computed is not published"),
    _m("publish-block-without-hold", "publication", BLK, "Blocks._publish_blocks",
       DropCall("hold_many"), "a published block's page gets no hold"),
    _m("publish-skips-closing-checkpoint", "publication", CKP, "Checkpoints._publish_ckpts",
       FlipCompare(">", ">=", touches="computed"),
       "the checkpoint exactly at computed is not published"),
    _m("publish-duplicate-checkpoint", "publication", CKP, "Checkpoints._publish_ckpts",
       AlwaysTrue("rec_index", value=False), "a second copy of a discoverable key is published"),
    _m("adopt-does-not-set-top", "publication", ORG, "MemoryOrganization.adopt",
       DropAssign("req.ckpt_top"), "an adopter's checkpoint top stays at 0"),
    # -- allocation --------------------------------------------------------------------------
    _m("growth-one-checkpoint-short", "allocation", ORG, "MemoryOrganization.allocate",
       ReplaceConst(1, 0, in_call="range"), "the destination checkpoint is not allocated"),
    _m("growth-floor-checkpoint", "allocation", ORG, "MemoryOrganization.allocate",
       ReplaceName("ceil_div", "(lambda a, b: a // b)", in_call="range"),
       "checkpoint boundaries rounded down"),
    _m("growth-floor-blocks", "allocation", ORG, "MemoryOrganization.allocate",
       ReplaceName("ceil_div", "(lambda a, b: a // b)", in_assign="n_blocks"),
       "a partial last block is not allocated"),
    _m("fits-strict", "allocation", ORG, "MemoryOrganization._fits_in",
       FlipCompare("<=", "<", touches="total"), "an allocation that fills the pool is refused",
       orgs=SHARED),
    _m("d0-fits-either-pool", "allocation", ORG, "MemoryOrganization._fits_in", SwapBoolOp(),
       "D0 admits when either pool has room", orgs=("D0",)),
    _m("s1-conv-page-not-counted", "allocation", PLC, "OwnPage.units", ReplaceConst(1, 0),
       "S1's need ignores the conv page", orgs=("S1",)),
    # a name is a stable identifier: an "-inline" mutant attacks the same operation as its
    # twin above, through a different operator (each is scored on its own)
    _m("fits-strict-inline", "allocation", ORG, "MemoryOrganization._fits_in",
       ReplaceName("need.total", "need.total + 1"), "the need is counted one unit high",
       orgs=SHARED),
    _m("d0-fits-either-pool-inline", "allocation", ORG, "MemoryOrganization._fits_in",
       SwapBoolOp(touches="rpool"), "D0 admits when either pool has room", orgs=("D0",)),
    _m("s1-conv-page-not-counted-inline", "allocation", PLC, "OwnPage.units",
       ReplaceName("members", "members - 1"), "S1's need ignores the conv page", orgs=("S1",)),
    _m("d0-inline-checkpoints-from-attention-pool", "pools", LAY,
       "DualPoolOrganization.ckpt_pool", ReplaceName("self.dual.recurrent", "self.dual.attention"),
       "D0 takes checkpoints from the attention pool", orgs=("D0",)),
    _m("d0-fixed-checkpoint-pool-attention", "pools", LAY, "DualPoolOrganization.ckpt_pool",
       ReplaceName("self.dual.recurrent", "self.dual.pool_for(StateKind.ATTENTION)"),
       "D0's checkpoint pool is the pool for attention", orgs=("D0",)),
    _m("s2-counts-room-of-cached-slabs", "allocation", PLC, "SlabSlot.units",
       ReplaceArg("free_slots", 0, None), "S2 counts the room of cached slabs, reclaimable "
       "during the same allocation", orgs=("S2",)),
    # allocation's reclaim of a cached block's page (_make_free -> _reclaim -> _lose_block)
    _m("make-free-inline-keeps-key", "reclaim", REC, "Reclaim._lose_block",
       DropAssign("self.attn_index[]"), "a reclaimed block's key stays discoverable"),
    _m("make-free-inline-waiters-kept", "reclaim", REC, "Reclaim._lose_block",
       ReplaceName("self.key_waiters.pop", "self.key_waiters.get"),
       "the waiters of a lost key stay registered"),
    _m("make-free-inline-waiters-not-woken", "reclaim", REC, "Reclaim._lose_block",
       FlipCompare("is not", "is", touches="held_by", in_for="key_waiters"),
       "the waiters of a lost key never rescan to publish their copies"),
    _m("make-free-inline-loss-without-requester", "events", REC, "Reclaim._make_free",
       ReplaceArg("_reclaim", 3, '""'), "an allocation's losses name no requester"),
    _m("make-free-inline-hold-kept", "reclaim", REC, "Reclaim._lose_block",
       DropCall("unhold"), "a lost block's page keeps its hold"),
    _m("make-free-inline-block-stays-live", "reclaim", BLK, "Blocks._forget_block",
       DropAssign("self.num_blocks"), "a forgotten block still counts as live"),
    _m("make-free-inline-owner-kept", "reclaim", REC, "Reclaim._reclaim",
       DropAssign("self.owner[]"), "a reclaimed page keeps its owner record"),
    _m("make-free-inline-no-watcher", "reclaim", POOL, "PagePool.reclaim",
       DropCall("watcher"), "the pool watcher is not told of a reclaim",
       equivalent="the watcher is a debug hook (None in production) that changes nothing; "
                  "its 'take' call for the same page, when it is handed out, runs the same "
                  "invalidate-before-reuse check"),
    # a forgotten block's object reused by the next block on its page
    _m("spare-reuse-keeps-depth", "allocation", BLK, "Blocks._new_blocks",
       DropAssign("blk.depth"), "a reused block object keeps its old depth"),
    # a block release drops its pages' references (_blocks_unref -> PagePool.decref_many)
    _m("unref-released-page-is-oldest", "release order", BLK, "Blocks._blocks_unref",
       Reverse("decref_many"),
       "a release's pages reach the LRU in reverse order: its shallowest page is the oldest"),
    _m("unref-in-use-not-counted", "pools", POOL, "PagePool.decref_many",
       DropAssign("unused"), "pages that lose their last reference stay counted in use"),
    _m("unref-unpublished-page-cached", "pools", POOL, "PagePool.decref_many",
       AlwaysTrue("holds"), "an unheld page with no reference is cached, not freed"),
    # allocate takes its pages (PagePool.take_many)
    _m("allocate-take-not-counted", "pools", POOL, "PagePool.take_many",
       DropAssign("self.num_in_use"), "taken pages are not counted in use"),
    _m("allocate-take-without-reference", "pools", POOL, "PagePool.take_many",
       ReplaceConst(1, 0, in_assign="refs"), "a taken page has no reference"),
    _m("make-free-one-short", "allocation", REC, "Reclaim._make_free",
       ReplaceName("need", "need - 1", in_test=True), "allocation frees one page too few"),
    _m("evict-one-more", "allocation", REC, "Reclaim.evict",
       FlipCompare("<", "<=", touches="num_units"), "an eviction reclaims one unit more"),
    # -- slabs -------------------------------------------------------------------------------
    _m("slab-full-one-early", "slabs", PLC, "SlabTable.place",
       ReplaceName("self.slots_per_slab", "self.slots_per_slab - 1", in_test=True),
       "a slab with one free slot counts as full", orgs=("S2",),
       geometry="syn-slots4-members2"),
    _m("slab-room-not-restored", "slabs", PLC, "SlabTable.clear",
       DropAssign("self._with_room[]"), "a slab whose slot is cleared does not get room back",
       orgs=("S2",), geometry="syn-slots4-members2"),
    _m("slab-never-reused", "slabs", PLC, "SlabTable.slab_with_room", skip(None),
       "every checkpoint takes a new slab", orgs=("S2",)),
    _m("slab-dropped-with-occupant", "slabs", PLC, "SlabSlot.release_slot",
       Chain((FlipCompare("==", "<=", touches="used"), ReplaceConst(0, 1))),
       "a slab with one occupant left is dropped", orgs=("S2",)),
    _m("slab-slot-not-referenced", "slabs", PLC, "SlabSlot.place", DropCall("incref"),
       "a slot in an existing slab takes no reference of it", orgs=("S2",)),
    _m("sentinel-decoded", "slabs", PLC, "decode_line", _decode_sentinel_too(),
       "the sentinel line is decoded like any other", orgs=("S2",)),
    _m("decode-16-slots", "slabs", PLC, "decode_line", ReplaceName("slots_per_slab", "16"),
       "lines decoded with 16 slots per slab whatever the geometry", orgs=("S2",),
       geometry="granite-4.0-h-micro"),
    _m("s2-built-with-16-slots", "slabs", LAY, "_s2",
       ReplaceName("units.slots_per_slab", "16"), "S2 built with 16 slots whatever the geometry",
       orgs=("S2",), geometry="granite-4.0-h-micro"),
    # -- pools -------------------------------------------------------------------------------
    _m("incref-many-keeps-page-cached", "pools", POOL, "PagePool.incref_many",
       DropAssign("cached[]"), "a cached page taken back into use stays in the LRU",
       orgs=SHARED),
    _m("decref-many-in-use-not-counted", "pools", POOL, "PagePool.decref_many",
       DropAssign("self.num_in_use"), "released pages stay counted in use"),
    _m("unhold-many-frees-page-in-use", "pools", POOL, "PagePool.unhold_many",
       AlwaysTrue("refs"), "dropping a page's last hold frees it although it is in use"),
    _m("d0-checkpoints-in-attention-pool", "pools", POOL, "DualPools.pool_for",
       ReplaceName("self.recurrent", "self.attention"),
       "D0 serves recurrent state from the attention pool", orgs=("D0",)),
    _m("s1-built-with-3-members", "pools", LAY, "_s1", ReplaceName("units.ssm_members", "3"),
       "S1 built with 3 member pages whatever the geometry", orgs=("S1",),
       geometry="syn-slots4-members2"),
]
BY_NAME = {m.name: m for m in MUTANTS}


@dataclass(frozen=True)
class MutantResult:
    mutant: CoreMutant
    killed_on: str | None  # organization whose machine failed first, or None
    error: str  # first line of the failure


def run_mutant(m: CoreMutant, run_settings: settings = MUTANT_SETTINGS) -> MutantResult:
    """Run ``m`` on each of its organizations until one machine fails. The organizations have
    one implementation of each operation (no compiled twin, no path chosen by a watcher or an
    observer), so the function a mutant changes is the one serving and simulation run."""
    with applied(m):
        for org in m.orgs:
            machine = MACHINES[org] if m.geometry is None else \
                machine_for(org, GEOMETRIES[m.geometry])
            try:
                run_state_machine_as_test(machine, settings=run_settings)
            except Exception as exc:  # noqa: BLE001 - any failure kills the mutant
                lines = str(exc).strip().splitlines() or [type(exc).__name__]
                return MutantResult(m, org, f"{type(exc).__name__}: {lines[0][:160]}")
    return MutantResult(m, None, "")


def check(mutants: list[CoreMutant]) -> None:
    """Build every mutant (its seam resolves, its operator matches as it says) without running
    it; :class:`~invariants.seams.SeamGone` names the first that does not."""
    for m in mutants:
        assert m.orgs and set(m.orgs) <= set(MACHINES), m.name
        assert m.geometry is None or m.geometry in GEOMETRIES, m.name
        m.replacement()


def score(results: list[MutantResult]) -> tuple[int, int]:
    """(killed, non-equivalent) over ``results``."""
    scored = [r for r in results if not r.mutant.equivalent]
    return sum(r.killed_on is not None for r in scored), len(scored)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Run the memory core's mutants against the state "
                                 "machines; print the score and the survivors.")
    ap.add_argument("--only", default="",
                    help="run only mutants whose name contains one of these (a,b,...)")
    ap.add_argument("--seams", action="store_true", help="list each mutant's seam and exit")
    ap.add_argument("--check", action="store_true",
                    help="build every mutant (seams and sites resolve) and exit")
    ap.add_argument("--show", metavar="NAME", help="print one mutant's rewritten function")
    args = ap.parse_args(argv)
    if args.show:
        m = BY_NAME[args.show]
        print(m.describe())
        print(mutated_source(m) if isinstance(m.change, Op) else m.change.describe())
        return 0
    chosen = [m for m in MUTANTS if any(s in m.name for s in args.only.split(","))]
    if not chosen:
        print(f"mutants: no mutant name contains {args.only!r}", file=sys.stderr)
        return 2
    if args.seams:
        print("\n".join(m.describe() for m in chosen))
        return 0
    if args.check:
        check(chosen)
        print(f"{len(chosen)} mutants: every seam and operator site resolves")
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
    return 0 if total and killed == total else 1


if __name__ == "__main__":
    sys.exit(main())
