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
"""

from __future__ import annotations

import duckdb

from lineage.materialize import swap

# tests set this to check that a wrong chain changes the answer (negative control): the chains
# are then joined from the episode's last waiting-entry row instead of its first
_FAULT_LAST_ROW = False

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

_ROWS = """
CREATE TEMP TABLE _entries__rows AS
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
"""


def materialize_entries(con: duckdb.DuckDBPyConnection, stmts: list) -> bool:
    """Put ``_entries``' rows in place as a TEMP table (True), or leave it to the view's SQL
    (False: some episode's least seq is tied or NULL; nothing is left behind)."""
    con.execute(_FIRST)
    try:
        # an identifier of our own, never a value
        con.execute(_ROWS.replace("{cut}", "last_seq" if _FAULT_LAST_ROW else "entry_seq"))
        ((want,),) = con.execute("SELECT count(*) FROM _entries__first").fetchall()
        ((got,),) = con.execute("SELECT count(*) FROM _entries__rows").fetchall()
    finally:
        con.execute("DROP TABLE _entries__first")
    if got != want:
        con.execute("DROP TABLE _entries__rows")
        return False
    swap(con, "_entries", stmts)
    return True
