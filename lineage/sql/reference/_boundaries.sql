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
        ep,
        pos,
        sum(CASE WHEN valid_entry THEN 0 ELSE 1 END) OVER (PARTITION BY ep ORDER BY pos)
            AS invalid_through
    FROM _chain_validity
    WHERE NOT is_rec AND has_window
),
rec AS (
    SELECT
        r.ep,
        r.pos AS rpos,
        r.end_tokens,
        r.valid_entry,
        r.end_tokens // p.attention_grid_tokens AS blocks_needed,
        len(e.chain) AS attention_keys
    FROM _chain_validity AS r
    CROSS JOIN _params AS p
    JOIN _entries AS e ON e.ep = r.ep
    WHERE r.is_rec AND r.has_window
)
SELECT
    rec.ep,
    rec.rpos,
    rec.end_tokens,
    rec.blocks_needed,
    coalesce(att.invalid_through, 0)
        + greatest(rec.blocks_needed - rec.attention_keys, 0)
        + CASE WHEN rec.valid_entry THEN 0 ELSE 1 END AS missing_at_entry
FROM rec
LEFT JOIN att
    ON att.ep = rec.ep AND att.pos = least(rec.blocks_needed, rec.attention_keys) - 1;

COMMENT ON VIEW _boundaries IS 'recurrent boundaries of windowed episodes and what each lacks at entry';
COMMENT ON COLUMN _boundaries.ep IS 'episode id';
COMMENT ON COLUMN _boundaries.rpos IS '0-based position in the recurrent chain';
COMMENT ON COLUMN _boundaries.end_tokens IS 'tokens: the boundary b';
COMMENT ON COLUMN _boundaries.blocks_needed IS 'attention blocks covering [0, b): b / ga';
COMMENT ON COLUMN _boundaries.missing_at_entry IS 'entries b lacks at waiting entry (0: jointly reusable)';
