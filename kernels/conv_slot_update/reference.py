"""Torch reference for the single-token causal conv1d update on conv state held in slot lines.

Per sequence with a real line, conv state ``S [conv_dim, K - 1]`` (K = d_conv) sits row-major at
``line_pool[l, c * (K - 1) + k]``. Accumulation is in fp32, sequential over the window in the
same order as the kernel: ``acc = bias; acc += S[:, k] * W[:, k] (k < K - 1); acc += x *
W[:, K - 1]``; SiLU is ``acc / (1 + exp(-acc))``. See README.md.
"""

from __future__ import annotations

import torch


def conv_update_ref(
    state: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    silu: bool = True,
    out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One step on contiguous state ``[batch, conv_dim, K - 1]``; returns ``(out, new_state)``.

    ``out [batch, conv_dim]``; ``new_state`` is the window shifted left by one with ``x`` last.
    ``state`` is not modified.
    """
    f32 = torch.float32
    width = weight.shape[1]
    s = state.to(f32)
    w = weight.to(f32)
    xf = x.to(f32)
    acc = bias.to(f32).expand_as(xf).clone() if bias is not None else torch.zeros_like(xf)
    for k in range(width - 1):
        acc = acc + s[:, :, k] * w[:, k]
    acc = acc + xf * w[:, width - 1]
    if silu:
        acc = acc / (1.0 + torch.exp(-acc))
    new = torch.cat([s[:, :, 1:], xf[:, :, None]], dim=2)
    return acc.to(out_dtype or x.dtype), new.to(state.dtype)


def conv_slot_update_ref(
    line_pool: torch.Tensor,
    src_lines: torch.Tensor,
    dst_lines: torch.Tensor | None,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    silu: bool = True,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Read state at ``src_lines``, write the new state at ``dst_lines`` (None: in place).

    Sequences whose source line is negative (the sentinel) are skipped entirely: nothing is read
    or written and their ``out`` row is untouched. Modifies ``line_pool``; returns ``out``.
    """
    batch, conv_dim = x.shape
    n = conv_dim * (weight.shape[1] - 1)
    if out is None:
        out = torch.zeros_like(x)
    dst = src_lines if dst_lines is None else dst_lines
    live = src_lines >= 0
    src = src_lines[live].to(torch.int64)
    state = line_pool[src, :n].view(-1, conv_dim, weight.shape[1] - 1)
    o, new = conv_update_ref(state, x[live], weight, bias, silu, out.dtype)
    out[live] = o
    line_pool[dst[live].to(torch.int64), :n] = new.reshape(-1, n)
    return out
