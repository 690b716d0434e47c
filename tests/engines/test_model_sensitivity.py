"""The tiny model's recurrent state matters: a zeroed checkpoint changes most requests' greedy
tokens, the true checkpoint none (the control), and the same geometry with transformers' default
initialisation -- the old tiny model's weights -- changes none (the measurement can say no)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybridmem.cli.main import main
from hybridmem.engines.state_sensitivity import SensitivityReport, measure_sensitivity

REQUESTS, TOKENS = 8, 16  # seed 0: 7 of 8 requests have a shared prefix of >= one 64-token step


@pytest.fixture(scope="module")
def report(tiny_model: Path) -> SensitivityReport:
    return measure_sensitivity(tiny_model, requests=REQUESTS, seed=0, new_tokens=TOKENS)


def test_zeroed_state_changes_a_majority_and_the_true_state_none(
        report: SensitivityReport) -> None:
    assert report.measured + report.skipped == REQUESTS and report.measured >= 6
    assert report.control_changed == 0, report.as_dict()  # splitting at b with the true state
    assert 2 * report.zero_changed > report.measured, report.as_dict()
    assert report.accepted
    assert all(0 < r.boundary < r.prompt_tokens and r.boundary % 64 == 0
               for r in report.requests)


def test_unshaped_weights_of_the_same_geometry_forget_the_state(tiny_model: Path,
                                                                tmp_path: Path) -> None:
    import torch
    from transformers import AutoConfig, FalconH1ForCausalLM

    config = AutoConfig.from_pretrained(str(tiny_model))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        FalconH1ForCausalLM(config).save_pretrained(tmp_path)  # default N(0, 0.02) init
    plain = measure_sensitivity(tmp_path, requests=REQUESTS, seed=0, new_tokens=TOKENS)
    assert plain.control_changed == 0
    assert plain.zero_changed == 0 and not plain.accepted, plain.as_dict()


def test_cli_reports_json_and_rejects_bad_input(tiny_model: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["model", "sensitivity", "--model", str(tiny_model), "--requests", "3",
               "--tokens", "8", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == (0 if out["accepted"] else 1)
    assert out["grid_tokens"] == 64 and out["measured"] + out["skipped"] == 3
    assert out["control_changed"] == 0
    for bad in (["--requests", "0"], ["--share", "nan"], ["--tokens", "999"], ["--grid", "0"]):
        with pytest.raises(SystemExit) as exc:  # refused by the flag's type, before any work
            main(["model", "sensitivity", *bad])
        assert exc.value.code == 2
        assert bad[1] in capsys.readouterr().err
