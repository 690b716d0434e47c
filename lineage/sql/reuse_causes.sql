-- reuse_causes: unreused shared-prefix tokens of the INITIAL episodes per cause, in the
-- precedence order of reuse_diagnosis, with the requests each cause affected. The rows' tokens
-- sum to the episodes' shared - reused tokens (other included, so nothing goes unaccounted).
CREATE OR REPLACE VIEW reuse_causes AS
WITH causes AS (
    SELECT * FROM (VALUES
        (1, 'grid'), (2, 'never-published'), (3, 'not-yet-published'), (4, 'lost'),
        (5, 'attention-lost'), (6, 'cap'), (7, 'other')
    ) AS c (rank, cause)
),
long AS (
    SELECT
        c.cause,
        CASE c.cause
            WHEN 'grid' THEN d.grid_tokens
            WHEN 'never-published' THEN d.never_published_tokens
            WHEN 'not-yet-published' THEN d.not_yet_published_tokens
            WHEN 'lost' THEN d.lost_tokens
            WHEN 'attention-lost' THEN d.attention_lost_tokens
            WHEN 'cap' THEN d.cap_tokens
            ELSE d.other_tokens
        END AS tokens
    FROM reuse_diagnosis AS d
    CROSS JOIN causes AS c
),
total AS (
    SELECT sum(unreused_tokens) AS unreused FROM reuse_diagnosis
)
SELECT
    c.rank,
    c.cause,
    coalesce(sum(l.tokens), 0) AS tokens,
    count(*) FILTER (WHERE l.tokens <> 0) AS requests,
    CASE WHEN t.unreused > 0 THEN coalesce(sum(l.tokens), 0) / t.unreused END AS share
FROM causes AS c
CROSS JOIN total AS t
LEFT JOIN long AS l ON l.cause = c.cause
GROUP BY c.rank, c.cause, t.unreused
ORDER BY c.rank;

COMMENT ON VIEW reuse_causes IS 'unreused shared-prefix tokens of INITIAL episodes per cause';
COMMENT ON COLUMN reuse_causes.rank IS 'precedence: 1 grid, 2 never-published, 3 not-yet-published, 4 lost, 5 attention-lost, 6 cap, 7 other';
COMMENT ON COLUMN reuse_causes.cause IS 'grid, never-published, not-yet-published, lost, attention-lost, cap, other';
COMMENT ON COLUMN reuse_causes.tokens IS 'tokens of shared - reused attributed to the cause, over every INITIAL episode';
COMMENT ON COLUMN reuse_causes.requests IS 'INITIAL episodes with a non-zero amount under the cause';
COMMENT ON COLUMN reuse_causes.share IS 'tokens / all unreused tokens (NULL: nothing unreused)';
