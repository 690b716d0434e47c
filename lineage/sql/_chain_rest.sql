-- _chain_rest: _chain_validity's rows for the positions _chain_probe leaves unsettled (a supply
-- row of the entry inside the window or inside the lookup step, or a run whose steps go back),
-- by the general lookups: ASOF at the adoption cut, ASOF over the entry's per-step states (as in
-- _step_supply) for M0 and an equi-join on the lookup step for M1, over only those positions'
-- entries.
CREATE OR REPLACE VIEW _chain_rest AS
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

COMMENT ON VIEW _chain_rest IS 'chain validity rows of the positions the probe leaves unsettled';
