-- _chain_validity: whether each chain entry is valid at the episode's four cuts.
--   entry: after all events with seq < entry_seq       (J_enter)
--   exact: after all events with seq < adopt_seq       (lookup, ordered by seq)
--   m0:    after all steps < adopt_step                (lookup, step-ordered lower bound)
--   m1:    m0, or published within adopt_step by a    (lookup, step-ordered upper bound)
--          request other than the episode's own
-- An entry's state at a seq cut is the is_pub of its last supply row before the cut (false when
-- none); that row's sup_no at the entry and the adoption cut delimits the rows in the window.
--
-- _chain_probe settles almost every position (its entry-cut state answers every cut); the few
-- others are _chain_rest's rows. Materialized (by lineage/probe.py's chain_validity_rows when
-- the probe was computed in Python; tests compare both).
CREATE OR REPLACE VIEW _chain_validity AS
SELECT
    ep, is_rec, pos, hash, end_tokens, in_reach,
    adopt_seq IS NOT NULL AS has_window,
    valid_entry,
    supply_before_entry,
    CASE WHEN adopt_seq IS NOT NULL THEN valid_entry END AS valid_exact,
    CASE WHEN adopt_seq IS NOT NULL THEN supply_before_entry END AS supply_before_adopt,
    CASE WHEN adopt_step IS NOT NULL THEN valid_entry END AS valid_m0,
    CASE WHEN adopt_step IS NOT NULL THEN valid_entry OR next_published_by_other END AS valid_m1
FROM _chain_probe
WHERE settled
UNION ALL
SELECT * FROM _chain_rest;

COMMENT ON VIEW _chain_validity IS 'validity of each episode chain entry at the entry, exact, M0 and M1 cuts';
COMMENT ON COLUMN _chain_validity.ep IS 'episode id';
COMMENT ON COLUMN _chain_validity.is_rec IS 'true: recurrent checkpoint; false: attention block';
COMMENT ON COLUMN _chain_validity.pos IS '0-based chain position';
COMMENT ON COLUMN _chain_validity.hash IS '64-bit cache key';
COMMENT ON COLUMN _chain_validity.end_tokens IS 'tokens: block end / checkpoint boundary';
COMMENT ON COLUMN _chain_validity.in_reach IS 'can move J: a checkpoint or a block below the deepest checkpoint boundary';
COMMENT ON COLUMN _chain_validity.has_window IS 'the episode was adopted after its entry';
COMMENT ON COLUMN _chain_validity.valid_entry IS 'valid at the waiting-entry cut';
COMMENT ON COLUMN _chain_validity.supply_before_entry IS 'supply rows of the entry before the waiting-entry cut';
COMMENT ON COLUMN _chain_validity.valid_exact IS 'valid at the adoption cut by seq (NULL: no window)';
COMMENT ON COLUMN _chain_validity.supply_before_adopt IS 'supply rows of the entry before the adoption cut (NULL: no window)';
COMMENT ON COLUMN _chain_validity.valid_m0 IS 'valid after all steps before the lookup step (NULL: no step)';
COMMENT ON COLUMN _chain_validity.valid_m1 IS 'valid_m0 or published within the lookup step by another request (NULL: no step)';
