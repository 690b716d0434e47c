"""ShareGPT-V3-like token workloads (SPEC §10, paper §4.2): shared contexts, Poisson arrivals.

The paper's workload: eight shared contexts, ~3,332 input tokens on average at model limit 8,192,
generation cap 1,024, common-prefix fraction ``q``, Poisson arrivals at rate ``lambda``, 300
requests a run, seeds as independent repeats. Its generator's token ids and arrival vectors were
not published (§4.5), so this module fixes one concrete generator with those properties::

    request i:  context c_i ~ U{0..7},  input length L_i,  output target O_i
                P_i = round(q * L_i) shared tokens

    prompt_i = context[c_i][0 : P_i]  ++  own_i[P_i : L_i]
               |---- shared prefix ---|  |-- request-unique tokens --|

- ``context[c]`` is a fixed random token sequence of the longest allowed prompt; ``own_i`` is a
  request-unique random sequence of length ``L_i``. ``q = 0`` gives no common prefix; ``q = 1``
  makes every prompt a prefix of its context, so two requests on one context share
  ``min(L_i, L_j)`` tokens.
- Lengths are lognormal truncated to their range (like a dataset filtered to the model limit),
  with ``mu`` solved so the truncated mean hits the target. At the reference limit 8,192: inputs
  in [32, 7,168] with mean 3,332 (sigma 0.7); output targets in [1, 1,024] with mean 256
  (sigma 0.9; the output shape is this module's choice, the paper gives none). For another
  limit every length is scaled by ``model_limit / 8192`` (limit 512: inputs in [2, 448], mean
  208.25, outputs capped at 64), so ``L_i + O_i <= model_limit`` always.
- System prompts (``system_prompt_min`` / ``system_prompt_max``, optional): context ``c`` gets
  a length ``S_c ~ U{min..max}`` and ``P_i = min(round(q L_i), S_c)``, so at ``q = 1`` every
  request opens with its context's system prompt (or is a prefix of it) and continues with
  request-unique tokens: chat-like sharing of a fixed prefix shorter than most prompts.
- Arrivals: the first request at 0 s, then exponential gaps of mean ``1 / rate``.
- ``isolate``: a request-unique ``cache_salt`` (SPEC §5) so no cross-request prefix hit.

Every random stream (contexts, lengths, context choice, own tokens, arrivals) is its own child of
``SeedSequence(seed)``: within a seed, ``q`` and ``isolate`` change neither lengths, contexts,
output targets nor arrivals, matching the paper's "recorded prompt lengths, contexts, and output
targets match within seeds".
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hybridmem.errors import HybridMemError
from hybridmem.inputs import read_input_text

REFERENCE_LIMIT = 8192      # model limit of the paper's workload
REFERENCE_MEAN_INPUT = 3332.0
REFERENCE_OUTPUT_CAP = 1024
REFERENCE_MIN_INPUT = 32
REFERENCE_MEAN_OUTPUT = 256.0
INPUT_SIGMA = 0.7
OUTPUT_SIGMA = 0.9
NUM_CONTEXTS = 8
MANIFEST_NAME = "workload.json"
MANIFEST_FORMAT = "hybridmem-workload"
MANIFEST_VERSION = 1

# Child streams of SeedSequence(seed); fixed positions keep each stream independent of the others.
# (a stream appended later leaves the earlier ones unchanged: child i depends on i alone)
_STREAMS = ("contexts", "input_len", "output_len", "context_choice", "own_tokens", "arrivals",
            "system_prompt")


class WorkloadError(HybridMemError):
    """Workload parameters or a manifest that cannot be used."""


@dataclass(frozen=True)
class WorkloadSpec:
    """Everything a workload is generated from; the same spec always gives the same workload."""

    vocab_size: int             # model vocabulary; prompt ids are drawn from [min_token_id, vocab)
    num_requests: int = 300
    rate: float = 3.0           # Poisson arrival rate, requests/s (math.inf: all at 0 s)
    share: float = 1.0          # q, the common-prefix fraction of each prompt, in [0, 1]
    seed: int = 0
    isolate: bool = False       # per-request cache_salt
    model_limit: int = REFERENCE_LIMIT
    min_token_id: int = 16      # ids below are left to special tokens
    num_contexts: int = NUM_CONTEXTS
    output_cap: int | None = None    # default: 1,024 scaled to model_limit
    mean_input: float | None = None  # default: 3,332 scaled to model_limit
    system_prompt_min: int | None = None  # per-context shared-prefix length S_c ~ U{min..max}
    system_prompt_max: int | None = None  # (both or neither; None: P_i = round(q L_i))


@dataclass(frozen=True)
class WorkloadRequest:
    """One request of a workload, in arrival order."""

    request_id: str
    arrival_s: float                  # planned arrival, seconds after the run starts
    prompt_token_ids: tuple[int, ...]
    max_output_tokens: int
    cache_salt: str | None            # set only in isolate mode
    context_id: int                   # which shared context the prompt draws its prefix from
    shared_prefix_tokens: int         # P_i = round(q L_i): leading tokens taken from the context

    @property
    def num_input_tokens(self) -> int:
        return len(self.prompt_token_ids)


class LengthPlan:
    """Resolved length ranges and lognormal parameters for one spec (pure arithmetic)."""

    def __init__(self, spec: WorkloadSpec) -> None:
        scale = spec.model_limit / REFERENCE_LIMIT
        self.output_cap = (max(1, round(REFERENCE_OUTPUT_CAP * scale))
                           if spec.output_cap is None else spec.output_cap)
        self.max_input = spec.model_limit - self.output_cap
        self.min_input = min(self.max_input, max(1, round(REFERENCE_MIN_INPUT * scale)))
        self.mean_input = (REFERENCE_MEAN_INPUT * scale if spec.mean_input is None
                           else float(spec.mean_input))
        self.mean_output = min(REFERENCE_MEAN_OUTPUT * scale, (1 + self.output_cap) / 2)
        if self.max_input < 1:
            raise WorkloadError(f"model limit {spec.model_limit} leaves no room for a prompt "
                                f"beside an output cap of {self.output_cap}")
        if not self.min_input < self.mean_input < self.max_input:
            raise WorkloadError(f"mean input {self.mean_input:g} must lie strictly between the "
                                f"prompt length bounds {self.min_input} and {self.max_input}")
        self.input_mu = solve_mu(self.mean_input, INPUT_SIGMA, self.min_input, self.max_input)
        self.output_mu = (solve_mu(self.mean_output, OUTPUT_SIGMA, 1, self.output_cap)
                          if self.output_cap > 1 else 0.0)

    def as_dict(self) -> dict[str, float]:
        return {"output_cap": self.output_cap, "min_input": self.min_input,
                "max_input": self.max_input, "mean_input": self.mean_input,
                "mean_output": self.mean_output, "input_mu": self.input_mu,
                "input_sigma": INPUT_SIGMA, "output_mu": self.output_mu,
                "output_sigma": OUTPUT_SIGMA}


def _phi(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def truncated_lognormal_mean(mu: float, sigma: float, lo: float, hi: float) -> float:
    """``E[X | lo <= X <= hi]`` for ``ln X ~ N(mu, sigma^2)``."""
    a, b = (math.log(lo) - mu) / sigma, (math.log(hi) - mu) / sigma
    mass = _phi(b) - _phi(a)
    if mass <= 0.0:
        return lo if b <= 0 else hi  # all mass beyond one end
    return math.exp(mu + sigma * sigma / 2) * (_phi(b - sigma) - _phi(a - sigma)) / mass


def solve_mu(mean: float, sigma: float, lo: float, hi: float) -> float:
    """The ``mu`` whose lognormal truncated to ``[lo, hi]`` has the given mean (bisection).

    Hand-written rather than ``scipy.optimize.brentq``: 200 fixed halvings give the same bits on
    every platform and scipy version, and every workload (and so every allocator digest and kept
    campaign result) is drawn from this ``mu``; a root finder with its own stopping rule could
    move its last bits."""
    left, right = math.log(lo) - 8 * sigma, math.log(hi) + 8 * sigma
    for _ in range(200):
        mid = 0.5 * (left + right)
        if truncated_lognormal_mean(mid, sigma, lo, hi) < mean:
            left = mid
        else:
            right = mid
    return 0.5 * (left + right)


def _truncated_lognormal_ints(rng: np.random.Generator, n: int, mu: float, sigma: float,
                              lo: int, hi: int) -> np.ndarray:
    """``n`` draws of ``round(X)``, ``X`` lognormal, redrawn until inside ``[lo, hi]``."""
    out = np.empty(n, dtype=np.int64)
    todo = np.arange(n)
    while todo.size:
        x = np.rint(rng.lognormal(mu, sigma, todo.size))
        ok = (x >= lo) & (x <= hi)
        out[todo[ok]] = x[ok]
        todo = todo[~ok]
    return out


def check_spec(spec: WorkloadSpec) -> None:
    if spec.num_requests < 1:
        raise WorkloadError(f"number of requests must be >= 1, got {spec.num_requests}")
    if not spec.rate > 0:
        raise WorkloadError(f"arrival rate must be > 0 requests/s, got {spec.rate}")
    if not 0.0 <= spec.share <= 1.0:
        raise WorkloadError(f"shared-prefix fraction q must lie in [0, 1], got {spec.share}")
    if spec.num_contexts < 1:
        raise WorkloadError(f"need at least one shared context, got {spec.num_contexts}")
    if not 0 <= spec.min_token_id < spec.vocab_size - 1:
        raise WorkloadError(f"token ids [{spec.min_token_id}, {spec.vocab_size}) leave fewer "
                            "than 2 usable ids")
    if spec.output_cap is not None and not 1 <= spec.output_cap < spec.model_limit:
        raise WorkloadError(f"output cap {spec.output_cap} must lie in [1, model limit "
                            f"{spec.model_limit})")
    if spec.seed < 0:
        raise WorkloadError(f"seed must be >= 0, got {spec.seed}")
    lo, hi = spec.system_prompt_min, spec.system_prompt_max
    if (lo is None) != (hi is None):
        raise WorkloadError("system prompt lengths need both a minimum and a maximum")
    if lo is not None and hi is not None and not (
            isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
        raise WorkloadError(f"system prompt lengths must be integers 1 <= min <= max, got "
                            f"[{lo}, {hi}]")


def sample_lengths(spec: WorkloadSpec) -> tuple[np.ndarray, np.ndarray]:
    """Input lengths and output targets of every request (no tokens; cheap for large N)."""
    check_spec(spec)
    plan = LengthPlan(spec)
    streams = _streams(spec.seed)
    n = spec.num_requests
    inputs = _truncated_lognormal_ints(streams["input_len"], n, plan.input_mu, INPUT_SIGMA,
                                       plan.min_input, plan.max_input)
    if plan.output_cap > 1:
        outputs = _truncated_lognormal_ints(streams["output_len"], n, plan.output_mu,
                                            OUTPUT_SIGMA, 1, plan.output_cap)
    else:
        outputs = np.ones(n, dtype=np.int64)
    return inputs, outputs


def _streams(seed: int) -> dict[str, np.random.Generator]:
    children = np.random.SeedSequence(seed).spawn(len(_STREAMS))
    return {name: np.random.default_rng(child) for name, child in zip(_STREAMS, children,
                                                                          strict=True)}


def arrival_times(spec: WorkloadSpec) -> np.ndarray:
    """Planned arrivals: 0 s, then cumulative exponential gaps of mean ``1 / rate``."""
    check_spec(spec)
    n = spec.num_requests
    if math.isinf(spec.rate):
        return np.zeros(n)
    gaps = _streams(spec.seed)["arrivals"].exponential(1.0 / spec.rate, n - 1)
    return np.concatenate(([0.0], np.cumsum(gaps)))


@dataclass(frozen=True)
class Workload:
    spec: WorkloadSpec
    requests: tuple[WorkloadRequest, ...]

    @property
    def plan(self) -> LengthPlan:
        return LengthPlan(self.spec)

    def total_input_tokens(self) -> int:
        return sum(r.num_input_tokens for r in self.requests)

    def save_manifest(self, path: str | Path) -> Path:
        """Write the JSON manifest (to ``path``, or ``path/workload.json`` for a directory)."""
        return save_manifest(self, path)


def make_workload(spec: WorkloadSpec) -> Workload:
    """The workload of ``spec``; identical for identical specs."""
    check_spec(spec)
    plan = LengthPlan(spec)
    streams = _streams(spec.seed)
    inputs, outputs = sample_lengths(spec)
    arrivals = arrival_times(spec)
    lo, hi = spec.min_token_id, spec.vocab_size
    contexts = streams["contexts"].integers(lo, hi, (spec.num_contexts, plan.max_input))
    choice = streams["context_choice"].integers(0, spec.num_contexts, spec.num_requests)
    own_rng = streams["own_tokens"]
    system = (None if spec.system_prompt_min is None else streams["system_prompt"].integers(
        spec.system_prompt_min, int(spec.system_prompt_max or 0) + 1, spec.num_contexts))
    requests = []
    for i in range(spec.num_requests):
        length = int(inputs[i])
        own = own_rng.integers(lo, hi, length)  # drawn at full length whatever q is
        shared = int(round(spec.share * length))
        if system is not None:
            shared = min(shared, int(system[choice[i]]))
        prompt = np.concatenate((contexts[choice[i], :shared], own[shared:]))
        rid = f"s{spec.seed}-r{i:05d}"
        requests.append(WorkloadRequest(
            request_id=rid,
            arrival_s=float(arrivals[i]),
            prompt_token_ids=tuple(prompt.tolist()),  # Python ints, as int(t) gives
            max_output_tokens=int(outputs[i]),
            cache_salt=f"isolate-{rid}" if spec.isolate else None,
            context_id=int(choice[i]),
            shared_prefix_tokens=shared,
        ))
    return Workload(spec=spec, requests=tuple(requests))


# --- manifest -------------------------------------------------------------------------------------

def _token_digest(requests: tuple[WorkloadRequest, ...]) -> str:
    h = hashlib.sha256()
    for r in requests:
        h.update(np.asarray(r.prompt_token_ids, dtype="<i8").tobytes())
        h.update(b"|")
    return h.hexdigest()


def manifest_dict(workload: Workload) -> dict[str, Any]:
    return {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "spec": dataclasses.asdict(workload.spec),
        "derived": workload.plan.as_dict(),
        "num_input_tokens": workload.total_input_tokens(),
        "prompt_tokens_sha256": _token_digest(workload.requests),
        "requests": [
            {f.name: getattr(r, f.name) for f in dataclasses.fields(r)}
            | {"prompt_token_ids": list(r.prompt_token_ids)}
            for r in workload.requests
        ],
    }


def save_manifest(workload: Workload, path: str | Path) -> Path:
    """Write ``workload`` as JSON; a directory ``path`` gets ``workload.json`` inside it."""
    p = Path(path)
    if p.is_dir():
        p = p / MANIFEST_NAME
    data = manifest_dict(workload)
    if math.isinf(workload.spec.rate):
        data["spec"]["rate"] = "inf"
    p.write_text(json.dumps(data, separators=(",", ":")))
    return p


def load_manifest(path: str | Path) -> Workload:
    """Read a manifest written by :func:`save_manifest`, checking its format and token digest."""
    p = Path(path)
    if p.is_dir():
        p = p / MANIFEST_NAME
    try:
        data = json.loads(read_input_text(p, "workload manifest", limit=1 << 30))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WorkloadError(f"cannot read workload manifest {str(p)!r}: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
        raise WorkloadError(f"{str(p)!r} is not a {MANIFEST_FORMAT} manifest")
    if data.get("version") != MANIFEST_VERSION:
        raise WorkloadError(f"{str(p)!r} has manifest version {data.get('version')!r}; this "
                            f"build reads version {MANIFEST_VERSION}")
    try:
        spec_d = dict(data["spec"])
        spec_d["rate"] = float(spec_d["rate"])
        spec = WorkloadSpec(**spec_d)
        requests = tuple(
            WorkloadRequest(**{**r, "prompt_token_ids": tuple(r["prompt_token_ids"])})
            for r in data["requests"])
    except (KeyError, TypeError, ValueError) as exc:
        raise WorkloadError(f"{str(p)!r}: malformed manifest ({exc})") from None
    if len(requests) != spec.num_requests:
        raise WorkloadError(f"{str(p)!r} lists {len(requests)} requests, its spec says "
                            f"{spec.num_requests}")
    digest = _token_digest(requests)
    if digest != data.get("prompt_tokens_sha256"):
        raise WorkloadError(f"{str(p)!r}: prompt token digest {digest[:12]}... does not match "
                            f"the recorded {str(data.get('prompt_tokens_sha256'))[:12]}...")
    return Workload(spec=spec, requests=requests)
