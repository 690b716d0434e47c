-- _shared_prefix: per INITIAL episode, how many prompt tokens another request had computed
-- before it: the longest common prefix with any request that entered earlier (SPEC §5, §7),
-- capped at L - 1 for a prompt of L tokens (vLLM caps a hit there, and so does the supply).
-- Token ids (_token_prefix) give it to the token; without them the attention hash chains give
-- it to the block: the keys are prefix-dependent, so position n of two chains holding one key
-- means their first (n + 1) * ga tokens agree, and the deepest position whose key an
-- earlier-entered request's chain held at the same position is the shared prefix.
--     ga = 512, r1 = [a b c], r2 = [a b x], r2 entered after r1: shared 1,024 tokens, with r1
CREATE OR REPLACE VIEW _shared_prefix AS
WITH initial AS (
    SELECT ep, request_id, entry_seq, prompt_tokens, chain
    FROM _entries
    WHERE preemption_count = 0
),
pos AS (
    SELECT
        ep,
        request_id,
        entry_seq,
        unnest(chain) AS hash,
        generate_subscripts(chain, 1) AS n
    FROM initial
),
first_holder AS (
    SELECT n, hash, min(entry_seq) AS first_seq, arg_min(request_id, entry_seq) AS first_request
    FROM pos
    GROUP BY n, hash
),
matched AS (
    SELECT p.ep, p.n AS blocks, f.first_request AS shared_with
    FROM pos AS p
    JOIN first_holder AS f ON f.n = p.n AND f.hash = p.hash AND f.first_seq < p.entry_seq
    QUALIFY row_number() OVER (PARTITION BY p.ep ORDER BY p.n DESC) = 1
),
raw AS (
    SELECT
        i.ep,
        i.request_id,
        i.prompt_tokens,
        t.request_id IS NOT NULL AS by_tokens,
        CASE WHEN t.request_id IS NOT NULL THEN t.shared_raw_tokens
             ELSE coalesce(m.blocks, 0) * p.attention_grid_tokens
        END AS shared_raw_tokens,
        CASE WHEN t.request_id IS NOT NULL THEN t.shared_with
             ELSE coalesce(m.shared_with, '')
        END AS shared_with
    FROM initial AS i
    CROSS JOIN _params AS p
    LEFT JOIN matched AS m ON m.ep = i.ep
    LEFT JOIN _token_prefix AS t ON t.request_id = i.request_id
)
SELECT
    ep,
    request_id,
    prompt_tokens,
    CASE WHEN by_tokens THEN 'tokens' ELSE 'chain' END AS shared_source,
    shared_raw_tokens,
    CASE WHEN prompt_tokens > 0 THEN least(shared_raw_tokens, prompt_tokens - 1)
         ELSE shared_raw_tokens
    END AS shared_tokens,
    shared_with
FROM raw;

COMMENT ON VIEW _shared_prefix IS 'per INITIAL episode: the prefix an earlier-entered request shares, capped at L - 1';
COMMENT ON COLUMN _shared_prefix.ep IS 'episode id (_entries.ep)';
COMMENT ON COLUMN _shared_prefix.request_id IS 'request id';
COMMENT ON COLUMN _shared_prefix.prompt_tokens IS 'tokens: prompt length L at waiting entry (0: not recorded)';
COMMENT ON COLUMN _shared_prefix.shared_source IS 'tokens (prompt token ids) or chain (attention block keys: to the attention block)';
COMMENT ON COLUMN _shared_prefix.shared_raw_tokens IS 'tokens: longest common prefix with an earlier-entered request, not capped';
COMMENT ON COLUMN _shared_prefix.shared_tokens IS 'tokens: that prefix capped at L - 1';
COMMENT ON COLUMN _shared_prefix.shared_with IS 'an earlier-entered request holding the shared prefix (by chain: the earliest; '''' when none)';
