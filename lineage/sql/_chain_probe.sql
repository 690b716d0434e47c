-- _chain_probe: every chain position with the state of its entry at the waiting-entry cut, and
-- whether that state also answers the three lookup cuts (settled). An entry's state at a seq cut
-- is the is_pub of its last supply row before the cut (false when none).
--
-- One ASOF lookup per chain position: the entry's first supply row at or after the entry cut
-- (row n+1; a sentinel after its last row when there is none) carries the state before it
-- (valid_before = the state at the entry cut), n, the previous row's step, and its own seq, step
-- kind and producer. When that row is not before the adoption cut, nothing happened to the entry inside
-- the window, so the exact cut sees the entry cut's state; when, besides, every entry's rows are
-- in step order (_supply_ordered; no step is NULL), row n is of an earlier step than the
-- lookup's and row n+1 is not, the state after the steps before the lookup (M0) is that state
-- too; M1 (M0, or published within the lookup step by another request) adds a publication by
-- another request in the lookup step, which is then row n+1, or a later row of that step only
-- if row n+1 is in the lookup step and row n+2 too (next_step; then the position is unsettled):
--
--     entry e:  ... row n (step 5) | entry cut ... adoption cut (step 9) | row n+1 (step 12)
--               exact = m0 = m1 = is_pub(row n)
--
-- Every other position (a supply row of the entry inside the window, two rows in the lookup
-- step, steps out of order) is left unsettled: _chain_validity answers it with
-- the general lookups. Every row depends on one entry's supply rows only, so the harness may
-- compute the view one key partition at a time (_params.parts / part; _supply_ordered is
-- global), bounding the memory of the join's sorts.
--
-- The same rows can be computed without the join: over the supply rows sorted by (entry, seq),
-- row n+1 is a binary search for the cut (lineage/probe.py does that when the harness
-- materializes this view; tests compare both).
CREATE OR REPLACE VIEW _chain_probe AS
WITH part_supply AS (
    -- the supply rows of this key partition (all of them unless the harness partitions)
    SELECT s.is_rec, s.hash, s.seq, s.sup_no, s.valid_before, s.prev_step, s.step, s.is_pub,
           s.request_id, s.next_step, s.is_last
    FROM _supply AS s CROSS JOIN _params AS p WHERE s.hash % p.parts = p.part
),
after_cut AS (
    -- every supply row, and a sentinel after each entry's last one (seq = max BIGINT)
    SELECT is_rec, hash, seq, sup_no - 1 AS rows_before, valid_before, prev_step,
           step, is_pub, request_id, next_step
    FROM part_supply
    UNION ALL
    SELECT is_rec, hash, 9223372036854775807, sup_no, is_pub, step, NULL, NULL, NULL, NULL
    FROM part_supply
    WHERE is_last
)
SELECT
    c.ep, c.is_rec, c.pos, c.hash, c.end_tokens, c.in_reach, c.adopt_seq, c.adopt_step,
    coalesce(nx.valid_before, false) AS valid_entry,
    coalesce(nx.rows_before, 0) AS supply_before_entry,
    coalesce(nx.is_pub AND nx.step = c.adopt_step AND nx.request_id IS DISTINCT FROM c.request_id,
             false) AS next_published_by_other,
    coalesce((c.adopt_seq IS NULL OR nx.seq IS NULL OR nx.seq >= c.adopt_seq)
             AND (c.adopt_step IS NULL
                  OR (o.ordered
                      AND (nx.prev_step IS NULL OR nx.prev_step < c.adopt_step)
                      AND (nx.step IS NULL OR nx.step > c.adopt_step
                           OR (nx.step = c.adopt_step
                               AND ((nx.is_pub AND nx.request_id IS DISTINCT FROM c.request_id)
                                    OR nx.next_step IS DISTINCT FROM c.adopt_step))))),
             false) AS settled
FROM (SELECT c.* FROM _chain AS c CROSS JOIN _params AS p
      WHERE c.hash % p.parts = p.part) AS c
CROSS JOIN _supply_ordered AS o
ASOF LEFT JOIN after_cut AS nx
    ON nx.is_rec = c.is_rec AND nx.hash = c.hash AND c.entry_seq <= nx.seq;

COMMENT ON VIEW _chain_probe IS 'chain positions with their entry-cut state and whether it answers the lookup cuts';
COMMENT ON COLUMN _chain_probe.ep IS 'episode id';
COMMENT ON COLUMN _chain_probe.is_rec IS 'true: recurrent checkpoint; false: attention block';
COMMENT ON COLUMN _chain_probe.pos IS '0-based chain position';
COMMENT ON COLUMN _chain_probe.hash IS '64-bit cache key';
COMMENT ON COLUMN _chain_probe.end_tokens IS 'tokens: block end / checkpoint boundary';
COMMENT ON COLUMN _chain_probe.in_reach IS 'can move J: a checkpoint or a block below the deepest checkpoint boundary';
COMMENT ON COLUMN _chain_probe.adopt_seq IS 'exact lookup cut (NULL: no window)';
COMMENT ON COLUMN _chain_probe.adopt_step IS 'lookup step for M0/M1 (NULL: no window or unknown step)';
COMMENT ON COLUMN _chain_probe.valid_entry IS 'valid at the waiting-entry cut';
COMMENT ON COLUMN _chain_probe.supply_before_entry IS 'supply rows of the entry before the waiting-entry cut';
COMMENT ON COLUMN _chain_probe.next_published_by_other IS 'row n+1 is a publication in the lookup step by a request other than the episode''s own';
COMMENT ON COLUMN _chain_probe.settled IS 'the entry-cut state is also the state at the exact, M0 and M1 cuts';
