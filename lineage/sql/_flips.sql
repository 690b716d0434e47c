-- _flips: the supply rows that change validity. An entry is valid from its publication until
-- its loss; a republication of a valid entry and a loss of an invalid one change nothing.
-- Flips of one entry alternate: the first makes it valid, the next invalid, ... The supply
-- numbers (sup_no) of an entry's rows between two cuts enumerate the changes inside a window.
CREATE OR REPLACE VIEW _flips AS
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
    sup_no
FROM _supply
WHERE is_flip;

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
COMMENT ON COLUMN _flips.sup_no IS 'number of the row among the entry''s supply rows (_supply.sup_no)';
