"""``_entries`` (lineage/sql/_entries.sql) for event tables larger than memory, with the hash
chains kept out of the first-row aggregate and out of the numbering sort.

The view aggregates each episode's waiting-entry rows (``arg_min_null(chain, seq)``: every
group's state holds a list) and numbers the groups with a window sorting the whole rows, chains
included. Here the aggregate and the numbering see the fixed columns only; the chains are then
joined from the episode's row at ``entry_seq`` (one streaming probe of the events):

    waiting_entry rows --GROUP BY (request_id, preemption_count): min(seq), step, depth, count
                       --row_number() ORDER BY the key--> ep            (TEMP, fixed columns)
    JOIN waiting_entry rows ON key AND seq = entry_seq  --> chain, recurrent_chain

The same rows as the view wherever each episode has exactly one waiting-entry row at its least
seq: checked by the row count (a tie at the least seq gives more rows, a NULL seq fewer), and
where it fails the view's SQL runs instead.

Once the probe and ``_chain_rest`` have read the chains (lineage/bounded.py), no later view on
the bounded path reads more of them than their lengths, and the lists (~0.7 GiB of a 100M-event
run's TEMP tables, which pushed ``episode_lineage``'s build into DuckDB's spill) are dropped:

    _entries__fixed (TEMP, materialize_entries): the view's columns, len(chain),
        len(recurrent_chain); _entries a view of the view's columns
    after the probe: ALTER TABLE _entries__fixed DROP COLUMN chain, recurrent_chain (DuckDB
        rewrites nothing); _entries (VIEW, while the views are created): lists of as many NULL keys
    _entries (VIEW, after; entries_exact): _entries__fixed JOIN the events' waiting-entry row at
        entry_seq for the chains (the join materialize_entries checked: one row per episode)
"""

from __future__ import annotations

import duckdb

from lineage.sql_files import load_sql

# tests set this to check that a wrong chain changes the answer (negative control): the chains
# are then joined from the episode's last waiting-entry row instead of its first
_FAULT_LAST_ROW = False
# likewise: the lengths standing for the chains after the probe one key short (recurrent)
_FAULT_NARROW_LENGTH = False
# likewise: the exact view put back by entries_exact gives each attention chain reversed
_FAULT_EXACT_CHAIN = False

# _entries' columns, in order (lineage/sql/_entries.sql)
ENTRY_COLUMNS = ("ep", "request_id", "preemption_count", "entry_seq", "entry_step",
                 "prompt_tokens", "chain", "entry_rows", "recurrent_chain", "adopt_seq",
                 "adopt_step", "j_adopt", "has_window")
FIXED_TABLE = "_entries__fixed"

_FIRST = """
CREATE TEMP TABLE _entries__first AS
WITH first_rows AS (
    SELECT
        request_id,
        preemption_count,
        min(seq) AS entry_seq,
        arg_min_null(step, seq) AS entry_step,
        arg_min_null(depth, seq) AS prompt_tokens,
        count(*) AS entry_rows,
        max(seq) AS last_seq
    FROM events
    WHERE kind = 'waiting_entry' AND request_id <> ''
    GROUP BY request_id, preemption_count
)
SELECT row_number() OVER (ORDER BY request_id, preemption_count) AS ep, *
FROM first_rows
"""

# the view's columns plus the chains' lengths (dropped with the chains after the probe)
_ROWS = """
CREATE TEMP TABLE {fixed} AS
SELECT *, len(chain) AS attention_keys, len(recurrent_chain) AS recurrent_keys
FROM (
WITH chains AS (
    SELECT request_id, preemption_count, seq, chain, recurrent_chain
    FROM events
    WHERE kind = 'waiting_entry' AND request_id <> ''
),
joined AS (
    SELECT
        f.*,
        coalesce(c.chain, CAST([] AS UBIGINT[])) AS chain,
        coalesce(c.recurrent_chain, CAST([] AS UBIGINT[])) AS recurrent_chain
    FROM _entries__first AS f
    JOIN chains AS c
        ON c.request_id = f.request_id AND c.preemption_count = f.preemption_count
       AND c.seq = f.{cut}
)
SELECT
    f.ep,
    f.request_id,
    f.preemption_count,
    f.entry_seq,
    f.entry_step,
    f.prompt_tokens,
    f.chain,
    f.entry_rows,
    CASE WHEN f.prompt_tokens > 0
         THEN f.recurrent_chain[1 : (f.prompt_tokens - 1) // p.recurrent_grid_tokens]
         ELSE f.recurrent_chain
    END AS recurrent_chain,
    a.adopt_seq,
    a.adopt_step,
    a.j_adopt,
    coalesce(f.entry_seq < a.adopt_seq, false) AS has_window
FROM joined AS f
CROSS JOIN _params AS p
LEFT JOIN _adoptions AS a
    ON a.request_id = f.request_id AND a.preemption_count = f.preemption_count
)
"""


def materialize_entries(con: duckdb.DuckDBPyConnection, stmts: list) -> bool:
    """Put ``_entries``' rows in place as a TEMP table (True), or leave it to the view's SQL
    (False: some episode's least seq is tied or NULL; nothing is left behind)."""
    con.execute(_FIRST)
    try:
        # an identifier of our own, never a value
        con.execute(_ROWS.replace("{cut}", "last_seq" if _FAULT_LAST_ROW else "entry_seq")
                    .replace("{fixed}", FIXED_TABLE))
        ((want,),) = con.execute("SELECT count(*) FROM _entries__first").fetchall()
        ((got,),) = con.execute(f"SELECT count(*) FROM {FIXED_TABLE}").fetchall()
    finally:
        con.execute("DROP TABLE _entries__first")
    if got != want:
        con.execute(f"DROP TABLE {FIXED_TABLE}")
        return False
    # _entries: the view's columns of the table (the lengths are for entries_narrow)
    con.execute(f"CREATE OR REPLACE VIEW _entries AS SELECT {', '.join(ENTRY_COLUMNS)} "
                f"FROM {FIXED_TABLE}")
    for st in stmts[1:]:
        con.execute(st.query)
    return True


_NARROW = f"""
CREATE OR REPLACE VIEW _entries AS
SELECT ep, request_id, preemption_count, entry_seq, entry_step, prompt_tokens,
       list_resize(CAST([] AS UBIGINT[]), attention_keys) AS chain,
       entry_rows,
       list_resize(CAST([] AS UBIGINT[]), {{recurrent}}) AS recurrent_chain,
       adopt_seq, adopt_step, j_adopt, has_window
FROM {FIXED_TABLE}
"""

# _ROWS without the aggregate: the fixed columns from the table, the chains from the episode's
# row at entry_seq (one row per episode: materialize_entries checked it)
_EXACT = f"""
CREATE OR REPLACE VIEW _entries AS
WITH chains AS (
    SELECT request_id, preemption_count, seq, chain, recurrent_chain
    FROM events
    WHERE kind = 'waiting_entry' AND request_id <> ''
),
joined AS (
    SELECT
        f.*,
        coalesce(c.chain, CAST([] AS UBIGINT[])) AS chain,
        coalesce(c.recurrent_chain, CAST([] AS UBIGINT[])) AS recurrent_chain
    FROM {FIXED_TABLE} AS f
    JOIN chains AS c
        ON c.request_id = f.request_id AND c.preemption_count = f.preemption_count
       AND c.seq = f.entry_seq
)
SELECT
    f.ep, f.request_id, f.preemption_count, f.entry_seq, f.entry_step, f.prompt_tokens,
    {{chain}} AS chain,
    f.entry_rows,
    CASE WHEN f.prompt_tokens > 0
         THEN f.recurrent_chain[1 : (f.prompt_tokens - 1) // p.recurrent_grid_tokens]
         ELSE f.recurrent_chain
    END AS recurrent_chain,
    f.adopt_seq, f.adopt_step, f.j_adopt, f.has_window
FROM joined AS f
CROSS JOIN _params AS p
"""


def entries_narrow(con: duckdb.DuckDBPyConnection) -> bool:
    """After the last read of the chains (the probe's split, ``_chain_rest``): the TEMP table
    ``_entries__fixed`` (as :func:`materialize_entries` put it) drops the two chain lists,
    keeping their lengths, and ``_entries`` becomes a view over it whose chains are lists of
    as many NULL keys (of the later views depth_changes reads its ``request_id``,
    episode_lineage ``episodes``' columns but not the chains' lengths, and
    ``_episode_depths``' SQL, where the NumPy steps aside, ``len(recurrent_chain)``).
    :func:`entries_exact` puts the exact rows back at the end. Only after
    :func:`materialize_entries` returned True."""
    # DuckDB drops a column without rewriting the others (the lists' blocks are freed)
    con.execute(f"ALTER TABLE {FIXED_TABLE} DROP COLUMN chain")
    con.execute(f"ALTER TABLE {FIXED_TABLE} DROP COLUMN recurrent_chain")
    recurrent = "greatest(recurrent_keys - 1, 0)" if _FAULT_NARROW_LENGTH else "recurrent_keys"
    # identifiers and expressions of our own, never values
    con.execute(_NARROW.replace("{recurrent}", recurrent))
    return True


def entries_exact(con: duckdb.DuckDBPyConnection) -> None:
    """``_entries``' exact rows as a view: the fixed columns from ``_entries__fixed``, the
    chains joined from the events (an ad-hoc read of ``_entries`` or ``episodes`` scans the
    events' waiting-entry rows), with the view's comments."""
    chain = "list_reverse(f.chain)" if _FAULT_EXACT_CHAIN else "f.chain"
    con.execute(_EXACT.replace("{chain}", chain))
    for st in con.extract_statements(load_sql("_entries"))[1:]:
        con.execute(st.query)
