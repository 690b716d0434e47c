"""End to end on vLLM (CPU, tiny Falcon-H1) with S2 serving inside vLLM's scheduler (grid 64),
and D0 at its native geometry (16-token blocks, 256-token checkpoints).

``--fault corrupt-checkpoint`` overwrites the retained checkpoint of every other case at its
S2 address (member pages and conv slot line, through the layer's LayerStore): those cases must be
``state-mismatch``; the untouched ones, in the same engine, must not be (the clean control).
``--fault stale-checkpoint`` (the organization's own fault: an adopter's Mamba table points at
another live checkpoint) must give ``state-mismatch`` on every case. Two engine starts: slow.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from hybridmem.cli.main import main

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not importable"),
]

CASES = 4


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import os

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CACHE_ROOT", str(tmp_path_factory.mktemp("vllm-cache")))
    from hybridmem.engines.tiny_model import build_tiny_model

    return Path(build_tiny_model(tmp_path_factory.mktemp("models") / "tiny").path)


def _run(model: Path, out: Path, fault: str, *org: str) -> tuple[int, dict[str, Any]]:
    code = main(["continuation", "--model", str(model), *(org or ("--org", "S2")),
                 "--cases", str(CASES), "--max-tokens", "4", "--fault", fault, "--out", str(out),
                 "--quiet"])
    return code, json.loads((out / "report.json").read_text())


def test_corrupted_s2_checkpoints_are_state_mismatch_and_only_those(model, tmp_path):
    code, report = _run(model, tmp_path, "corrupt-checkpoint")
    assert code == 0, "exit 0 means: the fault was detected and no clean case was flagged"
    assert (report["org"], report["fault"]) == ("S2", "corrupt-checkpoint")
    meta = report["meta"]
    assert meta["grid_tokens"] == meta["block_tokens"] == 64  # the organization grid, not 256
    assert meta["state_storage"]["conv"] == "slot" and meta["state_storage"]["members"] >= 2
    assert meta["trace_verdict"]["accepted"] is True
    cases = report["cases"]
    assert len(cases) == CASES
    for c in cases:
        assert c["adopted_depth"] == c["boundary"], c  # treated: adopted exactly at b
        if c["case"] % 2 == 0:
            assert c["faulted"] and c["verdict"] == "state-mismatch", c
            assert c["state_bitwise_equal"] is False and c["state_max_abs_diff"] > 0.1
        else:  # clean control in the same engine: no false state-mismatch
            assert not c["faulted"] and c["verdict"] == "identical", c
            assert c["state_max_abs_diff"] < 1e-4
    assert report["summary"]["state-mismatch"] == CASES // 2


def test_stale_checkpoint_is_state_mismatch_on_every_adopter(model, tmp_path):
    code, report = _run(model, tmp_path, "stale-checkpoint")
    assert code == 0
    # the fault hands every adopter another live checkpoint (a shallower one of its chain, else
    # any other): 3 retained runs per case
    assert report["meta"]["fault_count"] == 3 * CASES
    for c in report["cases"]:
        assert c["adopted_depth"] == c["boundary"], c
        assert c["verdict"] == "state-mismatch" and c["state_bitwise_equal"] is False, c


def test_d0_at_its_native_geometry_detects_corrupted_checkpoints(model, tmp_path):
    """D0 continues from 256-token checkpoints over 16-token blocks (its native unit): the
    corrupted composites are state-mismatch, the clean cases in the same engine identical."""
    code, report = _run(model, tmp_path, "corrupt-checkpoint", "--org", "D0",
                        "--attention-fraction", "0.5")
    assert code == 0
    meta = report["meta"]
    assert (meta["block_tokens"], meta["grid_tokens"]) == (16, 256)
    assert meta["state_storage"]["conv"] == "inside"
    assert meta["trace_verdict"]["accepted"] is True
    for c in report["cases"]:
        assert c["adopted_depth"] == c["boundary"] and c["boundary"] % 256 == 0, c
        want = "state-mismatch" if c["case"] % 2 == 0 else "identical"
        assert c["faulted"] == (c["case"] % 2 == 0) and c["verdict"] == want, c
