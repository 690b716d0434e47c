-- _params: the run's grids, one row. The harness binds both values from the run metadata
-- (hybridmem.meta); nothing is formatted into SQL text.
CREATE OR REPLACE TEMP TABLE _params AS
SELECT
    CAST(? AS BIGINT) AS attention_grid_tokens,
    CAST(? AS BIGINT) AS recurrent_grid_tokens;

COMMENT ON COLUMN _params.attention_grid_tokens IS
    'tokens per attention block (512 for S0-S2; 16 for D0)';
COMMENT ON COLUMN _params.recurrent_grid_tokens IS
    'tokens between recurrent checkpoint boundaries (512 for S0-S2; 1792 for D0 at Falcon-H1-7B)';
