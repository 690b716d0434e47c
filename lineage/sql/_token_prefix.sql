-- _token_prefix: per request, the shared prefix measured on prompt token ids, when the harness
-- has them (a run directory's workload.json). Bound, like _params: three parallel lists
-- (request ids, tokens, the earlier request) that are empty when no token ids were given, and
-- then _shared_prefix falls back to the hash chains.
--     request r2 = [5 9 9 4 7], earlier r1 = [5 9 9 3]: shared_raw_tokens 3, shared_with r1
CREATE OR REPLACE TEMP TABLE _token_prefix AS
SELECT
    unnest(CAST(? AS VARCHAR[])) AS request_id,
    unnest(CAST(? AS BIGINT[])) AS shared_raw_tokens,
    unnest(CAST(? AS VARCHAR[])) AS shared_with;

COMMENT ON COLUMN _token_prefix.request_id IS 'request id as the trace records it';
COMMENT ON COLUMN _token_prefix.shared_raw_tokens IS
    'tokens: longest common prefix of its prompt with any earlier-entered request''s prompt (not capped)';
COMMENT ON COLUMN _token_prefix.shared_with IS
    'an earlier-entered request holding that prefix ('''' when none)';
