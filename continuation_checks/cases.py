"""Continuation cases: a prompt, a restart boundary ``b`` on the recurrent grid, greedy tokens.

From a seed, cases come in shared-prefix families like the serving workload (SPEC §10)::

    family f:  context_f (random tokens)
      prompt_{f,j} = context_f[0 : P] ++ own_{f,j}     P = round(share * L), L in [grid+1, Lmax]
      boundaries   = every grid multiple b with b <= L - 1 (vLLM caps a hit at L - 1), up to
                     ``boundaries_per_prompt`` of them, deepest first

Several boundaries per prompt probe restart depth; several prompts per family share a prefix (each
case still runs under its own salts, so cases never reuse each other's state). From a file: JSON
lines, one object per case: ``{"prompt": [ids...], "boundary": b, "max_tokens": n}``.

Edge cases (:func:`make_edge_cases`) put the prompt's end on the places where off-by-one state
bugs live, for every boundary ``b`` the model limit allows, in turn::

    at L - 1     L = b + 1        the boundary is vLLM's cap; the consumer computes one token
    block end    L = b + G        the prompt is a multiple of the block; its last chunk ends on one
    mid block    L = b + G / 2    the last chunk ends between two boundaries
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hybridmem.errors import HybridMemError
from hybridmem.inputs import read_input_text

MAX_PROMPT = 1 << 20  # no model this check runs holds a longer sequence
MIN_TOKEN_ID = 16  # ids below are left to special tokens, as in the workload


@dataclass(frozen=True)
class Case:
    case: int
    family: int
    prompt: tuple[int, ...]
    boundary: int
    max_tokens: int

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)


def check_case(c: Case, grid: int, vocab: int, max_model_len: int) -> None:
    """Raise :class:`HybridMemError` naming the offending value."""
    n = len(c.prompt)
    if c.boundary <= 0 or c.boundary % grid:
        raise HybridMemError(f"case {c.case}: boundary {c.boundary} is not a positive multiple "
                             f"of the recurrent grid ({grid} tokens)")
    if c.boundary > n - 1:
        raise HybridMemError(f"case {c.case}: boundary {c.boundary} > prompt length {n} - 1 "
                             "(vLLM caps a prefix hit at length - 1)")
    if c.max_tokens < 1:
        raise HybridMemError(f"case {c.case}: max_tokens must be >= 1, got {c.max_tokens}")
    if n + c.max_tokens > max_model_len:
        raise HybridMemError(f"case {c.case}: prompt {n} + {c.max_tokens} tokens exceeds the "
                             f"model limit {max_model_len}")
    bad = [t for t in c.prompt if not 0 <= t < vocab]
    if bad:
        raise HybridMemError(f"case {c.case}: token id {bad[0]} outside [0, {vocab})")


def make_cases(n: int, seed: int, vocab: int, grid: int, max_model_len: int,
               max_tokens: int = 16, share: float = 0.5, prompts_per_family: int = 2,
               boundaries_per_prompt: int = 3) -> list[Case]:
    """``n`` cases from ``seed`` (deterministic)."""
    if n < 1:
        raise HybridMemError(f"number of cases must be >= 1, got {n}")
    if vocab <= MIN_TOKEN_ID + 1:
        raise HybridMemError(f"vocabulary of {vocab} ids leaves no prompt tokens")
    max_len = min(max_model_len - max_tokens, (boundaries_per_prompt + 1) * grid)
    if max_len < grid + 1:
        raise HybridMemError(f"model limit {max_model_len} leaves no prompt longer than one "
                             f"grid of {grid} tokens beside {max_tokens} output tokens")
    rng = np.random.default_rng(seed)
    cases: list[Case] = []
    family = 0
    while len(cases) < n:
        context = rng.integers(MIN_TOKEN_ID, vocab, max_len)
        for _ in range(prompts_per_family):
            length = int(rng.integers(grid + 1, max_len + 1))
            shared = round(share * length)
            own = rng.integers(MIN_TOKEN_ID, vocab, length - shared)
            prompt = tuple(int(t) for t in np.concatenate([context[:shared], own]))
            deepest = (length - 1) // grid * grid
            for b in range(deepest, 0, -grid)[:boundaries_per_prompt]:
                if len(cases) < n:
                    cases.append(Case(len(cases), family, prompt, b, max_tokens))
        family += 1
    return cases


EDGE_SHAPES = ("at L - 1", "block end", "mid block")


def edge_lengths(b: int, grid: int) -> dict[str, int]:
    """The prompt length of each edge shape at boundary ``b`` (see the module docstring)."""
    return {"at L - 1": b + 1, "block end": b + grid, "mid block": b + max(1, grid // 2)}


def make_edge_cases(n: int, seed: int, vocab: int, grid: int, max_model_len: int,
                    max_tokens: int = 16) -> list[Case]:
    """``n`` cases at exact block boundaries: every (boundary, edge shape) that fits the model
    limit in turn, each time with fresh random tokens from ``seed`` (deterministic)."""
    if n < 1:
        raise HybridMemError(f"number of cases must be >= 1, got {n}")
    if vocab <= MIN_TOKEN_ID + 1:
        raise HybridMemError(f"vocabulary of {vocab} ids leaves no prompt tokens")
    max_len = max_model_len - max_tokens
    shapes = [(b, length) for b in range(grid, max_len, grid)
              for length in edge_lengths(b, grid).values() if length <= max_len]
    if not shapes:
        raise HybridMemError(f"model limit {max_model_len} leaves no prompt longer than one "
                             f"grid of {grid} tokens beside {max_tokens} output tokens")
    rng = np.random.default_rng(seed)
    cases: list[Case] = []
    while len(cases) < n:
        b, length = shapes[len(cases) % len(shapes)]
        prompt = tuple(int(t) for t in rng.integers(MIN_TOKEN_ID, vocab, length))
        cases.append(Case(len(cases), len(cases), prompt, b, max_tokens))
    return cases


def _whole(v: Any, what: str, lo: int, hi: int) -> int:
    """A JSON integer in ``[lo, hi]``: no string, float or boolean stands in for one."""
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"{what} {str(v)[:40]!r} is not an integer in [{lo}, {hi}]")
    return v


def load_cases(path: Path) -> list[Case]:
    """Cases from a JSON-lines file (see the module docstring); every value's type and range is
    checked here, before any engine starts (the grid and vocabulary: by :func:`check_case`)."""
    cases: list[Case] = []
    text = read_input_text(path, "cases file")
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise TypeError("a case is a JSON object")
            unknown = set(obj) - {"prompt", "boundary", "max_tokens", "family"}
            if unknown:
                raise KeyError(f"unknown keys {sorted(unknown)}")
            if not isinstance(obj["prompt"], list) or len(obj["prompt"]) > MAX_PROMPT:
                raise TypeError(f"prompt must be a list of at most {MAX_PROMPT} token ids")
            prompt = tuple(_whole(t, "token id", 0, 2**31 - 1) for t in obj["prompt"])
            case = Case(len(cases), _whole(obj.get("family", len(cases)), "family", 0, 2**31),
                        prompt, _whole(obj["boundary"], "boundary", 1, MAX_PROMPT),
                        _whole(obj.get("max_tokens", 16), "max_tokens", 1, MAX_PROMPT))
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            raise HybridMemError(f"{path}:{lineno}: not a case ({type(exc).__name__}: "
                                 f"{str(exc)[:200]})") from None
        if not prompt:
            raise HybridMemError(f"{path}:{lineno}: empty prompt")
        cases.append(case)
    if not cases:
        raise HybridMemError(f"{path}: no cases")
    return cases
