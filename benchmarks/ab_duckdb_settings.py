"""The lineage report's SQL with and without ``preserve_insertion_order`` (interleaved rounds,
CPU and wall seconds of building every view with the heavy ones materialized and reading
``episode_lineage``)::

    PYTHONPATH=. python benchmarks/ab_duckdb_settings.py RUN.parquet [--rounds 2]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import duckdb
import pyarrow.parquet as pq

from lineage import views
from lineage.table import table_meta


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path")
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    table = pq.read_table(a.path)
    meta = table_meta(table, a.path)
    real_settings: Callable[..., None] = views._settings

    def run(preserve: bool) -> tuple[float, float]:
        def settings(con: duckdb.DuckDBPyConnection, **kw: Any) -> None:
            real_settings(con, **kw)
            con.execute(f"SET preserve_insertion_order = {str(preserve).lower()}")

        views._settings = settings
        try:
            c0, w0 = time.process_time(), time.perf_counter()
            con = views.connect(table, meta, materialize=True)
            con.sql("SELECT * FROM episode_lineage").to_arrow_table()
            con.close()
            return time.perf_counter() - w0, time.process_time() - c0
        finally:
            views._settings = real_settings

    for r in range(a.rounds):
        for preserve in (True, False):
            wall, cpu = run(preserve)
            print(f"round {r + 1} preserve_insertion_order={str(preserve).lower():5s} "
                  f"wall {wall:6.2f} s  cpu {cpu:6.2f} s", flush=True)


if __name__ == "__main__":
    main()
