-- _adoptions: the first adoption row of each episode; its depth is J_adopt.
CREATE OR REPLACE VIEW _adoptions AS
SELECT
    request_id,
    preemption_count,
    min(seq) AS adopt_seq,
    arg_min_null(step, seq) AS adopt_step,
    arg_min_null(depth, seq) AS j_adopt,
    count(*) AS adoption_rows
FROM events
WHERE kind = 'adoption' AND request_id <> ''
GROUP BY request_id, preemption_count;

COMMENT ON VIEW _adoptions IS 'first adoption row per episode';
COMMENT ON COLUMN _adoptions.request_id IS 'request id';
COMMENT ON COLUMN _adoptions.preemption_count IS 'episode key: 0 INITIAL, >=1 RESUME';
COMMENT ON COLUMN _adoptions.adopt_seq IS 'seq of the adoption (the exact lookup cut)';
COMMENT ON COLUMN _adoptions.adopt_step IS 'scheduler step of the lookup (the M0/M1 step)';
COMMENT ON COLUMN _adoptions.j_adopt IS 'tokens: joint depth the scheduler adopted';
COMMENT ON COLUMN _adoptions.adoption_rows IS 'adoption rows recorded for the episode (1 expected)';
