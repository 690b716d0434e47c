"""Suite-wide markers: ``slow`` tests run only with HYBRIDMEM_SLOW=1, ``gpu`` tests only where
CUDA is available. Each skip says why."""

import os

import pytest

SLOW = os.environ.get("HYBRIDMEM_SLOW") == "1"


def pytest_runtest_setup(item: pytest.Item) -> None:
    if "slow" in item.keywords and not SLOW:
        pytest.skip(f"slow test ({item.path.parent.name}); set HYBRIDMEM_SLOW=1 to run")
    if "gpu" in item.keywords:
        import torch

        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA device")
