-- _window_flips: every validity change of an episode's chain entries inside its waiting window
-- (entry_seq, adopt_seq). The entry's flips numbered flips_before_entry+1 .. flips_before_adopt
-- are exactly those in the window, so an equi-join on flip_no enumerates them without a range
-- join over the whole history of popular keys.
CREATE OR REPLACE VIEW _window_flips AS
WITH wanted AS (
    SELECT
        request_id,
        preemption_count,
        state_kind,
        pos,
        hash,
        unnest(range(flips_before_entry + 1, flips_before_adopt + 1)) AS flip_no
    FROM _chain_validity
    WHERE flips_before_adopt > flips_before_entry
)
SELECT
    w.request_id,
    w.preemption_count,
    w.state_kind,
    w.pos,
    f.seq,
    f.is_pub
FROM wanted AS w
JOIN _flips AS f
    ON f.state_kind = w.state_kind AND f.hash = w.hash AND f.flip_no = w.flip_no;

COMMENT ON VIEW _window_flips IS 'validity changes of chain entries inside each waiting window';
COMMENT ON COLUMN _window_flips.request_id IS 'request id of the waiting episode';
COMMENT ON COLUMN _window_flips.preemption_count IS 'episode key';
COMMENT ON COLUMN _window_flips.state_kind IS 'attention or recurrent';
COMMENT ON COLUMN _window_flips.pos IS '0-based chain position of the changed entry';
COMMENT ON COLUMN _window_flips.seq IS 'seq of the changing event';
COMMENT ON COLUMN _window_flips.is_pub IS 'true: became valid; false: lost';
