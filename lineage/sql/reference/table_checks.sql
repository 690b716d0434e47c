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
steps AS (
    SELECT
        step,
        max(step) OVER (ORDER BY seq ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_max
    FROM _supply
    WHERE step >= 0
)
SELECT
    s.events,
    s.first_seq,
    s.last_seq,
    coalesce(s.last_seq - s.first_seq + 1 - s.distinct_seqs, 0) AS seq_gaps,
    s.events - s.distinct_seqs AS duplicate_seqs,
    s.end_records,
    (SELECT count(*) FROM steps WHERE step < prev_max) AS supply_step_regressions
FROM s;

COMMENT ON VIEW table_checks IS 'integrity facts of the event table';
COMMENT ON COLUMN table_checks.events IS 'rows in the table';
COMMENT ON COLUMN table_checks.first_seq IS 'smallest seq';
COMMENT ON COLUMN table_checks.last_seq IS 'largest seq';
COMMENT ON COLUMN table_checks.seq_gaps IS 'sequence numbers missing between first_seq and last_seq';
COMMENT ON COLUMN table_checks.duplicate_seqs IS 'rows whose seq repeats another row''s';
COMMENT ON COLUMN table_checks.end_records IS 'end records (1 expected in a complete trace)';
COMMENT ON COLUMN table_checks.supply_step_regressions IS 'publications/losses whose step is below an earlier event''s (M0/M1 assume steps follow seq)';
