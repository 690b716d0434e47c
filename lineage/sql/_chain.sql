-- _chain: one row per (episode, chain position). Attention position i is the block covering
-- [i*ga, (i+1)*ga); recurrent position j is the checkpoint at boundary (j+1)*gr:
--
--     ga = 512, gr = 512 (S0-S2)      |blk0|blk1|blk2|            ckpt@512 ckpt@1024 ckpt@1536
--     ga = 16, gr = 1792 (D0)         112 blocks per checkpoint    ckpt@1792 ckpt@3584
--
-- adopt_seq / adopt_step are the lookup cuts, NULL where the episode has no window (or, for
-- adopt_step, when the lookup step is unknown).
CREATE OR REPLACE VIEW _chain AS
WITH ep AS (
    SELECT
        ep,
        request_id,
        entry_seq,
        chain,
        recurrent_chain,
        CASE WHEN has_window THEN adopt_seq END AS adopt_seq,
        CASE WHEN has_window AND adopt_step >= 0 THEN adopt_step END AS adopt_step
    FROM _entries
),
att AS (
    SELECT
        ep, request_id, entry_seq, adopt_seq, adopt_step,
        len(recurrent_chain) AS recurrent_keys,
        unnest(chain) AS hash,
        generate_subscripts(chain, 1) - 1 AS pos
    FROM ep
),
rec AS (
    SELECT
        ep, request_id, entry_seq, adopt_seq, adopt_step,
        unnest(recurrent_chain) AS hash,
        generate_subscripts(recurrent_chain, 1) - 1 AS pos
    FROM ep
)
SELECT
    att.ep, att.request_id, att.entry_seq, att.adopt_seq, att.adopt_step,
    false AS is_rec,
    att.pos,
    att.hash,
    (att.pos + 1) * p.attention_grid_tokens AS end_tokens,
    att.pos < att.recurrent_keys * (p.recurrent_grid_tokens // p.attention_grid_tokens)
        AS in_reach
FROM att CROSS JOIN _params AS p
UNION ALL
SELECT
    rec.ep, rec.request_id, rec.entry_seq, rec.adopt_seq, rec.adopt_step,
    true AS is_rec,
    rec.pos,
    rec.hash,
    (rec.pos + 1) * p.recurrent_grid_tokens AS end_tokens,
    true AS in_reach
FROM rec CROSS JOIN _params AS p;

COMMENT ON VIEW _chain IS 'episode chain positions with their grid boundaries and cuts';
COMMENT ON COLUMN _chain.ep IS 'episode id (_entries.ep)';
COMMENT ON COLUMN _chain.request_id IS 'request id of the episode';
COMMENT ON COLUMN _chain.entry_seq IS 'J_enter cut: state after every event with seq < entry_seq';
COMMENT ON COLUMN _chain.adopt_seq IS 'exact lookup cut (NULL: no window)';
COMMENT ON COLUMN _chain.adopt_step IS 'lookup step for M0/M1 (NULL: no window or unknown step)';
COMMENT ON COLUMN _chain.is_rec IS 'true: recurrent checkpoint position; false: attention block';
COMMENT ON COLUMN _chain.pos IS '0-based position in its chain';
COMMENT ON COLUMN _chain.hash IS '64-bit cache key at this position';
COMMENT ON COLUMN _chain.end_tokens IS 'tokens: end of the block / boundary of the checkpoint';
COMMENT ON COLUMN _chain.in_reach IS 'a checkpoint, or a block below the deepest checkpoint boundary (others never move J)';
