-- _episode_depths: A_max, R_max and J of each episode with a waiting entry, at each cut.
--   attention prefix n  = number of leading valid attention blocks; it covers n*ga tokens
--   A_max = deepest recurrent boundary of the chain with boundary <= n*ga
--         = min(floor(n*ga / gr), recurrent keys) * gr
--   R_max = deepest valid recurrent checkpoint, regardless of attention
--   J     = deepest valid recurrent checkpoint with boundary <= n*ga   (J at entry = J_enter)
-- Values are 0 when nothing qualifies, NULL when the cut does not exist (no window / no step).
CREATE OR REPLACE VIEW _episode_depths AS
WITH att AS (
    SELECT
        ep,
        coalesce(min(pos) FILTER (WHERE NOT valid_entry), count(*)) AS n_entry,
        coalesce(min(pos) FILTER (WHERE NOT valid_exact), count(*)) AS n_exact,
        coalesce(min(pos) FILTER (WHERE NOT valid_m0), count(*)) AS n_m0,
        coalesce(min(pos) FILTER (WHERE NOT valid_m1), count(*)) AS n_m1
    FROM _chain_validity
    WHERE NOT is_rec
    GROUP BY ep
),
prefix AS (
    SELECT
        e.ep,
        e.has_window AS has_exact,
        e.has_window AND e.adopt_step >= 0 AS has_step,
        len(e.recurrent_chain) AS recurrent_keys,
        p.recurrent_grid_tokens AS gr,
        coalesce(att.n_entry, 0) * p.attention_grid_tokens AS attn_entry,
        coalesce(att.n_exact, 0) * p.attention_grid_tokens AS attn_exact,
        coalesce(att.n_m0, 0) * p.attention_grid_tokens AS attn_m0,
        coalesce(att.n_m1, 0) * p.attention_grid_tokens AS attn_m1
    FROM _entries AS e
    CROSS JOIN _params AS p
    LEFT JOIN att ON att.ep = e.ep
),
rec AS (
    SELECT
        r.ep,
        max(r.end_tokens) FILTER (WHERE r.valid_entry) AS r_entry,
        max(r.end_tokens) FILTER (WHERE r.valid_entry AND r.end_tokens <= x.attn_entry) AS j_entry,
        max(r.end_tokens) FILTER (WHERE r.valid_exact) AS r_exact,
        max(r.end_tokens) FILTER (WHERE r.valid_exact AND r.end_tokens <= x.attn_exact) AS j_exact,
        max(r.end_tokens) FILTER (WHERE r.valid_m0) AS r_m0,
        max(r.end_tokens) FILTER (WHERE r.valid_m0 AND r.end_tokens <= x.attn_m0) AS j_m0,
        max(r.end_tokens) FILTER (WHERE r.valid_m1) AS r_m1,
        max(r.end_tokens) FILTER (WHERE r.valid_m1 AND r.end_tokens <= x.attn_m1) AS j_m1
    FROM (SELECT * FROM _chain_validity WHERE is_rec) AS r
    JOIN prefix AS x ON x.ep = r.ep
    GROUP BY r.ep
)
SELECT
    x.ep,
    x.attn_entry AS attention_prefix_entry,
    least(x.attn_entry // x.gr, x.recurrent_keys) * x.gr AS a_max_entry,
    coalesce(r.r_entry, 0) AS r_max_entry,
    coalesce(r.j_entry, 0) AS j_enter,
    CASE WHEN x.has_exact THEN least(x.attn_exact // x.gr, x.recurrent_keys) * x.gr
    END AS a_max_exact,
    CASE WHEN x.has_exact THEN coalesce(r.r_exact, 0) END AS r_max_exact,
    CASE WHEN x.has_exact THEN coalesce(r.j_exact, 0) END AS j_lookup_exact,
    CASE WHEN x.has_step THEN least(x.attn_m0 // x.gr, x.recurrent_keys) * x.gr END AS a_max_m0,
    CASE WHEN x.has_step THEN coalesce(r.r_m0, 0) END AS r_max_m0,
    CASE WHEN x.has_step THEN coalesce(r.j_m0, 0) END AS j_lookup_m0,
    CASE WHEN x.has_step THEN least(x.attn_m1 // x.gr, x.recurrent_keys) * x.gr END AS a_max_m1,
    CASE WHEN x.has_step THEN coalesce(r.r_m1, 0) END AS r_max_m1,
    CASE WHEN x.has_step THEN coalesce(r.j_m1, 0) END AS j_lookup_m1
FROM prefix AS x
LEFT JOIN rec AS r ON r.ep = x.ep;

COMMENT ON VIEW _episode_depths IS 'A_max, R_max and J of each entered episode at the entry, exact, M0 and M1 cuts';
COMMENT ON COLUMN _episode_depths.ep IS 'episode id';
COMMENT ON COLUMN _episode_depths.attention_prefix_entry IS 'tokens covered by the contiguous valid attention prefix at entry';
COMMENT ON COLUMN _episode_depths.a_max_entry IS 'tokens: A_max at waiting entry';
COMMENT ON COLUMN _episode_depths.r_max_entry IS 'tokens: R_max at waiting entry';
COMMENT ON COLUMN _episode_depths.j_enter IS 'tokens: J_enter, joint depth at the waiting-entry cut';
COMMENT ON COLUMN _episode_depths.a_max_exact IS 'tokens: A_max at the adoption cut by seq';
COMMENT ON COLUMN _episode_depths.r_max_exact IS 'tokens: R_max at the adoption cut by seq';
COMMENT ON COLUMN _episode_depths.j_lookup_exact IS 'tokens: J at the adoption cut by seq';
COMMENT ON COLUMN _episode_depths.a_max_m0 IS 'tokens: A_max, supply published before the lookup step';
COMMENT ON COLUMN _episode_depths.r_max_m0 IS 'tokens: R_max, supply published before the lookup step';
COMMENT ON COLUMN _episode_depths.j_lookup_m0 IS 'tokens: J, supply published before the lookup step';
COMMENT ON COLUMN _episode_depths.a_max_m1 IS 'tokens: A_max, also counting supply published within the lookup step';
COMMENT ON COLUMN _episode_depths.r_max_m1 IS 'tokens: R_max, also counting supply published within the lookup step';
COMMENT ON COLUMN _episode_depths.j_lookup_m1 IS 'tokens: J, also counting supply published within the lookup step';
