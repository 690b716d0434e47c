"""``lineage.supply.supply_rows`` (the NumPy sort behind the materialized ``_supply``) gives
exactly the rows of the view's SQL (its window), on the traces of test_probe, on the exact
dense-id path too; it steps aside where the window's order is arbitrary. Negative control: the
same rows with one entry's numbering off by one differ, and a report built on them differs."""

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from lineage import entry_order, supply, views

from .helpers import repeated_seq_table
from .test_probe import TABLES, _sorted


def sql_and_fast(table: pa.Table) -> tuple[list[tuple], list[tuple] | None]:
    con = views.connect(table, materialize=True, threads=1, accelerate=False)
    want = _sorted(con.sql("SELECT * FROM _supply").fetchall())
    rows = supply.supply_rows(con)
    if rows is None:
        con.close()
        return want, None
    con.register("_fast", rows)
    got = _sorted(con.sql("SELECT * FROM _fast").fetchall())
    con.close()
    return want, got


@pytest.mark.parametrize("name", TABLES)
def test_supply_rows_equal_the_sql(name):
    want, got = sql_and_fast(TABLES[name]())
    assert got is not None, "the NumPy numbering stepped aside"
    assert want
    assert got == want


def test_dense_id_path(monkeypatch):
    monkeypatch.setattr(entry_order, "_TRY_TOP_BITS", False)
    want, got = sql_and_fast(TABLES["S2-tight"]())
    assert got == want


def test_numbering_fault_changes_rows_and_report(monkeypatch):
    """Negative control: sup_no shifted by one for the rows of one entry differs from the SQL,
    and the public views computed from it differ from the accelerated report's."""
    table = TABLES["S2"]()
    want, got = sql_and_fast(table)
    assert got == want
    real = supply.supply_rows

    def faulty(con, done=None):
        rows = real(con, done)
        assert rows is not None
        first = rows["hash"][0]
        bump = pc.if_else(pc.equal(rows["hash"], first), pc.add(rows["sup_no"], 1),
                          rows["sup_no"])
        return rows.set_column(rows.column_names.index("sup_no"), "sup_no", bump)

    def lineage(tbl):
        con = views.connect(tbl, materialize=True, threads=1)
        out = _sorted(con.sql("SELECT * FROM _supply").fetchall())
        dc = _sorted(con.sql("SELECT * FROM _window_flips").fetchall())
        con.close()
        return out, dc

    good_rows, good_flips = lineage(table)
    assert good_rows == want
    monkeypatch.setitem(views.ACCELERATED, "_supply", faulty)
    bad_rows, bad_flips = lineage(table)
    assert bad_rows != want
    assert bad_flips != good_flips


def test_repeated_seq_of_one_entry_steps_aside():
    _, got = sql_and_fast(repeated_seq_table())
    assert got is None
