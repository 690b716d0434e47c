"""The per-episode views over ``_chain_validity`` computed episode range by episode range, for
event tables larger than memory (``views.connect_parquet(accelerate=True)``, with
lineage/bounded.py): no step scans the whole (spilled) ``_chain_validity`` or ``_entries``.
The range files keep the ``_chain_validity`` columns these views read (VALIDITY_COLUMNS).

    probe loop, key partition k:  validity rows --split by episode range--> validity_NNNN.arrow
    _entries stream (once):       entry_keys    --split by episode range--> entries_NNNN.arrow
    after _chain_rest:            its rows (~1% of positions) split alike, and kept whole

    _episode_depths   per range r: episode_depths(validity rows of r, entry keys of r) in
                      NumPy (rows appended; where it steps aside, the view's SQL, whole)
    _window_flips     once: its SQL with _chain_validity := _chain_rest's rows
    _boundaries       per range r holding a moved episode: its SQL with _chain_validity,
                      _entries and _window_flips := the moved episodes' rows of r (_entries:
                      ep and a chain of as many NULL keys as theirs, from the range files;
                      the SQL reads len(e.chain) alone), in a separate in-memory connection
                      (by_range_aside: its inputs and _params are all Arrow)

Episode ``ep`` (1-based, dense) lies in range ``(ep - 1) // size``. Each of these views reads
``_chain_validity`` and ``_entries`` only through rows of one episode (``GROUP BY ep``, joins
on ``ep``), so the ranges give the rows of the whole. ``_window_flips`` keeps only positions with
``supply_before_adopt > supply_before_entry``; a settled position has ``supply_before_adopt =
supply_before_entry`` (or NULL: no window), so ``_chain_rest``'s rows hold every one it keeps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lineage.entry_order import as_numpy, valid_mask
from lineage.materialize import Batched, swap
from lineage.part_files import PartWriter

# tests set this to check that a lost episode range changes the answer (negative control): the
# last range is then skipped by _episode_depths and _boundaries
_FAULT_DROP_LAST_RANGE = False

# tests set this to check that a wrong chain length changes _boundaries (negative control):
# each chain is then one key shorter
_FAULT_CHAIN_LENGTH = False

# tests set this to check that the grids the side connection binds matter (negative control):
# by_range_aside then binds the attention grid twice the run's
_FAULT_ASIDE_GRID = False

# the _chain_validity columns _episode_depths and _boundaries read, kept in the range files
VALIDITY_COLUMNS = ["ep", "is_rec", "pos", "end_tokens", "has_window", "valid_entry",
                    "valid_exact", "valid_m0", "valid_m1"]

Source = Callable[[int | None], pa.Table]


class EpisodeRanges:
    """``n_episodes`` episodes in at most ``ranges`` ranges; their files under ``directory``."""

    def __init__(self, directory: Path, n_episodes: int, ranges: int) -> None:
        self.size = max(1, -(-n_episodes // max(1, ranges)))
        self.count = max(1, -(-n_episodes // self.size))
        self.entries = PartWriter(directory, "entries", self.count)
        self.validity = PartWriter(directory, "validity", self.count)
        self.rest: pa.Table | None = None  # _chain_rest's rows, whole

    def index(self, ep: pa.ChunkedArray | pa.Array | np.ndarray) -> np.ndarray:
        """The range of each episode id (uint64, as ``PartWriter.write`` takes it)."""
        e = ep if isinstance(ep, np.ndarray) else as_numpy(ep, np.int64)
        return np.clip((e - 1) // self.size, 0, self.count - 1).astype(np.uint64)

    def write_validity(self, rows: pa.Table) -> None:
        """Append ``_chain_validity`` rows (its columns the range views read)."""
        rows = rows.select(VALIDITY_COLUMNS)
        if self.validity.schema is not None:
            rows = rows.cast(self.validity.schema)
        self.validity.write(rows, self.index(rows["ep"]))

    def rows(self, writer: PartWriter) -> Source:
        """Range ``r``'s rows of ``writer`` (an empty table for None or a range without)."""
        def get(r: int | None) -> pa.Table:
            got = writer.read(r) if r is not None else None
            if got is not None:
                return got
            assert writer.schema is not None
            return writer.schema.empty_table()
        return get

    def by_episode(self, rows: pa.Table) -> Source:
        """Range ``r``'s rows of ``rows`` (held whole, sorted by ep once)."""
        ep = as_numpy(rows["ep"], np.int64)
        order = np.argsort(ep, kind="stable")
        rows, ep = rows.take(pa.array(order)), ep[order]

        def get(r: int | None) -> pa.Table:
            if r is None:
                return rows.slice(0, 0)
            lo, hi = np.searchsorted(ep, [r * self.size + 1, (r + 1) * self.size + 1])
            return rows.slice(int(lo), int(hi - lo))
        return get

    def ranges(self, wanted: Iterable[int] | None = None) -> list[int]:
        out = list(range(self.count)) if wanted is None else sorted(set(wanted))
        if _FAULT_DROP_LAST_RANGE:
            out = [r for r in out if r != self.count - 1]
        return out


def only_episodes(rows: Source, eps: pa.ChunkedArray) -> Source:
    """``rows`` restricted to the episodes ``eps`` (a lookup table by ep: a hash set of every
    moved episode built per range grew with ranges x episodes)."""
    ep = as_numpy(eps, np.int64)
    member = np.zeros(int(ep.max()) + 2 if len(ep) else 1, bool)
    member[ep] = True

    def get(r: int | None) -> pa.Table:
        t = rows(r)
        e = np.minimum(as_numpy(t["ep"], np.int64), len(member) - 1)
        return t.filter(pa.array(member[np.maximum(e, 0)] & (e >= 0)))
    return get


def by_range(con: duckdb.DuckDBPyConnection, name: str, stmts: list,
             inputs: dict[str, Source], ranges: list[int]) -> None:
    """Materialize view ``name`` as a TEMP table of its SQL's rows over each range, the tables
    ``inputs`` names standing for range ``r``'s rows meanwhile (renamed ``<input>__all``)."""
    for src in inputs:
        con.execute(f"ALTER TABLE {src} RENAME TO {src}__all")
    try:
        first = True
        passes: list[int | None] = list(ranges) or [None]  # none: empty inputs, the columns
        for r in passes:
            for src, get in inputs.items():
                con.register(src, get(r))
            verb = f"CREATE TEMP TABLE {name}__rows AS" if first else f"INSERT INTO {name}__rows"
            con.execute(f"{verb} SELECT * FROM {name}")
            first = False
            for src in inputs:
                con.unregister(src)
    finally:
        for src in inputs:
            con.execute(f"ALTER TABLE {src}__all RENAME TO {src}")
    swap(con, name, stmts)


def by_range_aside(con: duckdb.DuckDBPyConnection, name: str, stmts: list,
                   inputs: dict[str, Source], ranges: list[int]) -> None:
    """As :func:`by_range`, for a view whose SQL reads only ``inputs`` and ``_params``: the SQL
    runs in a separate in-memory DuckDB connection (``_params`` copied into it) and its rows
    are appended to the TEMP table. At 100M events the main connection, holding the earlier
    views' TEMP tables (near its memory limit; a lower limit alone at 30M did not do it), made
    each range's joins and window 3.6x dearer than the same SQL over the same Arrow rows in a
    fresh connection (``_boundaries``: the history of benchmarks/RESULTS.md); the
    result, a few rows per moved episode, is all that crosses."""
    side = duckdb.connect()
    try:
        ((threads,),) = con.execute("SELECT current_setting('threads')").fetchall()
        side.execute("SET threads = ?", [int(threads)])
        params = con.sql("SELECT * FROM _params").to_arrow_table()
        if _FAULT_ASIDE_GRID:
            params = params.set_column(
                params.schema.get_field_index("attention_grid_tokens"), "attention_grid_tokens",
                pc.multiply(params["attention_grid_tokens"], 2))
        side.register("_params", params)
        out = Batched(con, f"{name}__rows")
        passes: list[int | None] = list(ranges) or [None]  # none: empty inputs, the columns
        for r in passes:
            for src, get in inputs.items():
                side.register(src, get(r))
            if not out.created:
                side.execute(stmts[0].query)  # the view itself, over the names registered
                # its own column types (an Arrow round trip may not give them back: HUGEINT
                # comes out as a decimal)
                cols = side.execute(f"DESCRIBE SELECT * FROM {name}").fetchall()
                con.execute(f"CREATE TEMP TABLE {name}__rows ("
                            + ", ".join(f'"{c[0]}" {c[1]}' for c in cols) + ")")
                out.created = True
            out.add(side.sql(f"SELECT * FROM {name}").to_arrow_table())
            for src in inputs:
                side.unregister(src)
        out.flush()
    finally:
        side.close()
    swap(con, name, stmts)


_CUTS = ("entry", "exact", "m0", "m1")
_DEPTH_COLS = ("ep", "attention_prefix_entry", "a_max_entry", "r_max_entry", "j_enter",
               "a_max_exact", "r_max_exact", "j_lookup_exact", "a_max_m0", "r_max_m0",
               "j_lookup_m0", "a_max_m1", "r_max_m1", "j_lookup_m1")
_NONE = np.int64(-1)  # "no row": end_tokens and pos are >= 0


def entry_keys(entries: pa.Table) -> pa.Table:
    """The ``_entries`` columns :func:`episode_depths` and ``_boundaries`` read (the chains'
    lengths, not the chains)."""
    return pa.table({
        "ep": entries["ep"], "has_window": entries["has_window"],
        "adopt_step": entries["adopt_step"],
        "recurrent_keys": pc.cast(pc.list_value_length(entries["recurrent_chain"]), pa.int64()),
        "attention_keys": pc.cast(pc.list_value_length(entries["chain"]), pa.int64())})


def chain_lengths(rows: Source) -> Source:
    """``_boundaries``' ``_entries`` rows from the range files: ``ep`` and a ``chain`` of
    ``attention_keys`` NULL keys (its SQL reads ``len(e.chain)`` alone), so that no step
    fetches the chains from the spilled ``_entries``."""
    def get(r: int | None) -> pa.Table:
        t = rows(r)
        n = as_numpy(t["attention_keys"], np.int64)
        if _FAULT_CHAIN_LENGTH:
            n = np.maximum(n - 1, 0)
        return pa.table({"ep": t["ep"], "chain": null_lists(n)})
    return get


def null_lists(lengths: np.ndarray) -> pa.ListArray:
    """Lists of ``lengths[i]`` NULL keys (``UBIGINT[]``)."""
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] >= 2**31:
        raise ValueError(f"{int(offsets[-1])} chain keys in one episode range")
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)),
                                    pa.nulls(int(offsets[-1]), pa.uint64()))


def episode_depths(cv: pa.Table, ent: pa.Table, ga: int, gr: int) -> pa.Table | None:
    """``_episode_depths``' rows (lineage/sql/_episode_depths.sql) for the entries ``ent``
    (:func:`entry_keys` of ``_entries`` rows) from their ``_chain_validity`` rows ``cv``
    (:data:`VALIDITY_COLUMNS`), in NumPy: the view's
    aggregates per episode are ``ufunc.at`` reductions into one slot per entry.

        att  n_cut  = min(pos) of the attention rows with valid_cut false, else their count
        rec  r_cut  = max(end_tokens) with valid_cut;  j_cut: and end_tokens <= n_cut * ga
        a_max_cut   = min(n_cut * ga // gr, recurrent keys) * gr        (NULL: no such cut)

    None where a row's episode is not among ``ent`` (the view's inner join would drop it)."""
    e_ep = as_numpy(ent["ep"], np.int64)
    n = len(e_ep)
    if n == 0:
        return pa.table({c: pa.array([], pa.int64()) for c in _DEPTH_COLS})
    lo = int(e_ep.min())
    slot = np.full(int(e_ep.max()) - lo + 1, -1, np.int64)
    slot[e_ep - lo] = np.arange(n)
    c_ep = as_numpy(cv["ep"], np.int64) - lo
    if len(c_ep) and (c_ep.min() < 0 or c_ep.max() >= len(slot)):
        return None
    idx = slot[c_ep]
    if np.any(idx < 0):
        return None
    is_rec = as_numpy(cv["is_rec"], bool)
    pos = as_numpy(cv["pos"], np.int64)
    end = as_numpy(cv["end_tokens"], np.int64)
    att, rec = ~is_rec, is_rec
    count = np.bincount(idx[att], minlength=n).astype(np.int64)
    win = as_numpy(ent["has_window"], bool, 0)
    step = as_numpy(ent["adopt_step"], np.int64, -1)
    has = {"entry": np.ones(n, bool), "exact": win,
           "m0": win & valid_mask(ent["adopt_step"]) & (step >= 0)}
    has["m1"] = has["m0"]
    keys = as_numpy(ent["recurrent_keys"], np.int64)
    out: dict[str, pa.Array] = {"ep": pa.array(e_ep)}
    for cut in _CUTS:
        col = cv["valid_" + cut]
        val = as_numpy(col, bool, 0)
        ok = valid_mask(col)
        bad = att & ok & ~val  # NOT valid_cut is true
        first_bad = np.full(n, np.iinfo(np.int64).max)
        np.minimum.at(first_bad, idx[bad], pos[bad])
        attn = np.where(first_bad < np.iinfo(np.int64).max, first_bad, count) * ga
        good = rec & ok & val
        r_max = np.full(n, _NONE)
        np.maximum.at(r_max, idx[good], end[good])
        good &= end <= attn[idx]
        j_max = np.full(n, _NONE)
        np.maximum.at(j_max, idx[good], end[good])
        a_max = np.minimum(attn // gr, keys) * gr
        mask = ~has[cut]
        r_max[r_max == _NONE] = 0
        j_max[j_max == _NONE] = 0
        if cut == "entry":
            out["attention_prefix_entry"] = pa.array(attn)
        prefix = "" if cut == "entry" else "lookup_"
        out["a_max_" + cut] = pa.array(a_max, pa.int64(), mask=mask)
        out["r_max_" + cut] = pa.array(r_max, pa.int64(), mask=mask)
        out["j_enter" if cut == "entry" else "j_" + prefix + cut] = pa.array(
            j_max, pa.int64(), mask=mask)
    return pa.table({c: out[c] for c in _DEPTH_COLS})
