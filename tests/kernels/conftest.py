"""Kernel tests run on CPU through the Triton interpreter when no CUDA device is present.

``TRITON_INTERPRET`` is read when a ``@triton.jit`` function is decorated, i.e. when a kernel
module is first imported, so it is set here, before any test module imports ``kernels.*``.
On a CUDA machine the variable is left alone and the same tests run on the GPU.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
