-- _boundary_transitions: the moments inside a waiting window at which a recurrent boundary
-- becomes jointly reusable (missing 1 -> 0) or stops being so (0 -> 1). A window flip of
-- attention block i counts against every boundary needing it (i < blocks_needed); a flip of
-- checkpoint j only against boundary j. missing_after never goes below 0 unless the SQL is wrong.
CREATE OR REPLACE VIEW _boundary_transitions AS
WITH deltas AS (
    SELECT
        b.ep,
        b.rpos,
        w.seq,
        sum(CASE WHEN w.is_pub THEN -1 ELSE 1 END) AS delta
    FROM _window_flips AS w
    JOIN _boundaries AS b
        ON b.ep = w.ep
       AND ((NOT w.is_rec AND w.pos < b.blocks_needed) OR (w.is_rec AND w.pos = b.rpos))
    GROUP BY b.ep, b.rpos, w.seq
),
running AS (
    SELECT
        d.ep,
        d.rpos,
        b.end_tokens,
        d.seq,
        b.missing_at_entry,
        b.missing_at_entry + sum(d.delta) OVER (
            PARTITION BY d.ep, d.rpos ORDER BY d.seq
            ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS missing_after
    FROM deltas AS d
    JOIN _boundaries AS b ON b.ep = d.ep AND b.rpos = d.rpos
),
flagged AS (
    SELECT
        *,
        missing_after = 0 AS valid_after,
        coalesce(lag(missing_after = 0) OVER (PARTITION BY ep, rpos ORDER BY seq),
                 missing_at_entry = 0) AS valid_before
    FROM running
)
SELECT ep, rpos, end_tokens, seq, missing_after, valid_after
FROM flagged
WHERE valid_after <> valid_before;

COMMENT ON VIEW _boundary_transitions IS 'in-window changes of joint reusability of each recurrent boundary';
COMMENT ON COLUMN _boundary_transitions.ep IS 'episode id';
COMMENT ON COLUMN _boundary_transitions.rpos IS '0-based recurrent chain position';
COMMENT ON COLUMN _boundary_transitions.end_tokens IS 'tokens: the boundary';
COMMENT ON COLUMN _boundary_transitions.seq IS 'seq of the event that changed it';
COMMENT ON COLUMN _boundary_transitions.missing_after IS 'entries the boundary lacks after the event';
COMMENT ON COLUMN _boundary_transitions.valid_after IS 'jointly reusable after the event';
