"""``lineage.bounded`` (``views.connect_parquet(accelerate=True)``: ``_supply``, ``_chain_probe``
and ``_chain_validity`` in NumPy key partition by key partition, rows into TEMP tables) gives
exactly the rows of the SQL in every public view and in the two materialized views it computes,
in one and in several key partitions, with step regressions and NULL steps; it steps aside (the
SQL runs) for a NULL hash or a repeated seq of one entry, and leaves no scratch files. Negative
control: a pipeline that loses its last key partition gives different rows."""

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lineage import (
    bounded,
    bounded_entries,
    episode_ranges,
    gathered_supply,
    materialize,
    supply_steps,
    views,
)
from lineage.synth import D0_SYNTH, SynthConfig, synthesize
from lineage.table import events_to_table

from .helpers import S2, regressed, repeated_seq_table
from .test_agreement import _random_events
from .test_sql_sets import PUBLIC, _canon

COMPARED = PUBLIC + ("_entries", "_supply", "_supply_ordered", "_chain_validity",
                     "_episode_depths", "_window_flips", "_boundaries", "_boundary_transitions")


ALL_BOUNDED = set(bounded.ENTRY_NAMES + bounded.NAMES + bounded.FACT_NAMES
                  + bounded.RANGE_NAMES + bounded.GATHERED_NAMES)


# _chain_validity's rows as the range views read them (written by the bounded path)
VALIDITY = "_chain_validity (range files)"


def _rows(con, name: str) -> list[tuple]:
    rows = [tuple(_canon(v) for v in r) for r in con.sql(f"SELECT * FROM {name}").fetchall()]
    return sorted(rows, key=repr)


def parquet_answers(table: pa.Table, tmp: Path, *, accelerate: bool, parts: int | None = None,
                    used: set[str] | None = None, sql: str = "current"
                    ) -> dict[str, list[tuple]]:
    """Every compared view's rows from ``connect_parquet`` over ``table`` written as Parquet;
    ``used`` collects the views the bounded pipeline computed."""
    path = tmp / "events.parquet"
    if not path.exists():
        pq.write_table(table, path)
    real = bounded.Bounded.materialize

    def spy(self, con, name, stmts):
        done = real(self, con, name, stmts)
        if done and used is not None:
            used.add(name)
        return done

    real_depths = bounded.episode_depths

    def depths_spy(*args):
        rows = real_depths(*args)
        if used is not None and rows is None:
            used.add("episode_depths stepped aside")
        return rows

    real_write = episode_ranges.EpisodeRanges.write_validity
    written: list[pa.Table] = []

    def write_spy(self, rows):
        written.append(rows.select(episode_ranges.VALIDITY_COLUMNS))
        real_write(self, rows)

    bounded.Bounded.materialize = spy  # type: ignore[method-assign]
    bounded.episode_depths = depths_spy
    episode_ranges.EpisodeRanges.write_validity = write_spy  # type: ignore[method-assign]
    try:
        db = tmp / f"db_{accelerate}_{parts}_{sql}.duckdb"
        con = views.connect_parquet([str(path)], database=str(db), memory_limit="1GB",
                                    temp_directory=str(tmp / "spill"), threads=1, sql=sql,
                                    accelerate=accelerate, bounded_parts=parts)
    finally:
        bounded.Bounded.materialize = real  # type: ignore[method-assign]
        bounded.episode_depths = real_depths
        episode_ranges.EpisodeRanges.write_validity = real_write  # type: ignore[method-assign]
    names = COMPARED if sql == "current" else PUBLIC
    out = {name: _rows(con, name) for name in names}
    if sql == "current":
        cols = ", ".join(episode_ranges.VALIDITY_COLUMNS)
        out[VALIDITY] = _rows(con, f"(SELECT {cols} FROM _chain_validity)")
        if accelerate and written:  # the rows the range views read, not the view's SQL
            con.register("_written", pa.concat_tables(written))
            out[VALIDITY] = _rows(con, "_written")
    con.close()
    return out


TABLES = {
    "S2-tight": lambda: synthesize(SynthConfig(requests=120, seed=11, arrival_rate=1.6,
                                               pool_units=160, contexts=3)),
    "D0": lambda: synthesize(SynthConfig(requests=60, seed=5, arrival_rate=1.0, **D0_SYNTH)),
    "regressed1": lambda: regressed(events_to_table(_random_events(1, S2), S2), 1),
}


# the default suite is near its time budget: two cases by default, the others slow
_SLOW = pytest.mark.slow


@pytest.mark.parametrize("name,parts", [
    ("S2-tight", 3), ("regressed1", 3),
    pytest.param("S2-tight", 1, marks=_SLOW), pytest.param("D0", 2, marks=_SLOW)])
def test_bounded_rows_equal_the_sql(name, parts, tmp_path):
    table = TABLES[name]()
    want = parquet_answers(table, tmp_path, accelerate=False)
    used: set[str] = set()
    got = parquet_answers(table, tmp_path, accelerate=True, parts=parts, used=used)
    assert used == ALL_BOUNDED, "the bounded path stepped aside"
    assert want["_chain_validity"], "the trace should have chain positions"
    for view in COMPARED + (VALIDITY,):
        assert got[view] == want[view], f"{view}: bounded and SQL rows differ"
    assert list((tmp_path / "spill").glob("lineage-parts-*")) == [], "scratch files left"


@pytest.mark.slow
def test_bounded_rows_equal_the_reference_sql(tmp_path):
    table = TABLES["S2-tight"]()
    ref = parquet_answers(table, tmp_path, accelerate=False, sql="reference")
    got = parquet_answers(table, tmp_path, accelerate=True, parts=4)
    for view in PUBLIC:
        assert got[view] == ref[view], f"{view}: bounded and reference SQL differ"


@pytest.mark.slow
def test_bounded_rows_equal_the_sql_in_small_inserts(tmp_path, monkeypatch):
    """The TEMP tables filled by many inserts (Batched flushing every 50 rows)."""
    table = TABLES["regressed1"]()
    want = parquet_answers(table, tmp_path, accelerate=False)
    monkeypatch.setattr(materialize, "INSERT_ROWS", 50)
    got = parquet_answers(table, tmp_path, accelerate=True, parts=3)
    for view in COMPARED + (VALIDITY,):
        assert got[view] == want[view], f"{view}: bounded and SQL rows differ"


def test_a_lost_partition_changes_the_rows(tmp_path, monkeypatch):
    """Negative control: the last key partition's chain positions skipped."""
    table = TABLES["S2-tight"]()
    want = parquet_answers(table, tmp_path, accelerate=False)
    monkeypatch.setattr(bounded, "_FAULT_DROP_LAST_PART", True)
    bad = parquet_answers(table, tmp_path, accelerate=True, parts=3)
    assert bad[VALIDITY] != want[VALIDITY]
    assert bad["episode_lineage"] != want["episode_lineage"]


def test_rest_supply_of_a_lost_partition_changes_the_rows(tmp_path, monkeypatch):
    """Negative control: _chain_rest reads only the gathered supply rows of the unsettled
    positions' entries; without the last key partition's, its rows and the window flips read
    from them change, while the _chain_validity view (its SQL over the whole _supply) does not.
    (No public view of this small trace moves: every one is compared equal above.)"""
    table = TABLES["S2-tight"]()
    want = parquet_answers(table, tmp_path, accelerate=False)
    monkeypatch.setattr(bounded, "_FAULT_REST_LAST_PART", True)
    bad = parquet_answers(table, tmp_path, accelerate=True, parts=3)
    assert bad["_chain_validity"] == want["_chain_validity"]
    assert bad[VALIDITY] != want[VALIDITY]
    assert bad["_window_flips"] != want["_window_flips"]
    assert bad["_boundary_transitions"] != want["_boundary_transitions"]


@pytest.mark.parametrize("rest_rows", [True, False], ids=["from-rest-rows", "numbered-again"])
def test_depth_changes_from_the_gathered_supply(rest_rows, tmp_path, monkeypatch):
    """depth_changes and loss_causes read only the supply rows gathered at the window flips'
    seqs (D0: the small traces above have no J change), taken from the unsettled entries' rows
    or numbered again from the part files; negative control (the latter): those rows numbered
    without the other rows of their entries (sup_no and is_flip then wrong) change both."""
    table = TABLES["D0"]()
    want = parquet_answers(table, tmp_path, accelerate=False)
    monkeypatch.setattr(gathered_supply, "_TRY_REST_ROWS", rest_rows)
    sources = []
    real = bounded.Bounded._depth_changes

    def spy(self, con, stmts):
        done = real(self, con, stmts)
        sources.append(self.seq_source)
        return done

    monkeypatch.setattr(bounded.Bounded, "_depth_changes", spy)
    used: set[str] = set()
    got = parquet_answers(table, tmp_path, accelerate=True, parts=2, used=used)
    assert used == ALL_BOUNDED
    assert sources == ["rest rows" if rest_rows else "numbered again"]
    assert want["depth_changes"], "the trace should move some episode's J"
    for view in ("depth_changes", "loss_causes", "episode_lineage", VALIDITY):
        assert got[view] == want[view], f"{view}: bounded and SQL rows differ"
    if rest_rows:
        return
    monkeypatch.setattr(gathered_supply, "_FAULT_SEQ_SUPPLY_ALONE", True)
    bad = parquet_answers(table, tmp_path, accelerate=True, parts=2)
    assert bad[VALIDITY] == want[VALIDITY]
    assert bad["depth_changes"] != want["depth_changes"]
    assert bad["loss_causes"] != want["loss_causes"]


def test_a_lost_episode_range_changes_the_rows(tmp_path, monkeypatch):
    """Negative control: the last episode range skipped by _episode_depths and _boundaries."""
    table = TABLES["S2-tight"]()
    want = parquet_answers(table, tmp_path, accelerate=False)
    monkeypatch.setattr(episode_ranges, "_FAULT_DROP_LAST_RANGE", True)
    bad = parquet_answers(table, tmp_path, accelerate=True, parts=3)
    assert bad[VALIDITY] == want[VALIDITY]
    assert bad["_episode_depths"] != want["_episode_depths"]
    assert bad["_boundaries"] != want["_boundaries"]
    assert bad["episode_lineage"] != want["episode_lineage"]


def test_boundaries_chain_lengths_from_the_range_files(tmp_path, monkeypatch):
    """_boundaries reads _entries' ep and len(chain) from the entries range files (a chain of
    NULL keys as long as the episode's; equal rows above). Negative control: each chain one key
    shorter changes _boundaries, and nothing before it."""
    _fault_changes_boundaries_alone(TABLES["S2-tight"](), tmp_path, monkeypatch,
                                    "_FAULT_CHAIN_LENGTH")


def _fault_changes_boundaries_alone(table, tmp_path, monkeypatch, fault: str) -> None:
    """With ``episode_ranges.<fault>`` set, the bounded path's _boundaries differs from the
    SQL path's, and the views before it do not."""
    want = parquet_answers(table, tmp_path, accelerate=False)
    monkeypatch.setattr(episode_ranges, fault, True)
    bad = parquet_answers(table, tmp_path, accelerate=True, parts=3)
    assert bad[VALIDITY] == want[VALIDITY]
    assert bad["_window_flips"] == want["_window_flips"]
    assert bad["_boundaries"] != want["_boundaries"]


def test_boundaries_sql_aside_binds_the_run_grids(tmp_path, monkeypatch):
    """_boundaries' SQL runs range by range in a separate in-memory connection (equal rows
    above) with the run's _params copied into it, into a table of the view's own column types.
    Negative control: the attention grid doubled there changes _boundaries, and nothing
    before it."""
    table = TABLES["S2-tight"]()
    path = tmp_path / "types.parquet"
    pq.write_table(table, path)
    types = {}
    for acc in (False, True):
        con = views.connect_parquet([str(path)], database=str(tmp_path / f"t{acc}.duckdb"),
                                    memory_limit="1GB", temp_directory=str(tmp_path / "spill"),
                                    threads=1, accelerate=acc, bounded_parts=3)
        types[acc] = con.execute("DESCRIBE _boundaries").fetchall()
        con.close()
    assert types[True] == types[False]
    _fault_changes_boundaries_alone(table, tmp_path, monkeypatch, "_FAULT_ASIDE_GRID")


def _kinds(table: pa.Table, tmp: Path) -> dict[str, str]:
    path = tmp / "kinds.parquet"
    pq.write_table(table, path)
    db = tmp / "kinds.duckdb"
    db.unlink(missing_ok=True)
    con = views.connect_parquet([str(path)], database=str(db), memory_limit="1GB",
                                temp_directory=str(tmp / "spill"), threads=1, accelerate=True,
                                bounded_parts=3)
    kinds = dict(con.execute("SELECT table_name, table_type FROM information_schema.tables "
                             "WHERE table_name IN ('_supply', 'run_summary', "
                             "'_supply__empty')").fetchall())
    con.close()
    return kinds


@pytest.mark.parametrize("name", ["S2-tight", "regressed1"])
def test_supply_kind_follows_the_step_regressions(name, tmp_path, monkeypatch):
    """_supply stays its SQL view where no step regresses (S2-tight) and is a TEMP table where
    one does (regressed1: table_checks then reads it whole); equal rows both ways (above).
    The TEMP table on S2-tight (``_FAULT_SUPPLY_TABLE``) gives the same rows too."""
    kind = "VIEW" if name == "S2-tight" else "LOCAL TEMPORARY"
    assert _kinds(TABLES[name](), tmp_path) == {"_supply": kind,
                                                "run_summary": "LOCAL TEMPORARY"}
    if name == "S2-tight":
        table = TABLES[name]()
        want = parquet_answers(table, tmp_path, accelerate=False)
        monkeypatch.setattr(bounded, "_FAULT_SUPPLY_TABLE", True)
        assert _kinds(table, tmp_path)["_supply"] == "LOCAL TEMPORARY"
        got = parquet_answers(table, tmp_path, accelerate=True, parts=3)
        assert [v for v in COMPARED if got[v] != want[v]] == []


def test_supply_stays_its_view_and_run_summary_counts_come_from_the_loop(tmp_path,
                                                                          monkeypatch):
    """_supply is not copied into a TEMP table on the bounded path where no step regresses (no
    view reads it whole then): it stays its SQL view, and run_summary, its one whole reader
    besides table_checks, gets its publication and loss counts from the _supply loop (equal
    rows above, where _supply's rows are its SQL's).
    Negative control: one publication too many changes run_summary, and nothing else."""
    table = TABLES["S2-tight"]()
    assert _kinds(table, tmp_path) == {"_supply": "VIEW", "run_summary": "LOCAL TEMPORARY"}
    want = parquet_answers(table, tmp_path, accelerate=False)
    monkeypatch.setattr(bounded, "_FAULT_SUPPLY_COUNTS", True)
    bad = parquet_answers(table, tmp_path, accelerate=True, parts=3)
    assert bad["run_summary"] != want["run_summary"]
    assert [v for v in COMPARED if bad[v] != want[v]] == ["run_summary"]


@pytest.mark.parametrize("name", ["S2-tight", "regressed1"])
def test_table_checks_without_supply_rows_where_no_step_regresses(name, tmp_path, monkeypatch):
    """table_checks is materialized at the end over no supply rows where the _supply_rows
    stream showed no step regressing (S2-tight), left to its SQL over the whole _supply where
    one does (regressed1); equal rows both ways.
    Negative control: the check answering "none" on regressed1 changes table_checks."""
    table = TABLES[name]()
    want = parquet_answers(table, tmp_path, accelerate=False)
    finished: list[bool] = []
    real = bounded.Bounded.finish

    def spy(self, con):
        done = real(self, con)
        finished.append(done)
        return done

    monkeypatch.setattr(bounded.Bounded, "finish", spy)
    got = parquet_answers(table, tmp_path, accelerate=True, parts=3)
    regressions = want["table_checks"][0][-1]
    assert (regressions == 0) == (name == "S2-tight")
    assert finished == [regressions == 0]
    assert got["table_checks"] == want["table_checks"]
    if regressions:
        monkeypatch.setattr(supply_steps, "_FAULT_NEVER_REGRESSES", True)
        bad = parquet_answers(table, tmp_path, accelerate=True, parts=3)
        assert bad["table_checks"] != want["table_checks"]


def test_finish_is_reported_to_on_view(tmp_path):
    """create_views reports the end-of-run table_checks to ``on_view`` (the benchmark's
    per-view timing) after every view."""
    path = tmp_path / "events.parquet"
    pq.write_table(TABLES["S2-tight"](), path)
    seen: list[str] = []
    con = views.connect_parquet([str(path)], database=str(tmp_path / "db.duckdb"),
                                memory_limit="1GB", temp_directory=str(tmp_path / "spill"),
                                threads=1, accelerate=True, bounded_parts=3,
                                on_view=seen.append)
    assert seen[-1] == bounded.FINISH_NAME and seen.count("table_checks") == 1
    ((kind,),) = con.execute("SELECT table_type FROM information_schema.tables "
                             "WHERE table_name = 'table_checks'").fetchall()
    assert kind == "LOCAL TEMPORARY"
    con.close()


def test_step_bounds_regress_as_the_sql_counts():
    """supply_steps.StepBounds over random (step, seq) rows split in parts: regresses() is
    whether table_checks.sql's count over them is positive (that SQL run in DuckDB)."""
    import duckdb
    import numpy as np

    rng = np.random.default_rng(5)
    con = duckdb.connect()
    sql = views.load_sql("table_checks")
    start = sql.index("step_bounds AS (")
    q = ("WITH " + sql[start:sql.index("SELECT\n    s.events")]
         + "SELECT n FROM regressions")
    seen = set()
    for _ in range(60):
        n = int(rng.integers(1, 40))
        seq = rng.permutation(n * 2)[:n]
        step = np.sort(rng.integers(-1, 8, n))[np.argsort(np.argsort(seq))]
        if rng.random() < 0.5:  # some inversions
            i, j = rng.integers(0, n, 2)
            step[i], step[j] = step[j], step[i]
        rows = pa.table({"step": pa.array(step), "seq": pa.array(seq)})
        con.register("_supply", rows)
        ((count,),) = con.execute(q).fetchall()
        b = supply_steps.StepBounds()
        for part in np.array_split(np.arange(n), 3):
            b.add(rows.take(pa.array(part)))
        assert b.regresses() == (count > 0)
        seen.add(count > 0)
    assert seen == {True, False}
    big = supply_steps.StepBounds()  # a seq past int32: not known (table_checks' SQL runs)
    big.add(pa.table({"step": pa.array([0, 1]), "seq": pa.array([1, 2**40])}))
    assert big.regresses() is None


@pytest.mark.slow
def test_depths_step_aside_to_the_whole_sql(tmp_path, monkeypatch):
    """Where the NumPy depths step aside, the view's SQL computes _episode_depths whole (over
    the _chain_validity view): the same rows."""
    table = TABLES["regressed1"]()
    want = parquet_answers(table, tmp_path, accelerate=False)
    monkeypatch.setattr(episode_ranges, "episode_depths", lambda *a: None)
    monkeypatch.setattr(bounded, "episode_depths", lambda *a: None)
    used: set[str] = set()
    got = parquet_answers(table, tmp_path, accelerate=True, parts=3, used=used)
    assert "_episode_depths" not in used and "_boundaries" in used
    for view in COMPARED:
        assert got[view] == want[view], f"{view}: bounded and SQL rows differ"


def _with_entry_tie(table: pa.Table) -> pa.Table:
    """A second waiting-entry row of one episode at the same (least) seq, with another chain."""
    kinds = table.column("kind").to_pylist()
    i = kinds.index("waiting_entry")
    twin = table.slice(i, 1)
    chain = twin.column("chain").to_pylist()[0]
    twin = twin.set_column(twin.column_names.index("chain"), "chain",
                           pa.array([list(reversed(chain)) + [7]], twin.schema.field("chain").type))
    return pa.concat_tables([table, twin])


def test_entries_step_aside_for_a_tie_at_the_least_seq(tmp_path):
    """Two waiting-entry rows of one episode at its least seq: the join would give two rows,
    so the view's SQL computes _entries (the bounded views after it still run)."""
    table = _with_entry_tie(TABLES["regressed1"]())
    used: set[str] = set()
    got = parquet_answers(table, tmp_path, accelerate=True, parts=3, used=used)
    assert "_entries" not in used
    assert set(bounded.NAMES) <= used
    con = views.connect(table)
    ((n,),) = con.execute("SELECT count(*) FROM _entries").fetchall()
    assert len(got["_entries"]) == n


def test_entries_from_the_last_row_change_the_rows(tmp_path, monkeypatch):
    """Negative control: the chains joined from each episode's last waiting-entry row."""
    table = pa.concat_tables([TABLES["regressed1"](), _later_entry(TABLES["regressed1"]())])
    want = parquet_answers(table, tmp_path, accelerate=False)
    monkeypatch.setattr(bounded_entries, "_FAULT_LAST_ROW", True)
    bad = parquet_answers(table, tmp_path, accelerate=True, parts=3)
    assert bad["_entries"] != want["_entries"]


def _later_entry(table: pa.Table) -> pa.Table:
    """A later waiting-entry row (another chain) of the first episode."""
    kinds = table.column("kind").to_pylist()
    i = kinds.index("waiting_entry")
    twin = table.slice(i, 1)
    last = max(table.column("seq").to_pylist())
    twin = twin.set_column(twin.column_names.index("seq"), "seq",
                           pa.array([last + 1], twin.schema.field("seq").type))
    twin = twin.set_column(twin.column_names.index("chain"), "chain",
                           pa.array([[7, 8, 9]], twin.schema.field("chain").type))
    return twin


def _with_null_hash(table: pa.Table) -> pa.Table:
    kinds = table.column("kind").to_pylist()
    hashes = table.column("hash").to_pylist()
    hashes[kinds.index("publication")] = None
    return table.set_column(table.column_names.index("hash"), "hash",
                            pa.array(hashes, table.schema.field("hash").type))


@pytest.mark.parametrize("make", [lambda: _with_null_hash(TABLES["S2-tight"]()),
                                  pytest.param(repeated_seq_table, marks=_SLOW)],
                         ids=["null-hash", "repeated-seq"])
def test_bounded_steps_aside_where_the_window_order_differs(make, tmp_path):
    """A NULL hash (the window keeps every NULL-hash row as one entry, across key partitions)
    or two rows of one entry at one seq: the SQL computes the three views, same rows."""
    table = make()
    want = parquet_answers(table, tmp_path, accelerate=False)
    used: set[str] = set()
    got = parquet_answers(table, tmp_path, accelerate=True, parts=3, used=used)
    assert used == set(bounded.ENTRY_NAMES)
    assert got == want
    assert list((tmp_path / "spill").glob("lineage-parts-*")) == []


@pytest.mark.slow
def test_bounded_rows_equal_the_sql_on_a_larger_run(tmp_path):
    """~150k events in 16 key partitions (each a few thousand supply rows)."""
    table = synthesize(SynthConfig(requests=3000, seed=7, arrival_rate=1.6, pool_units=400,
                                   contexts=6))
    want = parquet_answers(table, tmp_path, accelerate=False)
    used: set[str] = set()
    got = parquet_answers(table, tmp_path, accelerate=True, parts=16, used=used)
    assert used == ALL_BOUNDED
    for view in COMPARED:
        assert got[view] == want[view], f"{view}: bounded and SQL rows differ"


def test_seq_set_is_numpy_isin():
    """gathered_supply.SeqSet (one bit per seq) answers as np.isin, negative seqs and the
    range's ends included; negative control: the set shifted by one seq answers differently."""
    import numpy as np

    rng = np.random.default_rng(1)
    for _ in range(100):
        seqs = np.unique(rng.integers(-50, 1000, rng.integers(1, 50)))
        probe = np.concatenate([rng.integers(-100, 1100, 500), seqs, seqs - 1, seqs + 1])
        assert (gathered_supply.SeqSet(seqs).mask(probe) == np.isin(probe, seqs)).all()
        assert (gathered_supply.SeqSet(seqs + 1).mask(probe) != np.isin(probe, seqs)).any()
