"""Several runs in one DuckDB connection, for ``lineage query RUN1 RUN2 ... --sql``.

Each run's views are computed on its own connection (the grids are bound per run), then every
view the statement names, and ``events`` when it names it, is gathered into one table of the
same name whose first two columns say where each row came from::

    run           the path as given on the command line
    organization  the run's organization (S0, S1, S2, D0, vllm, ...)
    ...           the view's own columns

so ``SELECT organization, avg(j_adopt) FROM episode_lineage GROUP BY organization`` compares
organizations in one statement. The gathered views are tables (their rows held in memory), not
views over the runs: a statement over many large runs needs the memory of their views.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import duckdb
import pyarrow as pa

from lineage.source import Run
from lineage.views import EVENTS, connect, mentioned

SOURCE_COLUMNS = ("run", "organization")


def named_tables(sql: str) -> list[str]:
    """The public and private views ``sql`` names, and ``events`` if it names it."""
    names = sorted(mentioned(sql))
    if re.search(rf"\b{EVENTS}\b", sql, flags=re.IGNORECASE):
        names.append(EVENTS)
    return names


def gather(runs: Sequence[Run], sql: str) -> dict[str, pa.Table]:
    """``{name: rows of every run}`` of each table the statement names, with the source
    columns first (:data:`SOURCE_COLUMNS`)."""
    names = named_tables(sql)
    parts: dict[str, list[pa.Table]] = {n: [] for n in names}
    for run in runs:
        con = connect(run.table, run.meta, source=run.path, only=mentioned(sql),
                      materialize=True)
        try:
            for name in names:
                # identifiers come from our own SQL file names (checked by the view loader)
                t = con.sql(f"SELECT ? AS run, ? AS organization, * FROM {name}",
                            params=[run.path, run.meta.organization]).to_arrow_table()
                parts[name].append(t)
        finally:
            con.close()
    return {n: pa.concat_tables(ts, promote_options="default") for n, ts in parts.items()}


def connect_runs(runs: Sequence[Run], sql: str) -> duckdb.DuckDBPyConnection:
    """A fresh connection holding :func:`gather`'s tables under their view names."""
    tables = gather(runs, sql)
    con = duckdb.connect()
    con.execute("SET preserve_insertion_order = true")
    for name, table in tables.items():
        con.register(f"_{name}_arrow", table)
        con.execute(f"CREATE TABLE {name} AS SELECT * FROM _{name}_arrow")
        con.unregister(f"_{name}_arrow")
    return con
