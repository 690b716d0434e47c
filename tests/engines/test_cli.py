"""CLI 'run' and 'model': bad input is one line and exit 2; 'model build' builds, then reuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridmem.cli.main import main


@pytest.mark.parametrize("argv, needle", [
    (["--requests", "0"], "requests must be >= 1, got 0"),
    (["--share", "1.5"], "share must lie in [0, 1], got 1.5"),
    (["--rate", "0"], "rate must be > 0"),
    (["--cap", "0"], "cap must be >= 1, got 0"),
    (["--model", "/no/such/model"], "no config.json"),
    (["--server", "--server-timeout", "0"], "--server-timeout must be > 0 s, got 0.0"),
    (["--server", "--request-timeout", "-1"], "--request-timeout must be > 0 s, got -1.0"),
], ids=["requests", "share", "rate", "cap", "model", "server-timeout", "request-timeout"])
def test_run_rejects_bad_input_with_exit_2(argv: list[str], needle: str, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", *argv, "--out", str(tmp_path / "o")]) == 2
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
    assert main(["model", "build", "--out", str(out), "--seed", "-1"]) == 2


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
