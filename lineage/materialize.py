"""How ``create_views`` puts a materialized view's rows in place: computed by a Python function
(:data:`lineage.views.ACCELERATED`) and scanned as Arrow or copied into a TEMP table, or by the
view's SQL into a TEMP table key partition by key partition, a scratch view it reads computed per
partition first. The view keeps its name; its ``COMMENT ON`` lines are applied again. Rows built
piece by piece (lineage/bounded.py) go into TEMP tables through :class:`Batched`.
"""

from __future__ import annotations

from collections.abc import Callable

import duckdb
import pyarrow as pa

from lineage.entry_order import small_pages

Accelerator = Callable[[duckdb.DuckDBPyConnection, dict[str, pa.Table]], pa.Table | None]


def accelerated(con: duckdb.DuckDBPyConnection, fast: Accelerator | None, split: int,
                arrow_rows: dict[str, pa.Table]) -> pa.Table | None:
    """The rows of every key partition by ``fast`` (None: not applicable, run the SQL)."""
    if fast is None:
        return None
    done = []
    with small_pages():
        for part in range(split):
            if part:
                con.execute("UPDATE _params SET part = ?", [part])
            rows = fast(con, arrow_rows)
            if rows is None:
                return None
            done.append(rows)
    return pa.concat_tables(done)


def keep_rows(con: duckdb.DuckDBPyConnection, name: str, stmts: list, rows: pa.Table,
              in_place: bool) -> None:
    """Put Python-computed rows under the view's name: scanned in place (the connection holds
    the Arrow table until it closes) or copied into a TEMP table."""
    if in_place:
        con.register(f"{name}__arrow", rows)
        con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM {name}__arrow")
        for st in stmts[1:]:
            con.execute(st.query)
        return
    con.register("_accelerated_rows", rows)
    con.execute(f"CREATE TEMP TABLE {name}__rows AS SELECT * FROM _accelerated_rows")
    con.unregister("_accelerated_rows")
    swap(con, name, stmts)


def swap(con: duckdb.DuckDBPyConnection, name: str, stmts: list) -> None:
    con.execute(f"DROP VIEW {name}")
    con.execute(f"ALTER TABLE {name}__rows RENAME TO {name}")
    for st in stmts[1:]:
        if not st.query.lstrip().upper().startswith("COMMENT ON VIEW"):
            con.execute(st.query)


def materialize_sql(con: duckdb.DuckDBPyConnection, name: str, stmts: list, split: int,
                    scratch: str | None) -> None:
    """The view's rows by its SQL into a TEMP table (held in memory and spilled to the temp
    directory past the memory limit, never written into an on-disk database), key partition by
    key partition; with ``scratch``, that view's rows of each partition are first put in a
    TEMP table under its name (its SQL renamed ``<scratch>__sql`` meanwhile)."""
    if scratch is not None:
        con.execute(f"ALTER VIEW {scratch} RENAME TO {scratch}__sql")
    for part in range(split):
        if split > 1:
            con.execute("UPDATE _params SET part = ?", [part])
        if scratch is not None:
            con.execute(f"CREATE OR REPLACE TEMP TABLE {scratch} AS "
                        f"SELECT * FROM {scratch}__sql")
        verb = f"CREATE TEMP TABLE {name}__rows AS" if part == 0 else f"INSERT INTO {name}__rows"
        con.execute(f"{verb} SELECT * FROM {name}")
    if scratch is not None:
        con.execute(f"DROP TABLE {scratch}")
    swap(con, name, stmts)


# rows per insert into a TEMP table (Batched), at least
INSERT_ROWS = 1 << 18


def insert_rows(con: duckdb.DuckDBPyConnection, table: str, rows: pa.Table, first: bool
                ) -> None:
    """Create TEMP table ``table`` from ``rows`` (``first``) or append them to it."""
    con.register("_bounded_rows", rows)
    verb = f"CREATE TEMP TABLE {table} AS" if first else f"INSERT INTO {table}"
    con.execute(f"{verb} SELECT * FROM _bounded_rows")
    con.unregister("_bounded_rows")


class Batched:
    """Rows appended to a TEMP table ``table`` at least :data:`INSERT_ROWS` at a time: DuckDB's
    insert from Arrow costs ~3x per row in batches below its row group (122,880 rows) as in
    larger ones (14 BIGINT columns: 475 ns a row in 90k-row inserts, 144-180 in 262k-1M;
    the history of benchmarks/RESULTS.md)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, table: str) -> None:
        self.con, self.table, self.rows = con, table, INSERT_ROWS
        self.pending: list[pa.Table] = []
        self.count = 0
        self.created = False

    def add(self, rows: pa.Table) -> None:
        self.pending.append(rows)
        self.count += rows.num_rows
        if self.count >= self.rows:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            insert_rows(self.con, self.table, pa.concat_tables(self.pending), not self.created)
            self.created = True
        self.pending, self.count = [], 0

    def drop(self) -> None:
        """Forget the pending rows and drop the table if it was created."""
        self.pending, self.count = [], 0
        if self.created:
            self.con.execute(f"DROP TABLE {self.table}")
            self.created = False
