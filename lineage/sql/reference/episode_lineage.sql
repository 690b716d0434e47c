-- episode_lineage: the per-episode answer (SPEC §7; paper App. C.1, F.1, G.2).
--   class:  zero->zero      J_enter = 0, J_adopt = 0
--           positive-equal  J_enter > 0, J_adopt = J_enter
--           zero->positive  J_enter = 0, J_adopt > 0      (newly reusable)
--           deeper          J_enter > 0, J_adopt > J_enter
--           shallower       J_adopt < J_enter             (reduced depth)
--   NULL class: no waiting entry or no adoption recorded for the episode.
--   GapR = R_max - J_adopt at each lookup cut.
CREATE OR REPLACE VIEW episode_lineage AS
WITH changes AS (
    SELECT
        request_id,
        preemption_count,
        count(*) FILTER (WHERE kind = 'publication') AS inc_pubs,
        count(*) FILTER (WHERE kind = 'loss') AS dec_losses,
        count(*) FILTER (WHERE other_request_allocation) AS other_losses
    FROM depth_changes
    GROUP BY request_id, preemption_count
)
SELECT
    x.request_id,
    x.preemption_count,
    x.episode,
    x.entry_seq,
    x.adopt_seq,
    x.adopt_step,
    d.j_enter,
    x.j_adopt,
    CASE
        WHEN d.j_enter IS NULL OR x.j_adopt IS NULL THEN NULL
        WHEN d.j_enter = 0 AND x.j_adopt = 0 THEN 'zero->zero'
        WHEN d.j_enter = 0 THEN 'zero->positive'
        WHEN x.j_adopt = d.j_enter THEN 'positive-equal'
        WHEN x.j_adopt > d.j_enter THEN 'deeper'
        ELSE 'shallower'
    END AS class,
    d.a_max_entry,
    d.r_max_entry,
    d.a_max_m0,
    d.a_max_m1,
    d.a_max_exact,
    d.r_max_m0,
    d.r_max_m1,
    d.r_max_exact,
    d.j_lookup_m0,
    d.j_lookup_m1,
    d.j_lookup_exact,
    d.r_max_m0 - x.j_adopt AS gap_r_m0,
    d.r_max_m1 - x.j_adopt AS gap_r_m1,
    d.r_max_exact - x.j_adopt AS gap_r_exact,
    CASE WHEN x.has_window THEN coalesce(c.inc_pubs, 0) END AS depth_increasing_publications,
    CASE WHEN x.has_window THEN coalesce(c.dec_losses, 0) END AS depth_decreasing_losses,
    CASE WHEN x.has_window THEN coalesce(c.other_losses, 0) END AS other_request_allocation_losses
FROM episodes AS x
LEFT JOIN _episode_depths AS d ON d.ep = x.ep
LEFT JOIN changes AS c
    ON c.request_id = x.request_id AND c.preemption_count = x.preemption_count;

COMMENT ON VIEW episode_lineage IS 'per episode: J_enter, J_adopt, class, lookup A_max/R_max with M0/M1 and exact, window changes';
COMMENT ON COLUMN episode_lineage.request_id IS 'request id';
COMMENT ON COLUMN episode_lineage.preemption_count IS 'episode key: 0 INITIAL, >=1 RESUME';
COMMENT ON COLUMN episode_lineage.episode IS 'INITIAL or RESUME';
COMMENT ON COLUMN episode_lineage.entry_seq IS 'seq of the waiting entry (NULL: none)';
COMMENT ON COLUMN episode_lineage.adopt_seq IS 'seq of the adoption (NULL: none)';
COMMENT ON COLUMN episode_lineage.adopt_step IS 'scheduler step of the adoption lookup';
COMMENT ON COLUMN episode_lineage.j_enter IS 'tokens: J_enter, deepest joint boundary valid at the waiting-entry cut';
COMMENT ON COLUMN episode_lineage.j_adopt IS 'tokens: J_adopt, joint depth recorded by the scheduler';
COMMENT ON COLUMN episode_lineage.class IS 'zero->zero, positive-equal, zero->positive, deeper, shallower (NULL: unclassified)';
COMMENT ON COLUMN episode_lineage.a_max_entry IS 'tokens: A_max at waiting entry';
COMMENT ON COLUMN episode_lineage.r_max_entry IS 'tokens: R_max at waiting entry';
COMMENT ON COLUMN episode_lineage.a_max_m0 IS 'tokens: lookup A_max, M0 (supply before the lookup step)';
COMMENT ON COLUMN episode_lineage.a_max_m1 IS 'tokens: lookup A_max, M1 (also supply published within the step)';
COMMENT ON COLUMN episode_lineage.a_max_exact IS 'tokens: lookup A_max at the adoption seq';
COMMENT ON COLUMN episode_lineage.r_max_m0 IS 'tokens: lookup R_max, M0';
COMMENT ON COLUMN episode_lineage.r_max_m1 IS 'tokens: lookup R_max, M1';
COMMENT ON COLUMN episode_lineage.r_max_exact IS 'tokens: lookup R_max at the adoption seq';
COMMENT ON COLUMN episode_lineage.j_lookup_m0 IS 'tokens: lookup joint depth J, M0';
COMMENT ON COLUMN episode_lineage.j_lookup_m1 IS 'tokens: lookup joint depth J, M1';
COMMENT ON COLUMN episode_lineage.j_lookup_exact IS 'tokens: lookup joint depth J at the adoption seq';
COMMENT ON COLUMN episode_lineage.gap_r_m0 IS 'tokens: GapR = R_max - J_adopt, M0';
COMMENT ON COLUMN episode_lineage.gap_r_m1 IS 'tokens: GapR = R_max - J_adopt, M1';
COMMENT ON COLUMN episode_lineage.gap_r_exact IS 'tokens: GapR = R_max - J_adopt at the adoption seq';
COMMENT ON COLUMN episode_lineage.depth_increasing_publications IS 'publications in the waiting window that raised J (NULL: no window)';
COMMENT ON COLUMN episode_lineage.depth_decreasing_losses IS 'losses in the waiting window that lowered J (NULL: no window)';
COMMENT ON COLUMN episode_lineage.other_request_allocation_losses IS 'of those losses, taken for another request''s allocation (NULL: no window)';
