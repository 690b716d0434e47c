"""The few ``_supply`` rows some views read, gathered on the bounded path (lineage/bounded.py)
instead of a scan of the whole ``_supply``, which past ~30M events is DuckDB's largest TEMP
table (~110 B a row) and is read back from the spill:

    _chain_rest, _window_flips   every row of the unsettled positions' entries
                                 (rest_supply, per key partition in the probe loop)
    depth_changes                every row at _window_flips' seqs (gather_seq_supply): it joins
                                 _flips to its J changes on seq alone, and a J changes only at a
                                 window flip's seq
    loss_causes                  losses per (cause, is_rec) counted in the _supply loop
                                 (loss_counts), and depth_changes' loss seqs among those rows
    _supply_ordered              its one fact from the _supply loop (in_step_order)

While a view's SQL runs over them, the gathered rows stand for ``_supply``
(:func:`supply_standing`); the SQL files stay the definitions (tests compare both).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lineage.entry_order import as_numpy
from lineage.materialize import Batched
from lineage.part_files import PartWriter
from lineage.supply import number_supply

REST_TABLE = "_chain_rest__supply"
SEQ_TABLE = "_depth_changes__supply"
# no supply rows, with _supply's columns (as number_supply gives them)
EMPTY_TABLE = "_supply__empty"

# tests set this to check that the numbering matters (negative control): depth_changes' rows at
# the window flips' seqs numbered without the other rows of their entries
_FAULT_SEQ_SUPPLY_ALONE = False
# depth_changes' rows from REST_TABLE where they all are there; tests turn it off to run the
# numbering from the part files
_TRY_REST_ROWS = True


@contextmanager
def supply_standing(con: duckdb.DuckDBPyConnection, table: str | None, kind: str
                    ) -> Iterator[None]:
    """TEMP table ``table`` (None: :data:`EMPTY_TABLE`, no rows) is ``_supply`` meanwhile; the
    real one (``kind``: ``"VIEW"``, its SQL, where no view reads it whole; or ``"TABLE"``) is
    ``_supply__all`` and everything gets its name back after."""
    assert kind in ("VIEW", "TABLE"), kind
    con.execute(f"ALTER {kind} _supply RENAME TO _supply__all")
    try:
        con.execute(f"ALTER TABLE {table or EMPTY_TABLE} RENAME TO _supply")
        yield
    finally:
        con.execute(f"ALTER TABLE _supply RENAME TO {table or EMPTY_TABLE}")
        con.execute(f"ALTER {kind} _supply__all RENAME TO _supply")


def rest_supply(sup: pa.Table, rest: pa.Table) -> pa.Table | None:
    """``_supply``'s rows for the unsettled positions ``rest`` of one key partition (``sup``:
    its ``_supply_rows``): every row of each entry sharing a hash with one of them, numbered as
    ``_supply`` numbers them (every row of an entry is here, so ``sup_no`` and the neighbours
    are the same). ``_chain_rest`` and ``_window_flips`` read only those entries' rows (they
    join on ``(is_rec, hash)``, so an entry of the other kind is harmless). None: none, or the
    numbering stepped aside."""
    mine = sup.filter(pc.is_in(sup["hash"], value_set=pc.unique(rest["hash"])))
    return number_supply(mine) if mine.num_rows else None


def gather_seq_supply(con: duckdb.DuckDBPyConnection, split: PartWriter, parts: int,
                      seqs: np.ndarray, rest: bool) -> str:
    """``_supply``'s rows at ``seqs`` (sorted) into TEMP table :data:`SEQ_TABLE`; returns where
    they came from ("": none). Usually every one is a row of an unsettled position's entry,
    already numbered in :data:`REST_TABLE` (``rest``: it exists): taken from there when as many
    rows are there as the supply part files ``split`` hold at those seqs (their seq columns
    counted). Else each partition's rows at ``seqs``, numbered with the other rows of their
    entries."""
    if not len(seqs):
        return ""
    at_seqs = SeqSet(seqs)
    hits = []
    for k in range(parts):
        full = split.read(k, ["seq"])
        hits.append(0 if full is None else
                    int(np.count_nonzero(at_seqs.mask(as_numpy(full["seq"], np.int64)))))
    if not sum(hits):
        return ""
    if rest and _TRY_REST_ROWS:
        con.register("_seqs", pa.table({"seq": seqs}))
        con.execute(f"CREATE TEMP TABLE {SEQ_TABLE} AS SELECT s.* FROM {REST_TABLE} AS s "
                    "SEMI JOIN _seqs AS q ON q.seq = s.seq")
        con.unregister("_seqs")
        ((n,),) = con.execute(f"SELECT count(*) FROM {SEQ_TABLE}").fetchall()
        if n == sum(hits):
            return "rest rows"
        con.execute(f"DROP TABLE {SEQ_TABLE}")
    out = Batched(con, SEQ_TABLE)
    for k in range(parts):
        if not hits[k]:
            continue
        full = split.read(k)
        assert full is not None
        hit = at_seqs.mask(as_numpy(full["seq"], np.int64))
        keys = pc.unique(pc.filter(full["hash"], pa.array(hit)))
        mine = full.filter(pa.array(hit) if _FAULT_SEQ_SUPPLY_ALONE
                           else pc.is_in(full["hash"], value_set=keys))
        numbered = number_supply(mine)
        assert numbered is not None  # the whole partition was numbered
        out.add(numbered.filter(pa.array(at_seqs.mask(as_numpy(numbered["seq"], np.int64)))))
    out.flush()
    return "numbered again" if out.created else ""


def loss_causes_rows(con: duckdb.DuckDBPyConnection, losses: pa.Table, gathered: bool) -> None:
    """``loss_causes``' rows (lineage/sql/loss_causes.sql) into TEMP table
    ``loss_causes__rows``, from ``losses`` (:func:`sum_losses` of every partition's
    :func:`loss_counts`) and, for ``depth_decreasing_losses``, the loss rows at depth_changes'
    loss seqs among :data:`SEQ_TABLE`'s (``gathered``: it exists; every row at each window
    flip's seq, and a J change is at one)."""
    source = SEQ_TABLE if gathered else EMPTY_TABLE
    con.register("_loss_counts", losses)
    try:
        con.execute(f"""
            CREATE TEMP TABLE loss_causes__rows AS
            WITH dec AS (
                SELECT DISTINCT seq FROM depth_changes WHERE kind = 'loss'
            ),
            d AS (
                SELECT s.cause, s.is_rec, count(*) AS n
                FROM {source} AS s
                JOIN dec ON dec.seq = s.seq
                WHERE NOT s.is_pub
                GROUP BY s.cause, s.is_rec
            )
            SELECT
                c.cause,
                CASE WHEN c.is_rec THEN 'recurrent' ELSE 'attention' END AS state_kind,
                CAST(c.losses AS BIGINT) AS losses,
                CAST(c.effective_losses AS BIGINT) AS effective_losses,
                coalesce(d.n, 0) AS depth_decreasing_losses
            FROM _loss_counts AS c
            LEFT JOIN d ON d.cause IS NOT DISTINCT FROM c.cause AND d.is_rec = c.is_rec
            WHERE c.losses > 0""")
    finally:
        con.unregister("_loss_counts")


def in_step_order(numbered: pa.Table) -> bool:
    """``_supply_ordered``'s fact over these numbered rows (every row of each entry they hold):
    ``bool_and(step >= prev_step)`` (NULLs ignored) and no NULL step."""
    if numbered["step"].null_count:
        return False
    prev = numbered["prev_step"]
    has_prev = as_numpy(pc.is_valid(prev), bool)
    step = as_numpy(numbered["step"], np.int64)[has_prev]
    return bool(np.all(step >= as_numpy(prev, np.int64)[has_prev]))


def loss_counts(numbered: pa.Table) -> pa.Table:
    """Loss rows and those among them that flip, per (cause, is_rec), of these numbered rows."""
    loss = numbered.select(["cause", "is_rec", "is_flip"]).filter(
        pc.invert(numbered["is_pub"]))
    return sum_losses(pa.table({"cause": loss["cause"], "is_rec": loss["is_rec"],
                                "losses": pa.array(np.ones(loss.num_rows, np.int64)),
                                "effective_losses": pc.cast(loss["is_flip"], pa.int64())}))


def sum_losses(counts: pa.Table) -> pa.Table:
    """``counts`` (cause, is_rec, losses, effective_losses) summed per (cause, is_rec)."""
    g = counts.group_by(["cause", "is_rec"]).aggregate([("losses", "sum"),
                                                        ("effective_losses", "sum")])
    return pa.table({"cause": g["cause"], "is_rec": g["is_rec"], "losses": g["losses_sum"],
                     "effective_losses": g["effective_losses_sum"]})


class SeqSet:
    """Membership in a set of seqs as one bit per seq of its range (100M seqs: 12.5 MB), tested
    for a whole column at once (a few ns a row; a binary search of each costs ~10x)."""

    def __init__(self, seqs: np.ndarray) -> None:
        self.lo, self.hi = int(seqs.min()), int(seqs.max())
        off = seqs - self.lo
        self.bits = np.zeros((self.hi - self.lo) // 8 + 1, np.uint8)
        np.bitwise_or.at(self.bits, off >> 3, np.left_shift(1, off & 7).astype(np.uint8))

    def mask(self, seq: np.ndarray) -> np.ndarray:
        inside = (seq >= self.lo) & (seq <= self.hi)
        off = np.where(inside, seq - self.lo, 0)
        return inside & ((self.bits[off >> 3] >> (off & 7).astype(np.uint8)) & 1).astype(bool)
