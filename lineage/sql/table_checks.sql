-- table_checks: one row of integrity facts about the event table itself. They do not replace
-- the binary trace's verdict (END record, dropped and write-error counters); for an exported
-- Parquet table they are what can still be checked.
CREATE OR REPLACE VIEW table_checks AS
WITH s AS (
    SELECT
        count(*) AS events,
        min(seq) AS first_seq,
        max(seq) AS last_seq,
        count(DISTINCT seq) AS distinct_seqs,
        count(*) FILTER (WHERE kind = 'end') AS end_records
    FROM events
),
step_bounds AS (
    -- first seq of each known step; a supply row regresses when a later step began before it:
    --     steps by seq  1 1 2 1 3   ->  the third "1" (after step 2 began) is one regression
    SELECT step, min(seq) AS first_seq FROM _supply WHERE step >= 0 GROUP BY step
),
later_start AS (
    SELECT
        step,
        min(first_seq) OVER (ORDER BY step DESC
                             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS later_first_seq
    FROM step_bounds
),
regressions AS (
    SELECT count(*) AS n
    FROM _supply AS u
    JOIN later_start AS l ON l.step = u.step
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
