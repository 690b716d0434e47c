"""``lineage query`` is read-only: one statement, no file access from SQL
unless --allow-files, a statement timeout, and never a write over its input."""

import pyarrow.parquet as pq
import pytest

from hybridmem.cli.main import main
from lineage.table import events_to_table

from .helpers import S2, adopt, enter, pub

EVENTS = [pub(1, 1), pub(2, 1, rec=True), enter("a", 2, [1], [2]), adopt("a", 4, 0)]


@pytest.fixture()
def table(tmp_path):
    path = tmp_path / "run.parquet"
    pq.write_table(events_to_table(EVENTS, S2), path)
    return path


def q(capsys, *argv):
    code = main(["lineage", "query", *map(str, argv)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_select_runs_and_streams_rows(table, capsys):
    code, out, err = q(capsys, table, "--sql", "SELECT range AS i FROM range(25000)")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "i" and len(lines) == 25001 and lines[-1] == "24999"


@pytest.mark.parametrize("sql", [
    "COPY (SELECT 1) TO '{dir}/x.csv'", "INSTALL httpfs", "LOAD httpfs",
    "ATTACH '{dir}/x.db'", "CREATE TABLE t AS SELECT 1", "DROP VIEW episode_lineage",
    "SET enable_external_access = true", "PRAGMA version", "SELECT 1; SELECT 2",
])
def test_refused_statements(table, capsys, sql):
    code, _, err = q(capsys, table, "--sql", sql.format(dir=table.parent))
    assert code == 2 and ("not allowed" in err or "exactly one statement" in err), err
    assert not (table.parent / "x.csv").exists() and not (table.parent / "x.db").exists()


def test_no_file_access_from_sql_unless_allowed(table, capsys, tmp_path):
    csv = tmp_path / "other.csv"
    csv.write_text("a\n1\n")
    code, _, err = q(capsys, table, "--sql", f"SELECT * FROM read_csv('{csv}')")
    assert code == 2 and ("external access" in err.lower() or "disabled" in err.lower()), err
    # negative control: the same statement with --allow-files reads the file
    code, out, err = q(capsys, table, "--allow-files", "--sql", f"SELECT * FROM read_csv('{csv}')")
    assert code == 0 and out.splitlines() == ["a", "1"], err


def test_copy_with_allow_files_never_over_the_input(table, capsys, tmp_path):
    before = table.read_bytes()
    code, _, err = q(capsys, table, "--allow-files", "--sql",
                     f"COPY (SELECT 1 AS x) TO '{table}' (FORMAT csv)")
    assert code == 2 and "overwrite the input" in err
    assert table.read_bytes() == before
    out_csv = tmp_path / "out.csv"  # negative control: another target is written
    code, _, err = q(capsys, table, "--allow-files", "--sql",
                     f"COPY (SELECT 1 AS x) TO '{out_csv}' (FORMAT csv)")
    assert code == 0 and out_csv.read_text().splitlines() == ["x", "1"], err


def test_statement_timeout(table, capsys):
    code, _, err = q(capsys, table, "--timeout", "0.3", "--sql",
                     "SELECT count(*) FROM range(100000000000) a")
    assert code == 2 and "timeout" in err, err


def _timers():
    import threading

    return [t for t in threading.enumerate() if isinstance(t, threading.Timer)]


@pytest.mark.parametrize("consume", ["all", "none"])
def test_the_statement_timer_is_joined_when_the_rows_are_done(table, consume):
    """The timer's function holds the connection: a timer thread still ending at interpreter
    exit dropped the last reference there and DuckDB's destructor aborted the process (exit
    134, ~3 runs in 10 of ``lineage query ... --sql "select 1"``). Read to the end, or closed
    unread, no timer thread is left."""
    import pyarrow.parquet as pq

    from lineage.query import run_query
    from lineage.views import connect

    before = set(_timers())
    con = connect(pq.read_table(table), only=frozenset())
    result = run_query(con, "SELECT range FROM range(3)", timeout_s=60)
    # negative control: while the rows are open the timer runs, so the check below can see it
    assert set(_timers()) - before
    if consume == "all":
        assert [r[0] for r in result.rows] == [0, 1, 2]
    result.close()
    assert not set(_timers()) - before  # joined, not only cancelled
    con.close()


def test_query_creates_only_the_views_it_names(table, capsys):
    from lineage.views import creation_order, mentioned

    assert mentioned("SELECT 1") == frozenset()
    assert mentioned("select * FROM Episode_Lineage e, run_summary") == \
        {"episode_lineage", "run_summary"}
    named = creation_order("current", frozenset({"class_counts"}))
    assert "class_counts" in named and "episode_lineage" in named  # what it reads
    assert "run_summary" not in named and "_params" in named
    code, out, err = q(capsys, table, "--sql", "SELECT count(*) AS n FROM duckdb_views() "
                       "WHERE NOT internal AND view_name NOT IN ('events', '_events_arrow')")
    assert (code, out.split()) == (0, ["n", "0"]), err
    # (the private views read only ``events``: planning a public view costs seconds)
    code, out, err = q(capsys, table, "--sql", "SELECT count(*) AS n FROM _ADOPTIONS")
    assert (code, out.split()) == (0, ["n", "1"]), err
    # negative control: a view named only through a computed string is not created
    code, _, err = q(capsys, table, "--sql", "SELECT * FROM query_table('_adopt' || 'ions')")
    assert code == 2 and "_adoptions" in err, err
