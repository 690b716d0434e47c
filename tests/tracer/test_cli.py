"""``hybridmem trace``: exit codes, JSON keys, exports, stats, bench."""

import json

import pyarrow.parquet as pq
import pytest

from hybridmem.cli.main import main
from tests.tracer.helpers import every_kind, write_trace
from tracer import VERDICT_KEYS


def run_cli(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "t.hmtrace"
    write_trace(path, every_kind(), packet_records=4)
    return path


def test_verify_accepted_json(capsys, trace):
    code, out, _ = run_cli(capsys, "trace", "verify", str(trace), "--json")
    d = json.loads(out)
    assert code == 0 and tuple(d) == VERDICT_KEYS
    assert d == {"accepted": True, "records": 15, "end_present": True, "gaps": 0, "dropped": 0,
                 "write_errors": 0, "checksum_errors": 0, "recovered_records": 15,
                 "reason": "accepted"}


def test_verify_torn_tail_exits_1(capsys, trace, tmp_path):
    torn = tmp_path / "torn.hmtrace"
    torn.write_bytes(trace.read_bytes()[:-30])
    code, out, _ = run_cli(capsys, "trace", "verify", str(torn), "--json")
    d = json.loads(out)
    assert code == 1 and d["accepted"] is False and d["end_present"] is False
    assert d["reason"].startswith("not accepted: END missing (torn tail")
    assert d["recovered_records"] == 15  # END has a packet of its own: only END is torn
    code, out, _ = run_cli(capsys, "trace", "verify", str(torn))
    assert code == 1 and "END missing" in out


@pytest.mark.parametrize("content", [b"", b"not a trace at all", None], ids=["empty", "junk",
                                                                              "missing"])
def test_verify_unreadable_exits_2_with_one_line(capsys, tmp_path, content):
    path = tmp_path / "bad.hmtrace"
    if content is not None:
        path.write_bytes(content)
    code, out, err = run_cli(capsys, "trace", "verify", str(path), "--json")
    assert code == 2 and out == "" and err.count("\n") == 1 and str(path) in err


def test_export_parquet_and_perfetto(capsys, trace, tmp_path):
    pq_out, pf_out = tmp_path / "t.parquet", tmp_path / "t.json"
    code, out, _ = run_cli(capsys, "trace", "export", str(trace), "--parquet", str(pq_out))
    assert code == 0 and "accepted" in out
    assert pq.read_table(pq_out).num_rows == 16
    code, _, _ = run_cli(capsys, "trace", "export", str(trace), "--perfetto", str(pf_out))
    assert code == 0 and json.loads(pf_out.read_text())["traceEvents"]
    code, _, err = run_cli(capsys, "trace", "export", str(trace), "--parquet",
                           str(tmp_path / "no" / "x.parquet"))
    assert code == 2 and err.count("\n") == 1


def test_export_needs_exactly_one_output(capsys, trace):
    with pytest.raises(SystemExit) as exc:
        main(["trace", "export", str(trace)])
    assert exc.value.code == 2


def test_stats(capsys, trace):
    code, out, _ = run_cli(capsys, "trace", "stats", str(trace), "--json")
    d = json.loads(out)
    assert code == 0 and d["events"] == 15 and d["by_kind"]["loss"] == 2
    assert d["by_kind"]["end"] == 1 and d["by_request"]["req-β"]["episodes"] == 3
    assert d["requests"] == 3 and d["span_s"] > 0
    code, out, _ = run_cli(capsys, "trace", "stats", str(trace))
    assert code == 0 and "publication" in out and "req-α" in out


def test_bench_json(capsys, tmp_path, writer_path):
    out_path = tmp_path / "b.hmtrace"
    code, out, err = run_cli(capsys, "trace", "bench", "--events", "3000", "--out",
                             str(out_path), "--repeats", "1", "--json")
    d = json.loads(out)
    assert code == 0 and "trace bench:" in err
    assert list(d)[:4] == ["ns_per_event_enabled", "ns_per_event_disabled", "events", "path"]
    assert d["events"] == 3000 and d["path"] == str(out_path) and d["accepted"] is True
    assert d["ns_per_event_enabled"] > d["ns_per_event_disabled"] > 0
    # the floor is timed in the same run and the ratio is computed from the printed figures
    assert d["floor_ns_per_event"] > 0 and d["cpu_ratio_to_floor"] > 0
    ratio = d["ns_per_event_enabled"] / d["floor_ns_per_event"]
    assert abs(d["ratio_to_floor"] - ratio) < 0.01 * ratio
    # which writer ran; the pure-Python one is timed beside the compiled one in the same rounds
    assert d["writer_path"] == writer_path and d["writer_path_note"]
    assert (d["ratio_to_floor_pure"] is None) == (writer_path == "python")
    if writer_path == "c":
        assert d["ns_per_event_enabled_pure"] > 0 and d["cpu_ratio_to_floor_pure"] > 0
    before = out_path.read_bytes()
    code, _, err = run_cli(capsys, "trace", "bench", "--events", "500", "--out",
                           str(out_path), "--repeats", "1")  # an existing trace: refused
    assert code == 2 and "--force" in err and out_path.read_bytes() == before
    code, out, _ = run_cli(capsys, "trace", "bench", "--events", "500", "--out",
                           str(out_path), "--repeats", "1", "--force")
    assert code == 0 and f"writer   {writer_path}" in out


def test_bench_rejects_bad_count(capsys):
    with pytest.raises(SystemExit) as exc:  # refused by the parser, before any work
        main(["trace", "bench", "--events", "0"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--events" in err and err.count("\n") == 1
