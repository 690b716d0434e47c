"""Triton helpers shared by the kernels.

``cast_rtne``: fp32 -> bf16 by explicit round-to-nearest-even on the bit pattern. On a GPU
``x.to(tl.bfloat16)`` already rounds to nearest even, but the Triton interpreter (triton 3.9,
``TRITON_INTERPRET=1``) truncates instead, so CPU results would differ from torch's
``.to(torch.bfloat16)`` and from the GPU by one bf16 ulp in about half the elements. Doing the
rounding by hand gives the same bits on both backends (and equals torch's conversion; NaN stays
NaN). Other target dtypes use the ordinary cast.

``NATIVE_CAST`` (False under the interpreter) lets a kernel use the hardware conversion instead
(``cvt.rn.bf16.f32`` on NVIDIA: the same round-to-nearest-even bits, fewer instructions); the
launchers pass it as a constexpr, and the GPU tests check the bits against torch.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

# Read when this module is imported, as Triton reads TRITON_INTERPRET when kernels are decorated.
NATIVE_CAST: bool = os.environ.get("TRITON_INTERPRET", "0") not in ("1", "true", "True")


@triton.jit
def cast_rtne(x, dtype: tl.constexpr, NATIVE: tl.constexpr = False):
    if NATIVE and dtype == tl.bfloat16:
        return x.to(tl.bfloat16, fp_downcast_rounding="rtne")
    elif dtype == tl.bfloat16:
        xf = x.to(tl.float32)
        bits = xf.to(tl.uint32, bitcast=True)
        rounded = bits + 0x7FFF + ((bits >> 16) & 1)
        hi = tl.where(xf != xf, 0x7FC0, rounded >> 16)
        return hi.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(dtype)
