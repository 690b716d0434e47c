"""CLI contract of ``hybridmem lineage``: JSON keys, query, views, plot, refusals (exit 2)."""

import json

import pyarrow.parquet as pq
import pytest

from hybridmem.cli.main import main
from lineage.table import events_to_table
from tracer.schema import META_KEY

from .helpers import S2, adopt, enter, loss, pub

EVENTS = [pub(1, 1), pub(2, 1, rec=True), enter("a", 2, [1], [2]), enter("b", 2, [9], [8]),
          loss(2, 3, rec=True, requester="b"), adopt("a", 4, 0), adopt("b", 4, 0)]


def _write(tmp_path, meta=S2, name="run.parquet"):
    path = tmp_path / name
    pq.write_table(events_to_table(EVENTS, meta), path)
    return str(path)


def run_cli(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_report_json_contract(tmp_path, capsys):
    path = _write(tmp_path)
    code, out, err = run_cli(capsys, "lineage", path, "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["episodes"] == 2
    assert d["classes"] == {"zero->zero": 1, "positive-equal": 0, "zero->positive": 0,
                            "deeper": 0, "shallower": 1}
    assert d["replay_agreement"]["episodes"] == 2 and d["replay_agreement"]["agree"] == 2
    assert d["attribution"] == {"shallower": 1, "with_other_request_loss": 1}
    assert d["supply"]["publications"] == 2 and d["supply"]["losses"] == 1


def test_report_text_and_plot(tmp_path, capsys):
    path = _write(tmp_path)
    png = tmp_path / "out.png"
    code, out, err = run_cli(capsys, "lineage", path, path, "--plot", str(png))
    assert code == 0, err
    assert out.count("SQL vs replay: 2/2") == 2 and "attribution: 1/1" in out
    assert png.stat().st_size > 10_000


def test_query_and_views(tmp_path, capsys):
    path = _write(tmp_path)
    code, out, _ = run_cli(capsys, "lineage", "query", path, "--sql",
                           "SELECT request_id, class FROM episode_lineage ORDER BY 1")
    assert code == 0
    assert out.splitlines() == ["request_id\tclass", "a\tshallower", "b\tzero->zero"]
    code, out, _ = run_cli(capsys, "lineage", "views")
    assert code == 0
    assert "episode_lineage:" in out and "j_enter" in out and "_flips" not in out


@pytest.mark.parametrize("argv, needle", [
    (["lineage", "/nonexistent.parquet"], "no such file"),
    (["lineage", "query", "--sql", "SELECT 1"], "at least one PATH"),
    (["lineage", "query", "X"], "needs --sql"),
    (["lineage"], "at least one PATH"),
    (["lineage", "x.parquet", "--replay", "0"], "--replay"),
    (["lineage", "x.parquet", "--replay", "some"], "--replay"),
])
def test_bad_input_exits_2_with_one_line(capsys, argv, needle):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_bad_sql_and_missing_meta(tmp_path, capsys):
    path = _write(tmp_path)
    code, _, err = run_cli(capsys, "lineage", "query", path, "--sql", "SELEC nope")
    assert code == 2 and "--sql" in err
    table = events_to_table(EVENTS, S2).replace_schema_metadata({})
    bare = tmp_path / "bare.parquet"
    pq.write_table(table, bare)
    code, _, err = run_cli(capsys, "lineage", str(bare))
    assert code == 2 and META_KEY.decode() in err


def test_unaccepted_verdict_is_refused_unless_allowed(tmp_path, capsys):
    meta = dict(S2, verdict={"accepted": False, "reason": "no END record"})
    path = _write(tmp_path, meta)
    code, _, err = run_cli(capsys, "lineage", path)
    assert code == 2 and "no END record" in err
    code, out, _ = run_cli(capsys, "lineage", path, "--allow-unverified")
    assert code == 0 and "UNVERIFIED (no END record)" in out
    code, out, _ = run_cli(capsys, "lineage", path, "--allow-unverified", "--json")
    assert json.loads(out)["verification"] == {"verified": False, "reason": "no END record"}


def test_binary_trace_without_tracer_reader_is_a_clear_error(tmp_path, capsys):
    trace = tmp_path / "run.trace"
    trace.write_bytes(b"\0" * 16)
    code, _, err = run_cli(capsys, "lineage", str(trace))
    assert code == 2 and len(err.strip().splitlines()) == 1


def test_import_vllm_then_report(tmp_path, capsys):
    import msgpack

    stream = tmp_path / "kv.msgpack"
    stream.write_bytes(
        msgpack.packb([1.0, [["BlockStored", [5, 6], None, [], 16, None, "GPU"]]])
        + msgpack.packb([2.0, [["BlockRemoved", [6], "GPU"]]]))
    out_path = tmp_path / "kv.parquet"
    code, _, err = run_cli(capsys, "lineage", "import-vllm", str(stream), str(out_path))
    assert code == 0, err
    code, out, _ = run_cli(capsys, "lineage", str(out_path), "--json")
    d = json.loads(out)
    assert code == 0 and d["episodes"] == 0
    assert (d["supply"]["publications"], d["supply"]["losses"]) == (2, 1)


def test_replay_scope_is_printed_and_selectable(tmp_path, capsys):
    path = _write(tmp_path)
    code, out, err = run_cli(capsys, "lineage", path, "--replay", "1", "--json")
    d = json.loads(out)["replay_agreement"]
    assert code == 0 and (d["requests_replayed"], d["requests"], d["episodes"]) == (1, 2, 1)
    assert d["scope"].startswith("sample of 1 of 2 requests")
    code, out, _ = run_cli(capsys, "lineage", path, "--replay", "all")
    assert code == 0 and "SQL vs replay: 2/2" in out and "[replay scope: all 2 requests]" in out
    code, out, _ = run_cli(capsys, "lineage", path, "--replay", "off")
    assert code == 0 and "not checked (replay off)" in out


def test_lineage_command_does_not_import_torch():
    """``hybridmem lineage`` never imports torch (~3 CPU-seconds), which the lineage report never
    needs; nor does the full parser (``hybridmem --help``). Negative control: the same probe sees
    torch once the vLLM plugin is imported."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    probe = ("import sys; from hybridmem.cli.main import main, build_parser; {call}; "
             "print('torch' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": str(root)}

    def torch_loaded(call: str) -> bool:
        out = subprocess.run([sys.executable, "-c", probe.format(call=call)], env=env,
                             check=True, capture_output=True, text=True).stdout
        return out.strip().splitlines()[-1] == "True"

    assert not torch_loaded("main(['lineage', 'views'])")
    assert not torch_loaded("build_parser()")
    assert torch_loaded("import hybridmem.vllm_plugin")


def test_report_reads_only_the_lineage_columns_but_checks_them_all(tmp_path, capsys):
    """``open_run(columns=LINEAGE_COLUMNS)`` (what the report does) decodes only the columns the
    lineage reads and gives the same report as the whole table; a file lacking any shared
    column, even one the lineage never reads, is still refused (exit 2)."""
    from lineage.report import analyse, to_json
    from lineage.source import open_run
    from lineage.table import LINEAGE_COLUMNS

    path = _write(tmp_path)
    narrow = open_run(path, columns=LINEAGE_COLUMNS)
    assert narrow.table.column_names == list(LINEAGE_COLUMNS)
    assert narrow.meta == open_run(path).meta
    a, b = to_json(analyse(narrow)), to_json(analyse(open_run(path)))
    a.pop("seconds"), b.pop("seconds")
    assert a == b
    table = pq.read_table(path)
    pq.write_table(table.drop_columns(["ts_ns"]), tmp_path / "no_ts.parquet")
    code, _, err = run_cli(capsys, "lineage", str(tmp_path / "no_ts.parquet"))
    assert code == 2 and "lacks columns ['ts_ns']" in err and len(err.strip().splitlines()) == 1
