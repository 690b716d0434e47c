"""The continuation check's driver rules, engine-free: salts, where the state at b is read,
top-2 log-probabilities, the evidence a case is classified from, and the exit code.

Each test is the negative control of a ``continuation`` mutant in
``invariants/serving_mutants.py`` (named in brackets)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from continuation_checks.cases import Case
from continuation_checks.check import exit_code
from continuation_checks.compare import margin_at, margins, state_diff
from continuation_checks.engine import ContinuationEngine, StateBytes, Submitted, top2
from continuation_checks.run import _SALT, _result, _salt
from continuation_checks.verdict import ALL_RUNS, RETAINED_RUNS, Verdict

B = 64
CASE = Case(3, 0, tuple(range(100)), B, 8)


def state(seed: int) -> StateBytes:
    g = torch.Generator().manual_seed(seed)
    return StateBytes(torch.randn(16, generator=g), torch.randn(64, generator=g))


def test_every_arm_of_every_case_has_its_own_salt() -> None:
    cases = [CASE, Case(4, 0, CASE.prompt, B, 8)]
    salts = {_salt("cc", run, c) for run in _SALT for c in cases}
    assert len(salts) == len(_SALT) * len(cases)  # [arms-run-without-their-salts]
    assert all(s.startswith("cc-") for s in salts)


class FakeEngine:
    """What ``_block_at`` and ``_capture`` read on the engine."""

    def __init__(self, mamba: list[int], computed: int) -> None:
        self.grid = 32
        self.mamba_group = 1
        self.reads: list[int] = []
        req = SimpleNamespace(num_computed_tokens=computed)
        self.scheduler = SimpleNamespace(
            requests={"e": req},
            kv_cache_manager=SimpleNamespace(get_block_ids=lambda eid: ([1, 2, 3], mamba)))
        self.storage = SimpleNamespace(read_stored=lambda block: self.reads.append(block) or block)
        self.by_engine_id = {"e": Submitted("k", engine_id="e")}
        self.watch: dict[str, int] = {}
        self.watch_early: dict[str, int] = {}

    # looked up at call time, so a mutant installed after this module loaded is what runs
    def _block_at(self, engine_id: str, b: int) -> int | None:
        return ContinuationEngine._block_at(self, engine_id, b)  # type: ignore[arg-type]

    def capture(self) -> None:
        ContinuationEngine._capture(self)  # type: ignore[arg-type]


def test_the_state_at_b_is_the_block_at_position_b_over_g_minus_one() -> None:
    eng = FakeEngine([0, 7, 9], B)
    assert eng._block_at("e", 64) == 7  # [boundary-state-read-one-position-late]
    assert eng._block_at("e", 32) is None  # the null block: not held
    assert eng._block_at("e", 128) is None  # past the table


def test_the_state_is_read_at_the_step_that_ends_at_b_only() -> None:
    eng = FakeEngine([0, 7, 9], B)
    eng.watch["e"] = B
    eng.capture()
    assert eng.reads == [7] and eng.by_engine_id["e"].state == 7 and not eng.watch
    late = FakeEngine([0, 7, 9], B + 20)  # the step ran past b: never read, noted
    late.watch["e"] = B
    late.watch_early["e"] = B
    late.capture()  # [state-read-after-the-boundary-passed]
    assert late.reads == [] and late.by_engine_id["e"].state is None
    assert "ran past b=64" in late.by_engine_id["e"].state_note and not late.watch
    early = FakeEngine([0, 7, 9], B - 20)  # not there yet: still watched
    early.watch["e"] = B
    early.capture()
    assert early.reads == [] and early.watch == {"e": B}


def test_top2_are_the_two_largest_log_probabilities_whatever_the_order() -> None:
    pos = {5: SimpleNamespace(logprob=-3.0), 9: SimpleNamespace(logprob=-0.2),
           2: SimpleNamespace(logprob=-1.5)}
    assert top2(pos) == (-0.2, -1.5)  # [margin-from-ascending-logprobs]
    assert top2({1: SimpleNamespace(logprob=-0.1)}) == (-0.1, float("-inf"))


def test_margins_are_top1_minus_top2() -> None:
    t = [(-0.2, -1.5), (-0.1, -0.3)]
    assert margins(t) == pytest.approx([1.3, 0.2])
    assert margin_at(t, 0) == pytest.approx(1.3)  # [margin-sign-flipped]


def test_a_nan_state_difference_is_infinite() -> None:
    a = state(1)
    nan = StateBytes(a.conv.clone(), a.ssm.clone())
    nan.ssm[0] = float("nan")
    d = state_diff(nan, a)
    assert d.max_abs == float("inf") and d.scaled == float("inf")  # [nan-state-difference-passes]
    assert state_diff(a, a).max_abs == 0.0


def sub(tokens: list[int], *, st: Any = None, adopted: Any = None, depth: int | None = None,
        top: list[tuple[float, float]] | None = None) -> Submitted:
    s = Submitted("k", token_ids=list(tokens), top2=top or [(-0.1, -2.0)] * len(tokens))
    s.state, s.adopted_state, s.adopted_depth = st, adopted, depth
    return s


def evidence(**override: Submitted) -> Any:
    ref = state(0)
    runs: dict[tuple[int, str], Submitted] = {}
    for r in ALL_RUNS:
        if r in RETAINED_RUNS:
            runs[(3, r)] = sub([1, 2, 3, 4], adopted=ref, depth=B)
        else:
            runs[(3, r)] = sub([1, 2, 3, 4], st=ref)
    for r, s in override.items():
        runs[(3, r.replace("_", "-"))] = s
    producers = {(3, r): sub([1], st=ref) for r in RETAINED_RUNS}
    return runs, producers


def test_the_copy_check_compares_with_the_producer_not_the_reference() -> None:
    runs, producers = evidence()
    # the split arm's state differs slightly (within tolerance); the adopted bytes are the
    # producer's exactly: a clean copy
    ref = state(0)
    near = StateBytes(ref.conv.clone(), ref.ssm.clone())
    near.ssm[0] += 1e-7
    for r in ("split", "split-repeat", "split-alone"):
        runs[(3, r)].state = near
    res = _result(CASE, runs, producers, False, "float32")
    # [copy-checked-against-split]
    assert all(res.evidence.copy[r].bitwise_equal for r in RETAINED_RUNS)
    assert res.decision.verdict is Verdict.IDENTICAL


def test_the_reference_variance_includes_split_alone() -> None:
    runs, producers = evidence()
    far = state(0)
    far = StateBytes(far.conv.clone(), far.ssm.clone())
    far.ssm[0] += 0.25
    runs[(3, "split-alone")].state = far
    res = _result(CASE, runs, producers, False, "float32")
    # [reference-variance-from-split-itself]
    assert max(d.scaled for d in res.evidence.reference_state) > 0.01


def test_first_divergence_and_margin_of_a_case() -> None:
    runs, producers = evidence(
        retained=sub([1, 2, 9, 9], adopted=state(0), depth=B),
        retained_alone=sub([1, 9, 9, 9], adopted=state(0), depth=B),
        recompute=sub([1, 2, 3, 4], st=state(0), top=[(-0.1, -2.0), (-0.4, -0.5), (-1, -2),
                                                        (-1, -2)]))
    res = _result(CASE, runs, producers, False, "float32")
    assert res.first_divergence == 1  # the earliest of the retained runs [first-divergence-latest]
    assert res.margin_at_divergence == pytest.approx(0.1)  # recompute's [margin-at-...]


def report(*cases: tuple[bool, str]) -> dict[str, Any]:
    return {"cases": [{"faulted": f, "verdict": v} for f, v in cases]}


def test_exit_code() -> None:
    mismatch, same = Verdict.STATE_MISMATCH.value, Verdict.IDENTICAL.value
    assert exit_code(report((False, same)), None) == 0
    assert exit_code(report((False, Verdict.UNEXPLAINED.value)), None) == 1
    assert exit_code(report((True, mismatch), (False, same)), "corrupt-checkpoint") == 0
    assert exit_code(report((True, same), (False, same)), "corrupt-checkpoint") == 1
    # a flagged unfaulted case fails a faulted check [faulted-check-accepts-false-positives]
    assert exit_code(report((True, mismatch), (False, mismatch)), "corrupt-checkpoint") == 1
