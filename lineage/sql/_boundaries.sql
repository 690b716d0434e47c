-- _boundaries: per windowed episode and recurrent boundary b (chain position rpos), the number of
-- entries that b still lacks at waiting entry: invalid attention blocks among the first b/ga,
-- blocks the attention chain does not reach, and the checkpoint itself if invalid. b is jointly
-- reusable exactly when missing = 0, and J = the deepest such b.
--
--   ga = 512, chain valid = [x, ., x], ckpts valid at 512, 1536:
--     b=512:  blocks {0} ok, ckpt ok          missing 0
--     b=1024: blocks {0,1}: 1 invalid, ckpt . missing 2
--     b=1536: blocks {0,1,2}: 1 invalid      missing 1     -> J = 512
CREATE OR REPLACE VIEW _boundaries AS
WITH att AS (
    SELECT
        request_id,
        preemption_count,
        pos,
        sum(CASE WHEN valid_entry THEN 0 ELSE 1 END)
            OVER (PARTITION BY request_id, preemption_count ORDER BY pos) AS invalid_through
    FROM _chain_validity
    WHERE state_kind = 'attention' AND adopt_seq IS NOT NULL
),
rec AS (
    SELECT
        r.request_id,
        r.preemption_count,
        r.pos AS rpos,
        r.end_tokens,
        r.valid_entry,
        r.end_tokens // p.attention_grid_tokens AS blocks_needed,
        len(e.chain) AS attention_keys
    FROM _chain_validity AS r
    CROSS JOIN _params AS p
    JOIN _entries AS e
        ON e.request_id = r.request_id AND e.preemption_count = r.preemption_count
    WHERE r.state_kind = 'recurrent' AND r.adopt_seq IS NOT NULL
)
SELECT
    rec.request_id,
    rec.preemption_count,
    rec.rpos,
    rec.end_tokens,
    rec.blocks_needed,
    coalesce(att.invalid_through, 0)
        + greatest(rec.blocks_needed - rec.attention_keys, 0)
        + CASE WHEN rec.valid_entry THEN 0 ELSE 1 END AS missing_at_entry
FROM rec
LEFT JOIN att
    ON att.request_id = rec.request_id AND att.preemption_count = rec.preemption_count
   AND att.pos = least(rec.blocks_needed, rec.attention_keys) - 1;

COMMENT ON VIEW _boundaries IS 'recurrent boundaries of windowed episodes and what each lacks at entry';
COMMENT ON COLUMN _boundaries.request_id IS 'request id';
COMMENT ON COLUMN _boundaries.preemption_count IS 'episode key';
COMMENT ON COLUMN _boundaries.rpos IS '0-based position in the recurrent chain';
COMMENT ON COLUMN _boundaries.end_tokens IS 'tokens: the boundary b';
COMMENT ON COLUMN _boundaries.blocks_needed IS 'attention blocks covering [0, b): b / ga';
COMMENT ON COLUMN _boundaries.missing_at_entry IS 'entries b lacks at waiting entry (0: jointly reusable)';
