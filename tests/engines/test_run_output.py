"""``hybridmem run --json``: the summary alone on stdout, vLLM's log in OUT/engine.log.

Slow (an engine run of 4 requests, ~30 CPU-s), so it runs with HYBRIDMEM_SLOW=1.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_json_stdout_is_the_summary_alone(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    r = subprocess.run(
        [sys.executable, "-m", "hybridmem.cli.main", "run", "--model", str(tiny_model),
         "--requests", "4", "--rate", "100", "--quiet", "--json", "--out", str(out)],
        capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads(r.stdout)  # nothing else on stdout: the whole of it parses
    assert summary["completed"] == 4 and summary["organization"] == "S2"
    assert summary["budget"] == "b40"  # the tiny model's default budget
    log = (out / "engine.log").read_text()
    assert "INFO" in log and "vllm" in log
    # the engine's own records went to the file, not the terminal
    assert not any(line.startswith(("INFO ", "WARNING ")) for line in r.stderr.splitlines())
    assert "wrote " in r.stderr and "wrote " not in r.stdout
