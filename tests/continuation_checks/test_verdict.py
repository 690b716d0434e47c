"""Each verdict on constructed arm results (no engine): the rules of continuation_checks.verdict.

Every case is built from one clean baseline (``identical``) and changed in exactly the way that
should move it to another verdict, so each test is also the negative control of the others.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from continuation_checks.compare import first_divergence, margin_at, state_diff
from continuation_checks.engine import StateBytes
from continuation_checks.verdict import (
    ALL_RUNS,
    RETAINED_RUNS,
    CaseEvidence,
    Verdict,
    classify,
)

B = 256
TOKENS = [5, 9, 2, 7, 7, 1, 3, 8]


def state(seed: int = 0) -> StateBytes:
    g = torch.Generator().manual_seed(seed)
    return StateBytes(torch.randn(96, generator=g), torch.randn(512, generator=g))


def perturbed(s: StateBytes, rel: float) -> StateBytes:
    """``s`` with one SSM element moved by ``rel`` of the state's largest magnitude."""
    ssm = s.ssm.clone()
    ssm[3] += rel * float(s.ssm.abs().max())
    return StateBytes(s.conv.clone(), ssm)


def baseline(dtype: str = "float32") -> CaseEvidence:
    ref = state()
    same = state_diff(ref, ref)
    return CaseEvidence(
        boundary=B,
        tokens={r: list(TOKENS) for r in ALL_RUNS},
        adopted_depth={r: B for r in RETAINED_RUNS},
        copy={r: same for r in RETAINED_RUNS},
        retained_state={r: same for r in RETAINED_RUNS},
        reference_state=[same, same],
        dtype=dtype,
    )


def with_tokens(ev: CaseEvidence, **runs: list[int]) -> CaseEvidence:
    tokens = dict(ev.tokens)
    tokens.update({k.replace("_", "-"): v for k, v in runs.items()})
    return dataclasses.replace(ev, tokens=tokens)


DIVERGED = TOKENS[:4] + [0, 0, 0, 0]  # first divergence at 4


def test_identical():
    d = classify(baseline())
    assert d.verdict is Verdict.IDENTICAL, d.reason
    assert "bitwise equal" in d.reason


def test_untreated_when_a_consumer_adopted_another_depth():
    ev = baseline()
    ev.adopted_depth["retained-repeat"] = B - 128
    d = classify(ev)
    assert d.verdict is Verdict.UNTREATED and "retained-repeat=128" in d.reason
    # never silently compared: even diverging tokens do not make it anything else
    assert classify(with_tokens(ev, retained=DIVERGED)).verdict is Verdict.UNTREATED


def test_untreated_when_no_adoption_or_no_state():
    ev = baseline()
    ev.adopted_depth["retained"] = None
    assert classify(ev).verdict is Verdict.UNTREATED
    ev = baseline()
    ev.retained_state["retained-alone"] = None
    assert classify(ev).verdict is Verdict.UNTREATED
    ev = baseline()
    ev.reference_state = ev.reference_state[:1]
    assert classify(ev).verdict is Verdict.UNTREATED


def test_state_mismatch_on_a_copy_difference_even_with_identical_tokens():
    """A corrupted checkpoint on a model that forgets its state: tokens equal, bytes not."""
    ev = baseline()
    ref = state()
    ev.copy["retained"] = state_diff(perturbed(ref, 1e-7), ref)  # any bit counts for a copy
    d = classify(ev)
    assert d.verdict is Verdict.STATE_MISMATCH and "not the state its producer" in d.reason


def test_state_mismatch_beyond_tolerance_but_not_within():
    ref = state()
    ev = baseline()
    ev.retained_state["retained"] = state_diff(perturbed(ref, 0.5), ref)  # O(1): a bug
    assert classify(ev).verdict is Verdict.STATE_MISMATCH
    # control: an fp32 ulp-level difference (the batch variance measured on CPU) is numerics
    ev = baseline()
    ev.retained_state["retained"] = state_diff(perturbed(ref, 1e-7), ref)
    assert classify(ev).verdict is Verdict.IDENTICAL
    assert "within tolerance" in classify(ev).reason


def test_tolerance_follows_the_reference_variance_and_dtype():
    ref = state()
    ev = baseline()
    ev.retained_state["retained"] = state_diff(perturbed(ref, 1e-3), ref)
    assert classify(ev).verdict is Verdict.STATE_MISMATCH  # fp32 envelope is 1e-5
    ev.reference_state = [state_diff(perturbed(ref, 2e-3), ref), ev.reference_state[0]]
    assert classify(ev).verdict is Verdict.IDENTICAL  # within the reference's own variance
    ev = baseline("bfloat16")
    ev.retained_state["retained"] = state_diff(perturbed(ref, 1e-3), ref)
    assert classify(ev).verdict is Verdict.IDENTICAL  # within bf16's 2^-5 envelope


def test_state_mismatch_wins_over_an_unstable_reference():
    ref = state()
    ev = with_tokens(baseline(), recompute_repeat=DIVERGED, retained=DIVERGED)
    ev.copy["retained"] = state_diff(perturbed(ref, 0.5), ref)
    assert classify(ev).verdict is Verdict.STATE_MISMATCH


def test_reference_unstable():
    ev = with_tokens(baseline(), retained=DIVERGED, recompute_repeat=DIVERGED)
    d = classify(ev)
    assert d.verdict is Verdict.REFERENCE_UNSTABLE
    assert "recompute vs recompute-repeat at 4" in d.reason
    ev = with_tokens(baseline(), retained=DIVERGED, split_repeat=DIVERGED)
    assert classify(ev).verdict is Verdict.REFERENCE_UNSTABLE


def test_numerics_when_the_divergence_appears_without_reuse():
    # restart-at-b numerics: the split reference (no reuse) diverges like the retained run
    ev = with_tokens(baseline(), retained=DIVERGED, split=DIVERGED, split_repeat=DIVERGED,
                     split_alone=DIVERGED)
    d = classify(ev)
    assert d.verdict is Verdict.NUMERICS and "recompute vs split at 4" in d.reason
    # batch variance: the retained consumer alone differs from the batched one
    ev = with_tokens(baseline(), retained=DIVERGED)
    d = classify(ev)
    assert d.verdict is Verdict.NUMERICS and "retained vs retained-alone at 4" in d.reason


def test_unexplained_when_nothing_accounts_for_the_divergence():
    ev = with_tokens(baseline(), retained=DIVERGED, retained_repeat=DIVERGED,
                     retained_alone=DIVERGED)
    d = classify(ev)
    assert d.verdict is Verdict.UNEXPLAINED and "at 4" in d.reason


def test_missing_arm_is_a_caller_error():
    ev = baseline()
    del ev.tokens["split-alone"]
    with pytest.raises(ValueError, match="split-alone"):
        classify(ev)


def test_first_divergence_and_margin():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    top2 = [(-0.1, -2.0), (-0.5, -0.6)]
    assert margin_at(top2, 1) == pytest.approx(0.1)
    assert margin_at(top2, None) is None and margin_at(top2, 5) is None


def test_state_diff_measures():
    a = state(1)
    d = state_diff(a, a)
    assert d.bitwise_equal and d.max_abs == 0.0 and d.scaled == 0.0
    b = perturbed(a, 0.25)
    d = state_diff(b, a)
    assert not d.bitwise_equal and not d.ssm_equal and d.conv_equal
    assert d.scaled == pytest.approx(0.25, rel=1e-5)
    with pytest.raises(ValueError, match="shapes differ"):
        state_diff(StateBytes(a.conv[:5], a.ssm), a)


def test_a_state_exactly_at_the_tolerance_is_within_it():
    ref = state()
    ev = baseline()
    d = state_diff(perturbed(ref, 1e-3), ref)
    ev.retained_state["retained"] = d
    ev.reference_state = [d, d]  # tolerance = the reference variance = this difference
    assert ev.tolerance == d.scaled
    assert classify(ev).verdict is Verdict.IDENTICAL  # [tolerance-boundary-inclusive]


def test_a_copy_differing_within_tolerance_is_still_a_mismatch():
    ref = state()
    ev = baseline()
    ev.copy["retained-alone"] = state_diff(perturbed(ref, 1e-6), ref)
    assert not ev.copy["retained-alone"].bitwise_equal
    assert classify(ev).verdict is Verdict.STATE_MISMATCH  # [copy-compared-with-tolerance]


def test_a_deeper_adoption_is_untreated():
    ev = baseline()
    ev.adopted_depth["retained"] = B + 128
    assert classify(ev).verdict is Verdict.UNTREATED  # [deeper-adoption-treated]


def test_split_instability_alone_is_reference_unstable():
    ev = with_tokens(baseline(), retained=DIVERGED, split_repeat=DIVERGED)
    d = classify(ev)
    assert d.verdict is Verdict.REFERENCE_UNSTABLE and "split vs split-repeat at 4" in d.reason
