-- reuse_diagnosis: per INITIAL episode, the prompt tokens another request had computed before
-- it (shared, capped at L - 1), the tokens it reused (J_adopt), and every token of the
-- difference under one cause (paper §2.1, §3.1, App. C.1, G.2; SPEC §5, §7):
--   grid               no recurrent boundary between the deepest one <= shared and shared:
--                      the checkpoint grid (recurrent_grid_tokens) is coarser than the prefix
--   never-published,   per boundary J_adopt < b <= shared not adopted (_reuse_boundaries),
--   not-yet-published, the tokens between it and the boundary below
--   lost,
--   attention-lost
--   cap                the next boundary above is the prompt's end L, which the L - 1 cap
--                      excludes (a prompt of a whole number of grid units, fully shared)
--   other              what is left: shared - reused - the causes above (0 on a clean trace;
--                      negative when a request reused more than an earlier one shared)
--     gr = 1568, L = 1000, shared 600, J_adopt 0: grid 600 (no boundary inside 600 tokens)
--     gr = 512, L = 1024, identical to an earlier prompt: shared 1023, J_adopt 512, cap 511
CREATE OR REPLACE VIEW reuse_diagnosis AS
WITH ep AS (
    SELECT
        s.*,
        e.j_adopt,
        e.adopt_step,
        p.recurrent_grid_tokens AS gr,
        s.shared_tokens // p.recurrent_grid_tokens * p.recurrent_grid_tokens AS deepest
    FROM _shared_prefix AS s
    JOIN _entries AS e ON e.ep = s.ep
    CROSS JOIN _params AS p
    WHERE e.j_adopt IS NOT NULL
),
seg AS (
    SELECT
        ep,
        coalesce(sum(tokens) FILTER (WHERE cause = 'never-published'), 0) AS never_published,
        coalesce(sum(tokens) FILTER (WHERE cause = 'not-yet-published'), 0) AS not_yet_published,
        coalesce(sum(tokens) FILTER (WHERE cause = 'lost'), 0) AS lost,
        coalesce(sum(tokens) FILTER (WHERE cause = 'attention-lost'), 0) AS attention_lost,
        coalesce(sum(tokens) FILTER (WHERE cause = 'other'), 0) AS other_boundaries,
        arg_max(detail, boundary) AS deepest_detail,
        count(*) AS boundaries
    FROM _reuse_boundaries
    GROUP BY ep
),
top AS (
    SELECT
        x.*,
        greatest(x.shared_tokens - greatest(x.deepest, x.j_adopt), 0) AS top_tokens,
        x.shared_raw_tokens >= x.deepest + x.gr AS capped
    FROM ep AS x
),
counted AS (
    SELECT
        t.ep,
        t.request_id,
        t.prompt_tokens,
        t.shared_source,
        t.shared_raw_tokens,
        t.shared_tokens,
        t.shared_with,
        t.j_adopt AS reused_tokens,
        t.shared_tokens - t.j_adopt AS unreused_tokens,
        CASE WHEN t.capped THEN 0 ELSE t.top_tokens END AS grid_tokens,
        coalesce(g.never_published, 0) AS never_published_tokens,
        coalesce(g.not_yet_published, 0) AS not_yet_published_tokens,
        coalesce(g.lost, 0) AS lost_tokens,
        coalesce(g.attention_lost, 0) AS attention_lost_tokens,
        CASE WHEN t.capped THEN t.top_tokens ELSE 0 END AS cap_tokens,
        t.gr,
        t.deepest,
        t.adopt_step,
        coalesce(g.boundaries, 0) AS boundaries,
        g.deepest_detail
    FROM top AS t
    LEFT JOIN seg AS g ON g.ep = t.ep
),
full_rows AS (
    SELECT
        *,
        unreused_tokens - grid_tokens - never_published_tokens - not_yet_published_tokens
            - lost_tokens - attention_lost_tokens - cap_tokens AS other_tokens
    FROM counted
),
ranked AS (
    SELECT
        *,
        greatest(grid_tokens, never_published_tokens, not_yet_published_tokens, lost_tokens,
                 attention_lost_tokens, cap_tokens, abs(other_tokens)) AS most
    FROM full_rows
)
SELECT
    request_id,
    prompt_tokens,
    shared_source,
    shared_tokens,
    shared_with,
    reused_tokens,
    unreused_tokens,
    grid_tokens,
    never_published_tokens,
    not_yet_published_tokens,
    lost_tokens,
    attention_lost_tokens,
    cap_tokens,
    other_tokens,
    CASE
        WHEN most = 0 THEN 'none'
        WHEN grid_tokens = most THEN 'grid'
        WHEN never_published_tokens = most THEN 'never-published'
        WHEN not_yet_published_tokens = most THEN 'not-yet-published'
        WHEN lost_tokens = most THEN 'lost'
        WHEN attention_lost_tokens = most THEN 'attention-lost'
        WHEN cap_tokens = most THEN 'cap'
        ELSE 'other'
    END AS cause,
    concat_ws('; ',
        CASE WHEN grid_tokens > 0
             THEN format('grid {} tokens: no recurrent boundary in ({}, {}]', gr, deepest,
                         shared_tokens)
        END,
        CASE WHEN cap_tokens > 0
             THEN format('the boundary at L = {} is past the L - 1 cap', deepest + gr)
        END,
        CASE WHEN boundaries > 0
             THEN deepest_detail
                  || CASE WHEN boundaries > 1
                          THEN format(' (and {} boundaries below)', boundaries - 1)
                          ELSE '' END
        END,
        CASE WHEN other_tokens < 0
             THEN format('reused {} tokens more than an earlier request shared',
                         -other_tokens)
        END
    ) AS detail,
    adopt_step
FROM ranked;

COMMENT ON VIEW reuse_diagnosis IS 'per INITIAL episode: shared prefix, reused tokens, and the unreused tokens by cause';
COMMENT ON COLUMN reuse_diagnosis.request_id IS 'request id';
COMMENT ON COLUMN reuse_diagnosis.prompt_tokens IS 'tokens: prompt length L at waiting entry (0: not recorded, then no cap)';
COMMENT ON COLUMN reuse_diagnosis.shared_source IS 'tokens (prompt token ids) or chain (attention block keys: to the attention block)';
COMMENT ON COLUMN reuse_diagnosis.shared_tokens IS 'tokens: longest common prefix with an earlier-entered request, capped at L - 1';
COMMENT ON COLUMN reuse_diagnosis.shared_with IS 'an earlier-entered request holding that prefix (by chain: the earliest; '''' when none)';
COMMENT ON COLUMN reuse_diagnosis.reused_tokens IS 'tokens: J_adopt of the INITIAL episode';
COMMENT ON COLUMN reuse_diagnosis.unreused_tokens IS 'tokens: shared - reused (the sum of the cause columns)';
COMMENT ON COLUMN reuse_diagnosis.grid_tokens IS 'tokens above the deepest recurrent boundary <= shared (grid coarser than the prefix)';
COMMENT ON COLUMN reuse_diagnosis.never_published_tokens IS 'tokens below boundaries whose checkpoint no earlier request published (before the lookup or after)';
COMMENT ON COLUMN reuse_diagnosis.not_yet_published_tokens IS 'tokens below boundaries published only after (or within the step of) the lookup';
COMMENT ON COLUMN reuse_diagnosis.lost_tokens IS 'tokens below boundaries whose checkpoint was published and lost before the lookup';
COMMENT ON COLUMN reuse_diagnosis.attention_lost_tokens IS 'tokens below boundaries whose checkpoint was valid but attention prefix was not (A_max < boundary)';
COMMENT ON COLUMN reuse_diagnosis.cap_tokens IS 'tokens above the deepest boundary <= L - 1 when the next one, at L, was shared (the L - 1 cap)';
COMMENT ON COLUMN reuse_diagnosis.other_tokens IS 'tokens: unexplained rest (0 on a clean trace; negative: reused more than shared)';
COMMENT ON COLUMN reuse_diagnosis.cause IS 'the cause holding the most unreused tokens (none when all shared tokens were reused)';
COMMENT ON COLUMN reuse_diagnosis.detail IS 'the grid, the cap and the deepest unadopted boundary, as the trace shows them';
COMMENT ON COLUMN reuse_diagnosis.adopt_step IS 'scheduler step of the lookup';
