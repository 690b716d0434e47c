"""Never destroy the user's data: outputs are written to a temporary file
and renamed, an output that is an input is refused, and a run clears its previous summary
before it starts."""

import os

import pyarrow.parquet as pq
import pytest

from hybridmem.cli.main import main
from hybridmem.outputs import OutputError, atomic_output, check_output, same_file
from tests.tracer.helpers import every_kind, write_trace


@pytest.fixture()
def trace(tmp_path):
    path = tmp_path / "run.hmt"
    write_trace(path, every_kind())
    return path


@pytest.mark.parametrize("flag", ["--parquet", "--perfetto"])
def test_export_onto_its_input_is_refused(trace, capsys, flag):
    before = trace.read_bytes()
    assert main(["trace", "export", str(trace), flag, str(trace)]) == 2
    assert "is an input" in capsys.readouterr().err
    assert trace.read_bytes() == before
    assert main(["trace", "verify", str(trace)]) == 0


def test_export_onto_a_hard_link_of_its_input_is_refused(trace, tmp_path, capsys):
    link = tmp_path / "link.parquet"
    os.link(trace, link)
    assert same_file(link, trace)
    assert main(["trace", "export", str(trace), "--parquet", str(link)]) == 2
    assert trace.read_bytes()[:8] == b"HMTRACE\x00"


def test_failed_parquet_write_keeps_the_old_target(trace, tmp_path, capsys, monkeypatch):
    out = tmp_path / "events.parquet"
    assert main(["trace", "export", str(trace), "--parquet", str(out)]) == 0  # negative control
    before = out.read_bytes()

    def half_write(self, batch, *args, **kw):  # the streamed export dies mid-file
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pq.ParquetWriter, "write_batch", half_write)
    assert main(["trace", "export", str(trace), "--parquet", str(out)]) == 2
    err = capsys.readouterr().err
    assert "None" not in err and err.count("\n") == 1
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events.parquet", "run.hmt"]


def test_atomic_output_leaves_target_on_error(tmp_path):
    target = tmp_path / "x.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_output(target) as tmp:
        tmp.write_text("new, half")
        raise RuntimeError("killed")
    assert target.read_text() == "old" and list(tmp_path.iterdir()) == [target]
    with atomic_output(target) as tmp:  # negative control: success replaces
        tmp.write_text("new")
    assert target.read_text() == "new"


def test_check_output_refusals(tmp_path):
    for bad in ("", str(tmp_path), str(tmp_path / "no" / "x")):
        with pytest.raises(OutputError):
            check_output(bad)
    with pytest.raises(OutputError, match="is an input"):
        check_output(tmp_path / "a" / ".." / "in.txt", [tmp_path / "in.txt"])


def test_lineage_outputs_never_over_inputs(trace, tmp_path, capsys):
    table = tmp_path / "t.parquet"
    assert main(["trace", "export", str(trace), "--parquet", str(table)]) == 0
    before = table.read_bytes()
    assert main(["lineage", "import-vllm", str(table), str(table)]) == 2
    assert main(["lineage", str(table), "--plot", str(tmp_path / "t.png"),
                 "--allow-unverified"]) in (0, 1)  # control: another name is written
    png = tmp_path / "t.png"
    assert png.read_bytes()[:4] == b"\x89PNG"
    os.link(table, tmp_path / "t2.png")  # a plot over a hard link of the input
    assert main(["lineage", str(table), "--plot", str(tmp_path / "t2.png")]) == 2
    assert table.read_bytes() == before


def test_bench_never_overwrites_a_foreign_file(tmp_path, capsys):
    other = tmp_path / "notes.txt"
    other.write_text("mine")
    assert main(["trace", "bench", "--events", "10", "--repeats", "1", "--out", str(other)]) == 2
    assert other.read_text() == "mine"


def test_a_run_clears_its_previous_summary_before_serving(tmp_path, monkeypatch):
    from hybridmem.engines import vllm_run
    from hybridmem.engines.run_results import clear_previous_outputs

    out = tmp_path / "run"
    out.mkdir()
    (out / "summary.json").write_text('{"trace_verdict": {"accepted": true}}')
    (out / "results.parquet").write_bytes(b"old")
    (out / "notes.txt").write_text("kept")
    monkeypatch.setattr(vllm_run, "resolve_model", lambda model, data_dir: tmp_path)
    monkeypatch.setattr(vllm_run, "vocab_size", lambda model: 512)
    cfg = vllm_run.RunConfig(model="tiny", requests=2, rate=1.0, share=0.5, seed=0, cap=2,
                             trace_dir=None, out=out)
    vllm_run.prepare_run(cfg)  # what both drivers do before the engine starts
    assert not (out / "summary.json").exists() and not (out / "results.parquet").exists()
    assert (out / "notes.txt").read_text() == "kept"
    assert clear_previous_outputs(out) == []
