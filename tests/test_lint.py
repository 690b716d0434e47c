"""ruff, mypy and the import layers (import-linter, LAYERS.md) run as part of the test suite
(configured in pyproject.toml)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BACKGROUND_MYPY = pytest.StashKey[tuple[subprocess.Popen, Path]]()


def _tool(name: str) -> str:
    exe = Path(sys.executable).parent / name
    return str(exe) if exe.exists() else (shutil.which(name) or name)


def test_ruff_clean():
    r = subprocess.run([_tool("ruff"), "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def mypy_command() -> list[str]:
    return [_tool("mypy")]


def test_mypy_clean(request):
    """mypy takes ~40 s on 2 cores; tests/conftest.py starts it in the background when the
    session selects this test (the suite itself runs on one core) and this test waits for it.
    Run alone, or without that start, it runs here."""
    background = request.config.stash.get(BACKGROUND_MYPY, None)
    if background is not None:
        proc, log = background
        proc.wait()
        out = log.read_text()
    else:
        r = subprocess.run(mypy_command(), cwd=ROOT, capture_output=True, text=True)
        proc, out = r, r.stdout + r.stderr
    assert proc.returncode == 0, out


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
