-- _supply_ordered: one row, whether every entry's supply rows are in step order (no step goes
-- back from one row of an entry to its next, no step is NULL). _chain_validity's one-lookup
-- M0/M1 answer relies on it; materialized once, since that view may be computed in several key
-- partitions and this fact is about all of them.
CREATE OR REPLACE VIEW _supply_ordered AS
SELECT coalesce(bool_and(step >= prev_step), true) AND count(step) = count(*) AS ordered
FROM _supply;

COMMENT ON VIEW _supply_ordered IS 'whether the supply rows of every entry are in step order';
COMMENT ON COLUMN _supply_ordered.ordered IS 'no entry''s step goes back from a supply row to its next, and no step is NULL';
