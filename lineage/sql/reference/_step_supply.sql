-- _step_supply: per entry and scheduler step, the state at the end of that step (events of the
-- step in seq order) and whether the step published it. The M0/M1 lookup bracket reads this:
-- M0 = state after the latest earlier step; M1 = M0 or published within the lookup's step by a
-- request other than the one looking up (its own publications follow its lookup).
CREATE OR REPLACE VIEW _step_supply AS
SELECT
    is_rec,
    hash,
    step,
    arg_max(is_pub, seq) AS valid_after_step,
    bool_or(is_pub) AS published_in_step,
    CASE WHEN min(request_id) FILTER (WHERE is_pub) = max(request_id) FILTER (WHERE is_pub)
         THEN min(request_id) FILTER (WHERE is_pub) END AS sole_publisher
FROM _supply
GROUP BY is_rec, hash, step;

COMMENT ON VIEW _step_supply IS 'per (entry, step): state after the step, published within it';
COMMENT ON COLUMN _step_supply.is_rec IS 'true: recurrent checkpoint; false: attention block';
COMMENT ON COLUMN _step_supply.hash IS '64-bit cache key';
COMMENT ON COLUMN _step_supply.step IS 'scheduler step';
COMMENT ON COLUMN _step_supply.valid_after_step IS 'the last event of the step (by seq) is a publication';
COMMENT ON COLUMN _step_supply.published_in_step IS 'the step holds at least one publication of the entry';
COMMENT ON COLUMN _step_supply.sole_publisher IS 'request_id when exactly one request published the entry in the step';
