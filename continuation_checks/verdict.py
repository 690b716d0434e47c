"""The verdict of one case from its arm results, with the evidence that decided it.

Inputs (:class:`CaseEvidence`): greedy token ids of every arm run, the consumers' adopted depths
(from the trace's ADOPTION events) and three kinds of state comparison at ``b``:

* ``copy``: each retained consumer's adopted bytes (read at admission) against the state its own
  producer computed (read right after the producer's step that ended at b). The same bytes stored
  and read back: any difference is a storage bug, no tolerance;
* ``retained``: each adopted checkpoint against the ``split`` arm's from-scratch state at b;
* ``reference``: the from-scratch states at b against each other (split vs split-repeat vs
  split-alone): the reference's own variance across batch contexts.

Tolerance of the ``retained`` comparison: ``max(reference variance, ENVELOPE[dtype] * max|ref|)``.
The envelope is a stated numerics allowance (fp32 1e-5, bf16 2^-5 of the state's largest
magnitude): on CPU float32 a prefix computed in another batch differs from the split arm's by
~1e-6 relative (measured), while a corrupted, stale or swapped checkpoint differs by O(1).

Rules, first match wins::

    untreated        a retained consumer adopted depth != b, or a state at b was not captured
    state-mismatch   a copy differs at all, or a retained checkpoint differs from the
                     from-scratch state at b beyond the tolerance
    identical        every retained run's tokens equal the recompute arm's
    reference-unstable  recompute != its repeat, or split != its repeat (token ids)
    numerics         the divergence also appears without reuse: recompute != split, or a batched
                     run != its alone run (retained, split)
    unexplained      retained state matches, references agree and repeat, batching changes
                     nothing, and still retained != recompute: the evidence points outside the
                     recurrent state (e.g. reused attention KV) -- none of the above explains it

``state-mismatch`` is tested before the token rules: state bytes are direct evidence, so an
unstable reference (bf16) cannot hide a corrupted checkpoint, and a model that forgets its state
(trap 1 of the vLLM notes) cannot hide one behind identical tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from continuation_checks.compare import StateDiff, first_divergence


class Verdict(StrEnum):
    IDENTICAL = "identical"
    UNTREATED = "untreated"
    REFERENCE_UNSTABLE = "reference-unstable"
    NUMERICS = "numerics"
    STATE_MISMATCH = "state-mismatch"
    UNEXPLAINED = "unexplained"


VERDICTS = tuple(v.value for v in Verdict)
RETAINED_RUNS = ("retained", "retained-repeat", "retained-alone")
REFERENCE_RUNS = ("recompute", "recompute-repeat", "split", "split-repeat", "split-alone")
ALL_RUNS = RETAINED_RUNS + REFERENCE_RUNS
ENVELOPE = {"float32": 1e-5, "bfloat16": 2.0 ** -5}


@dataclass
class CaseEvidence:
    boundary: int
    tokens: dict[str, list[int]]                 # run name -> greedy token ids
    adopted_depth: dict[str, int | None]         # retained run -> ADOPTION depth
    copy: dict[str, StateDiff | None]            # retained run -> adopted vs its producer's state
    retained_state: dict[str, StateDiff | None]  # retained run -> adopted vs split state at b
    reference_state: list[StateDiff]             # split vs split-repeat, split vs split-alone
    dtype: str = "float32"
    notes: list[str] = field(default_factory=list)

    @property
    def tolerance(self) -> float:
        """Allowed scaled difference: reference variance or the dtype's envelope."""
        ref = max((d.scaled for d in self.reference_state), default=0.0)
        return max(ref, ENVELOPE.get(self.dtype, ENVELOPE["bfloat16"]))


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    reason: str


def _diverges(ev: CaseEvidence, a: str, b: str) -> int | None:
    return first_divergence(ev.tokens[a], ev.tokens[b])


def classify(ev: CaseEvidence) -> Decision:
    missing = [r for r in ALL_RUNS if r not in ev.tokens]
    if missing:
        raise ValueError(f"case evidence lacks arm runs {missing}")
    wrong = {r: ev.adopted_depth.get(r) for r in RETAINED_RUNS
             if ev.adopted_depth.get(r) != ev.boundary}
    if wrong:
        return Decision(Verdict.UNTREATED, f"adopted depth != boundary {ev.boundary}: "
                        + ", ".join(f"{r}={d}" for r, d in wrong.items()))
    no_state = [f"{r} (copy)" for r in RETAINED_RUNS if ev.copy.get(r) is None]
    no_state += [r for r in RETAINED_RUNS if ev.retained_state.get(r) is None]
    if no_state or len(ev.reference_state) < 2:
        what = no_state + ([] if len(ev.reference_state) >= 2 else ["split references"])
        return Decision(Verdict.UNTREATED, f"state at b={ev.boundary} not captured for "
                        + ", ".join(what))

    for r in RETAINED_RUNS:
        c = ev.copy[r]
        assert c is not None
        if not c.bitwise_equal:
            return Decision(Verdict.STATE_MISMATCH, (
                f"{r}: the adopted checkpoint is not the state its producer computed at "
                f"b={ev.boundary}: max abs {c.max_abs:.3g} (scaled {c.scaled:.3g}; ssm equal "
                f"{c.ssm_equal}, conv equal {c.conv_equal})"))
    tol = ev.tolerance
    for r in RETAINED_RUNS:
        d = ev.retained_state[r]
        assert d is not None
        if d.scaled > tol:
            return Decision(Verdict.STATE_MISMATCH, (
                f"{r}: adopted checkpoint vs from-scratch state at b={ev.boundary}: max abs "
                f"{d.max_abs:.3g} (scaled {d.scaled:.3g}; ssm equal {d.ssm_equal}, conv equal "
                f"{d.conv_equal}) beyond the tolerance {tol:.3g}"))
    held = [d for d in ev.retained_state.values() if d is not None]
    state_words = ("bitwise equal" if all(d.bitwise_equal for d in held) else
                   f"within tolerance (max scaled {max(d.scaled for d in held):.3g})")

    div = {r: _diverges(ev, r, "recompute") for r in RETAINED_RUNS}
    if all(i is None for i in div.values()):
        return Decision(Verdict.IDENTICAL, "every retained run equals recompute token by token; "
                        f"state at b {state_words}")
    unstable = [f"{a} vs {b} at {i}" for a, b in (("recompute", "recompute-repeat"),
                                                  ("split", "split-repeat"))
                if (i := _diverges(ev, a, b)) is not None]
    if unstable:
        return Decision(Verdict.REFERENCE_UNSTABLE,
                        "reference differs from its own repeat: " + "; ".join(unstable))
    witness = [f"{a} vs {b} at {i}" for a, b in (("recompute", "split"),
                                                 ("retained", "retained-alone"),
                                                 ("split", "split-alone"))
               if (i := _diverges(ev, a, b)) is not None]
    first = min(i for i in div.values() if i is not None)
    if witness:
        return Decision(Verdict.NUMERICS, (
            f"retained diverges from recompute at {first} with the state at b {state_words}; "
            "the divergence appears without reuse too: " + "; ".join(witness)))
    return Decision(Verdict.UNEXPLAINED, (
        f"retained diverges from recompute at {first}, yet the state at b is {state_words}, the "
        "references repeat and agree, and batching changes nothing"))
