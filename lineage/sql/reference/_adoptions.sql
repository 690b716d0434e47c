-- _adoptions: the first adoption row of each episode; its depth is J_adopt.
CREATE OR REPLACE VIEW _adoptions AS
SELECT
    request_id,
    preemption_count,
    seq AS adopt_seq,
    step AS adopt_step,
    depth AS j_adopt,
    count(*) OVER (PARTITION BY request_id, preemption_count) AS adoption_rows
FROM events
WHERE kind = 'adoption' AND request_id <> ''
QUALIFY row_number() OVER (PARTITION BY request_id, preemption_count ORDER BY seq) = 1;

COMMENT ON VIEW _adoptions IS 'first adoption row per episode';
COMMENT ON COLUMN _adoptions.request_id IS 'request id';
COMMENT ON COLUMN _adoptions.preemption_count IS 'episode key: 0 INITIAL, >=1 RESUME';
COMMENT ON COLUMN _adoptions.adopt_seq IS 'seq of the adoption (the exact lookup cut)';
COMMENT ON COLUMN _adoptions.adopt_step IS 'scheduler step of the lookup (the M0/M1 step)';
COMMENT ON COLUMN _adoptions.j_adopt IS 'tokens: joint depth the scheduler adopted';
COMMENT ON COLUMN _adoptions.adoption_rows IS 'adoption rows recorded for the episode (1 expected)';
