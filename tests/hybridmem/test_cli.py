"""CLI contract of ``plan`` and ``storage``: JSON shape, exit codes, one-line errors."""

import json
import subprocess
import sys

import pytest

from hybridmem.cli.main import main


def run_cli(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_plan_json_contract(capsys):
    code, out, _ = run_cli(capsys, "plan", "--model", "falcon-h1-7b", "--budget", "b63", "--json")
    assert code == 0
    d = json.loads(out)
    assert d["model"] == "falcon-h1-7b" and d["budget"] == "b63"
    assert d["nominal_bytes"] == 101_154_816
    assert d["orgs"]["S0"].items() >= {"pages": 63, "page_bytes": 1_594_368,
                                       "bytes": 100_445_184}.items()
    assert {k: d["orgs"]["S1"][k] for k in ("pages", "page_bytes", "bytes")} == {
        "pages": 193, "page_bytes": 524_288, "bytes": 101_187_584}
    d0 = d["orgs"]["D0"]
    assert {k: d0[k] for k in ("attention_units", "attention_unit_bytes", "attention_bytes",
                               "recurrent_units", "recurrent_unit_bytes", "recurrent_bytes",
                               "bytes", "attention_fraction")} == {
        "attention_units": 3256, "attention_unit_bytes": 16384, "attention_bytes": 53346304,
        "recurrent_units": 29, "recurrent_unit_bytes": 1594368, "recurrent_bytes": 46236672,
        "bytes": 99582976, "attention_fraction": 0.527383}


def test_plan_table_and_size_budget(capsys):
    code, out, _ = run_cli(capsys, "plan", "--model", "falcon-h1-7b", "--budget", "96MiB")
    assert code == 0 and "S0 pages" in out and "D0 bytes" in out


def test_storage_bytes_json(capsys):
    code, out, _ = run_cli(capsys, "storage", "--model", "falcon-h1-7b", "--attention", "120",
                           "--recurrent", "16", "--json")
    assert code == 0
    d = json.loads(out)["orgs"]
    assert d["S2"]["bytes"] == int(84.5 * 2**20)
    assert d["D0"]["attention_units"] == 3840
    assert d["D0"]["bytes"] == 60 * 2**20 + 16 * 1_594_368


def test_storage_capacity_json(capsys):
    code, out, _ = run_cli(capsys, "storage", "--model", "falcon-h1-7b", "--capacity", "100MiB",
                           "--mix", "1,1", "--json")
    assert code == 0
    cap = json.loads(out)["capacity"]
    assert {k: cap[k] for k in ("S0", "S1", "S2")} == {"S0": 32, "S1": 40, "S2": 49}
    assert "D0" in cap


BAD_INPUTS = [
    (["plan", "--model", "nope", "--budget", "b63"], "nope"),
    (["plan", "--model", "falcon-h1-7b", "--budget", "b0"], "b0"),
    (["plan", "--model", "falcon-h1-7b", "--budget", "-5"], "-5"),
    (["plan", "--model", "falcon-h1-7b", "--budget", "0"], "0"),
    (["plan", "--model", "falcon-h1-7b", "--budget", "bx"], "bx"),
    (["plan", "--model", "falcon-h1-7b", "--budget", "b63", "--attention-fraction", "1.2"], "1.2"),
    (["storage", "--model", "falcon-h1-7b", "--attention", "1", "--recurrent", "17",
      "--slabs", "1"], "--slabs 1"),
    (["storage", "--model", "falcon-h1-7b", "--capacity", "100MiB", "--mix", "1"], "'1'"),
    (["plan", "--model", "falcon-h1-7b"], "--budget"),
]


@pytest.mark.parametrize("argv,needle", BAD_INPUTS, ids=[" ".join(a[3:]) for a, _ in BAD_INPUTS])
def test_bad_input_exits_2_with_one_line(capsys, argv, needle):
    with pytest.raises(SystemExit) as exc:
        code = main(argv)
        raise SystemExit(code)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert needle in err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


def test_bad_config_files(tmp_path, capsys):
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{not json")
    llama = tmp_path / "llama"
    llama.mkdir()
    (llama / "config.json").write_text('{"model_type": "llama", "num_hidden_layers": 2}')
    for spec, needle in ((bad_json, "cannot read config"), (llama, "not a Mamba2-style")):
        code = main(["plan", "--model", str(spec), "--budget", "b63"])
        err = capsys.readouterr().err
        assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_console_script_runs():
    r = subprocess.run([sys.executable, "-m", "hybridmem.cli.main", "plan", "--model", "nope",
                        "--budget", "b63"], capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_unwritable_output_path_is_one_line_exit_2(tmp_path, capsys):
    from hybridmem.events import Event, EventKind
    from tracer import TraceWriter

    trace = tmp_path / "t.hmt"
    with TraceWriter(trace, {"organization": "S2"}) as w:
        w.on_event(Event(EventKind.FINISH, request_id="r0"))
    code = main(["trace", "export", str(trace), "--parquet", "/proc/no/such/dir/out.parquet"])
    err = capsys.readouterr().err
    assert code == 2 and "/proc/no/such/dir" in err and len(err.strip().splitlines()) == 1
