"""``benchmarks/bench_export.py`` runs end to end on tiny traces (its figures are benchmarks)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import bench_export

pytestmark = pytest.mark.writer_paths("default")  # one writer path is enough for a benchmark


def test_bench_export_prints_both_sizes_and_the_ratio(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_export.main(["--events", "1000", "3000", "--work", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "1,000 events" in out and "3,000 events" in out and "accepted False" not in out
    assert "columnar / row at 3,000 events" in out
    assert "peak RSS ratio" in out
    assert "perfetto files at 3,000 events: same objects" in out and "perfetto CPU" in out


def test_bench_export_refuses_sizes_out_of_order(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ex:
        bench_export.main(["--events", "3000", "1000"])
    assert ex.value.code == 2 and "3000 1000" in capsys.readouterr().err
