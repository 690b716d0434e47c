-- _window_flips: every validity change of an episode's chain entries inside its waiting window
-- (entry_seq, adopt_seq). The entry's supply rows numbered supply_before_entry+1 ..
-- supply_before_adopt are exactly those in the window, so an equi-join on sup_no enumerates them
-- (the flips among them are the changes) without a range join over the whole history of popular
-- keys. Blocks beyond the deepest checkpoint boundary
-- cannot move J and are left out.
CREATE OR REPLACE VIEW _window_flips AS
WITH wanted AS (
    SELECT
        ep,
        is_rec,
        pos,
        hash,
        unnest(range(supply_before_entry + 1, supply_before_adopt + 1)) AS sup_no
    FROM _chain_validity
    WHERE supply_before_adopt > supply_before_entry AND in_reach
)
SELECT
    w.ep,
    w.is_rec,
    w.pos,
    f.seq,
    f.is_pub
FROM wanted AS w
JOIN _flips AS f
    ON f.is_rec = w.is_rec AND f.hash = w.hash AND f.sup_no = w.sup_no;

COMMENT ON VIEW _window_flips IS 'validity changes of chain entries inside each waiting window';
COMMENT ON COLUMN _window_flips.ep IS 'episode id of the waiting episode';
COMMENT ON COLUMN _window_flips.is_rec IS 'true: recurrent checkpoint; false: attention block';
COMMENT ON COLUMN _window_flips.pos IS '0-based chain position of the changed entry';
COMMENT ON COLUMN _window_flips.seq IS 'seq of the changing event';
COMMENT ON COLUMN _window_flips.is_pub IS 'true: became valid; false: lost';
