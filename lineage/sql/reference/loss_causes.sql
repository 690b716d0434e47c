-- loss_causes: loss rows per cause and state kind: all recorded, those that invalidated a valid
-- entry, and the distinct ones that lowered some waiting episode's J.
CREATE OR REPLACE VIEW loss_causes AS
WITH dec AS (
    SELECT DISTINCT seq FROM depth_changes WHERE kind = 'loss'
)
SELECT
    s.cause,
    CASE WHEN s.is_rec THEN 'recurrent' ELSE 'attention' END AS state_kind,
    count(*) AS losses,
    count(f.seq) AS effective_losses,
    count(dec.seq) AS depth_decreasing_losses
FROM _supply AS s
LEFT JOIN _flips AS f ON f.seq = s.seq
LEFT JOIN dec ON dec.seq = s.seq
WHERE NOT s.is_pub
GROUP BY s.cause, s.is_rec;

COMMENT ON VIEW loss_causes IS 'losses per cause and state kind';
COMMENT ON COLUMN loss_causes.cause IS 'allocation, slab_reclaim, eviction, invalidation, preemption, finish, none';
COMMENT ON COLUMN loss_causes.state_kind IS 'attention or recurrent';
COMMENT ON COLUMN loss_causes.losses IS 'loss rows recorded';
COMMENT ON COLUMN loss_causes.effective_losses IS 'loss rows that invalidated a valid entry';
COMMENT ON COLUMN loss_causes.depth_decreasing_losses IS 'distinct loss events that lowered at least one waiting episode''s J';
