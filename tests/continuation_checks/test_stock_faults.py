"""End to end on vLLM (CPU, tiny Falcon-H1), ``--org vllm``: the stock path's fault controls.

``fresh-slot`` (a prefix-hit consumer reads a slot that holds another request's state) and
``boundary-shift`` (its adopted state is the one a block earlier: the state at b - G, the empty
state when b = G) act on every other case at the consumer's admission. Those cases must be
``state-mismatch``; the untouched ones, in the same engine, must not be (the control). The
cases file puts the faulted cases at b = G and b = 2 G, so both boundary-shift sources (the
empty state, a producer's state read at b - G) are exercised. One engine start plus the arms
per fault: marked slow.
"""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import pytest

from hybridmem.cli.main import main

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not importable"),
]

GRID = 256  # the tiny model's Mamba block on CPU (vLLM's aligned block)
BOUNDARIES = (GRID, GRID, 2 * GRID, 2 * GRID)  # cases 0 and 2 faulted


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import os

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CACHE_ROOT", str(tmp_path_factory.mktemp("vllm-cache")))
    from hybridmem.engines.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny").path


@pytest.mark.parametrize("fault", ["fresh-slot", "boundary-shift"])
def test_stock_fault_is_state_mismatch_and_only_there(model, tmp_path, fault):
    rng = random.Random(7)
    cases = tmp_path / "cases.jsonl"
    cases.write_text("".join(
        json.dumps({"prompt": [rng.randrange(1, 200) for _ in range(b + 40)], "boundary": b,
                    "max_tokens": 4}) + "\n" for b in BOUNDARIES))
    out = tmp_path / "cc"
    code = main(["continuation", "--model", str(model), "--cases-file", str(cases),
                 "--fault", fault, "--out", str(out), "--quiet", "--json"])
    report = json.loads((out / "report.json").read_text())
    assert code == 0, report["summary"]  # detected, and no clean case flagged
    by_case = {c["case"]: c for c in report["cases"]}
    for i, c in by_case.items():
        assert c["adopted_depth"] == c["boundary"] == BOUNDARIES[i], c
        if i % 2 == 0:
            assert c["faulted"] and c["verdict"] == "state-mismatch", c
            assert c["state_bitwise_equal"] is False
        else:
            assert not c["faulted"] and c["verdict"] == "identical", c

