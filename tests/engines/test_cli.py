"""CLI 'run' and 'model': bad input is one line and exit 2; 'model build' builds, then reuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridmem.cli.main import main


def _code(argv: list[str]) -> int:
    """main()'s status; a flag value refused by the parser exits (SystemExit) with it."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


@pytest.mark.parametrize("argv, needle", [
    (["--requests", "0"], "--requests: 0 is outside [1, "),
    (["--share", "1.5"], "--share: 1.5 is outside [0, 1]"),
    (["--rate", "0"], "--rate: 0 is outside (0, "),
    (["--cap", "0"], "--cap: 0 is outside [1, "),
    (["--model", "/no/such/model"], "no config.json"),
    (["--server", "--server-timeout", "0"], "--server-timeout: 0 is outside (0, "),
    (["--server", "--request-timeout", "-1"], "--request-timeout: -1 is outside (0, "),
    (["--seed", "4294967296"], "--seed: 4294967296 is outside [0, 4,294,967,295]"),
], ids=["requests", "share", "rate", "cap", "model", "server-timeout", "request-timeout", "seed"])
def test_run_rejects_bad_input_with_exit_2(argv: list[str], needle: str, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert _code(["run", *argv, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists(), "a rejected run must not write output"


def test_model_build_then_reuse(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")
    out = tmp_path / "m"
    assert main(["model", "build", "--out", str(out), "--seed", "3"]) == 0
    assert capsys.readouterr().out.startswith(f"built {out} (seed 3")
    assert main(["model", "build", "--out", str(out), "--seed", "3"]) == 0
    assert capsys.readouterr().out.startswith(f"reused {out} (seed 3")
    assert _code(["model", "build", "--out", str(out), "--seed", "-1"]) == 2


@pytest.mark.parametrize("server", [False, True], ids=["inprocess", "server"])
def test_run_rejects_a_model_without_vocab_size(server: bool, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    argv = ["run", "--model", str(model), "--out", str(tmp_path / "o")]
    assert main(argv + (["--server"] if server else [])) == 2
    err = capsys.readouterr().err
    assert "config.json gives no vocab_size" in err and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists()
