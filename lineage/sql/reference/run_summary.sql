-- run_summary: one row per run, the numbers the report prints. Depth means are over classified
-- INITIAL episodes with a lookup cut (the paper's Table G-3 rule excludes RESUME episodes).
CREATE OR REPLACE VIEW run_summary AS
WITH l AS (
    SELECT * FROM episode_lineage
),
dec AS (
    SELECT
        count(DISTINCT seq) FILTER (WHERE kind = 'publication') AS depth_increasing_publications,
        count(DISTINCT seq) FILTER (WHERE kind = 'loss') AS depth_decreasing_losses
    FROM depth_changes
),
sup AS (
    SELECT
        count(*) FILTER (WHERE is_pub) AS publications,
        count(*) FILTER (WHERE NOT is_pub) AS losses
    FROM _supply
),
agg AS (
    SELECT
        count(*) AS episodes,
        count(*) FILTER (WHERE episode = 'INITIAL') AS initial_episodes,
        count(*) FILTER (WHERE episode = 'RESUME') AS resume_episodes,
        count(*) FILTER (WHERE class IS NOT NULL) AS classified_episodes,
        count(*) FILTER (WHERE entry_seq IS NOT NULL AND adopt_seq IS NULL) AS unadopted_episodes,
        count(*) FILTER (WHERE entry_seq IS NULL) AS episodes_without_entry,
        count(*) FILTER (WHERE class = 'shallower') AS shallower_episodes,
        count(*) FILTER (WHERE class = 'shallower' AND other_request_allocation_losses > 0)
            AS shallower_with_other_request_loss,
        count(*) FILTER (WHERE episode = 'INITIAL' AND class IS NOT NULL
                          AND r_max_m0 IS NOT NULL) AS mean_scope_episodes,
        avg(j_adopt) FILTER (WHERE episode = 'INITIAL' AND class IS NOT NULL
                             AND r_max_m0 IS NOT NULL) AS mean_j_adopt,
        avg(r_max_m0) FILTER (WHERE episode = 'INITIAL' AND class IS NOT NULL) AS mean_r_max_m0,
        avg(r_max_m1) FILTER (WHERE episode = 'INITIAL' AND class IS NOT NULL) AS mean_r_max_m1,
        avg(r_max_exact) FILTER (WHERE episode = 'INITIAL' AND class IS NOT NULL
                                 AND r_max_m0 IS NOT NULL) AS mean_r_max_exact,
        avg(a_max_m0) FILTER (WHERE episode = 'INITIAL' AND class IS NOT NULL) AS mean_a_max_m0,
        avg(a_max_m1) FILTER (WHERE episode = 'INITIAL' AND class IS NOT NULL) AS mean_a_max_m1,
        avg(a_max_exact) FILTER (WHERE episode = 'INITIAL' AND class IS NOT NULL
                                 AND r_max_m0 IS NOT NULL) AS mean_a_max_exact
    FROM l
)
SELECT agg.*, sup.publications, sup.losses, dec.depth_increasing_publications,
       dec.depth_decreasing_losses
FROM agg CROSS JOIN sup CROSS JOIN dec;

COMMENT ON VIEW run_summary IS 'one row of run totals: episodes, attribution, depth means, supply totals';
COMMENT ON COLUMN run_summary.episodes IS 'episodes (request_id, preemption_count) seen';
COMMENT ON COLUMN run_summary.initial_episodes IS 'episodes with preemption_count 0';
COMMENT ON COLUMN run_summary.resume_episodes IS 'episodes with preemption_count >= 1';
COMMENT ON COLUMN run_summary.classified_episodes IS 'episodes with both J_enter and J_adopt';
COMMENT ON COLUMN run_summary.unadopted_episodes IS 'entered but never adopted before the end of the trace';
COMMENT ON COLUMN run_summary.episodes_without_entry IS 'adopted with no waiting entry recorded';
COMMENT ON COLUMN run_summary.shallower_episodes IS 'n: episodes with J_adopt < J_enter';
COMMENT ON COLUMN run_summary.shallower_with_other_request_loss IS 'k: shallower episodes with >= 1 depth-decreasing loss for another request''s allocation';
COMMENT ON COLUMN run_summary.mean_scope_episodes IS 'classified INITIAL episodes with a lookup step: the scope of the means';
COMMENT ON COLUMN run_summary.mean_j_adopt IS 'tokens/request: mean J_adopt over the mean scope';
COMMENT ON COLUMN run_summary.mean_r_max_m0 IS 'tokens/request: mean lookup R_max, M0';
COMMENT ON COLUMN run_summary.mean_r_max_m1 IS 'tokens/request: mean lookup R_max, M1';
COMMENT ON COLUMN run_summary.mean_r_max_exact IS 'tokens/request: mean lookup R_max at the adoption seq';
COMMENT ON COLUMN run_summary.mean_a_max_m0 IS 'tokens/request: mean lookup A_max, M0';
COMMENT ON COLUMN run_summary.mean_a_max_m1 IS 'tokens/request: mean lookup A_max, M1';
COMMENT ON COLUMN run_summary.mean_a_max_exact IS 'tokens/request: mean lookup A_max at the adoption seq';
COMMENT ON COLUMN run_summary.publications IS 'publication rows of attention blocks and checkpoints';
COMMENT ON COLUMN run_summary.losses IS 'loss rows of attention blocks and checkpoints';
COMMENT ON COLUMN run_summary.depth_increasing_publications IS 'distinct publications that raised some waiting episode''s J';
COMMENT ON COLUMN run_summary.depth_decreasing_losses IS 'distinct losses that lowered some waiting episode''s J';
