"""End to end on vLLM (CPU, tiny Falcon-H1): the corruption control through the CLI.

``--fault corrupt-checkpoint`` overwrites the retained checkpoint of every other case in place
(vLLM's Mamba row of the block the consumer will adopt). Those cases must be ``state-mismatch``;
the untouched ones, run in the same engine, must not be (the control of the control). One engine
start (~10-20 s on 2 cores) plus the arms: marked slow.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from hybridmem.cli.main import main

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not importable"),
]


@pytest.fixture(scope="module")
def faulted_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path]:
    import os

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CACHE_ROOT", str(tmp_path_factory.mktemp("vllm-cache")))
    from hybridmem.engines.tiny_model import build_tiny_model

    model = build_tiny_model(tmp_path_factory.mktemp("models") / "tiny").path
    out = tmp_path_factory.mktemp("cc")
    code = main(["continuation", "--model", str(model), "--org", "vllm", "--cases", "4",
                 "--max-tokens", "4",
                 "--fault", "corrupt-checkpoint", "--out", str(out), "--quiet", "--json"])
    return code, out


def test_corrupted_checkpoints_are_state_mismatch_and_only_those(faulted_run):
    code, out = faulted_run
    assert code == 0, "exit 0 means: the fault was detected and no clean case was flagged"
    report = json.loads((out / "report.json").read_text())
    assert report["fault"] == "corrupt-checkpoint" and report["org"] == "vllm"
    assert report["dtype"] == "float32"
    assert set(report) >= {"summary", "cases", "model", "org", "dtype", "fault"}
    by_case = {c["case"]: c for c in report["cases"]}
    assert len(by_case) == 4
    for i, c in by_case.items():
        assert c["adopted_depth"] == c["boundary"], c  # treated: adoption at exactly b
        if i % 2 == 0:
            assert c["faulted"] and c["verdict"] == "state-mismatch", c
            assert c["state_bitwise_equal"] is False and c["state_max_abs_diff"] > 0.1
        else:
            assert not c["faulted"] and c["verdict"] == "identical", c
            assert c["state_max_abs_diff"] is not None and c["state_max_abs_diff"] < 1e-4
    assert report["summary"]["state-mismatch"] == 2
    assert report["meta"]["trace_verdict"]["accepted"] is True


def test_outputs_one_row_per_case_and_arm(faulted_run):
    import pyarrow.parquet as pq

    _, out = faulted_run
    t = pq.read_table(out / "cases.parquet").to_pylist()
    assert len(t) == 4 * 8
    assert {r["run"] for r in t} == {"retained", "retained-repeat", "retained-alone", "recompute",
                                     "recompute-repeat", "split", "split-repeat", "split-alone"}
    assert all(len(r["output_token_ids"]) == 4 for r in t)
    assert (out / "continuation.png").stat().st_size > 1000
