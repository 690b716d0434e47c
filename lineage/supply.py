"""The rows of the ``_supply`` view (lineage/sql/_supply.sql) without DuckDB's window: one NumPy
sort of ``_supply_rows`` by (entry, seq) gives each row's number in its entry and its
neighbours', written back in the rows' own order (the strings are never moved):

    entry (false, 7), by seq:   pub(3)  pub(8)  loss(20)
    sup_no                      1       2       3
    valid_before                false   true    true      (is_pub of the row before)
    is_flip                     true    false   true
    prev_step / next_step       lag / lead of step within the entry; is_last: no row after

``supply_rows`` returns None (the harness then runs the SQL) where the view's window would order
rows differently from the sort: a NULL seq or hash, or two rows of one entry at the same seq.
"""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa

from lineage.entry_order import as_numpy, entry_order, valid_mask


def supply_rows(con: duckdb.DuckDBPyConnection, done: dict[str, pa.Table] | None = None
                ) -> pa.Table | None:
    """``SELECT * FROM _supply``, computed from ``_supply_rows`` in NumPy (None: run the SQL)."""
    return number_supply(con.sql("SELECT * FROM _supply_rows").to_arrow_table())


def number_supply(rows: pa.Table) -> pa.Table | None:
    """``rows`` (``_supply_rows``' columns, every row of each entry they hold) with ``_supply``'s
    numbering columns appended (None: the window would order them differently, or no rows)."""
    m = rows.num_rows
    if not m or rows["seq"].null_count or rows["hash"].null_count or rows["is_rec"].null_count:
        return None
    seq = as_numpy(rows["seq"], np.int64)
    sorted_ = entry_order(as_numpy(rows["is_rec"], bool), as_numpy(rows["hash"], np.uint64),
                          seq.copy(), 0)
    if sorted_ is None:
        return None
    order, _, same = sorted_
    seq_o = seq[order]
    if np.any(same & (seq_o[1:] == seq_o[:-1])):
        return None  # a repeated seq of one entry: the window orders those rows arbitrarily
    first = np.ones(m, bool)  # the row starts its entry
    np.logical_not(same, out=first[1:])
    last = np.ones(m, bool)
    last[:-1] = first[1:]
    idx = np.arange(m, dtype=np.int64)
    start = np.where(first, idx, 0)
    np.maximum.accumulate(start, out=start)
    pub = as_numpy(rows["is_pub"], bool)[order]
    step = as_numpy(rows["step"], np.int64)[order]
    step_ok = valid_mask(rows["step"])[order]
    before = np.zeros(m, bool)
    before[1:] = pub[:-1]
    before[first] = False
    prev = np.zeros(m, np.int64)
    prev[1:] = step[:-1]
    prev_ok = np.zeros(m, bool)
    prev_ok[1:] = step_ok[:-1]
    prev_ok &= ~first
    nxt = np.zeros(m, np.int64)
    nxt[:-1] = step[1:]
    nxt_ok = np.zeros(m, bool)
    nxt_ok[:-1] = step_ok[1:]
    nxt_ok &= ~last

    def back(sorted_col: np.ndarray) -> np.ndarray:
        out = np.empty_like(sorted_col)
        out[order] = sorted_col
        return out

    cols = {
        "sup_no": pa.array(back(idx - start + 1)),
        "is_flip": pa.array(back(pub != before)),
        "valid_before": pa.array(back(before)),
        "prev_step": pa.array(back(prev), pa.int64(), mask=back(~prev_ok)),
        "next_step": pa.array(back(nxt), pa.int64(), mask=back(~nxt_ok)),
        "is_last": pa.array(back(last)),
    }
    for name, col in cols.items():
        rows = rows.append_column(name, col)
    return rows
