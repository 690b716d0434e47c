"""``hybridmem run --json``: the summary alone on stdout, vLLM's log in OUT/engine.log.

Slow (an engine run of 4 requests, ~30 CPU-s), so it runs with HYBRIDMEM_SLOW=1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def _run(tiny_model: Path, out: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hybridmem.cli.main", "run", "--model", str(tiny_model),
         "--requests", "4", "--rate", "100", "--quiet", "--json", "--out", str(out)],
        capture_output=True, text=True, timeout=600, check=False,
        env={k: v for k, v in {**os.environ, **env}.items() if k != "TORCH_CPP_LOG_LEVEL"
             or "TORCH_CPP_LOG_LEVEL" in env})


def test_json_stdout_is_the_summary_alone(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    r = _run(tiny_model, out)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads(r.stdout)  # nothing else on stdout: the whole of it parses
    assert summary["completed"] == 4 and summary["organization"] == "S2"
    assert summary["budget"] == "b40"  # the tiny model's default budget
    log = (out / "engine.log").read_text()
    assert "INFO" in log and "vllm" in log
    # the engine's own records went to the file, not the terminal
    assert not any(line.startswith(("INFO ", "WARNING ")) for line in r.stderr.splitlines())
    assert "wrote " in r.stderr and "wrote " not in r.stdout
    # nor native code's: PyTorch's C++ NUMA notice and vLLM's weight-loading progress bar
    ours = ("wrote ", "vLLM's log: ")
    assert [ln for ln in r.stderr.splitlines() if not ln.startswith(ours)] == []


def test_native_warnings_show_when_the_caller_asks(tiny_model: Path, tmp_path: Path) -> None:
    """Control for the check above: the NUMA notice is real, held back only by the log level
    the CLI sets (a level the caller sets wins)."""
    r = _run(tiny_model, tmp_path / "o", TORCH_CPP_LOG_LEVEL="INFO")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "NUMA" in r.stderr
