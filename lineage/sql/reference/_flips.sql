-- _flips: the supply events that change validity. An entry is valid from its publication until
-- its loss; a republication of a valid entry and a loss of an invalid one change nothing.
-- Flips of one entry alternate: flip 1 makes it valid, flip 2 invalid, ... so the last flip
-- before a cut says whether the entry is valid at that cut, and flip numbers between two cuts
-- enumerate the changes inside a window.
CREATE OR REPLACE VIEW _flips AS
WITH ordered AS (
    SELECT
        *,
        coalesce(lag(is_pub) OVER (PARTITION BY is_rec, hash ORDER BY seq), false) AS was_valid
    FROM _supply
)
SELECT
    seq,
    step,
    is_rec,
    hash,
    is_pub,
    depth,
    cause,
    requester,
    request_id,
    row_number() OVER (PARTITION BY is_rec, hash ORDER BY seq) AS flip_no
FROM ordered
WHERE is_pub <> was_valid;

COMMENT ON VIEW _flips IS 'validity changes of each (is_rec, hash) entry, numbered per entry';
COMMENT ON COLUMN _flips.seq IS 'record sequence number of the changing event';
COMMENT ON COLUMN _flips.step IS 'scheduler step of the event';
COMMENT ON COLUMN _flips.is_rec IS 'true: recurrent checkpoint; false: attention block';
COMMENT ON COLUMN _flips.hash IS '64-bit cache key';
COMMENT ON COLUMN _flips.is_pub IS 'true: the entry became valid; false: it was lost';
COMMENT ON COLUMN _flips.depth IS 'tokens: boundary of the entry';
COMMENT ON COLUMN _flips.cause IS 'loss cause';
COMMENT ON COLUMN _flips.requester IS 'request whose allocation caused the loss';
COMMENT ON COLUMN _flips.request_id IS 'request the event is about';
COMMENT ON COLUMN _flips.flip_no IS '1-based number of this change for the entry (odd = valid)';
