"""The NumPy materializations of ``_supply``, ``_chain_probe`` and ``_chain_validity`` for event
tables larger than memory (``views.connect_parquet(accelerate=True)``): partition-local, each
key partition's rows written into scratch files or TEMP tables (DuckDB's memory limit,
spilling), never held whole in Python; then the per-episode views over ``_chain_validity``
episode range by episode range (lineage/episode_ranges.py), and the views that read a few supply
rows by their SQL over those rows only. ``_supply`` and ``_chain_validity`` themselves stay
their SQL views (for ad-hoc queries): no view on this path reads either whole.

    _supply_rows --stream--> split by hash % parts --> supply part files (Arrow IPC, temp dir)
                      +--> each step's first and last seq (table_checks: lineage/supply_steps.py)
    per part k:  supply file k --number_supply--> _supply_ordered's fact, loss_causes' counts
                     per (cause, is_rec), run_summary's publication and loss counts
                 (_supply itself stays its SQL view: no view on this path reads it whole)
    at the end:  table_checks by its SQL over no supply rows where no step regresses (finish())
    _entries ----stream--> chain positions flattened once, split alike --> chain part files
                      +--> entry rows split by episode range --> entries range files
    per part k:  supply file k + chain file k --probe_table-->
                     settled positions   --> validity range files (split by episode range)
                     unsettled positions --> _chain_probe (a small TEMP table, ~1%)
                     every supply row of their entries, numbered --> _chain_rest__supply
    once:        SELECT * FROM _chain_rest (its SQL, _chain_rest__supply standing for _supply)
                     --> validity range files, and kept whole
    _chain_validity stays its SQL view (no later view reads it whole)
    _episode_depths, _window_flips, _boundaries: lineage/episode_ranges.py (_window_flips with
                     _chain_rest__supply standing for _supply; _boundaries' SQL in a separate
                     in-memory connection, range by range)
    depth_changes: its SQL over the supply rows at _window_flips' seqs (_depth_changes__supply:
                     from _chain_rest__supply when the supply files hold no others there)
    loss_causes:   the counts, and depth_changes' loss seqs among those rows
    run_summary:   its SQL with no supply rows, then the two counts (its only read of _supply)

"Standing for": ``_supply`` (the view) is renamed ``_supply__all`` and the small table (or
``_supply__empty``, no rows) takes its name
while the view's SQL runs (the gathering: lineage/gathered_supply.py). Every row of the three
key-partitioned views depends on one entry's (``(is_rec, hash)``) rows only, so the key
partitions give the rows of the whole. Python holds one stream batch while splitting and one
partition or range while computing, plus the entries' fixed columns (about 50 bytes per
episode). A NULL hash among the supply rows (the window keeps all of them as one entry), or
anything the NumPy functions step aside for, falls back to the SQL for the view and every later
one.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lineage.bounded_entries import materialize_entries
from lineage.entry_order import as_numpy, small_pages
from lineage.episode_ranges import (
    EpisodeRanges,
    Source,
    by_range,
    by_range_aside,
    chain_lengths,
    entry_keys,
    episode_depths,
    only_episodes,
)
from lineage.gathered_supply import (
    EMPTY_TABLE,
    REST_TABLE,
    SEQ_TABLE,
    gather_seq_supply,
    in_step_order,
    loss_causes_rows,
    loss_counts,
    rest_supply,
    sum_losses,
    supply_standing,
)
from lineage.materialize import Batched, insert_rows, swap
from lineage.part_files import PartWriter
from lineage.probe import EntryArrays, chain_positions, entry_arrays, probe_table, validity_columns
from lineage.sql_files import load_sql
from lineage.supply import number_supply
from lineage.supply_steps import StepBounds

NAMES = ("_supply", "_chain_probe", "_chain_validity")
# one-row facts about the whole _supply, gathered in its partition loop
FACT_NAMES = ("_supply_ordered",)
# computed by their SQL over the supply rows they read, gathered from the supply part files
GATHERED_NAMES = ("depth_changes", "loss_causes", "run_summary")
# of them, the ones views.HEAVY does not materialize: connect_parquet adds them on this path
EXTRA_NAMES = ("loss_causes", "run_summary")
# materialized by finish() after every view, by its SQL with no supply rows, where the
# _supply_rows stream showed no step regressing (the on_view name create_views gives it then)
FINISH_NAME = "table_checks (no supply rows)"
# computed before them by their own SQL without the chains in the aggregate (bounded_entries.py)
ENTRY_NAMES = ("_entries",)
# computed episode range by episode range after them (lineage/episode_ranges.py)
RANGE_NAMES = ("_episode_depths", "_window_flips", "_boundaries")
# rows per stream batch while splitting (supply rows; episodes for the chains)
BATCH_ROWS = 1 << 20
BATCH_EPISODES = 1 << 17
# the probe's supply columns
_SUP_COLS = ["is_rec", "hash", "seq", "step", "is_pub", "request_id"]
_ENT_COLS = ["ep", "request_id", "entry_seq", "has_window", "adopt_seq", "adopt_step"]
_CHAIN_TYPES = {"row": np.int64, "is_rec": bool, "pos": np.int64, "hash": np.uint64,
                "reach": bool}

# tests set this to check that a lost partition changes the answer (negative control): the
# last key partition's chain positions are then skipped
_FAULT_DROP_LAST_PART = False
# likewise: run_summary's publication count (from the _supply loop) one too many
_FAULT_SUPPLY_COUNTS = False
# tests set this to run the TEMP table _supply (kept where a step regresses) on a trace whose
# steps do not regress
_FAULT_SUPPLY_TABLE = False
# likewise: the last key partition's unsettled entries' supply rows are not gathered for
# _chain_rest
_FAULT_REST_LAST_PART = False


class Bounded:
    """The three views computed key partition by key partition (``parts``), scratch files under
    ``temp_directory``. ``create_views`` calls :meth:`materialize` at each materialized view and
    :meth:`close` at the end."""

    def __init__(self, parts: int, temp_directory: str) -> None:
        if not 1 <= parts <= 4096:
            raise ValueError(f"parts must be 1..4096, got {parts}")
        self.parts = parts
        Path(temp_directory).mkdir(parents=True, exist_ok=True)
        self.directory = Path(tempfile.mkdtemp(prefix="lineage-parts-", dir=temp_directory))
        self._supply: PartWriter | None = None
        self._probed = False
        self._ranges: EpisodeRanges | None = None
        self._validity_done = False
        self._ordered: bool | None = None
        self._rest_supply = False
        self._seq_supply: bool | None = None  # None: not gathered
        self._losses: pa.Table | None = None  # loss_causes' counts per (cause, is_rec)
        self._supply_counts: tuple[int, int] | None = None  # publication rows, loss rows
        self.supply_kind = "VIEW"  # _supply after _supply_rows: its view, or a TEMP table
        self._regresses: bool | None = None  # some supply step regresses (None: not known)
        self.checks_without_supply = False  # finish() materialized table_checks (tests read it)
        self.seq_source = ""  # where depth_changes' supply rows came from (tests read it)

    def materialize(self, con: duckdb.DuckDBPyConnection, name: str, stmts: list) -> bool:
        """Put the view's rows in place (True), or leave it to the SQL (False)."""
        with small_pages():
            if name == "_entries":
                return materialize_entries(con, stmts)
            if name == "_supply":
                return self._supply_rows(con, stmts)
            if name == "_supply_ordered":
                return self._supply_ordered(con, stmts)
            if name == "_chain_probe":
                return self._probe(con, stmts)
            if name == "_chain_validity":
                return self._validity(con, stmts)
            if name in RANGE_NAMES:
                return self._by_range(con, name, stmts)
            if name == "depth_changes":
                return self._depth_changes(con, stmts)
            if name == "loss_causes":
                return self._loss_causes(con, stmts)
            if name == "run_summary":
                return self._run_summary(con, stmts)
        return False

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

    def _split(self, con: duckdb.DuckDBPyConnection, query: str, stem: str, batch: int,
               steps: StepBounds) -> PartWriter | None:
        out = PartWriter(self.directory, stem, self.parts)
        reader = con.sql(query).to_arrow_reader(batch)
        try:
            for b in reader:
                if b.column("hash").null_count:
                    return None
                steps.add(b)
                part = as_numpy(b.column("hash"), np.uint64) % np.uint64(self.parts)
                out.write(pa.Table.from_batches([b]), part)
        finally:
            out.close()
        return out

    def _supply_rows(self, con: duckdb.DuckDBPyConnection, stmts: list) -> bool:
        """Every key partition's rows numbered (``number_supply``) for the facts later views
        read: ``_supply_ordered``'s, loss_causes' counts, run_summary's publications and
        losses. ``_supply`` itself stays its SQL view where no step regresses: no later view
        on this path then reads it whole (each reads the few rows gathered for it, or the
        facts), and a TEMP table of every supply row (~53M rows, ~110 B each, at 100M events)
        was DuckDB's largest, written to its spill and read back by nothing. Where a step
        regresses (or that is not known) ``table_checks`` reads it whole: a TEMP table then."""
        steps = StepBounds()  # _supply's rows are _supply_rows', numbered
        split = self._split(con, "SELECT * FROM _supply_rows", "supply", BATCH_ROWS, steps)
        if split is None:
            return False
        regresses = steps.regresses()
        out = None if regresses is False and not _FAULT_SUPPLY_TABLE else Batched(
            con, "_supply__rows")
        ordered = True
        losses: list[pa.Table] = []
        pubs = lost = 0
        empty: pa.Table | None = None
        for k in range(self.parts):
            rows = split.read(k)
            if rows is None:
                continue
            numbered = number_supply(rows)
            if numbered is None:
                if out is not None:
                    out.drop()
                split.remove()
                return False
            ordered = ordered and in_step_order(numbered)
            losses.append(loss_counts(numbered))
            is_pub = numbered["is_pub"]
            pubs += int(pc.sum(is_pub).as_py() or 0)
            lost += int(pc.sum(pc.invert(is_pub)).as_py() or 0)
            if empty is None:
                empty = numbered.slice(0, 0)
            if out is not None:
                out.add(numbered)
        if empty is None:  # no supply rows at all
            split.remove()
            return False
        if _FAULT_SUPPLY_COUNTS:
            pubs += 1
        con.register("_supply_no_rows", empty)
        con.execute(f"CREATE TEMP TABLE {EMPTY_TABLE} AS SELECT * FROM _supply_no_rows")
        con.unregister("_supply_no_rows")
        if out is not None:
            out.flush()
            swap(con, "_supply", stmts)
        else:
            for st in stmts[1:]:  # the view's comments; it stays the view
                con.execute(st.query)
        self.supply_kind = "TABLE" if out is not None else "VIEW"
        self._supply = split
        self._ordered = ordered
        self._regresses = regresses
        self._losses = sum_losses(pa.concat_tables(losses))
        self._supply_counts = (pubs, lost)
        return True

    def _run_summary(self, con: duckdb.DuckDBPyConnection, stmts: list) -> bool:
        """The view's SQL with no supply rows standing for ``_supply`` (its only read of
        it: ``count(*)`` of the publication and of the loss rows), then those two counts
        from the ``_supply`` loop."""
        if self._supply_counts is None:
            return False
        with supply_standing(con, None, self.supply_kind):
            con.execute("CREATE TEMP TABLE run_summary__rows AS SELECT * FROM run_summary")
        con.execute("UPDATE run_summary__rows SET publications = ?, losses = ?",
                    list(self._supply_counts))
        swap(con, "run_summary", stmts)
        return True

    def finish(self, con: duckdb.DuckDBPyConnection) -> bool:
        """After every view: ``table_checks`` (a view, its SQL run when read) materialized
        by its SQL with no supply rows standing for ``_supply`` where the ``_supply_rows``
        stream showed no step regressing (its supply part then counts 0 whatever the rows;
        lineage/supply_steps.py). At the end, so that the spilled ``_supply`` is not touched;
        at creation the query ran while ``_supply`` was being spilled. False: left alone.
        The empty stand-in for ``_supply`` is dropped after."""
        try:
            return self._checks_without_supply(con)
        finally:
            if self._supply_counts is not None:
                con.execute(f"DROP TABLE IF EXISTS {EMPTY_TABLE}")
                self._supply_counts = None

    def _checks_without_supply(self, con: duckdb.DuckDBPyConnection) -> bool:
        if self._regresses is False:
            ((n,),) = con.execute("SELECT count(*) FROM duckdb_views() "
                                  "WHERE view_name = 'table_checks'").fetchall()
            if n == 1:
                with supply_standing(con, None, self.supply_kind):
                    con.execute("CREATE TEMP TABLE table_checks__rows AS "
                                "SELECT * FROM table_checks")
                swap(con, "table_checks", con.extract_statements(load_sql("table_checks")))
                self.checks_without_supply = True
                return True
        return False

    def _supply_ordered(self, con: duckdb.DuckDBPyConnection, stmts: list) -> bool:
        """The view's one row from the facts the ``_supply`` loop gathered (no scan of the
        spilled ``_supply``)."""
        if self._ordered is None:
            return False
        con.execute("CREATE TEMP TABLE _supply_ordered__rows AS SELECT CAST(? AS BOOLEAN) "
                    "AS ordered", [self._ordered])
        swap(con, "_supply_ordered", stmts)
        return True

    def _chain_split(self, con: duckdb.DuckDBPyConnection, ga: int, gr: int
                     ) -> tuple[PartWriter, EntryArrays] | None:
        """The chain positions split by key partition, and the entries' fixed columns (in the
        order the positions' ``row`` indexes)."""
        out = PartWriter(self.directory, "chain", self.parts)
        fixed = []
        offset = 0
        ranges = self._ranges
        assert ranges is not None
        ((episodes,),) = con.execute("SELECT count(*) FROM _entries").fetchall()
        narrow = episodes < 2**31
        reader = con.sql("SELECT * FROM _entries").to_arrow_reader(BATCH_EPISODES)
        try:
            for b in reader:
                t = pa.Table.from_batches([b])
                if t["entry_seq"].null_count:
                    return None
                c = chain_positions(t, ga, gr)
                c["row"] += offset
                offset += t.num_rows
                fixed.append(t.select(_ENT_COLS))
                part = c["hash"] % np.uint64(self.parts)
                # the files hold what cannot be recomputed, narrow: end = (pos + 1) * grid
                del c["end"]
                if narrow:
                    c["row"], c["pos"] = c["row"].astype(np.int32), c["pos"].astype(np.int32)
                out.write(pa.table(c), part)
                ranges.entries.write(entry_keys(t), ranges.index(t["ep"]))
        finally:
            out.close()
            ranges.entries.close()
        if not fixed:
            return None
        return out, entry_arrays(pa.concat_tables(fixed).combine_chunks())

    def _probe(self, con: duckdb.DuckDBPyConnection, stmts: list) -> bool:
        if self._supply is None:
            return False
        ((ga, gr),) = con.execute(
            "SELECT attention_grid_tokens, recurrent_grid_tokens FROM _params").fetchall()
        ((ordered,),) = con.execute("SELECT ordered FROM _supply_ordered").fetchall()
        if ga <= 0 or gr <= 0:
            return False
        ((episodes,),) = con.execute("SELECT count(*) FROM _entries").fetchall()
        self._ranges = ranges = EpisodeRanges(self.directory, episodes, self.parts)
        split = self._chain_split(con, ga, gr)
        if split is None:
            return False
        chains, ent = split
        sup_schema = self._supply.schema
        assert sup_schema is not None
        empty_sup = sup_schema.empty_table().select(_SUP_COLS)
        created: list[str] = []

        def drop() -> None:
            for t in created:
                con.execute(f"DROP TABLE {t}")

        last = self.parts - 1 if _FAULT_DROP_LAST_PART else self.parts
        rest_sup = Batched(con, REST_TABLE)
        for k in range(last):
            ct = chains.read(k)
            if ct is None:
                continue
            c = {n: as_numpy(ct[n], _CHAIN_TYPES[n]) for n in _CHAIN_TYPES}
            c["end"] = (c["pos"] + 1) * np.where(c["is_rec"], gr, ga)
            full = self._supply.read(k)
            sup = full.select(_SUP_COLS) if full is not None else empty_sup
            p = probe_table(sup, ent, c, bool(ordered))
            if p is None:
                rest_sup.drop()
                drop()
                return False
            settled = p["settled"]
            done = p.filter(settled)
            rest = p.filter(pc.invert(settled))
            ranges.write_validity(pa.table(validity_columns(done)))
            insert_rows(con, "_chain_probe__rest", rest, not created)
            created = ["_chain_probe__rest"]
            if full is not None and rest.num_rows and not (_FAULT_REST_LAST_PART
                                                           and k == last - 1):
                gathered = rest_supply(full, rest)
                if gathered is not None:
                    rest_sup.add(gathered)
        rest_sup.flush()
        self._rest_supply = rest_sup.created
        chains.remove()  # the supply files stay until depth_changes (_gather_seq_supply)
        if not created:
            return False
        for st in stmts[1:]:  # the view's comments; the view is set aside until _chain_validity
            con.execute(st.query)
        con.execute("ALTER VIEW _chain_probe RENAME TO _chain_probe__sql")
        con.execute("ALTER TABLE _chain_probe__rest RENAME TO _chain_probe")
        self._probed = True
        return True

    def _drop_rest_supply(self, con: duckdb.DuckDBPyConnection) -> None:
        if self._rest_supply:
            con.execute(f"DROP TABLE {REST_TABLE}")
            self._rest_supply = False

    def _validity(self, con: duckdb.DuckDBPyConnection, stmts: list) -> bool:
        if not self._probed:
            return False
        ranges = self._ranges
        assert ranges is not None
        # _chain_rest reads _chain_probe: here only the unsettled positions, all it needs; and
        # _supply: here only their entries' rows (a scan of the spilled _supply spared)
        with supply_standing(con, REST_TABLE if self._rest_supply else None, self.supply_kind):
            rest = con.sql("SELECT * FROM _chain_rest").to_arrow_table()
        con.execute("DROP TABLE _chain_probe")
        con.execute("ALTER VIEW _chain_probe__sql RENAME TO _chain_probe")
        ranges.write_validity(rest)
        ranges.validity.close()
        ranges.rest = rest
        # no later view reads the whole _chain_validity (the range views read the files, and
        # _window_flips _chain_rest's rows): it stays its SQL, for ad-hoc queries
        for st in stmts[1:]:
            con.execute(st.query)
        self._validity_done = True
        return True

    def _depth_changes(self, con: duckdb.DuckDBPyConnection, stmts: list) -> bool:
        """The view's SQL over only the supply rows it reads instead of a scan of the spilled
        ``_supply``: it joins ``_flips`` to its J changes on seq alone, and a J change is at a
        window flip's seq, so every supply row at those seqs (numbered) stands for
        ``_supply``."""
        if self._supply is None:
            return False
        try:
            seqs = con.sql("SELECT DISTINCT seq FROM _window_flips").to_arrow_table()
            self.seq_source = gather_seq_supply(con, self._supply, self.parts,
                                                np.sort(as_numpy(seqs["seq"], np.int64)),
                                                self._rest_supply)
            self._seq_supply = bool(self.seq_source)
        finally:
            self._drop_rest_supply(con)
            self.close()
            self._supply = None
        with supply_standing(con, SEQ_TABLE if self._seq_supply else None, self.supply_kind):
            con.execute("CREATE TEMP TABLE depth_changes__rows AS SELECT * FROM depth_changes")
        swap(con, "depth_changes", stmts)
        return True

    def _loss_causes(self, con: duckdb.DuckDBPyConnection, stmts: list) -> bool:
        """The view's rows from the ``_supply`` loop's loss counts per (cause, is_rec) and, for
        ``depth_decreasing_losses``, the loss rows at depth_changes' loss seqs among the rows
        gathered at the window flips' seqs (every row at each such seq; a J change is at one)
        instead of a scan of the spilled ``_supply``; as loss_causes.sql counts them."""
        if self._seq_supply is None or self._losses is None:
            return False
        try:
            loss_causes_rows(con, self._losses, bool(self._seq_supply))
        finally:
            if self._seq_supply:
                con.execute(f"DROP TABLE {SEQ_TABLE}")
            self._seq_supply = None
        swap(con, "loss_causes", stmts)
        return True

    def _depths_in_numpy(self, con: duckdb.DuckDBPyConnection, stmts: list, validity: Source,
                         entries: Source) -> bool:
        """``_episode_depths`` range by range by ``episode_ranges.episode_depths`` (False: it
        stepped aside; nothing is left behind and the view's SQL runs, whole)."""
        ranges = self._ranges
        assert ranges is not None
        ((ga, gr),) = con.execute(
            "SELECT attention_grid_tokens, recurrent_grid_tokens FROM _params").fetchall()
        out = Batched(con, "_episode_depths__rows")
        for r in ranges.ranges():
            rows = episode_depths(validity(r), entries(r), ga, gr)
            if rows is None:
                out.drop()
                return False
            out.add(rows)
        out.flush()
        if not out.created:
            return False
        swap(con, "_episode_depths", stmts)
        return True

    def _by_range(self, con: duckdb.DuckDBPyConnection, name: str, stmts: list) -> bool:
        ranges = self._ranges
        if not self._validity_done or ranges is None:
            return False
        validity, entries = ranges.rows(ranges.validity), ranges.rows(ranges.entries)
        assert name in ("_episode_depths", "_window_flips", "_boundaries"), name
        if name == "_window_flips":
            rest = ranges.rest
            assert rest is not None
            with supply_standing(con, REST_TABLE if self._rest_supply else None, self.supply_kind):
                by_range(con, name, stmts, {"_chain_validity": lambda r: rest}, [0])
            return True
        if name == "_episode_depths":  # False where NumPy steps aside: the view's SQL, whole
            return self._depths_in_numpy(con, stmts, validity, entries)
        # _boundaries: only the moved episodes' rows, of the ranges holding them
        flips = con.sql("SELECT * FROM _window_flips").to_arrow_table()
        moved = flips["ep"]
        inputs = {"_chain_validity": only_episodes(validity, moved),
                  # its SQL reads ep and len(chain) of _entries: the range files hold both
                  "_entries": chain_lengths(only_episodes(entries, moved)),
                  # each range's own flips: the view's DISTINCT over all of them, per range,
                  # grew with ranges x flips
                  "_window_flips": ranges.by_episode(flips)}
        # its SQL in a separate connection (lineage/episode_ranges.py: by_range_aside)
        by_range_aside(con, name, stmts, inputs,
                       ranges.ranges(ranges.index(moved).astype(np.int64).tolist()))
        if self._supply is None:  # else they wait for depth_changes
            self._drop_rest_supply(con)
            self.close()
        return True

