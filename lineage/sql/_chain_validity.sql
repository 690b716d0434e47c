-- _chain_validity: whether each chain entry is valid at the episode's four cuts.
--   entry: after all events with seq < entry_seq       (J_enter)
--   exact: after all events with seq < adopt_seq       (lookup, ordered by seq)
--   m0:    after all steps < adopt_step                (lookup, step-ordered lower bound)
--   m1:    m0, or published within adopt_step by a    (lookup, step-ordered upper bound)
--          request other than the episode's own
-- An entry's state at a seq cut is the is_pub of its last supply row before the cut (false when
-- none); that row's sup_no at the entry and the adoption cut delimits the rows in the window.
--
-- _chain_probe settles almost every position (its entry-cut state answers every cut). The few
-- others (a supply row of the entry inside the window or inside the lookup step, or a run whose
-- steps go back) take the general lookups: ASOF at the adoption cut, ASOF over the entry's
-- per-step states (as in _step_supply) for M0 and an equi-join on the lookup step for M1, over
-- only those positions' entries.
CREATE OR REPLACE VIEW _chain_validity AS
WITH rest AS MATERIALIZED (
    SELECT r.*, e.request_id
    FROM _chain_probe AS r
    JOIN _entries AS e ON e.ep = r.ep
    WHERE NOT r.settled
),
rest_keys AS (
    SELECT DISTINCT is_rec, hash FROM rest
),
rest_supply AS MATERIALIZED (
    SELECT s.is_rec, s.hash, s.seq, s.step, s.is_pub, s.sup_no, s.request_id
    FROM _supply AS s
    SEMI JOIN rest_keys AS k ON k.is_rec = s.is_rec AND k.hash = s.hash
),
rest_steps AS MATERIALIZED (
    -- _step_supply, for the entries of these positions only
    SELECT
        is_rec,
        hash,
        step,
        arg_max(is_pub, seq) AS valid_after_step,
        bool_or(is_pub) AS published_in_step,
        CASE WHEN min(request_id) FILTER (WHERE is_pub) = max(request_id) FILTER (WHERE is_pub)
             THEN min(request_id) FILTER (WHERE is_pub) END AS sole_publisher
    FROM rest_supply
    GROUP BY is_rec, hash, step
)
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
SELECT
    r.ep, r.is_rec, r.pos, r.hash, r.end_tokens, r.in_reach,
    r.adopt_seq IS NOT NULL AS has_window,
    r.valid_entry,
    r.supply_before_entry,
    CASE WHEN r.adopt_seq IS NOT NULL THEN coalesce(fa.is_pub, false) END AS valid_exact,
    CASE WHEN r.adopt_seq IS NOT NULL THEN coalesce(fa.sup_no, 0) END AS supply_before_adopt,
    CASE WHEN r.adopt_step IS NOT NULL THEN coalesce(s0.valid_after_step, false) END AS valid_m0,
    CASE WHEN r.adopt_step IS NOT NULL
         THEN coalesce(s0.valid_after_step, false)
              OR coalesce(s1.published_in_step AND s1.sole_publisher IS DISTINCT FROM r.request_id,
                          false)
    END AS valid_m1
FROM rest AS r
ASOF LEFT JOIN rest_supply AS fa
    ON fa.is_rec = r.is_rec AND fa.hash = r.hash AND r.adopt_seq > fa.seq
ASOF LEFT JOIN rest_steps AS s0
    ON s0.is_rec = r.is_rec AND s0.hash = r.hash AND r.adopt_step > s0.step
LEFT JOIN rest_steps AS s1
    ON s1.is_rec = r.is_rec AND s1.hash = r.hash AND s1.step = r.adopt_step;

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
