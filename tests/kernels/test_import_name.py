"""The kernels import as ``hybridmem.kernels`` from any working directory.

The files live in the top-level folder ``kernels/``; ``hybridmem/kernels`` is a symlink to it. A
top-level import package named ``kernels`` clashes with Hugging Face's ``kernels`` (installed
beside vLLM): outside the repository root Python finds that one first. The test imports the
project's kernels in a subprocess whose working directory is a temporary folder, so the
repository root is not on the path by accident.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import importlib.util, json, sys
spec = importlib.util.find_spec(sys.argv[1])
print(json.dumps(None if spec is None else spec.origin))
"""


def _origin(module: str, cwd: Path) -> str | None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    out = subprocess.run([sys.executable, "-c", PROBE, module], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout)


def test_project_kernels_import_outside_the_repository_root(tmp_path):
    for module in ("hybridmem.kernels", "hybridmem.kernels.paging",
                   "hybridmem.kernels.checkpoint_copy.reference"):
        origin = _origin(module, tmp_path)
        assert origin is not None, module
        # the real file is in the top-level kernels/ folder
        assert Path(origin).resolve().is_relative_to(ROOT / "kernels"), (module, origin)
    # and the module really imports there (torch, triton and all)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = "import hybridmem.kernels.paging as p; print(p.num_members.__module__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip() == "hybridmem.kernels.paging"


def _hf_kernels_installed() -> bool:
    try:
        dist = importlib.metadata.distribution("kernels")
    except importlib.metadata.PackageNotFoundError:
        return False
    return dist.metadata["Name"] == "kernels" and "huggingface" in str(dist.metadata).lower()


@pytest.mark.skipif(not _hf_kernels_installed(), reason="Hugging Face's kernels is not installed")
def test_the_old_top_level_name_is_hugging_faces(tmp_path):
    # negative control: run as an installed user would (no PYTHONPATH) from the same temporary
    # folder, the name `kernels` finds Hugging Face's package, not this project's: the clash
    # that `import kernels` in this project would meet
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", PROBE, "kernels"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120, check=True)
    origin = json.loads(out.stdout)
    assert origin is not None
    assert not (Path(origin).parent / "paging.py").exists(), origin
    assert "site-packages" in origin, origin
