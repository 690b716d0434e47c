"""Boundary exports: the state after every cut inside a prefill chunk, from vLLM's CPU kernels.

The reference for the state at offset ``o`` is the same kernel run on the row's prefix
``[0, o)`` alone (what a run whose chunks stop at ``o`` stores); negative controls: the states
at different cuts differ, and dropping a cut loses its state.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytestmark = pytest.mark.vllm

H, P, N, DIM, K = 4, 8, 16, 24, 4  # heads, head dim, d_state, conv channels, conv kernel


def _scan_inputs(lens: list[int], seed: int = 0) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    t = sum(lens)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    return {"x": torch.randn(t, H, P, generator=g), "dt": torch.rand(t, H, generator=g) - 1.0,
            "A": -torch.rand(H, generator=g) * 0.2, "B": torch.randn(t, 1, N, generator=g),
            "C": torch.randn(t, 1, N, generator=g), "chunk_size": 64, "cu_seqlens": cu,
            "cu_chunk_seqlens": cu, "last_chunk_indices": torch.arange(len(lens)),
            "seq_idx": torch.arange(len(lens)), "D": torch.rand(H, generator=g),
            "dt_bias": torch.rand(H, generator=g), "dt_softplus": True,
            "initial_states": torch.randn(len(lens), H, P, N, generator=g),
            "state_dtype": torch.float32}


def _run(scan: Any, inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    out = torch.zeros(inputs["x"].shape[0], H, P)
    return scan(**inputs, out=out), out


def _prefix(inputs: dict[str, Any], row: int, o: int) -> dict[str, Any]:
    """Row ``row``'s first ``o`` tokens as a batch of one."""
    lo = int(inputs["cu_seqlens"][row])
    cut = {k: inputs[k][lo:lo + o] for k in ("x", "dt", "B", "C")}
    one = torch.tensor([0, o], dtype=torch.int32)
    return {**inputs, **cut, "cu_seqlens": one, "cu_chunk_seqlens": one,
            "last_chunk_indices": torch.arange(1), "seq_idx": torch.arange(1),
            "initial_states": inputs["initial_states"][row:row + 1]}


def test_segmented_scan_states_at_cuts_equal_the_prefix_runs() -> None:
    from vllm.model_executor.layers.mamba.ops.ssd_combined import (
        mamba_chunk_scan_combined_varlen as scan,
    )

    from hybridmem.vllm_plugin.boundary_export import segmented_scan

    inputs = _scan_inputs([150, 40, 200])
    cuts = {0: [64, 128], 2: [64, 128, 192]}
    sink: dict[tuple[int, int], torch.Tensor] = {}
    final, out = _run(segmented_scan(scan, cuts, sink), inputs)
    whole, whole_out = _run(scan, inputs)
    assert sorted(sink) == [(0, 64), (0, 128), (2, 64), (2, 128), (2, 192)]
    for (row, o), state in sink.items():
        want, _ = _run(scan, _prefix(inputs, row, o))
        assert torch.allclose(state, want[0], rtol=1e-5, atol=1e-5), (row, o)
    assert torch.allclose(final, whole, rtol=1e-5, atol=1e-5)
    assert torch.allclose(out, whole_out, rtol=1e-5, atol=1e-5)
    # negative controls: the cuts hold different states, and a row without cuts has none
    assert not torch.allclose(sink[(0, 64)], sink[(0, 128)], atol=1e-3)
    assert not torch.allclose(sink[(2, 192)], final[2], atol=1e-3)
    assert not any(row == 1 for row, _ in sink)


def test_conv_capture_equals_the_end_state_of_a_prefix_chunk() -> None:
    from vllm.model_executor.layers.mamba.ops.cpu.causal_conv1d import causal_conv1d_fn_cpu

    from hybridmem.vllm_plugin.boundary_export import conv_capture

    g = torch.Generator().manual_seed(1)
    lens = [130, 70]
    x = torch.randn(DIM, sum(lens), generator=g)
    weight, bias = torch.randn(DIM, K, generator=g), torch.randn(DIM, generator=g)
    states = torch.randn(3, DIM, K - 1, generator=g)
    qs = torch.tensor([0, 130, 200], dtype=torch.int32)
    index, has = torch.tensor([1, 2]), torch.tensor([True, False])
    cuts = {0: [2, 64, 128], 1: [1, 64]}  # 2 and 1 reach back into the initial state
    sink: dict[tuple[int, int], torch.Tensor] = {}
    start_states = states.clone()
    out = conv_capture(causal_conv1d_fn_cpu, cuts, sink)(
        x, weight, bias, conv_states=states, query_start_loc=qs, cache_indices=index,
        has_initial_state=has, activation="silu")
    ref_states = start_states.clone()
    ref = causal_conv1d_fn_cpu(x, weight, bias, conv_states=ref_states, query_start_loc=qs,
                               cache_indices=index, has_initial_state=has, activation="silu")
    assert torch.equal(out, ref) and torch.equal(states, ref_states)  # unchanged otherwise
    for (row, o), got in sink.items():
        prefix_states = start_states.clone()
        lo = int(qs[row])
        causal_conv1d_fn_cpu(x[:, lo:lo + o].contiguous(), weight, bias,
                             conv_states=prefix_states, query_start_loc=torch.tensor([0, o]),
                             cache_indices=index[row:row + 1],
                             has_initial_state=has[row:row + 1], activation="silu")
        assert torch.equal(got, prefix_states[int(index[row])]), (row, o)
    assert not torch.equal(sink[(0, 64)], sink[(0, 128)])  # negative control


def test_boundary_capture_restores_the_kernels() -> None:
    from vllm.model_executor.layers.mamba import mamba_mixer2 as mm

    from hybridmem.vllm_plugin.boundary_export import boundary_capture

    before = (mm.mamba_chunk_scan_combined_varlen, mm.causal_conv1d_fn)
    with pytest.raises(RuntimeError), boundary_capture({0: [64]}, {}):
        assert mm.causal_conv1d_fn is not before[1]
        raise RuntimeError("forward failed")
    assert (mm.mamba_chunk_scan_combined_varlen, mm.causal_conv1d_fn) == before
