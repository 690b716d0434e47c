-- _supply_ordered: not used by the reference set (its _chain_validity takes the general lookups
-- for every position); defined so that the current set's name binds over the reference _supply.
CREATE OR REPLACE VIEW _supply_ordered AS
SELECT CAST(NULL AS BOOLEAN) AS ordered;

COMMENT ON VIEW _supply_ordered IS 'unused by the reference SQL set';
COMMENT ON COLUMN _supply_ordered.ordered IS 'NULL';
