"""Comparisons between arm runs: token ids, first divergence, logit margins, state bytes.

Margins come from vLLM's top-2 logprobs: ``log p1 - log p2`` of the log-softmax equals the top-1 /
top-2 *logit* margin (the normalizer cancels), so a small margin at a divergence says greedy
decoding stood on a near-tie there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token id (the shorter length if one is a prefix), or None."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def margins(top2: Sequence[tuple[float, float]]) -> list[float]:
    """Top-1 minus top-2 logit margin at every generated position."""
    return [t1 - t2 for t1, t2 in top2]


def margin_at(top2: Sequence[tuple[float, float]], index: int | None) -> float | None:
    if index is None or index >= len(top2):
        return None
    t1, t2 = top2[index]
    return t1 - t2


class StateDiff(NamedTuple):
    """Two states' agreement: conv and SSM bytes together."""

    bitwise_equal: bool
    max_abs: float       # max |a - b| over conv and SSM elements
    max_rel: float       # elementwise: max |a - b| / max(|b|, tiny)
    ssm_equal: bool
    conv_equal: bool
    scaled: float = 0.0  # max |a - b| / max |b| (per part, the larger): the envelope's measure

    def as_dict(self) -> dict[str, Any]:
        return self._asdict()


def state_diff(a: Any, b: Any) -> StateDiff:
    """Compare two :class:`~continuation_checks.engine.StateBytes` (bit-level and numeric)."""
    import torch

    ssm_eq = bool(torch.equal(a.ssm, b.ssm))
    conv_eq = bool(torch.equal(a.conv, b.conv))
    max_abs = 0.0
    max_rel = 0.0
    scaled = 0.0
    tiny = torch.finfo(torch.float32).tiny
    for x, y in ((a.ssm, b.ssm), (a.conv, b.conv)):
        if x.shape != y.shape:
            raise ValueError(f"state shapes differ: {tuple(x.shape)} vs {tuple(y.shape)}")
        xf, yf = x.float(), y.float()
        d = (xf - yf).abs()
        if d.numel():
            m = float(d.max())
            if math.isnan(m):  # max() below would drop a NaN (comparisons with NaN are False)
                m = math.inf
            max_abs = max(max_abs, m)
            max_rel = max(max_rel, float((d / yf.abs().clamp_min(tiny)).max()))
            scaled = max(scaled, m / max(float(yf.abs().max()), tiny))
    if math.isnan(max_abs) or math.isnan(scaled):
        max_abs = scaled = math.inf
    return StateDiff(ssm_eq and conv_eq, max_abs, max_rel, ssm_eq, conv_eq, scaled)
