"""The serving path's mutant set: plausible bugs in the vLLM plugin, the continuation verdicts and
the lineage SQL, each named for the behaviour it breaks and applied at a seam
(:mod:`invariants.seams`), and the script that scores them against the fast tests.

A mutant is *killed* when the fast test files it names fail with it installed. By default each
mutant's files run by ``pytest.main`` in a child forked from a parent that has imported torch,
vLLM and the plugin modules once (the child installs the mutant before any test module loads);
``--isolated`` runs each in its own ``pytest -x -q -p invariants.seam_plugin`` process with
``HYBRIDMEM_SEAM_MUTANT`` naming it (slower, the same code). Either way the tests exercise the
installed code in-process. Equivalent mutants are run but not scored; each says why no test
can tell it apart. Run::

    PYTHONPATH=. python -m invariants.serving_mutants              # score and survivors
    PYTHONPATH=. python -m invariants.serving_mutants --only admission
    PYTHONPATH=. python -m invariants.serving_mutants --check      # every seam resolves (fast)

The slow test ``tests/invariants/test_serving_mutants.py::test_serving_mutation_score`` runs the
whole set and requires >= 95% of the non-equivalent mutants killed; a few run in-process in the
default suite.

The ``admission-*`` mutants sit in the organization (``MemoryOrganization.admission`` / ``fits``
/ ``ckpts_after``: the paper's admission rule, which the KV manager calls); their tests drive the
manager's public calls against a reference model of the rule, so they do not depend on where
the rule lives. A seam that moves raises :class:`~invariants.seams.SeamGone` (``--check`` and
the fast test say which).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from invariants.seams import (
    AlwaysTrue,
    DropAssign,
    DropCall,
    FlipCompare,
    Negate,
    ReplaceArg,
    ReplaceConst,
    ReplaceName,
    Seam,
    SeamMutant,
    SwapBoolOp,
    SwapOperands,
    Unslice,
    replaced,
    returns,
    skip,
)

ROOT = Path(__file__).resolve().parent.parent
ENV = "HYBRIDMEM_SEAM_MUTANT"

MGR = "hybridmem.vllm_plugin.org_manager"
ST = "hybridmem.vllm_plugin.state_table"
RES = "hybridmem.vllm_plugin.resident"
STO = "hybridmem.vllm_plugin.layer_store"
BND = "hybridmem.vllm_plugin.boundary_export"
FLT = "hybridmem.vllm_plugin.faults"
SCH = "hybridmem.vllm_plugin.org_scheduler"
ORG = "hybridmem.memory.organization"  # the paper's admission rule lives in the organization

# the fast test files that must kill each cluster's mutants
T_MANAGER = ("tests/engines/test_org_manager.py", "tests/engines/test_org_manager_model.py")
T_STATE = ("tests/engines/test_state_table.py",) + T_MANAGER
T_RESIDENT = ("tests/engines/test_resident.py",)
T_STORAGE = ("tests/engines/test_org_state_storage.py",)
T_BOUNDARY = ("tests/engines/test_boundary_export.py",)
T_FAULTS = ("tests/engines/test_org_state_config.py",)
T_SCHED = ("tests/engines/test_org_scheduler_split.py",)
T_VERDICT = ("tests/continuation_checks/test_verdict.py",
             "tests/continuation_checks/test_run_units.py")
T_LINEAGE = ("tests/lineage/test_classes.py",)


def _m(name: str, cluster: str, module: str, qualname: str, change: object, why: str,
       tests: tuple[str, ...], equivalent: str = "") -> SeamMutant:
    return SeamMutant(name, cluster, Seam(module, qualname), change, why,  # type: ignore[arg-type]
                      tests, equivalent)


def _sql_edit(view: str, old: str, new: str) -> object:
    """``load_sql`` returns view ``view`` with the one occurrence of ``old`` replaced by ``new``
    (SQL has no AST here: the view is the seam, the token its operator; a token that is not
    exactly once in the view fails the run loudly)."""
    def change(text: str, name: str, *_a: object, **_k: object) -> str:
        if name != view:
            return text
        n = text.count(old)
        if n != 1:
            raise AssertionError(f"SQL mutant: {old!r} occurs {n} times in {view}.sql")
        return text.replace(old, new)
    return returns(change, f"{view}.sql: {old!r} -> {new!r}")


MUTANTS: list[SeamMutant] = [
    # -- KV manager: zeroing, block ids, tables ----------------------------------------------------
    _m("adopted-blocks-zeroed", "kv-manager", MGR, "OrgKVCacheManager._admit",
       Unslice("attn", in_call="extend"),
       "the adopter's cached attention blocks are queued for zeroing with its new ones",
       T_MANAGER),
    _m("new-blocks-not-zeroed", "kv-manager", MGR, "OrgKVCacheManager._new_blocks",
       DropCall("extend"), "blocks added to a running request are never queued for zeroing",
       T_MANAGER),
    _m("zeroing-queue-never-emptied", "kv-manager", MGR,
       "OrgKVCacheManager.take_new_block_ids",
       replaced(lambda self: list(self._new_attn_ids), "return the queue, keep it"),
       "take_new_block_ids hands the same blocks out again every step", T_MANAGER),
    _m("sent-tables-resent", "kv-manager", MGR, "OrgKVCacheManager._new_blocks",
       DropAssign("sent[]"), "a running request receives its whole table again each step "
       "(vLLM's tables are append-only)", T_MANAGER),
    _m("hit-attention-ids-are-pages", "kv-manager", MGR, "OrgKVCacheManager.get_computed_blocks",
       ReplaceConst(1, 0), "the hit's attention block ids are page ids (page 0 = null block)",
       T_MANAGER),
    _m("hit-checkpoint-at-first-position", "kv-manager", MGR,
       "OrgKVCacheManager.get_computed_blocks", ReplaceConst(-1, 0),
       "the hit's checkpoint goes to Mamba position 0 instead of its depth's", T_MANAGER),
    _m("recurrent-id-without-null-offset", "kv-manager", MGR, "OrgKVCacheManager._home_id",
       ReplaceName("self._rec_offset", "self._rec_offset - 1"),
       "a checkpoint's block id is its home page (page 0 aliases the null block)", T_MANAGER),
    _m("d0-recurrent-ids-overlap-attention", "kv-manager", MGR, "OrgKVCacheManager.__init__",
       ReplaceName("plan.recurrent_id_offset", "0"),
       "D0's recurrent ids are not shifted past the attention pool", T_MANAGER),
    _m("mamba-table-one-position-early", "kv-manager", MGR, "OrgKVCacheManager._positions",
       ReplaceConst(1, 0), "position i gets the checkpoint after i grids, not i + 1", T_MANAGER),
    _m("estimate-cached-tokens-zero", "kv-manager", MGR,
       "OrgKVCacheManager.estimate_cached_tokens", skip(0),
       "the adopted depth is never reported to vLLM's stats", T_MANAGER),
    _m("prefix-skip-flag-ignored", "kv-manager", MGR,
       "OrgKVCacheManager.prefix_cache_lookup_enabled",
       ReplaceName("request.skip_reading_prefix_cache", "False"),
       "a request that must not read the prefix cache still adopts", T_MANAGER),
    _m("decode-tokens-not-appended", "kv-manager", MGR, "OrgKVCacheManager._sync",
       FlipCompare(">", "<"), "tokens added since the last call never reach the organization",
       T_MANAGER),
    # -- KV manager: admission (need + H <= available) ---------------------------------------------
    _m("admission-forgets-recurrent-taking", "admission", ORG, "MemoryOrganization.admission",
       ReplaceName("taken_r", "0", every=True),
       "units the hit's checkpoint takes out of the reclaimable set still count as available",
       T_MANAGER),
    _m("admission-forgets-attention-taking", "admission", ORG, "MemoryOrganization.admission",
       ReplaceName("taken_a", "0", every=True),
       "cached blocks the hit adopts still count as available", T_MANAGER),
    _m("admission-ignores-headroom", "admission", ORG, "MemoryOrganization.fits",
       ReplaceName("ha", "0", every=True), "the attention headroom H is not reserved",
       T_MANAGER),
    _m("admission-ignores-recurrent-units", "admission", ORG, "MemoryOrganization.fits",
       ReplaceName("units", "0", every=True),
       "the checkpoints the request will write are not counted", T_MANAGER),
    _m("admission-strict-fit", "admission", ORG, "MemoryOrganization.fits",
       FlipCompare("<=", "<", every=True), "need + H == available is refused", T_MANAGER),
    _m("admission-one-checkpoint-short", "admission", ORG, "MemoryOrganization.ckpts_after",
       ReplaceConst(1, 0), "the checkpoint at the last boundary is not counted", T_MANAGER),
    _m("full-sequence-gate-ignored", "admission", MGR, "OrgKVCacheManager.allocate_slots",
       Negate("full_sequence_must_fit"), "vLLM's whole-sequence gate is inverted", T_MANAGER),
    _m("too-small-raised-while-others-hold", "admission", MGR, "OrgKVCacheManager._admit",
       Negate("holds_storage"), "a rejection stops the run although others will free storage",
       T_MANAGER),
    # -- KV manager: publication and release -------------------------------------------------------
    _m("publishes-scheduled-not-computed", "kv-manager", MGR, "OrgKVCacheManager.allocate_slots",
       ReplaceArg("publish", 1, "total"),
       "state not yet executed is published (a checkpoint discoverable before it exists)",
       T_MANAGER),
    _m("superseded-checkpoints-kept", "kv-manager", MGR, "OrgKVCacheManager.allocate_slots",
       DropCall("release_superseded"),
       "a running request keeps every older checkpoint of its chain", T_MANAGER),
    _m("finish-publishes-nothing", "kv-manager", MGR, "OrgKVCacheManager.free",
       DropCall("publish"), "a finished request's last computed state is never published",
       T_MANAGER),
    _m("finish-treated-as-preemption", "kv-manager", MGR, "OrgKVCacheManager.free",
       Negate("is_finished"), "free() preempts finished requests and finishes preempted ones",
       T_MANAGER),
    _m("exports-kept-after-free", "kv-manager", MGR, "OrgKVCacheManager.free",
       DropCall("drop_exports"), "a freed request's boundary exports stay registered this step",
       T_MANAGER),
    _m("exports-kept-across-steps", "kv-manager", MGR, "OrgKVCacheManager.new_step_starts",
       DropCall("clear"), "last step's exports are still registered at the next", T_MANAGER),
    _m("export-names-the-end-boundary", "kv-manager", MGR, "OrgKVCacheManager._register_export",
       ReplaceArg("range", 1, "end + 1"),
       "a boundary at the chunk's end is exported although the forward writes it itself",
       T_MANAGER),
    _m("export-misses-the-first-boundary", "kv-manager", MGR,
       "OrgKVCacheManager._register_export", ReplaceConst(1, 2, in_assign="first"),
       "the first interior boundary of a chunk is skipped", T_MANAGER),
    _m("export-under-the-previous-position", "kv-manager", MGR,
       "OrgKVCacheManager._register_export", ReplaceConst(1, 2, in_assign="dst"),
       "the export is registered under the previous position's block id", T_MANAGER),
    _m("fit-chunk-counts-own-pins", "kv-manager", MGR, "OrgKVCacheManager.fit_chunk",
       FlipCompare("!=", "==", touches="owner"),
       "the request's own pins are deducted instead of the others'", T_MANAGER),
    _m("fit-chunk-never-shortens", "kv-manager", MGR, "OrgKVCacheManager.fit_chunk",
       replaced(lambda self, request, start, end: end, "return end"),
       "a chunk whose checkpoints cannot all be held is scheduled whole", T_MANAGER),
    # -- state table (manager mirror and the table itself) -----------------------------------------
    _m("state-table-keeps-dropped-mapping", "state-table", ST, "StateTable.drop", skip(),
       "a dropped block id still resolves to its old address", T_STATE),
    _m("manager-never-drops-mappings", "state-table", MGR, "OrgKVCacheManager._sync_state",
       DropCall("drop"), "released checkpoints stay in the table", T_STATE),
    _m("changed-address-not-updated", "state-table", MGR, "OrgKVCacheManager._sync_state",
       FlipCompare("!=", "==", touches="addr"),
       "a block id whose checkpoint moved keeps the old address", T_STATE),
    _m("state-not-synced-after-growth", "state-table", MGR, "OrgKVCacheManager.allocate_slots",
       DropCall("_sync_state", every=True),
       "checkpoints allocated to a running request are not registered (nor the superseded "
       "ones released on a step that grows nothing dropped)", T_STATE),
    _m("state-not-synced-after-free", "state-table", MGR, "OrgKVCacheManager.free",
       DropCall("_sync_state"), "checkpoints released at finish or preemption stay mapped",
       T_STATE),
    _m("null-block-accepted", "state-table", ST, "StateTable.set",
       FlipCompare("<=", "<"), "block id 0 (vLLM's null block) can be given an address", T_STATE),
    _m("export-collision-allowed", "state-table", ST, "StateTable.set_export",
       FlipCompare("!=", "=="), "two requests may export into one destination block", T_STATE),
    _m("drop-exports-drops-the-others", "state-table", ST, "StateTable.drop_exports",
       FlipCompare("==", "!="), "dropping one request's exports drops everyone else's", T_STATE),
    # -- write-back residency ----------------------------------------------------------------------
    _m("write-back-keeps-remapped-row", "residency", RES, "Residency._write_back",
       AlwaysTrue("peek"), "a row whose block id now maps elsewhere is written to its old "
       "address", T_RESIDENT),
    _m("departed-rows-not-written-back", "residency", RES, "Residency.begin_step",
       DropCall("_write_back"), "rows that left the batch are dropped without a write-back",
       T_RESIDENT),
    _m("fresh-rows-read-anyway", "residency", RES, "Residency.begin_step",
       FlipCompare("not in", "in", touches="fresh"), "rows with state are not read, fresh rows are",
       T_RESIDENT),
    _m("padding-slot-handed-out", "residency", RES, "Residency.begin_step",
       ReplaceConst(1, 0, in_call="range"), "slot 0 (vLLM's padding row) is given to a key",
       T_RESIDENT),
    _m("growth-without-flush", "residency", RES, "Residency.begin_step",
       DropCall("flush_all"), "growing the scratch loses the resident rows", T_RESIDENT),
    _m("flush-is-a-no-op", "residency", RES, "Residency.flush", skip(),
       "a copy reads pages the scratch has newer bytes for", T_RESIDENT),
    _m("scattered-slots-read-as-contiguous", "residency", RES, "Residency.read",
       Negate("range"), "non-contiguous slots are read as one block", T_RESIDENT),
    _m("forget-writes-back", "residency", RES, "Residency.forget",
       replaced(lambda self, addresses: self.flush(addresses), "flush instead"),
       "rows about to be overwritten are written back first", T_RESIDENT,
       equivalent="forget() runs right before a copy overwrites the whole checkpoint at those "
       "addresses, so a write-back first leaves the same pages (only an extra write)"),
    # -- page storage ------------------------------------------------------------------------------
    _m("conv-rows-not-written", "storage", STO, "LayerStore.write_rows",
       DropCall("index_copy_", touches="conv_pool"), "a write-back stores the SSM state only",
       T_STORAGE),
    _m("copy-skips-conv", "storage", STO, "LayerStore.copy_many",
       DropCall("index_copy_", touches="conv_pool"), "align copies move the SSM state only",
       T_STORAGE),
    _m("member-bound-off-by-one", "storage", STO, "LayerStore.tables",
       FlipCompare(">=", ">", touches="top"), "member id == num_pages is accepted", T_STORAGE),
    _m("partial-member-not-scattered", "storage", STO, "scatter_pages_cpu",
       DropAssign("pool[]"), "the last, partial member page is never written", T_STORAGE),
    # -- boundary export (CPU forward) -------------------------------------------------------------
    _m("boundary-state-one-piece-early", "boundary-export", BND, "segmented_scan",
       ReplaceConst(1, 0, in_assign="sink"),
       "the state after piece k is filed under piece k's start", T_BOUNDARY),
    _m("conv-head-from-row-not-slot", "boundary-export", BND, "conv_capture",
       ReplaceName("index", "None", in_assign="slot", every=True),
       "the initial conv state is read from the row's position, not its cache slot",
       T_BOUNDARY),
    _m("conv-window-at-width-from-head", "boundary-export", BND, "conv_capture",
       FlipCompare(">=", ">", touches="width"),
       "a cut exactly ``width`` tokens in takes the initial-state branch", T_BOUNDARY,
       equivalent="at o == width the initial-state branch concatenates head[:, width:] "
       "(empty) with x[:, lo:lo + width]: the same window as the in-chunk branch"),
    # -- faults ------------------------------------------------------------------------------------
    _m("fault-env-ignored", "faults", FLT, "active",
       replaced(lambda: __import__(FLT, fromlist=["_ACTIVE"])._ACTIVE, "ignore the env"),
       "HYBRIDMEM_FAULT never activates a fault in an engine started without the config",
       T_FAULTS),
    _m("unknown-fault-means-off", "faults", FLT, "is_active",
       Negate("FAULTS"), "a typo in a fault name is silently off (and known names raise)",
       T_FAULTS),
    # -- scheduler ---------------------------------------------------------------------------------
    _m("chunk-stops-every-other-boundary", "scheduler", SCH,
       "OrgScheduler._mamba_block_aligned_split", ReplaceConst(1, 2, in_assign="stop"),
       "with chunk stops on, a chunk runs past a checkpoint boundary", T_SCHED),
    _m("chunks-not-fitted", "scheduler", SCH, "OrgScheduler._mamba_block_aligned_split",
       ReplaceName("self.kv_cache_manager.fit_chunk", "(lambda r, s, e: e)"),
       "with boundary exports, a chunk is never shortened to what the pool can hold",
       T_SCHED),
    _m("decode-sent-to-fit-chunk", "scheduler", SCH, "OrgScheduler._mamba_block_aligned_split",
       AlwaysTrue("num_prompt_tokens", value=False),
       "decode steps are fitted like prefill chunks", T_SCHED,
       equivalent="a decode chunk [start, start + 1) spans no boundary, so fit_chunk returns "
       "its end unchanged (only a wasted call)"),
    # -- continuation verdicts and arms ------------------------------------------------------------
    _m("arms-run-without-their-salts", "continuation", "continuation_checks.run", "_salt",
       replaced(lambda tag, run, case: f"{tag}-{case.case}", "one salt per case"),
       "every arm of a case shares one salt: a reference arm can hit the retained state",
       T_VERDICT),
    _m("boundary-state-read-one-position-late", "continuation", "continuation_checks.engine",
       "ContinuationEngine._block_at", ReplaceConst(1, 0, in_assign="i"),
       "the Mamba block at b / G is read instead of b / G - 1", T_VERDICT),
    _m("state-read-after-the-boundary-passed", "continuation", "continuation_checks.engine",
       "ContinuationEngine._capture", FlipCompare("==", ">=", touches="num_computed_tokens",
                                                  every=True),
       "the state is read at a step that ended past b", T_VERDICT),
    _m("margin-from-ascending-logprobs", "continuation", "continuation_checks.engine", "top2",
       ReplaceArg("sorted", "reverse", None), "top-1 / top-2 taken from the two smallest "
       "log-probabilities", T_VERDICT),
    _m("margin-sign-flipped", "continuation", "continuation_checks.compare", "margin_at",
       SwapOperands("-"), "the margin at a divergence is top-2 minus top-1", T_VERDICT),
    _m("prefix-is-no-divergence", "continuation", "continuation_checks.compare",
       "first_divergence", FlipCompare("==", "!="),
       "a run that is a strict prefix of the other counts as no divergence", T_VERDICT),
    _m("nan-state-difference-passes", "continuation", "continuation_checks.compare",
       "state_diff", Negate("m"), "a NaN difference is dropped by max() (reads as 0)", T_VERDICT),
    _m("copy-compared-with-tolerance", "continuation", "continuation_checks.verdict",
       "classify", AlwaysTrue("bitwise_equal", value=True, in_assign="state_words"),
       "a stored-and-read-back checkpoint may differ at all", T_VERDICT),
    _m("tolerance-boundary-inclusive", "continuation", "continuation_checks.verdict",
       "classify", FlipCompare(">", ">=", touches="scaled"),
       "a retained state exactly at the tolerance is a mismatch", T_VERDICT),
    _m("tolerance-ignores-reference-variance", "continuation", "continuation_checks.verdict",
       "CaseEvidence.tolerance", ReplaceName("ref", "0.0"),
       "the reference's own variance is never allowed", T_VERDICT),
    _m("split-instability-unseen", "continuation", "continuation_checks.verdict", "classify",
       ReplaceConst("split-repeat", "split"),
       "split vs its repeat is never compared (an unstable reference reads as numerics)",
       T_VERDICT),
    _m("batching-witness-unseen", "continuation", "continuation_checks.verdict", "classify",
       ReplaceConst("retained-alone", "retained"),
       "retained vs retained-alone is never compared", T_VERDICT),
    _m("deeper-adoption-treated", "continuation", "continuation_checks.verdict", "classify",
       FlipCompare("!=", "<", touches="adopted_depth"),
       "a consumer that adopted deeper than b counts as treated", T_VERDICT),
    _m("faulted-check-accepts-false-positives", "continuation", "continuation_checks.check",
       "exit_code", SwapBoolOp("false"),
       "a faulted check passes when an unfaulted case is flagged", T_VERDICT),
    _m("reference-variance-from-split-itself", "continuation", "continuation_checks.run",
       "_result", ReplaceConst("split-alone", "split"),
       "split-alone is never compared with split (the reference variance loses a context)",
       T_VERDICT),
    _m("copy-checked-against-split", "continuation", "continuation_checks.run", "_result",
       ReplaceArg("_diff", 1, "split", in_assign="copy"),
       "the copy check compares the adopted bytes with the from-scratch state, not the "
       "producer's", T_VERDICT),
    _m("margin-at-retained-divergence-from-retained", "continuation", "continuation_checks.run",
       "CaseResult.margin_at_divergence", ReplaceConst("recompute", "retained"),
       "the margin is read from the retained run's log-probabilities", T_VERDICT),
    _m("first-divergence-latest", "continuation", "continuation_checks.run",
       "CaseResult.first_divergence", ReplaceName("min", "max"),
       "the case's first divergence is the latest over the retained runs", T_VERDICT),
    # -- lineage: replay and SQL -------------------------------------------------------------------
    _m("depth-class-swapped", "lineage", "lineage.replay", "depth_class",
       FlipCompare(">", "<"), "deeper and shallower adoptions swap classes", T_LINEAGE),
    _m("joint-depth-past-attention", "lineage", "lineage.replay", "depths_from_flags",
       FlipCompare("<=", "<", every=True), "a checkpoint exactly at the attention prefix's end "
       "is not joint", T_LINEAGE),
    _m("sql-depth-class-swapped", "lineage", "lineage.sql_files", "load_sql",
       _sql_edit("episode_lineage", "x.j_adopt > d.j_enter", "x.j_adopt < d.j_enter"),
       "the SQL's deeper and shallower adoptions swap classes", T_LINEAGE),
    _m("sql-deeper-counted-as-equal", "lineage", "lineage.sql_files", "load_sql",
       _sql_edit("episode_lineage", "x.j_adopt = d.j_enter", "x.j_adopt >= d.j_enter"),
       "the SQL counts every adoption at least as deep as J_enter as positive-equal",
       T_LINEAGE),
]
BY_NAME = {m.name: m for m in MUTANTS}


@dataclass(frozen=True)
class Outcome:
    mutant: SeamMutant
    killed: bool
    seconds: float
    detail: str  # the failing test (killed) or the pytest summary line


def run_one(m: SeamMutant, python: str = sys.executable, timeout: float = 600) -> Outcome:
    """``m``'s test files in a pytest process with ``m`` installed (see the module doc)."""
    env = dict(os.environ, **{ENV: m.name})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    cmd = [python, "-m", "pytest", "-x", "-q", "-p", "invariants.seam_plugin",
           "-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning", *m.tests]
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    failed = [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))]
    if proc.returncode not in (0, 1):  # 2+: interrupted, collection error, no tests
        raise RuntimeError(f"mutant {m.name}: pytest exited {proc.returncode}:\n"
                           + "\n".join(lines[-15:]))
    detail = failed[0] if failed else (lines[-1] if lines else "")
    return Outcome(m, proc.returncode == 1, time.perf_counter() - t, detail)


# what every mutant's tests import: loaded once by the parent of the forked runs
PRELOAD = ("torch", "vllm.v1.core.sched.scheduler", "vllm.v1.core.kv_cache_manager",
           "vllm.v1.kv_cache_interface", "vllm.v1.request", MGR, ST, RES, STO, BND, FLT, SCH,
           "continuation_checks.run", "continuation_checks.check", "lineage.replay",
           "lineage.views", "pytest")


def run_forked(m: SeamMutant, timeout: float = 600) -> Outcome:
    """``m``'s test files run by ``pytest.main`` in a child forked from this process (which
    has imported :data:`PRELOAD` but no test module): the child installs ``m`` first, as the
    plugin does, so it runs the same code as :func:`run_one` without paying the imports of a
    fresh interpreter per mutant. The parent runs no torch operation (fork-safe)."""
    import tempfile

    t = time.perf_counter()
    with tempfile.TemporaryFile("w+") as log:
        pid = os.fork()
        if pid == 0:  # the child: never returns
            rc = 3
            try:
                os.dup2(log.fileno(), 1)
                os.dup2(log.fileno(), 2)
                import pytest

                from invariants.seams import install

                install(m)
                # plain asserts: a failure still fails; rewriting every module costs seconds
                rc = int(pytest.main(["-x", "-q", "-p", "no:cacheprovider", "--assert=plain",
                                      "-W", "ignore::DeprecationWarning", *m.tests]))
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(rc)
        deadline = time.monotonic() + timeout
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                raise RuntimeError(f"mutant {m.name}: tests ran past {timeout} s")
            time.sleep(0.05)
        rc = os.waitstatus_to_exitcode(status)
        log.seek(0)
        lines = log.read().strip().splitlines()
    failed = [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))]
    if rc not in (0, 1):
        raise RuntimeError(f"mutant {m.name}: pytest exited {rc}:\n" + "\n".join(lines[-15:]))
    detail = failed[0] if failed else (lines[-1] if lines else "")
    return Outcome(m, rc == 1, time.perf_counter() - t, detail)


def run_set(mutants: list[SeamMutant], isolated: bool = False) -> list[Outcome]:
    """Every mutant's outcome: forked children (default on POSIX), or one fresh pytest process
    each (``isolated``)."""
    if isolated or not hasattr(os, "fork"):
        return [run_one(m) for m in mutants]
    os.environ.setdefault("TRITON_INTERPRET", "1")  # as tests/conftest.py sets it, before kernels
    os.chdir(ROOT)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    return [run_forked(m) for m in mutants]


def score(outcomes: list[Outcome]) -> tuple[int, int]:
    """(killed, scored): equivalent mutants are not scored."""
    scored = [o for o in outcomes if not o.mutant.equivalent]
    return sum(o.killed for o in scored), len(scored)


def check_seams(mutants: list[SeamMutant]) -> None:
    """Every mutant builds (its seam and operator site exist): SeamGone otherwise."""
    for m in mutants:
        m.replacement()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="mutants whose name or cluster contains this")
    ap.add_argument("--check", action="store_true", help="only check that every seam resolves")
    ap.add_argument("--isolated", action="store_true",
                    help="one fresh pytest process per mutant (with the plugin) instead of a "
                    "forked child")
    args = ap.parse_args(argv)
    chosen = [m for m in MUTANTS if args.only in m.name or args.only in m.cluster]
    check_seams(chosen)
    if args.check:
        print(f"{len(chosen)} mutants: every seam and operator site resolves")
        return 0
    t0 = time.perf_counter()
    outcomes = []
    for m in chosen:
        o = run_set([m], args.isolated)[0]
        outcomes.append(o)
        tag = "killed  " if o.killed else "SURVIVED"
        eq = " (equivalent)" if m.equivalent else ""
        print(f"{tag} {m.name}{eq} [{o.seconds:.1f} s] {o.detail[:110]}", flush=True)
    killed, scored = score(outcomes)
    survivors = [o.mutant.name for o in outcomes if not o.killed and not o.mutant.equivalent]
    print(f"serving mutation score: {killed}/{scored} non-equivalent mutants killed "
          f"({100 * killed / max(scored, 1):.1f}%), "
          f"{sum(1 for o in outcomes if o.mutant.equivalent)} equivalent; "
          f"{time.perf_counter() - t0:.0f} s")
    print(f"survivors: {', '.join(survivors) or 'none'}")
    return 0 if killed == scored else 1


if __name__ == "__main__":
    sys.exit(main())
