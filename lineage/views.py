"""The thin DuckDB harness: register an event table, bind the run's grids, create the lineage
views from ``lineage/sql/*.sql`` in dependency order.

Each ``.sql`` file holds one view (or, for ``_params``, the one parameter table) named like the
file, its ``COMMENT ON`` lines documenting every column; names starting with ``_`` are private
building blocks. The only values that vary per run (the two grids) are bound parameters of
``_params.sql``; no SQL text is ever formatted.

    con = views.connect(table)            # pyarrow.Table with hybridmem.meta
    con.sql("SELECT * FROM episode_lineage").arrow()
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import duckdb
import pyarrow as pa

from lineage.bounded import EXTRA_NAMES, FINISH_NAME, Bounded
from lineage.materialize import Accelerator, accelerated, keep_rows, materialize_sql
from lineage.probe import chain_validity_rows, probe_rows
from lineage.sql_files import (
    PARAMS,
    SQL_DIR,
    SQL_SETS,
    creation_order,
    load_sql,
    mentioned,
    public_views,
    sql_names,
)
from lineage.supply import supply_rows
from lineage.table import LINEAGE_COLUMNS, RunMeta, check_columns, table_meta
from tracer.schema import arrow_schema

__all__ = ["EVENTS", "PARAMS", "SQL_DIR", "SQL_SETS", "connect", "connect_parquet",
           "create_views", "creation_order", "describe_views", "load_sql", "mentioned",
           "public_views",
           "sql_names"]

EVENTS = "events"
# The bound per-request table of shared prefixes measured on token ids (lineage/sql/
# _token_prefix.sql): three parallel lists, request ids, tokens, the earlier request.
TOKEN_PREFIX = "_token_prefix"
TokenPrefix = tuple[list[str], list[int], list[str]]
NO_TOKEN_PREFIX: TokenPrefix = ([], [], [])

# Views that several later views read: computed once into tables by ``connect(materialize=)``.
# DuckDB inlines views, so without this every reader recomputes the ASOF joins below it.
HEAVY_SETS = {
    "current": ("_adoptions", "_entries", "_supply", "_supply_ordered", "_chain_probe",
                "_chain_validity",
                "_episode_depths", "_window_flips", "_boundaries", "_boundary_transitions",
                "depth_changes", "episode_lineage"),
    "reference": ("_adoptions", "_entries", "_flips", "_step_supply", "_chain_validity",
                  "_episode_depths", "_boundaries", "_window_flips", "_boundary_transitions",
                  "depth_changes", "episode_lineage"),
}
HEAVY = HEAVY_SETS["current"]

# Materialized views computed key partition by key partition when ``parts > 1``
# (``_params.parts`` / ``part``; see lineage/sql/_chain_validity.sql), and how many events one
# partition should hold when ``connect_parquet`` chooses: past ~10M events (~6 GB of DuckDB
# memory) the ASOF join of ``_chain_validity`` spills and its CPU per event triples.
PARTITIONED_SETS: dict[str, tuple[str, ...]] = {"current": ("_chain_probe", "_chain_validity"),
                                                "reference": ()}
PART_EVENTS = 10_000_000
# Events per key partition of the bounded NumPy materializations (connect_parquet(accelerate=)):
# each partition's sort and gathers then stay within a few tens of MB (over 10M events, 8
# partitions took 0.6x the CPU of 2 in the probe's sort and gathers; benchmarks/RESULTS.md).
BOUNDED_PART_EVENTS = 1_000_000

# Materialized views computed by their SQL only per key partition of the one view that reads
# them (scratch -> reader): never held whole. When a Python function computes the scratch view
# instead, it is kept whole and its reader computed in one piece.
SCRATCH_SETS: dict[str, dict[str, str]] = {"current": {"_chain_probe": "_chain_validity"},
                                           "reference": {}}

# Materialized views whose rows a Python function can compute faster than DuckDB runs their SQL
# (it returns the rows of the partition in ``_params``, or None to run the SQL after all; it is
# given the Arrow rows of the views computed so far this way, by name). The SQL file stays the
# definition: ad-hoc connections run it, and tests compare both.
ACCELERATED: dict[str, Accelerator] = {
    "_supply": supply_rows,
    "_chain_probe": probe_rows,
    "_chain_validity": chain_validity_rows,
}
# Accelerated views whose Arrow rows DuckDB scans in place; the others are copied into a TEMP
# table, which the views reading them many times scan faster.
SCAN_IN_PLACE = {"_supply", "_chain_probe"}

_IDENT = re.compile(r"^[a-z_][a-z0-9_]*$")


def create_views(con: duckdb.DuckDBPyConnection, meta: RunMeta,
                 materialize: tuple[str, ...] = (), sql: str = "current",
                 on_view: Callable[[str], None] | None = None, parts: int = 1,
                 accelerate: bool = True, bounded: Bounded | None = None,
                 only: frozenset[str] | None = None,
                 token_prefix: TokenPrefix = NO_TOKEN_PREFIX) -> None:
    """Bind the grids into ``_params`` and create every view (the table ``events`` must exist;
    ``only``: just those views and what they read, see :func:`creation_order`).

    Names in ``materialize`` become tables holding the view's rows, swapped in under the same
    name once computed; the views after them then read the table. Their column comments are
    kept (``COMMENT ON COLUMN`` applies to tables too); the view comment is dropped.
    ``on_view(name)`` is called after each one is created (the per-view timing uses it).
    With ``parts > 1`` the materialized views of :data:`PARTITIONED_SETS` are computed one key
    partition at a time (the rows of each appended), which bounds their memory; the rows are
    the same. With ``accelerate`` the materialized views of :data:`ACCELERATED` (current set
    only) are computed by their Python function where it applies; the rows are the same.
    ``bounded`` (current set only; instead of ``accelerate``) computes ``_entries`` without
    the chains in its aggregate, ``_supply``, ``_chain_probe`` and ``_chain_validity`` in NumPy
    key partition by key partition, and ``_episode_depths``, ``_window_flips`` and
    ``_boundaries`` episode range by episode range (lineage/bounded.py,
    lineage/episode_ranges.py; ``_supply`` and ``_chain_validity`` then stay their SQL
    views, no later view reading them whole: run_summary gets its two supply counts from the
    ``_supply`` loop); at the end it may materialize views left to their SQL
    (``Bounded.finish``: table_checks) and is closed (its scratch files removed).
    """
    if bounded is not None and sql != "current":
        raise ValueError("bounded materializations need the current SQL set")
    try:
        _create_views(con, meta, materialize, sql, on_view, parts,
                      accelerate and bounded is None, bounded, only, token_prefix)
        if bounded is not None and bounded.finish(con) and on_view is not None:
            on_view(FINISH_NAME)
    finally:
        if bounded is not None:
            bounded.close()


def _create_views(con: duckdb.DuckDBPyConnection, meta: RunMeta, materialize: tuple[str, ...],
                  sql: str, on_view: Callable[[str], None] | None, parts: int,
                  accelerate: bool, bounded: Bounded | None,
                  only: frozenset[str] | None,
                  token_prefix: TokenPrefix = NO_TOKEN_PREFIX) -> None:
    if not 1 <= parts <= 4096:
        raise ValueError(f"parts must be 1..4096, got {parts}")
    if parts > 1 and not set(PARTITIONED_SETS[sql]) <= set(materialize):
        raise ValueError("parts > 1 needs the partitioned views materialized "
                         f"({PARTITIONED_SETS[sql]})")
    arrow_rows: dict[str, pa.Table] = {}
    deferred: dict[str, str] = {}  # reader -> its scratch view, renamed <scratch>__sql
    for name in creation_order(sql, only):
        stmts = con.extract_statements(load_sql(name, sql))
        for i, st in enumerate(stmts):
            if name == PARAMS and i == 0:
                con.execute(st.query, [meta.attention_grid_tokens, meta.recurrent_grid_tokens])
            elif name == TOKEN_PREFIX and i == 0:
                con.execute(st.query, list(token_prefix))
            elif name in materialize and i > 0:
                continue  # comments are applied after the swap below
            else:
                con.execute(st.query)
        if name in materialize:
            # identifiers cannot be bound; these come from our own file names, checked here
            assert _IDENT.match(name), f"SQL file name {name!r} is not a plain identifier"
            if bounded is not None and bounded.materialize(con, name, stmts):
                if on_view is not None:
                    on_view(name)
                continue
            scratch = deferred.pop(name, None)  # a scratch view this one reads, deferred
            split = parts if name in PARTITIONED_SETS[sql] else 1
            if name in SCRATCH_SETS[sql].values() and scratch is None:
                split = 1  # its scratch was computed in Python, whole
            if split > 1:
                con.execute("UPDATE _params SET parts = ?, part = 0", [split])
            fast = ACCELERATED.get(name) if accelerate and sql == "current" else None
            rows = accelerated(con, fast, split, arrow_rows)
            if rows is not None:
                arrow_rows[name] = rows
                keep_rows(con, name, stmts, rows, in_place=name in SCAN_IN_PLACE)
            elif name in SCRATCH_SETS[sql]:
                # computed per key partition of its reader instead (below), never whole
                deferred[SCRATCH_SETS[sql][name]] = name
                for st in stmts[1:]:
                    con.execute(st.query)
            else:
                materialize_sql(con, name, stmts, split, scratch)
            if scratch is not None:  # the scratch view is its SQL again
                con.execute(f"ALTER VIEW {scratch}__sql RENAME TO {scratch}")
            if split > 1:
                con.execute("UPDATE _params SET parts = 1, part = 0")
        if on_view is not None:
            on_view(name)


def _settings(con: duckdb.DuckDBPyConnection, *, materialize: bool, threads: int | None,
              memory_limit: str | None, temp_directory: str | None) -> None:
    # The cardinality of the chain side is often estimated far too low; DuckDB then turns an
    # ASOF join into a nested loop over every (entry, history) pair (minutes instead of ms).
    con.execute("SET asof_loop_join_threshold = 0")
    if threads is not None:
        con.execute("SET threads = ?", [threads])
    if memory_limit is not None:  # e.g. "6GB"; DuckDB spills to disk beyond it
        con.execute("SET memory_limit = ?", [memory_limit])
    if temp_directory is not None:  # where it spills
        con.execute("SET temp_directory = ?", [temp_directory])
    if materialize:
        # Tables built here are read by key, never in insertion order (every view that needs an
        # order says ORDER BY / OVER (ORDER BY ...)): dropping the guarantee lets DuckDB build
        # them in parallel without re-sorting (~20-30% less CPU over 1M events). Ad-hoc
        # connections (``lineage query``) keep the default.
        con.execute("SET preserve_insertion_order = false")


# Below this many events a materialized report runs DuckDB on one thread. Its hash
# aggregations have ~1 group per 10 events, so with more threads each builds a partial table of
# nearly every group and the merge repeats the work: over 1M events one thread costs ~0.7x the
# CPU of two (``_episode_depths`` 0.45 -> 0.18 CPU-s), at ~1.2x the wall time on an idle 2-core
# box and the same wall time on a busy one (benchmarks/RESULTS.md). Larger tables keep DuckDB's
# default (one thread per core).
SINGLE_THREAD_EVENTS = 4_000_000


def connect(table: pa.Table, meta: RunMeta | None = None, *, source: str = "table",
            copy: bool | None = None, materialize: bool = False, threads: int | None = None,
            memory_limit: str | None = None, sql: str = "current",
            on_view: Callable[[str], None] | None = None,
            parts: int = 1, accelerate: bool = True, only: frozenset[str] | None = None,
            token_prefix: TokenPrefix = NO_TOKEN_PREFIX) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with ``events`` and every lineage view. ``table`` needs
    the :data:`lineage.table.LINEAGE_COLUMNS` (``events`` holds whatever columns it has).

    ``copy=True`` loads the Arrow table into a DuckDB table once; ``copy=False`` registers it
    as a zero-copy Arrow scan (the table must outlive the connection; DuckDB keeps a reference).
    The default copies for ad-hoc connections (a query may scan ``events`` many times) and
    scans for ``materialize``: the heavy views read ``events`` four times, each only the columns
    and rows it needs, which over 1M events costs ~0.05 CPU-s against ~0.5 for the full copy
    (strings and hash chains included). ``materialize`` computes the :data:`HEAVY` views once
    into tables (for reports that read several views, and for ``lineage query`` with
    ``only``: planning a public view over the nested SQL costs seconds even on a tiny
    table). ``threads`` defaults, when materializing, to 1 for tables of at most
    :data:`SINGLE_THREAD_EVENTS` rows, else to DuckDB's default. ``meta`` defaults to the
    table's own ``hybridmem.meta``. ``sql`` names the SQL set (:data:`SQL_SETS`); ``on_view``
    see :func:`create_views` (it is also called with ``events`` once the table is loaded), and
    ``parts``, ``accelerate`` and ``only`` too. ``token_prefix`` binds ``_token_prefix``
    (shared prefixes measured on prompt token ids; by default none, and ``_shared_prefix``
    measures them on the hash chains).
    """
    sql_names(sql)  # an unknown set is a ValueError before any work
    check_columns(table, source, LINEAGE_COLUMNS)
    meta = meta if meta is not None else table_meta(table, source)
    if copy is None:
        copy = not materialize
    if threads is None and materialize and table.num_rows <= SINGLE_THREAD_EVENTS:
        threads = 1
    con = duckdb.connect()
    _settings(con, materialize=materialize, threads=threads, memory_limit=memory_limit,
              temp_directory=None)
    con.register("_events_arrow", table)
    if copy:
        con.execute(f"CREATE TABLE {EVENTS} AS SELECT * FROM _events_arrow")
        con.unregister("_events_arrow")
    else:
        con.execute(f"CREATE VIEW {EVENTS} AS SELECT * FROM _events_arrow")
    if on_view is not None:
        on_view(EVENTS)
    create_views(con, meta, HEAVY_SETS[sql] if materialize else (), sql, on_view, parts,
                 accelerate, only=only, token_prefix=token_prefix)
    return con


def connect_parquet(paths: list[str], meta: RunMeta | None = None, *, database: str,
                    memory_limit: str, temp_directory: str, materialize: bool = True,
                    threads: int | None = None, sql: str = "current",
                    on_view: Callable[[str], None] | None = None, parts: int | None = None,
                    accelerate: bool = False, bounded_parts: int | None = None
                    ) -> duckdb.DuckDBPyConnection:
    """Like :func:`connect`, for event tables larger than memory: the Parquet files in
    ``paths`` (one run, e.g. written tile by tile) are read by DuckDB itself (never into
    Python), under ``memory_limit``, spilling to ``temp_directory``. Every file must carry the
    event columns; ``events`` is a view of their :data:`lineage.table.LINEAGE_COLUMNS` (the
    ones the views read) over the files. The materialized views are TEMP tables (memory,
    spilling to ``temp_directory``); the database file ``database`` holds only the views.
    ``meta`` defaults to the first file's ``hybridmem.meta``; ``on_view`` as in
    :func:`connect`; ``parts`` (see :func:`create_views`) defaults to one key partition per
    :data:`PART_EVENTS` events (from the files' footers). ``accelerate`` computes ``_supply``,
    ``_chain_probe`` and ``_chain_validity`` in NumPy key partition by key partition and the
    per-episode views after them episode range by episode range (lineage/bounded.py: scratch
    files in ``temp_directory``, the rows in TEMP tables), in ``bounded_parts`` partitions and
    as many ranges (default one per :data:`BOUNDED_PART_EVENTS` events).
    """
    import pyarrow.parquet as pq

    sql_names(sql)  # an unknown set is a ValueError before any work
    if not paths:
        raise ValueError("connect_parquet needs at least one Parquet file")
    rows = 0
    for path in paths:
        empty = pq.read_schema(path).empty_table()
        check_columns(empty, path)
        if meta is None:
            meta = table_meta(empty, path)
        rows += pq.read_metadata(path).num_rows
    assert meta is not None
    if parts is None:
        parts = max(1, -(-rows // PART_EVENTS)) if materialize else 1
    con = duckdb.connect(database)
    _settings(con, materialize=materialize, threads=threads, memory_limit=memory_limit,
              temp_directory=temp_directory)
    # ``events`` is a view over the files: each of the four scans decodes only its columns,
    # and nothing is copied or spilled (over 10M events 0.8x the CPU of loading them into
    # ``database`` first, 33 against 41 CPU-s)
    con.read_parquet(paths).select(", ".join(LINEAGE_COLUMNS)).create_view(EVENTS)
    if on_view is not None:
        on_view(EVENTS)
    bounded = None
    if accelerate and materialize and sql == "current":
        bounded = Bounded(max(1, -(-rows // BOUNDED_PART_EVENTS)) if bounded_parts is None
                          else bounded_parts, temp_directory)
    heavy = HEAVY_SETS[sql] if materialize else ()
    if bounded is not None:  # views it computes from rows gathered on the way (else their SQL)
        heavy += EXTRA_NAMES
    create_views(con, meta, heavy, sql, on_view, parts, accelerate=False, bounded=bounded)
    return con


@dataclass(frozen=True, slots=True)
class ColumnDoc:
    name: str
    type: str
    comment: str


@dataclass(frozen=True, slots=True)
class ViewDoc:
    name: str
    comment: str
    columns: tuple[ColumnDoc, ...]


def describe_views(include_private: bool = False) -> list[ViewDoc]:
    """Every view's comment and column comments, read back from DuckDB's catalog after creating
    the views over an empty event table (so this also proves that the SQL binds)."""
    empty = arrow_schema().empty_table()
    meta = RunMeta("none", 512, 512, {})
    con = connect(empty, meta)
    views = con.execute(
        "SELECT view_name, coalesce(comment, '') FROM duckdb_views() WHERE NOT internal"
    ).fetchall()
    out = []
    for vname, vcomment in sorted(views, key=lambda v: creation_order().index(v[0])):
        if vname.startswith("_") and not include_private:
            continue
        cols = con.execute(
            "SELECT column_name, data_type, coalesce(comment, '') FROM duckdb_columns() "
            "WHERE table_name = ? ORDER BY column_index", [vname]).fetchall()
        out.append(ViewDoc(vname, vcomment, tuple(ColumnDoc(*c) for c in cols)))
    con.close()
    return out
