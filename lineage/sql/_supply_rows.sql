-- _supply_rows: the publication and loss rows of attention blocks and complete recurrent
-- checkpoints, as _supply numbers them (one row per event).
CREATE OR REPLACE VIEW _supply_rows AS
SELECT
    seq,
    step,
    state_kind = 'recurrent' AS is_rec,
    hash,
    kind = 'publication' AS is_pub,
    depth,
    cause,
    requester,
    request_id
FROM events
WHERE kind IN ('publication', 'loss')
  AND state_kind IN ('attention', 'recurrent');

COMMENT ON VIEW _supply_rows IS 'publication/loss rows of attention blocks and recurrent checkpoints';
COMMENT ON COLUMN _supply_rows.seq IS 'record sequence number (total order)';
COMMENT ON COLUMN _supply_rows.step IS 'scheduler step of the event (-1 unknown)';
COMMENT ON COLUMN _supply_rows.is_rec IS 'true: a recurrent checkpoint; false: an attention block';
COMMENT ON COLUMN _supply_rows.hash IS '64-bit cache key; with is_rec it names the entry';
COMMENT ON COLUMN _supply_rows.is_pub IS 'true for a publication, false for a loss';
COMMENT ON COLUMN _supply_rows.depth IS 'tokens: boundary of the entry';
COMMENT ON COLUMN _supply_rows.cause IS 'loss cause (none for publications)';
COMMENT ON COLUMN _supply_rows.requester IS 'request whose allocation caused the loss';
COMMENT ON COLUMN _supply_rows.request_id IS 'request the event is about (producer of a publication)';
