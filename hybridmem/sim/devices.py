"""GPU presets for the simulator's roofline: peak dense BF16 FLOP/s, HBM bandwidth, memory.

All constants are the vendors' public datasheet figures (dense, i.e. without 2:4 sparsity):

=============  ===================  =============  ========  ==================================
preset         BF16 dense tensor    HBM bandwidth  memory    source
=============  ===================  =============  ========  ==================================
a100-40gb      312 TFLOP/s          1,555 GB/s     40 GB     NVIDIA A100 Tensor Core GPU
                                                             datasheet (PCIe 40GB column; the
                                                             paper's A100-PCIE-40GB, §4.1)
h100-80gb      989.4 TFLOP/s        3,350 GB/s     80 GB     NVIDIA H100 Tensor Core GPU
                                                             datasheet (SXM5 column)
h200           989.4 TFLOP/s        4,800 GB/s     141 GB    NVIDIA H200 Tensor Core GPU
                                                             datasheet (SXM column)
=============  ===================  =============  ========  ==================================

``max_num_batched_tokens`` is what vLLM 0.32's ``vllm serve`` picks by default on that GPU
(``engine/arg_utils.py``, ``_set_default_max_num_seqs_and_batched_tokens_args``: 2,048 tokens
on an A100 or any GPU under 70 GiB, 8,192 on H100/H200-class GPUs), so a simulated step packs
as many prefill tokens as the paper's server would have.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from hybridmem.errors import HybridMemError

TFLOP = 1e12
GB = 1e9


@dataclass(frozen=True)
class Device:
    name: str
    peak_bf16_flops: float      # FLOP/s, dense tensor-core BF16
    hbm_bytes_per_s: float      # B/s
    memory_bytes: int           # total device memory, B
    max_num_batched_tokens: int  # vLLM's serve default on this device

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


DEVICES: dict[str, Device] = {
    "a100-40gb": Device("a100-40gb", 312 * TFLOP, 1555 * GB, 40 * 10**9, 2048),
    "h100-80gb": Device("h100-80gb", 989.4 * TFLOP, 3350 * GB, 80 * 10**9, 8192),
    "h200": Device("h200", 989.4 * TFLOP, 4800 * GB, 141 * 10**9, 8192),
}


def get_device(name: str) -> Device:
    try:
        return DEVICES[name]
    except KeyError:
        raise HybridMemError(f"unknown device {name!r}; expected one of "
                             f"{', '.join(DEVICES)}") from None
