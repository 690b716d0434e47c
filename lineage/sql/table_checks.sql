-- table_checks: one row of integrity facts about the event table itself. They do not replace
-- the binary trace's verdict (END record, dropped and write-error counters); for an exported
-- Parquet table they are what can still be checked.
CREATE OR REPLACE VIEW table_checks AS
WITH bounds AS (
    SELECT
        count(*) AS events,
        min(seq) AS first_seq,
        max(seq) AS last_seq,
        count(*) FILTER (WHERE kind = 'end') AS end_records,
        -- dense: the seq range fits in at most events / 4096 + 16 slices of 65,536 values
        coalesce((CAST(max(seq) AS HUGEINT) - min(seq)) // 65536 < count(*) // 4096 + 16, false)
            AS dense
    FROM events
),
dense_distinct AS (
    -- distinct seqs of a dense range without a hash table of every seq (one that outgrows memory
    -- past ~30M events): one bitmap of 65,536 bits per slice seq >> 16, its set bits counted
    --     seqs 1 1 2 70000  ->  slice 0: bits {1, 2}, slice 1: bit {4464}  ->  3 distinct
    SELECT CAST(sum(bit_count(b)) AS BIGINT) AS n
    FROM (
        SELECT bitstring_agg(CAST(seq & 65535 AS INTEGER), 0, 65535) AS b
        FROM events
        WHERE (SELECT dense FROM bounds)
        GROUP BY seq >> 16
    )
),
sparse_distinct AS (
    SELECT count(DISTINCT seq) AS n FROM events WHERE NOT (SELECT dense FROM bounds)
),
s AS (
    SELECT
        b.events,
        b.first_seq,
        b.last_seq,
        CASE WHEN b.dense THEN coalesce(d.n, 0) ELSE x.n END AS distinct_seqs,
        b.end_records
    FROM bounds AS b CROSS JOIN dense_distinct AS d CROSS JOIN sparse_distinct AS x
),
step_bounds AS (
    -- first seq of each known step; a supply row regresses when a later step began before it:
    --     steps by seq  1 1 2 1 3   ->  the third "1" (after step 2 began) is one regression
    SELECT step, min(seq) AS first_seq, max(seq) AS last_seq
    FROM _supply
    WHERE step >= 0
    GROUP BY step
),
later_start AS (
    SELECT
        step,
        last_seq,
        min(first_seq) OVER (ORDER BY step DESC
                             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS later_first_seq
    FROM step_bounds
),
regressing_steps AS (
    -- only a step whose last row follows a later step's start can hold a regression; the rows
    -- are counted for those steps alone (usually none), not joined for every step
    SELECT step, later_first_seq FROM later_start WHERE last_seq > later_first_seq
),
regressions AS (
    SELECT count(*) AS n
    FROM _supply AS u
    JOIN regressing_steps AS l ON l.step = u.step
    WHERE u.seq > l.later_first_seq
)
SELECT
    s.events,
    s.first_seq,
    s.last_seq,
    coalesce(s.last_seq - s.first_seq + 1 - s.distinct_seqs, 0) AS seq_gaps,
    s.events - s.distinct_seqs AS duplicate_seqs,
    s.end_records,
    r.n AS supply_step_regressions
FROM s CROSS JOIN regressions AS r;

COMMENT ON VIEW table_checks IS 'integrity facts of the event table';
COMMENT ON COLUMN table_checks.events IS 'rows in the table';
COMMENT ON COLUMN table_checks.first_seq IS 'smallest seq';
COMMENT ON COLUMN table_checks.last_seq IS 'largest seq';
COMMENT ON COLUMN table_checks.seq_gaps IS 'sequence numbers missing between first_seq and last_seq';
COMMENT ON COLUMN table_checks.duplicate_seqs IS 'rows whose seq repeats another row''s';
COMMENT ON COLUMN table_checks.end_records IS 'end records (1 expected in a complete trace)';
COMMENT ON COLUMN table_checks.supply_step_regressions IS 'publications/losses whose step is below an earlier event''s (M0/M1 assume steps follow seq)';
