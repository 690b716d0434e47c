-- depth_changes: the events inside each waiting window (entry_seq, adopt_seq) that change the
-- episode's joint depth J: depth-increasing publications (j_after > j_before) and
-- depth-decreasing losses (j_after < j_before). Only a boundary transition can move J, so J is
-- evaluated at those moments only: J after an event = deepest boundary reusable after it.
-- other_request_allocation marks the losses the attribution counts: taken for an allocation
-- (cause allocation, or a slab reclaim made for one) by a request other than the episode's.
CREATE OR REPLACE VIEW depth_changes AS
WITH points AS (
    SELECT DISTINCT ep, seq FROM _boundary_transitions
),
grid AS (
    SELECT p.ep, p.seq, b.rpos, b.end_tokens, b.missing_at_entry = 0 AS valid_at_entry
    FROM points AS p
    JOIN _boundaries AS b ON b.ep = p.ep
),
state AS (
    SELECT g.*, coalesce(t.valid_after, g.valid_at_entry) AS valid
    FROM grid AS g
    ASOF LEFT JOIN _boundary_transitions AS t
        ON t.ep = g.ep AND t.rpos = g.rpos AND g.seq >= t.seq
),
after AS (
    SELECT ep, seq, coalesce(max(end_tokens) FILTER (WHERE valid), 0) AS j_after
    FROM state
    GROUP BY ep, seq
),
at_entry AS (
    SELECT ep, coalesce(max(end_tokens) FILTER (WHERE missing_at_entry = 0), 0) AS j_enter
    FROM _boundaries
    GROUP BY ep
),
sequenced AS (
    SELECT
        a.ep, a.seq, a.j_after,
        coalesce(lag(a.j_after) OVER (PARTITION BY a.ep ORDER BY a.seq), e.j_enter) AS j_before
    FROM after AS a
    JOIN at_entry AS e ON e.ep = a.ep
)
SELECT
    x.request_id,
    x.preemption_count,
    s.seq,
    f.step,
    CASE WHEN f.is_pub THEN 'publication' ELSE 'loss' END AS kind,
    CASE WHEN f.is_rec THEN 'recurrent' ELSE 'attention' END AS state_kind,
    f.hash,
    f.depth,
    f.cause,
    f.requester,
    f.request_id AS event_request_id,
    s.j_before,
    s.j_after,
    (NOT f.is_pub AND f.requester <> '' AND f.requester <> x.request_id
     AND f.cause IN ('allocation', 'slab_reclaim')) AS other_request_allocation
FROM sequenced AS s
JOIN _entries AS x ON x.ep = s.ep
JOIN _flips AS f ON f.seq = s.seq
WHERE s.j_after <> s.j_before;

COMMENT ON VIEW depth_changes IS 'in-window events that move an episode''s joint depth J';
COMMENT ON COLUMN depth_changes.request_id IS 'request id of the waiting episode';
COMMENT ON COLUMN depth_changes.preemption_count IS 'episode key';
COMMENT ON COLUMN depth_changes.seq IS 'seq of the event';
COMMENT ON COLUMN depth_changes.step IS 'scheduler step of the event';
COMMENT ON COLUMN depth_changes.kind IS 'publication (depth-increasing) or loss (depth-decreasing)';
COMMENT ON COLUMN depth_changes.state_kind IS 'attention or recurrent entry that changed';
COMMENT ON COLUMN depth_changes.hash IS '64-bit key of the entry';
COMMENT ON COLUMN depth_changes.depth IS 'tokens: boundary of the entry';
COMMENT ON COLUMN depth_changes.cause IS 'loss cause: allocation, slab_reclaim, eviction, ...';
COMMENT ON COLUMN depth_changes.requester IS 'request whose allocation caused the loss';
COMMENT ON COLUMN depth_changes.event_request_id IS 'request the event is about (producer of a publication)';
COMMENT ON COLUMN depth_changes.j_before IS 'tokens: J just before the event';
COMMENT ON COLUMN depth_changes.j_after IS 'tokens: J just after the event';
COMMENT ON COLUMN depth_changes.other_request_allocation IS 'a loss for another request''s allocation (cause allocation or slab_reclaim)';
