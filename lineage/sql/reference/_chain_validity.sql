-- _chain_validity: whether each chain entry is valid at the episode's four cuts.
--   entry: after all events with seq < entry_seq       (J_enter)
--   exact: after all events with seq < adopt_seq       (lookup, ordered by seq)
--   m0:    after all steps < adopt_step                (lookup, step-ordered lower bound)
--   m1:    m0, or published within adopt_step by a    (lookup, step-ordered upper bound)
--          request other than the episode's own
-- The flip counts before the entry and adoption cuts delimit the changes inside the window.
CREATE OR REPLACE VIEW _chain_validity AS
SELECT
    c.ep,
    c.is_rec,
    c.pos,
    c.hash,
    c.end_tokens,
    c.in_reach,
    c.adopt_seq IS NOT NULL AS has_window,
    coalesce(fe.is_pub, false) AS valid_entry,
    coalesce(fe.flip_no, 0) AS flips_before_entry,
    CASE WHEN c.adopt_seq IS NOT NULL THEN coalesce(fa.is_pub, false) END AS valid_exact,
    CASE WHEN c.adopt_seq IS NOT NULL THEN coalesce(fa.flip_no, 0) END AS flips_before_adopt,
    CASE WHEN c.adopt_step IS NOT NULL THEN coalesce(s0.valid_after_step, false) END AS valid_m0,
    CASE WHEN c.adopt_step IS NOT NULL
         THEN coalesce(s0.valid_after_step, false)
              OR coalesce(s1.published_in_step AND s1.sole_publisher IS DISTINCT FROM c.request_id,
                          false)
    END AS valid_m1
FROM _chain AS c
ASOF LEFT JOIN _flips AS fe
    ON fe.is_rec = c.is_rec AND fe.hash = c.hash AND c.entry_seq > fe.seq
ASOF LEFT JOIN _flips AS fa
    ON fa.is_rec = c.is_rec AND fa.hash = c.hash AND c.adopt_seq > fa.seq
ASOF LEFT JOIN _step_supply AS s0
    ON s0.is_rec = c.is_rec AND s0.hash = c.hash AND c.adopt_step > s0.step
LEFT JOIN _step_supply AS s1
    ON s1.is_rec = c.is_rec AND s1.hash = c.hash AND s1.step = c.adopt_step;

COMMENT ON VIEW _chain_validity IS 'validity of each episode chain entry at the entry, exact, M0 and M1 cuts';
COMMENT ON COLUMN _chain_validity.ep IS 'episode id';
COMMENT ON COLUMN _chain_validity.is_rec IS 'true: recurrent checkpoint; false: attention block';
COMMENT ON COLUMN _chain_validity.pos IS '0-based chain position';
COMMENT ON COLUMN _chain_validity.hash IS '64-bit cache key';
COMMENT ON COLUMN _chain_validity.end_tokens IS 'tokens: block end / checkpoint boundary';
COMMENT ON COLUMN _chain_validity.in_reach IS 'can move J: a checkpoint or a block below the deepest checkpoint boundary';
COMMENT ON COLUMN _chain_validity.has_window IS 'the episode was adopted after its entry';
COMMENT ON COLUMN _chain_validity.valid_entry IS 'valid at the waiting-entry cut';
COMMENT ON COLUMN _chain_validity.flips_before_entry IS 'validity changes of the entry before the waiting-entry cut';
COMMENT ON COLUMN _chain_validity.valid_exact IS 'valid at the adoption cut by seq (NULL: no window)';
COMMENT ON COLUMN _chain_validity.flips_before_adopt IS 'validity changes before the adoption cut (NULL: no window)';
COMMENT ON COLUMN _chain_validity.valid_m0 IS 'valid after all steps before the lookup step (NULL: no step)';
COMMENT ON COLUMN _chain_validity.valid_m1 IS 'valid_m0 or published within the lookup step by another request (NULL: no step)';
