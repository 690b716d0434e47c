"""Does a model's recurrent state matter? Greedy continuations from a true and a zeroed checkpoint.

A state-handling test ("S2 hands the adopter the right checkpoint, so its tokens equal the
reference") proves something only if a wrong state would change the tokens. This module measures
that on a shared-prefix workload (:func:`hybridmem.workload.make_workload`, scaled to the model
limit the run driver uses), with transformers as the engine::

    prompt     |<---------- shared prefix ---------->|<--- own tail --->|
    grid       0      g      2g  ...     b          b = g floor(min(P, L - 1) / g), P shared
    reference  greedy over the whole prompt, no split
    true       prefix [0, b) -> cache; continue [b, L) + T decode steps from that cache
    zero       the same, with every layer's SSM and conv state zeroed at b (attention KV kept)

``b`` is the deepest grid boundary an adopter could reuse (inside the shared prefix and below
the prompt length, as vLLM caps hits at L - 1). ``true`` must equal ``reference`` on every request
(the negative control: splitting at a checkpoint is exact); a model whose state matters makes
``zero`` differ on most requests. Requests whose shared prefix is shorter than one grid step have
no checkpoint and are skipped (counted).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hybridmem.workload import WorkloadSpec, make_workload


@dataclass(frozen=True)
class RequestSensitivity:
    request_id: str
    prompt_tokens: int
    boundary: int                 # b: tokens before the checkpoint
    true_matches_reference: bool  # the control
    zero_divergence: int | None   # first generated index where zero != true (None: equal)
    min_margin: float             # smallest top-1 minus top-2 logit along the true continuation


@dataclass(frozen=True)
class SensitivityReport:
    model: str
    grid_tokens: int
    new_tokens: int
    skipped: int                  # requests without a boundary (shared prefix < one grid step)
    requests: tuple[RequestSensitivity, ...]

    @property
    def measured(self) -> int:
        return len(self.requests)

    @property
    def zero_changed(self) -> int:
        return sum(r.zero_divergence is not None for r in self.requests)

    @property
    def control_changed(self) -> int:
        return sum(not r.true_matches_reference for r in self.requests)

    @property
    def accepted(self) -> bool:
        """The control never changes and the zeroed state changes a strict majority."""
        return (self.measured > 0 and self.control_changed == 0
                and 2 * self.zero_changed > self.measured)

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "grid_tokens": self.grid_tokens, "new_tokens": self.new_tokens,
                "skipped": self.skipped, "measured": self.measured,
                "zero_changed": self.zero_changed, "control_changed": self.control_changed,
                "accepted": self.accepted, "requests": [asdict(r) for r in self.requests]}


def _zeroed(cache: Any) -> Any:
    """A deep copy of a transformers hybrid cache with every conv and SSM state set to 0."""
    out = copy.deepcopy(cache)
    touched = 0
    for layer in out.layers:
        for name in ("conv_states", "recurrent_states"):
            for tensor in (getattr(layer, name, None) or {}).values():
                if tensor is not None:
                    tensor.zero_()
                    touched += 1
    assert touched, "no conv/SSM state found in the cache; this indicates a transformers change"
    return out


def _greedy(model: Any, ids: list[int], cache: Any, n: int) -> tuple[list[int], float]:
    """``n`` greedy tokens after feeding ``ids`` on top of ``cache`` (None: fresh); min margin."""
    import torch

    tokens: list[int] = []
    margin = float("inf")
    feed = torch.tensor([ids])
    for _ in range(n):
        out = model(feed, past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        top = torch.topk(out.logits[0, -1], 2).values
        margin = min(margin, float(top[0] - top[1]))
        tokens.append(int(out.logits[0, -1].argmax()))
        feed = torch.tensor([[tokens[-1]]])
    return tokens, margin


def measure_sensitivity(model_dir: Path | str, requests: int = 20, seed: int = 0,
                        share: float = 0.5, new_tokens: int = 32, grid_tokens: int = 64,
                        model_limit: int = 1024, progress: Callable[[int, int], None] | None = None
                        ) -> SensitivityReport:
    """Run the three arms of the module docstring on ``requests`` workload requests."""
    import torch
    from transformers import AutoModelForCausalLM

    for name, value, lo in (("requests", requests, 1), ("new_tokens", new_tokens, 1),
                            ("grid_tokens", grid_tokens, 1), ("model_limit", model_limit, 64)):
        if value < lo:
            raise ValueError(f"{name} must be >= {lo}, got {value}")
    model_dir = Path(model_dir)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    workload = make_workload(WorkloadSpec(vocab_size=model.config.vocab_size, num_requests=requests,
                                          share=share, seed=seed, model_limit=model_limit))
    rows = []
    skipped = 0
    with torch.no_grad():
        for i, req in enumerate(workload.requests):
            prompt = list(req.prompt_token_ids)
            b = grid_tokens * (min(req.shared_prefix_tokens, len(prompt) - 1) // grid_tokens)
            if progress is not None:
                progress(i + 1, requests)
            if b == 0:
                skipped += 1
                continue
            reference, _ = _greedy(model, prompt, None, new_tokens)
            prefix = model(torch.tensor([prompt[:b]]), use_cache=True).past_key_values
            zero, _ = _greedy(model, prompt[b:], _zeroed(prefix), new_tokens)
            true, margin = _greedy(model, prompt[b:], prefix, new_tokens)
            div = next((j for j, (x, y) in enumerate(zip(true, zero, strict=True)) if x != y),
                       None)
            rows.append(RequestSensitivity(req.request_id, len(prompt), b, true == reference,
                                           div, margin))
    return SensitivityReport(str(model_dir), grid_tokens, new_tokens, skipped, tuple(rows))
