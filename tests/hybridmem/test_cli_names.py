"""One model-name registry and one set of defaults across the subcommands; a torch-free --help."""

import subprocess
import sys

import pytest

from hybridmem.cli import models
from hybridmem.cli.main import build_parser, main

CHECK_TORCH = ("import sys; {pre}from hybridmem.cli.main import build_parser; build_parser(); "
               "print(sorted(m for m in ('torch', 'vllm', 'duckdb') if m in sys.modules))")


def _imported(pre: str = "") -> str:
    r = subprocess.run([sys.executable, "-c", CHECK_TORCH.format(pre=pre)], capture_output=True,
                       text=True, check=True)
    return r.stdout.strip()


def test_help_imports_no_torch_vllm_or_duckdb():
    assert _imported() == "[]"
    # negative control: the same probe sees torch once the plugin is imported
    assert "torch" in _imported("import hybridmem.vllm_plugin; ")


def test_spelled_names_equal_their_sources():
    from hybridmem.cli.run import FAULT_NAMES
    from hybridmem.sim.schedulers import CHUNKINGS, DEFAULT_CHUNKING, ORGS
    from hybridmem.vllm_plugin.faults import FAULTS

    assert FAULT_NAMES == tuple(FAULTS)
    assert models.ORG_CHOICES == ORGS
    assert models.CHUNKING_CHOICES == CHUNKINGS
    assert models.DEFAULT_CHUNKING == DEFAULT_CHUNKING


def test_one_set_of_defaults():
    orgs = {}
    for cmd in ("run", "sim", "continuation"):
        args = build_parser(cmd).parse_args([cmd, "--out", "x"])
        orgs[cmd] = args.org
    assert set(orgs.values()) == {models.DEFAULT_ORG} == {"S2"}
    assert (models.default_budget("tiny"), models.default_cap("tiny")) == ("b40", 8)
    assert (models.default_budget("falcon-h1-7b"), models.default_cap("falcon-h1-7b")) == (
        "b63", 63)


@pytest.mark.parametrize("argv, needle", [
    (["run", "--model", "falcon-h1-7b", "--out", "{tmp}/o"], "hybridmem sim --model"),
    (["continuation", "--model", "nemotron-h-8b", "--out", "{tmp}/o"], "architecture-only"),
    (["sim", "--model", "tiny", "--out", "{tmp}/o"], "hybridmem run --model tiny"),
    (["run", "--model", "nope", "--out", "{tmp}/o"], "not one of tiny, falcon-h1-7b"),
])
def test_names_refused_with_the_command_that_takes_them(argv, needle, tmp_path, capsys):
    assert main([a.format(tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err
    assert not (tmp_path / "o").exists()


def test_every_name_is_priced_by_plan(capsys):
    for name in models.names():
        assert main(["plan", "--model", name, "--budget", "b63"]) == 0, name
    out = capsys.readouterr().out
    assert "model tiny (parallel): 2 layers" in out and "grid 64 tokens" in out


def test_a_built_tiny_directory_gets_the_tiny_defaults(tmp_path):
    import json

    d = tmp_path / "tiny"
    d.mkdir()
    assert models.default_budget(str(d)) == "b63"  # control: a plain directory
    (d / "hybridmem.json").write_text(json.dumps({"format": "hybridmem-model", "version": 2,
                                                   "grid_tokens": 64}))
    assert (models.default_budget(str(d)), models.default_cap(str(d))) == ("b40", 8)
    assert models.grid_tokens(str(d)) == 64
