"""Recurrent state at every boundary inside a prefill chunk, computed during the forward.

vLLM's Mamba2 forward writes only a chunk's end state (seams note, trap 3), while an
organization holds a checkpoint at every recurrent boundary ``b`` (a multiple of the grid). For
a prefill row whose chunk ``[start, end)`` spans boundaries, :func:`boundary_capture` makes the
forward also produce the state after each ``b`` (token offset ``o = b - start`` into the row)::

    SSM    the row's scan runs as consecutive pieces [0, o_1) [o_1, o_2) ... [o_k, len), each
           starting from the previous piece's final state (rows are batched per round: round
           k scans every row's k-th piece in one kernel call); the final state after piece i
           is the state at boundary o_i. The arithmetic is the same as a run whose chunks
           stop at every boundary (each piece starts from the stored previous state).
    conv   the state after offset o is the last (k - 1) inputs before it:
           cat(initial conv state, x_row)[:, o : o + k - 1], exactly as the CPU conv kernel
           stores a chunk's end state (a slice of x_row when o >= k - 1).

Both are captured into ``sink[(row, o)]`` while the original forward runs unchanged otherwise
(the two kernels are looked up by name in ``mamba_mixer2``; they are swapped for the duration
of the call and restored). CPU only: the CPU scan ignores chunk metadata, so pieces need none;
on a GPU the scheduler stops chunks at boundaries instead (``org_state.boundary_exports``).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from itertools import accumulate
from typing import Any

import torch

Sink = dict[str, dict[tuple[int, int], torch.Tensor]]

_SIGNATURES: dict[Any, inspect.Signature] = {}


def _signature(fn: Callable[..., Any]) -> inspect.Signature:
    """``inspect.signature(fn)``, memoised (it costs ~100 us; the kernels never change)."""
    sig = _SIGNATURES.get(fn)
    if sig is None:
        sig = _SIGNATURES[fn] = inspect.signature(fn)
    return sig


def segmented_scan(original: Callable[..., Any], cuts: dict[int, list[int]],
                   sink: dict[tuple[int, int], torch.Tensor]) -> Callable[..., Any]:
    """``mamba_chunk_scan_combined_varlen`` that also leaves the state at every cut in
    ``sink`` (see the module docstring); returns the per-row final states as the original."""
    sig = _signature(original)

    @functools.wraps(original)
    def scan(*args: Any, **kwargs: Any) -> Any:
        a = sig.bind(*args, **kwargs).arguments
        x, dt, b_, c_, cu, out = a["x"], a["dt"], a["B"], a["C"], a["cu_seqlens"], a["out"]
        z, init = a.get("z"), a.get("initial_states")
        if a.get("return_intermediate_states"):
            raise NotImplementedError("boundary exports with in-forward checkpoints")
        qs = cu.tolist()
        batch = len(qs) - 1
        pieces = [[0, *cuts.get(r, []), qs[r + 1] - qs[r]] for r in range(batch)]
        current: list[Any] = [None] * batch
        for k in range(max(len(p) - 1 for p in pieces)):
            rows = [r for r in range(batch) if len(pieces[r]) - 1 > k]
            spans = [(qs[r] + pieces[r][k], qs[r] + pieces[r][k + 1]) for r in rows]
            lens = [hi - lo for lo, hi in spans]
            cu_k = torch.tensor([0, *accumulate(lens)], dtype=cu.dtype, device=cu.device)
            if k == 0:
                init_k = init  # every row has a first piece
            else:
                init_k = torch.stack([current[r] for r in rows])
            one = torch.arange(len(rows), device=cu.device)
            kw = dict(a)
            kw.update(cu_seqlens=cu_k, cu_chunk_seqlens=cu_k, last_chunk_indices=one,
                      seq_idx=one, initial_states=init_k)
            if len(rows) == 1:  # one token range: views, the kernel writes into ``out``
                lo, hi = spans[0]
                kw.update(x=x[lo:hi], dt=dt[lo:hi], B=b_[lo:hi], C=c_[lo:hi],
                          z=None if z is None else z[lo:hi], out=out[lo:hi])
                states = original(**kw)
            else:
                idx = torch.cat([torch.arange(lo, hi) for lo, hi in spans]).to(x.device)
                out_k = torch.empty((len(idx), *out.shape[1:]), dtype=out.dtype,
                                    device=out.device)
                kw.update(x=x.index_select(0, idx), dt=dt.index_select(0, idx),
                          B=b_.index_select(0, idx), C=c_.index_select(0, idx),
                          z=None if z is None else z.index_select(0, idx), out=out_k)
                states = original(**kw)
                out.index_copy_(0, idx, out_k)
            for j, r in enumerate(rows):
                current[r] = states[j]
                if k + 2 < len(pieces[r]):  # this piece ends at a cut, not at the row's end
                    sink[(r, pieces[r][k + 1])] = states[j]
        return torch.stack(current)

    return scan


def conv_capture(original: Callable[..., Any], cuts: dict[int, list[int]],
                 sink: dict[tuple[int, int], torch.Tensor]) -> Callable[..., Any]:
    """``causal_conv1d_fn`` (prefill) that first leaves the conv state at every cut in
    ``sink`` (``(dim, k - 1)``, the conv state's dtype), then runs unchanged."""
    sig = _signature(original)

    @functools.wraps(original)
    def conv(*args: Any, **kwargs: Any) -> Any:
        a = sig.bind(*args, **kwargs).arguments
        x, weight, states = a["x"], a["weight"], a["conv_states"]
        qs = a["query_start_loc"].tolist()
        index, has = a.get("cache_indices"), a.get("has_initial_state")
        width = weight.shape[-1] - 1
        if states.shape[1] != x.shape[0]:
            raise NotImplementedError(f"conv state layout {tuple(states.shape)} for inputs "
                                      f"{tuple(x.shape)}: boundary exports need (dim, width)")
        for r, offsets in cuts.items():
            lo = qs[r]
            head = None
            for o in offsets:
                if o >= width:  # the last ``width`` inputs before o all lie in this chunk
                    piece = x[:, lo + o - width:lo + o].to(states.dtype)
                else:  # reaches back into the initial conv state
                    if head is None:
                        if has is not None and bool(has[r]):
                            slot = r if index is None else int(index[r])
                            head = states[slot, :, :width]
                        else:
                            head = torch.zeros(x.shape[0], width, dtype=states.dtype,
                                               device=x.device)
                    piece = torch.cat([head[:, o:], x[:, lo:lo + o].to(states.dtype)], dim=-1)
                # a copy (the kernel may overwrite x in place), through the weight's dtype as
                # the kernel's own state write goes
                sink[(r, o)] = piece.to(weight.dtype).to(states.dtype).clone()
        return original(*args, **kwargs)

    return conv


@contextlib.contextmanager
def boundary_capture(cuts: dict[int, list[int]], sink: Sink) -> Iterator[None]:
    """Within the block, Mamba2 forwards leave boundary states in ``sink["ssm"]`` and
    ``sink["conv"]`` (keys ``(prefill row, offset)``)."""
    from vllm.model_executor.layers.mamba import mamba_mixer2 as mm

    scan, conv = mm.mamba_chunk_scan_combined_varlen, mm.causal_conv1d_fn
    mm.mamba_chunk_scan_combined_varlen = segmented_scan(scan, cuts, sink.setdefault("ssm", {}))
    mm.causal_conv1d_fn = conv_capture(conv, cuts, sink.setdefault("conv", {}))
    try:
        yield
    finally:
        mm.mamba_chunk_scan_combined_varlen, mm.causal_conv1d_fn = scan, conv
