"""Torch reference for the Mamba2 single-token selective state update, on contiguous and on paged
state. Everything is computed in fp32; the new state is cast to the state dtype, the output to
the output dtype. See README.md for the recurrence and the address formula.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from hybridmem.kernels.checkpoint_copy.reference import gather_pages_ref, scatter_pages_ref

SOFTPLUS_THRESHOLD = 20.0  # softplus(dt) = dt above this, as in Mamba2 / vLLM


class SsmParams(NamedTuple):
    """Per-step inputs with every tensor in its full (possibly stride-0 expanded) shape.

    x, dt, z: [batch, heads, head_dim]; A: [heads, head_dim, d_state]; B, C: [batch, groups,
    d_state]; D, dt_bias: [heads, head_dim].
    """

    x: torch.Tensor
    dt: torch.Tensor
    A: torch.Tensor
    B: torch.Tensor
    C: torch.Tensor
    D: torch.Tensor | None
    z: torch.Tensor | None
    dt_bias: torch.Tensor | None


def expand_params(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    z: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    d_state: int,
) -> SsmParams:
    """Broadcast Mamba2's per-head parameters to full shapes (views, no copies) and check shapes.

    Accepted: dt ``[batch, heads]`` or ``[batch, heads, head_dim]``; A ``[heads]`` or
    ``[heads, head_dim, d_state]``; D and dt_bias ``[heads]`` or ``[heads, head_dim]``.
    """
    if x.dim() != 3:
        raise ValueError(f"x must be [batch, heads, head_dim], got {tuple(x.shape)}")
    batch, heads, dim = x.shape
    if dt.dim() == 2:
        dt = dt[:, :, None].expand(batch, heads, dim)
    if A.dim() == 1:
        A = A[:, None, None].expand(heads, dim, d_state)
    if D is not None and D.dim() == 1:
        D = D[:, None].expand(heads, dim)
    if dt_bias is not None and dt_bias.dim() == 1:
        dt_bias = dt_bias[:, None].expand(heads, dim)
    want = {
        "dt": (dt, (batch, heads, dim)),
        "A": (A, (heads, dim, d_state)),
        "D": (D, (heads, dim)),
        "z": (z, (batch, heads, dim)),
        "dt_bias": (dt_bias, (heads, dim)),
    }
    for name, (t, shape) in want.items():
        if t is not None and tuple(t.shape) != shape:
            raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
    if B.dim() != 3 or B.shape[0] != batch or B.shape[2] != d_state:
        raise ValueError(f"B must be [{batch}, groups, {d_state}], got {tuple(B.shape)}")
    if tuple(C.shape) != tuple(B.shape):
        raise ValueError(f"C {tuple(C.shape)} must match B {tuple(B.shape)}")
    if heads % B.shape[1]:
        raise ValueError(f"heads {heads} must be a multiple of groups {B.shape[1]}")
    return SsmParams(x, dt, A, B, C, D, z, dt_bias)


def softplus_ref(dt: torch.Tensor) -> torch.Tensor:
    return torch.where(dt <= SOFTPLUS_THRESHOLD, torch.log(torch.exp(dt) + 1.0), dt)


def selective_state_update_ref(
    state: torch.Tensor,
    p: SsmParams,
    dt_softplus: bool = False,
    out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step on contiguous state ``[batch, heads, head_dim, d_state]``.

    Returns ``(out [batch, heads, head_dim], new_state)``; ``state`` is not modified.
    """
    f32 = torch.float32
    heads = state.shape[1]
    groups = p.B.shape[1]
    dt = p.dt.to(f32)
    if p.dt_bias is not None:
        dt = dt + p.dt_bias.to(f32)
    if dt_softplus:
        dt = softplus_ref(dt)
    dA = torch.exp(p.A.to(f32) * dt[..., None])
    Bh = p.B.to(f32).repeat_interleave(heads // groups, dim=1)  # head h uses group h // ratio
    Ch = p.C.to(f32).repeat_interleave(heads // groups, dim=1)
    dB = Bh[:, :, None, :] * dt[..., None]
    x = p.x.to(f32)
    new = state.to(f32) * dA + dB * x[..., None]
    out = (new * Ch[:, :, None, :]).sum(dim=-1)
    if p.D is not None:
        out = out + x * p.D.to(f32)
    if p.z is not None:
        z = p.z.to(f32)
        out = out * (z * torch.sigmoid(z))
    return out.to(out_dtype or p.x.dtype), new.to(state.dtype)


def paged_selective_state_update_ref(
    pool: torch.Tensor,
    src_pages: torch.Tensor,
    dst_pages: torch.Tensor | None,
    p: SsmParams,
    dt_softplus: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Gather each live row's state from ``src_pages``, step it, scatter it to ``dst_pages``.

    Rows whose page ids are negative are skipped: no state read or written, ``out`` row untouched.
    Modifies ``pool`` in place and returns ``out``.
    """
    batch, heads, dim = p.x.shape
    d_state = p.A.shape[2]
    if out is None:
        out = torch.zeros_like(p.x)
    dst = src_pages if dst_pages is None else dst_pages
    live = (src_pages >= 0).all(dim=1)
    arena = torch.zeros(batch, heads * dim * d_state, dtype=pool.dtype, device=pool.device)
    gather_pages_ref(pool, src_pages, arena)
    state = arena.view(batch, heads, dim, d_state)[live]

    def rows(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t[live]

    q = SsmParams(p.x[live], p.dt[live], p.A, p.B[live], p.C[live], p.D, rows(p.z), p.dt_bias)
    o, new = selective_state_update_ref(state, q, dt_softplus, out_dtype=out.dtype)
    out[live] = o
    arena[live] = new.reshape(new.shape[0], -1)
    scatter_pages_ref(pool, torch.where(live[:, None], dst, -1), arena)
    return out
