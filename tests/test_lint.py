"""ruff, mypy and the import layers (import-linter, LAYERS.md) run as part of the test suite
(configured in pyproject.toml)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tool(name: str) -> str:
    exe = Path(sys.executable).parent / name
    return str(exe) if exe.exists() else (shutil.which(name) or name)


def test_ruff_clean():
    r = subprocess.run([_tool("ruff"), "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_clean():
    r = subprocess.run([_tool("mypy")], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def _lint_imports() -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([_tool("lint-imports"), "--no-cache"], cwd=ROOT, capture_output=True,
                          text=True, env=env)


def test_import_layers_kept():
    r = _lint_imports()
    assert r.returncode == 0, r.stdout + r.stderr


def test_import_layers_catch_an_upward_import():
    """Negative control: a deliberate upward import (tracer -> the CLI) breaks the contract."""
    probe = ROOT / "tracer" / "_upward_import_probe.py"
    probe.write_text("import hybridmem.cli.main  # noqa: F401  deliberate upward import\n")
    try:
        r = _lint_imports()
    finally:
        probe.unlink()
    assert r.returncode != 0 and "BROKEN" in r.stdout, r.stdout + r.stderr
    assert "tracer._upward_import_probe -> hybridmem.cli.main" in r.stdout
