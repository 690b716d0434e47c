"""Suite-wide markers: ``slow`` tests run only with HYBRIDMEM_SLOW=1, ``gpu`` tests only where
CUDA is available. Each skip says why."""

import os

import pytest
import torch

# Kernel modules read TRITON_INTERPRET when a @triton.jit function is decorated, i.e. when a
# kernel module is first imported -- which tests outside tests/kernels do too (the organization
# state storage, the continuation checks). Set it here, before any test module is collected.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

SLOW = os.environ.get("HYBRIDMEM_SLOW") == "1"


def pytest_runtest_setup(item: pytest.Item) -> None:
    if "slow" in item.keywords and not SLOW:
        pytest.skip(f"slow test ({item.path.parent.name}); set HYBRIDMEM_SLOW=1 to run")
    if "gpu" in item.keywords:
        import torch

        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA device")
