"""Drive every arm of every case through one engine, phase by phase, and classify each case.

Salts separate the arms (a salt enters every block hash, so no arm can hit another's state)::

    1  producers (ret): prompt[:b+1], 1 token, batched; state read at b
       [fault: corrupt the published checkpoint of every other case in place]
    2  retained consumers (ret), then recompute (rec) and split (spl), batched
    3  producers (ret2) [fault]; 4  retained-repeat, recompute-repeat, split-repeat, batched
    5  producers (retA) [fault]; 6  retained-alone, then split-alone, one request at a time

A consumer's ADOPTION depth (trace) must equal b; the bytes it continues from are read from the
storage at admission. The split arm's own state at b is read right after the step that ends its
chunk at b: the from-scratch reference state.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from continuation_checks.cases import Case
from continuation_checks.compare import StateDiff, first_divergence, margin_at, state_diff
from continuation_checks.engine import ContinuationEngine, Submitted, progress
from continuation_checks.state_readers import StateBytes
from continuation_checks.verdict import (
    ALL_RUNS,
    RETAINED_RUNS,
    CaseEvidence,
    Decision,
    classify,
)

FAULTS = ("corrupt-checkpoint", "fresh-slot", "boundary-shift")  # applied here, through
# the storage, to every other case
# the failure classes users meet on stock vLLM, emulated at the consumer's admission (its
# adopted block is overwritten before its forward): a prefix-hit request that reads a
# recycled state slot holding another request's state, and an adopted state one block off
# the hit length (the state at b - G; the empty state when b = G)
VLLM_FAULTS = ("fresh-slot", "boundary-shift")
# the organizations' own faults (hybridmem.vllm_plugin.faults): the engine injects them, on
# every case it can affect; which cases it hit is the check's finding, so every case counts
# as faulted
ORG_FAULTS = ("stale-checkpoint", "swap-members", "skip-invalidate")
_SALT = {"retained": "ret", "retained-repeat": "ret2", "retained-alone": "retA",
         "recompute": "rec", "recompute-repeat": "rec2", "split": "spl", "split-repeat": "spl2",
         "split-alone": "splA"}


@dataclass
class CaseResult:
    case: Case
    runs: dict[str, Submitted]
    producers: dict[str, Submitted]
    evidence: CaseEvidence
    decision: Decision
    faulted: bool = False

    @property
    def first_divergence(self) -> int | None:
        idx = [first_divergence(self.runs[r].token_ids, self.runs["recompute"].token_ids)
               for r in RETAINED_RUNS]
        found = [i for i in idx if i is not None]
        return min(found) if found else None

    @property
    def margin_at_divergence(self) -> float | None:
        return margin_at(self.runs["recompute"].top2, self.first_divergence)


def _salt(tag: str, run: str, case: Case) -> str:
    return f"{tag}-{_SALT[run]}-{case.case}"


def run_cases(eng: ContinuationEngine, cases: list[Case], fault: str | None = None,
              tag: str = "cc", show_progress: bool = True
              ) -> tuple[list[CaseResult], dict[str, Any]]:
    """All phases for ``cases``; returns per-case results and timing."""
    if fault is not None and fault not in FAULTS + ORG_FAULTS:
        raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS + ORG_FAULTS)}")
    say = progress if show_progress else (lambda _m: None)
    t0 = time.perf_counter()
    producers: dict[tuple[int, str], Submitted] = {}
    runs: dict[tuple[int, str], Submitted] = {}
    if fault in ORG_FAULTS:
        if eng.cfg.fault != fault:
            raise ValueError(f"fault {fault!r} is the engine's own; the engine was started with "
                             f"{eng.cfg.fault!r}")
        faulted = {c.case for c in cases}
        corrupt: set[int] = set()
    else:
        faulted = corrupt = {c.case for c in cases[::2]} if fault is not None else set()

    shift = fault == "boundary-shift"
    swap = fault in VLLM_FAULTS
    grid = eng.grid

    def produce(run: str) -> None:
        """Producers of one retained run, batched; then the fault, if any, on their output
        (boundary-shift: a faulted producer also stops at b - G, where its state is read)."""
        t = time.perf_counter()
        subs = []
        for c in cases:
            early = c.boundary - grid if shift and c.case in corrupt and c.boundary > grid \
                else None
            subs.append(eng.submit(f"{tag}/{c.case}/{run}/producer",
                                   list(c.prompt[: c.boundary + 1]), 1, _salt(tag, run, c),
                                   watch=c.boundary, split_at=early, watch_early=early))
        eng.run(subs)
        for c, sub in zip(cases, subs, strict=True):
            producers[(c.case, run)] = sub
            if c.case in corrupt and sub.state_block is not None and not swap:
                eng.storage.corrupt(sub.state_block)  # every other case: the rest stay clean
        say(f"{run} producers: {len(subs)} in {time.perf_counter() - t:.1f} s")

    def fault_state(c: Case, run: str) -> Any:
        """What a faulted consumer's adopted block holds instead (None: leave it)."""
        own = producers[(c.case, run)].state
        if own is None:
            return None
        if fault == "boundary-shift":
            if c.boundary <= grid:  # one block below the first boundary: the empty state
                return StateBytes(own.conv.new_zeros(own.conv.shape),
                                  own.ssm.new_zeros(own.ssm.shape))
            return producers[(c.case, run)].early_state
        # fresh-slot: the slot last held another case's checkpoint of this run
        others = [producers[(o.case, run)].state for o in cases if o.case != c.case]
        other = next((o for o in others if o is not None), None)
        if other is None:
            return StateBytes(own.conv.new_zeros(own.conv.shape), own.ssm.new_zeros(own.ssm.shape))
        return other

    def submit(c: Case, run: str) -> Submitted:
        key = f"{tag}/{c.case}/{run}"
        prompt = list(c.prompt)
        if run.startswith("retained"):
            sub = eng.submit(key, prompt, c.max_tokens, _salt(tag, run, c), adopt_at=c.boundary)
            if swap and c.case in corrupt:
                state = fault_state(c, run)
                if state is not None:
                    eng.inject[sub.engine_id] = state
        elif run.startswith("split"):  # split, split-repeat, split-alone
            sub = eng.submit(key, prompt, c.max_tokens, _salt(tag, run, c), split_at=c.boundary,
                             watch=c.boundary)
        else:
            sub = eng.submit(key, prompt, c.max_tokens, _salt(tag, run, c))
        runs[(c.case, run)] = sub
        return sub

    # Each retained run's producers run right before its consumers, and the consumers are queued
    # before the references of their phase (admission is first come, first served): between a
    # publication and its adoption only consumers allocate, and the producers' blocks are the
    # most recently freed, so the block pool evicts them last.
    for retained, refs in (("retained", ("recompute", "split")),
                           ("retained-repeat", ("recompute-repeat", "split-repeat"))):
        produce(retained)
        t = time.perf_counter()
        subs = [submit(c, retained) for c in cases]
        subs += [submit(c, r) for c in cases for r in refs]
        eng.run(subs)
        say(f"{retained}, {', '.join(refs)}: {len(subs)} requests batched in "
            f"{time.perf_counter() - t:.1f} s")
    produce("retained-alone")
    t = time.perf_counter()
    for run in ("retained-alone", "split-alone"):
        for c in cases:
            eng.run([submit(c, run)])
    say(f"retained-alone, split-alone: {2 * len(cases)} requests one at a time in "
        f"{time.perf_counter() - t:.1f} s")

    results = [_result(c, runs, producers, c.case in faulted, eng.cfg.dtype) for c in cases]
    timing = {"cases": len(cases), "engine_init_s": eng.init_s,
              "check_s": time.perf_counter() - t0}
    return results, timing


def _diff(a: Any, b: Any) -> StateDiff | None:
    return None if a is None or b is None else state_diff(a, b)


def _result(c: Case, runs: dict[tuple[int, str], Submitted],
            producers: dict[tuple[int, str], Submitted], faulted: bool,
            dtype: str) -> CaseResult:
    mine = {r: runs[(c.case, r)] for r in ALL_RUNS}
    split = mine["split"].state
    refs = [d for r in ("split-repeat", "split-alone")
            if (d := _diff(mine[r].state, split)) is not None]
    diffs = {r: _diff(mine[r].adopted_state, split) for r in RETAINED_RUNS}
    copy = {r: _diff(mine[r].adopted_state, producers[(c.case, r)].state) for r in RETAINED_RUNS}
    notes = [f"{r}: {s.state_note}" for r, s in mine.items() if s.state_note]
    notes += [f"{r} producer: {producers[(c.case, r)].state_note}" for r in RETAINED_RUNS
              if producers[(c.case, r)].state_note]
    ev = CaseEvidence(
        boundary=c.boundary,
        tokens={r: list(s.token_ids) for r, s in mine.items()},
        adopted_depth={r: mine[r].adopted_depth for r in RETAINED_RUNS},
        copy=copy, retained_state=diffs, reference_state=refs, dtype=dtype, notes=notes,
    )
    return CaseResult(c, mine, {r: producers[(c.case, r)] for r in RETAINED_RUNS}, ev,
                      classify(ev), faulted)
