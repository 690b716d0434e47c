-- _params: the run's grids, one row, and the key partition being computed. The harness binds
-- every value (grids from the run metadata, hybridmem.meta); nothing is formatted into SQL.
-- parts / part: _chain_validity keeps the chain positions and supply rows of the entries with
-- hash % parts = part. The harness computes it part by part (part 0 .. parts-1, appending)
-- when the table is too large for one pass in memory, and leaves parts = 1 (everything) after.
CREATE OR REPLACE TEMP TABLE _params AS
SELECT
    CAST(? AS BIGINT) AS attention_grid_tokens,
    CAST(? AS BIGINT) AS recurrent_grid_tokens,
    CAST(1 AS UBIGINT) AS parts,
    CAST(0 AS UBIGINT) AS part;

COMMENT ON COLUMN _params.attention_grid_tokens IS
    'tokens per attention block (512 for S0-S2; 16 for D0)';
COMMENT ON COLUMN _params.recurrent_grid_tokens IS
    'tokens between recurrent checkpoint boundaries (512 for S0-S2; 1792 for D0 at Falcon-H1-7B)';
COMMENT ON COLUMN _params.parts IS
    'key partitions of the chain validity being computed (1: all at once)';
COMMENT ON COLUMN _params.part IS
    'the partition being computed: entries with hash % parts = part';
