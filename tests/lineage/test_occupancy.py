"""Pool occupancy from ALLOCATION events (tracer/occupancy.py, lineage/occupancy.py): every point
partitions the pool, on real simulated traces; a corrupted event fails the check."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tracer
from hybridmem.cli.main import main
from tracer.occupancy import OccupancyError, PoolSeries, check_series, occupancy, pool_sizes


def table_meta(path):
    t = tracer.events_table(path)
    return t, json.loads(t.schema.metadata[b"hybridmem.meta"])


def corrupt_free(table, seq, value):
    """The table with allocation event ``seq``'s ``free`` replaced by ``value``."""
    seqs = table.column("seq").to_pylist()
    free = table.column("free").to_pylist()
    free[seqs.index(seq)] = value
    i = table.schema.get_field_index("free")
    return table.set_column(i, table.schema.field(i), pa.array(free, pa.int64()))


@pytest.mark.vllm
@pytest.mark.parametrize("org,pools", [("S2", {"pages"}), ("D0", {"attention", "recurrent"})])
def test_series_partition_the_pool_at_every_point(sim_traces, org, pools):
    table, meta = table_meta(sim_traces[org])
    series = occupancy(table, meta)
    assert {s.pool for s in series} == pools
    for s in series:
        assert len(s.seq) > 10
        assert all(u + a == s.size and 0 <= a <= s.size
                   for u, a in zip(s.in_use, s.available, strict=True))
        assert s.available[0] == s.size  # the first allocation finds the pool empty
        assert max(s.in_use) > 0
    assert sum(pool_sizes(meta).values()) == sum(s.size for s in series)


@pytest.mark.vllm
def test_a_corrupted_event_fails_the_check(sim_traces):
    table, meta = table_meta(sim_traces["S2"])
    good = occupancy(table, meta)[0]
    bad_seq = good.seq[len(good.seq) // 2]
    with pytest.raises(OccupancyError, match=f"seq {bad_seq} reports {good.size + 1}"):
        occupancy(corrupt_free(table, bad_seq, good.size + 1), meta)
    with pytest.raises(OccupancyError, match=f"seq {bad_seq}"):
        occupancy(corrupt_free(table, bad_seq, -1), meta)


def test_check_series_itself():
    check_series(PoolSeries("pages", 4, [1, 2], [1, 2], [0, 1], [4, 0]))
    with pytest.raises(OccupancyError, match="seq 2"):
        check_series(PoolSeries("pages", 4, [1, 2], [1, 2], [0, 1], [4, 5]))


def test_a_run_without_pool_size_is_refused():
    with pytest.raises(OccupancyError, match="names no pool size"):
        pool_sizes({"organization": "S2"})


@pytest.mark.vllm
def test_cli_writes_the_figure_and_refuses_a_corrupted_run(sim_traces, tmp_path, capsys):
    png = tmp_path / "occ.png"
    code = main(["lineage", sim_traces["S2"], sim_traces["D0"], "--occupancy", str(png),
                 "--replay", "off"])
    assert code == 0 and png.stat().st_size > 10_000
    table, meta = table_meta(sim_traces["S2"])
    s = occupancy(table, meta)[0]
    bad = tmp_path / "bad.parquet"
    pq.write_table(corrupt_free(table, s.seq[3], s.size + 7), bad)
    capsys.readouterr()
    code = main(["lineage", str(bad), "--occupancy", str(tmp_path / "bad.png"),
                 "--replay", "off"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and "outside the pool" in err[-1]
    assert not (tmp_path / "bad.png").exists()
