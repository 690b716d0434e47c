"""The GPU cost model: how long one engine step takes, as a sum of rooflines over a device preset.

One step runs the scheduled sequences ``i`` with ``n_i`` new tokens on top of ``c_i`` computed
ones (a prefill chunk: ``n_i > 1``; a decode: ``n_i = 1``). With ``T = sum n_i`` tokens, ``S``
sequences, attention layers ``L_a``, Mamba layers ``L_m`` and the model's shape
(:mod:`.model_shape`)::

    GEMMs      F = 2 P_active T            B = weight bytes (every weight read once a step)
    attention  F = L_a sum_i 4 H_q d n_i (c_i + (n_i + 1) / 2)           (QK^T and AV, causal)
               B = L_a a sum_i (c_i + 2 n_i)                             (read context, write new)
    recurrent  F = L_m T 6 d_ssm N                                       (state update per token)
               B = L_m sum_i 2 (s / e_ssm + c / e_conv)                  (read + write the state)
    checkpoint B = L_m sum_i k_i 2 (s / e_ssm + c / e_conv),  k_i = boundaries of the org's
                   checkpoint grid g crossed by [c_i, c_i + n_i)          (copy into a new slot)

    t_step = t_0 + S t_seq + sum over the four parts of max(F / (eta_F peak), B / (eta_B BW))

``e_ssm`` and ``e_conv`` are the organization's own state access (:data:`ACCESS`): contiguous
state (vLLM's block, S0's page, D0's composite) reads at 1; S1/S2 read the SSM state through
three member-page ids and S2 the conv state through a 32-KiB slot line, each at an efficiency
below 1 (an indirection and shorter runs). ``g`` is the organization's checkpoint grid
(512 tokens for S0/S1/S2, 1,792 for D0, the block size for vLLM's stock manager).

What is and is not modelled: kernels are assumed to run back to back (no overlap across parts),
at one achieved fraction of peak each; no launch-level detail, no CUDA-graph effects, no
tensor-parallel communication, no sampling cost beyond the lm_head GEMM. The constants
(``eta_F``, ``eta_B``, ``t_0``, ``t_seq``, ``e_*``) are defaults chosen, not measured, until
``hybridmem sim calibrate`` fits them to step times measured on a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, NamedTuple

from hybridmem.errors import HybridMemError
from hybridmem.sim.devices import Device
from hybridmem.sim.model_shape import ModelShape


@dataclass(frozen=True)
class CostConstants:
    """The free constants of the step-time model (defaults: uncalibrated guesses)."""

    mfu: float = 0.55                 # eta_F: achieved fraction of peak BF16 FLOP/s
    bw_eff: float = 0.75              # eta_B: achieved fraction of HBM bandwidth
    step_overhead_s: float = 0.004    # t_0: per-step scheduling, input preparation, launches
    per_seq_overhead_s: float = 5e-5  # t_seq: per scheduled sequence (metadata, sampling)
    member_page_eff: float = 0.90     # e_ssm for S1/S2: SSM state through member-page ids
    slot_line_eff: float = 0.80       # e_conv for S2: conv state through 32-KiB slot lines

    def check(self) -> CostConstants:
        for name in ("mfu", "bw_eff", "member_page_eff", "slot_line_eff"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0.0 < v <= 1.0):
                raise HybridMemError(f"cost constant {name} must lie in (0, 1], got {v!r}")
        for name in ("step_overhead_s", "per_seq_overhead_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0.0 <= v < 10.0):
                raise HybridMemError(f"cost constant {name} must lie in [0, 10) s, got {v!r}")
        return self

    def as_dict(self) -> dict[str, float]:
        return asdict(self)

    def with_values(self, **values: float) -> CostConstants:
        unknown = set(values) - set(asdict(self))
        if unknown:
            raise HybridMemError(f"unknown cost constants {sorted(unknown)}; known: "
                                 f"{sorted(asdict(self))}")
        return replace(self, **values).check()


@dataclass(frozen=True)
class StateAccess:
    """An organization's recurrent-state access: how its checkpoint state is addressed."""

    member_pages: bool         # SSM state through member-page ids (S1/S2)
    slot_lines: bool           # conv state through slab slot lines (S2)


ACCESS: dict[str, StateAccess] = {
    "vllm": StateAccess(False, False),
    "S0": StateAccess(False, False),
    "S1": StateAccess(True, False),
    "S2": StateAccess(True, True),
    "D0": StateAccess(False, False),
}


class Seq(NamedTuple):
    new_tokens: int      # n_i
    context: int         # c_i, tokens already computed before this step


class StepFeatures(NamedTuple):
    """Sufficient statistics of one step for the cost model (and a timing file's columns)."""

    tokens: int          # T = sum n_i
    seqs: int            # S
    kv_tokens: int       # sum c_i + 2 n_i  (attention KV read + written, tokens)
    attn_pairs: float    # sum n_i (c_i + (n_i + 1) / 2)  (causal query-key pairs)
    checkpoints: int     # sum k_i, checkpoint boundaries crossed


class StepCost(NamedTuple):
    seconds: float
    gemm_s: float
    attention_s: float
    recurrent_s: float
    checkpoint_s: float
    overhead_s: float
    flops: float
    bytes: float
    checkpoints: int


class CostModel:
    """Step times of one model on one device under one organization's state access."""

    def __init__(self, shape: ModelShape, device: Device, org: str,
                 grid_tokens: int, constants: CostConstants | None = None) -> None:
        if org not in ACCESS:
            raise HybridMemError(f"unknown organization {org!r}; expected one of "
                                 f"{', '.join(ACCESS)}")
        self.shape, self.device, self.org = shape, device, org
        self.k = (constants or CostConstants()).check()
        acc = ACCESS[org]
        if not isinstance(grid_tokens, int) or grid_tokens < 1:
            raise HybridMemError(f"checkpoint grid must be a positive token count, "
                                 f"got {grid_tokens!r}")
        self.grid = grid_tokens
        g = shape.geometry
        e_ssm = self.k.member_page_eff if acc.member_pages else 1.0
        e_conv = self.k.slot_line_eff if acc.slot_lines else 1.0
        # effective bytes of one state touch (read or write) in one Mamba layer
        self._state_touch = g.ssm_bytes / e_ssm + g.conv_bytes / e_conv
        self._flops_s = device.peak_bf16_flops * self.k.mfu
        self._bytes_s = device.hbm_bytes_per_s * self.k.bw_eff

    def _roof(self, flops: float, nbytes: float) -> float:
        return max(flops / self._flops_s, nbytes / self._bytes_s)

    def features(self, seqs: Sequence[Seq]) -> StepFeatures:
        """The per-step sums the step time depends on (what a timing file records)."""
        grid = self.grid
        tokens = kv = ck = 0
        pairs = 0.0
        for s in seqs:
            tokens += s.new_tokens
            kv += s.context + 2 * s.new_tokens
            pairs += s.new_tokens * (s.context + (s.new_tokens + 1) / 2.0)
            ck += (s.context + s.new_tokens) // grid - s.context // grid
        return StepFeatures(tokens, len(seqs), kv, pairs, ck)

    def parts(self, f: StepFeatures) -> tuple[tuple[float, float], ...]:
        """(FLOPs, bytes) of the GEMM, attention, recurrent and checkpoint parts of a step."""
        sh, g = self.shape, self.shape.geometry
        return (
            (2.0 * sh.active_params * f.tokens, float(sh.weight_bytes) if f.tokens else 0.0),
            (4.0 * sh.attention_layers * sh.q_heads * g.head_dim * f.attn_pairs,
             float(sh.attention_layers * g.attn_bytes_per_token * f.kv_tokens)),
            (float(sh.mamba_layers * f.tokens * 6 * g.d_ssm * g.d_state),
             sh.mamba_layers * f.seqs * 2.0 * self._state_touch),
            (0.0, sh.mamba_layers * f.checkpoints * 2.0 * self._state_touch),
        )

    def time(self, f: StepFeatures) -> StepCost:
        overhead = self.k.step_overhead_s + self.k.per_seq_overhead_s * f.seqs
        fb = self.parts(f)
        parts = [self._roof(fl, b) for fl, b in fb]
        flops = sum(fl for fl, _ in fb)
        nbytes = sum(b for _, b in fb)
        return StepCost(overhead + sum(parts), parts[0], parts[1], parts[2], parts[3], overhead,
                        flops, nbytes, f.checkpoints)

    def step(self, seqs: Sequence[Seq]) -> StepCost:
        """The duration of one step running ``seqs`` (an empty step costs the overhead only)."""
        return self.time(self.features(seqs))

    def describe(self) -> dict[str, Any]:
        return {"org": self.org, "device": self.device.as_dict(), "grid_tokens": self.grid,
                "constants": self.k.as_dict(), "model": self.shape.as_dict()}
