"""Fixtures for the simulator tests: vLLM's scheduler in-process, no model, no GPU."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def _sim_env(tmp_path_factory: pytest.TempPathFactory) -> None:
    os.environ.setdefault("VLLM_CACHE_ROOT", str(tmp_path_factory.mktemp("vllm-cache")))
    os.environ.pop("HYBRIDMEM_TRACE", None)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
