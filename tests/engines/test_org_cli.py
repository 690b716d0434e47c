"""CLI 'run' in organization mode: every option is validated before any work."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridmem.cli.main import main


def exit_code(argv: list[str]) -> int:
    """main's status: returned, or raised by argparse for a flag value its type refuses."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


@pytest.mark.parametrize("argv, needle", [
    (["--org", "S9"], "org must be one of S0, S1, S2, D0, vllm, got 'S9'"),
    (["--org", "S2", "--budget", "b0"], "budget label must be b1 or larger, got 'b0'"),
    (["--org", "S2", "--budget", "lots"], "bad budget 'lots'"),
    (["--org", "S1", "--headroom", "1.5"], "--headroom: 1.5 is outside [0, 1)"),
    (["--org", "S1", "--headroom", "nan"], "--headroom: 'nan' is not finite"),
    (["--org", "S2", "--pin-k", "4"], "--pin-k: 4 is outside [1, 3]"),
    (["--org", "S2", "--pin-budget", "2"], "pin-budget needs pin-k"),
    (["--org", "S2", "--pin-k", "2", "--pin-budget", "0"],
     "--pin-budget: 0 is outside [1, 1,048,576]"),
    (["--org", "S2", "--fault", "nope"], "--fault 'nope': not one of"),
    (["--org", "D0", "--attention-fraction", "1.0"],
     "--attention-fraction: 1 is outside [0.001, 0.999]"),
    (["--org", "vllm", "--budget", "b40"], "--budget needs an organization"),
    (["--org", "vllm", "--check-invariants"], "--check-invariants needs an organization"),
    (["--org", "vllm", "--fault", "skip-invalidate"], "--fault needs an organization"),
    (["--org", "vllm", "--poison-vllm-state"], "--poison-vllm-state needs an organization"),
    (["--org", "S2", "--no-prefix-caching"], "needs prefix caching"),
    (["--org", "S0", "--kv-blocks", "10"], "--kv-blocks does not apply to --org S0"),
], ids=["org", "budget-label", "budget-text", "headroom", "headroom-nan", "pin-k",
        "pin-budget-alone", "pin-budget", "fault", "fraction", "vllm-budget", "vllm-checks",
        "vllm-fault", "vllm-poison", "no-prefix-caching", "kv-blocks"])
def test_org_options_are_validated_with_exit_2(argv: list[str], needle: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(["run", *argv, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists(), "a rejected run must not write output"


def test_d0_without_a_fraction_is_refused_before_writing(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str],
                                                          tiny_model: Path) -> None:
    argv = ["run", "--model", str(tiny_model), "--org", "D0", "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--org D0 needs --attention-fraction" in err and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists()


def test_faults_are_one_registry() -> None:
    from hybridmem.vllm_plugin import faults

    assert set(faults.FAULTS) == {"stale-checkpoint", "skip-invalidate", "swap-members"}
    assert faults.FAULTS["swap-members"].side == "worker"
    faults.activate("stale-checkpoint")
    assert faults.active() == "stale-checkpoint"
    faults.activate(None)
    assert faults.active() is None
    with pytest.raises(ValueError, match="unknown fault"):
        faults.check("swap")
