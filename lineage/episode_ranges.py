"""The per-episode views over ``_chain_validity`` computed episode range by episode range, for
event tables larger than memory (``views.connect_parquet(accelerate=True)``, with
lineage/bounded.py): no step scans the whole (spilled) ``_chain_validity`` or ``_entries``.

    probe loop, key partition k:  validity rows --split by episode range--> validity_NNNN.arrow
    _entries stream (once):       entry rows    --split by episode range--> entries_NNNN.arrow
    after _chain_rest:            its rows (~1% of positions) split alike, and kept whole

    _chain_validity   TEMP table filled range by range from the files (ordered by ep)
    _episode_depths   per range r: its SQL with _chain_validity := validity rows of r,
                                   _entries := entry rows of r            (rows appended)
    _window_flips     once: its SQL with _chain_validity := _chain_rest's rows
    _boundaries       per range r holding a moved episode, as _episode_depths

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

from lineage.entry_order import as_numpy
from lineage.materialize import swap
from lineage.part_files import PartWriter

# tests set this to check that a lost episode range changes the answer (negative control): the
# last range is then skipped by _episode_depths and _boundaries
_FAULT_DROP_LAST_RANGE = False

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

    def ranges(self, wanted: Iterable[int] | None = None) -> list[int]:
        out = list(range(self.count)) if wanted is None else sorted(set(wanted))
        if _FAULT_DROP_LAST_RANGE:
            out = [r for r in out if r != self.count - 1]
        return out


def by_range(con: duckdb.DuckDBPyConnection, name: str, stmts: list,
             inputs: dict[str, Source], ranges: list[int]) -> None:
    """Materialize view ``name`` as a TEMP table of its SQL's rows over each range, the tables
    ``inputs`` names standing for range ``r``'s rows meanwhile (renamed ``<input>__all``)."""
    for src in inputs:
        con.execute(f"ALTER TABLE {src} RENAME TO {src}__all")
    try:
        first = True
        for r in ranges or [None]:  # no range: one pass over empty inputs gives the columns
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
