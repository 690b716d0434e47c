"""Drive every arm of every case through one engine, phase by phase, and classify each case.

Salts separate the arms (a salt enters every block hash, so no arm can hit another's state)::

    phase 1  producers  prompt[:b+1], 1 token, salts ret / ret2 / retA     (batched; watch b)
             [fault: corrupt the published checkpoint of the affected cases in place]
    phase 2  retained consumers (ret), recompute (rec), split (spl)         (batched)
    phase 3  the same again: retained-repeat (ret2), recompute-repeat, split-repeat
    phase 4  retained-alone consumers (retA) and split-alone (splA), one request at a time

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
from continuation_checks.verdict import (
    ALL_RUNS,
    RETAINED_RUNS,
    CaseEvidence,
    Decision,
    classify,
)

FAULTS = ("corrupt-checkpoint",)  # faults this module applies itself (through the storage)
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
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
    say = progress if show_progress else (lambda _m: None)
    t0 = time.perf_counter()
    producers: dict[tuple[int, str], Submitted] = {}
    for c in cases:
        for run in RETAINED_RUNS:
            producers[(c.case, run)] = eng.submit(
                f"{tag}/{c.case}/{run}/producer", list(c.prompt[: c.boundary + 1]), 1,
                _salt(tag, run, c), watch=c.boundary)
    eng.run(list(producers.values()))
    say(f"phase 1: {len(producers)} producers in {time.perf_counter() - t0:.1f} s")
    faulted: set[int] = set()
    if fault == "corrupt-checkpoint":
        for c in cases[::2]:  # every other case: the rest must stay clean
            for run in RETAINED_RUNS:
                block = producers[(c.case, run)].state_block
                if block is not None:
                    eng.storage.corrupt(block)
            faulted.add(c.case)

    runs: dict[tuple[int, str], Submitted] = {}

    def submit(c: Case, run: str) -> Submitted:
        key = f"{tag}/{c.case}/{run}"
        prompt = list(c.prompt)
        if run.startswith("retained"):
            sub = eng.submit(key, prompt, c.max_tokens, _salt(tag, run, c), adopt_at=c.boundary)
        elif run.startswith("split"):  # split, split-repeat, split-alone
            sub = eng.submit(key, prompt, c.max_tokens, _salt(tag, run, c), split_at=c.boundary,
                             watch=c.boundary)
        else:
            sub = eng.submit(key, prompt, c.max_tokens, _salt(tag, run, c))
        runs[(c.case, run)] = sub
        return sub

    for phase, names in ((2, ("retained", "recompute", "split")),
                         (3, ("retained-repeat", "recompute-repeat", "split-repeat"))):
        t = time.perf_counter()
        eng.run([submit(c, r) for c in cases for r in names])
        say(f"phase {phase}: {len(cases) * len(names)} requests in "
            f"{time.perf_counter() - t:.1f} s")
    t = time.perf_counter()
    for c in cases:
        for run in ("retained-alone", "split-alone"):
            eng.run([submit(c, run)])
    say(f"phase 4: {2 * len(cases)} requests alone in {time.perf_counter() - t:.1f} s")

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
