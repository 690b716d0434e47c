-- _supply: every publication or loss of an attention block or a complete recurrent checkpoint.
-- A cache entry is keyed by (is_rec, hash): vLLM-style hybrids reuse one block hash for the
-- attention and the recurrent group, so the hash alone does not name an entry.
CREATE OR REPLACE VIEW _supply AS
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

COMMENT ON VIEW _supply IS 'publication/loss rows of attention blocks and recurrent checkpoints';
COMMENT ON COLUMN _supply.seq IS 'record sequence number (total order)';
COMMENT ON COLUMN _supply.step IS 'scheduler step of the event (-1 unknown)';
COMMENT ON COLUMN _supply.is_rec IS 'true: a recurrent checkpoint; false: an attention block';
COMMENT ON COLUMN _supply.hash IS '64-bit cache key; with is_rec it names the entry';
COMMENT ON COLUMN _supply.is_pub IS 'true for a publication, false for a loss';
COMMENT ON COLUMN _supply.depth IS 'tokens: boundary of the entry';
COMMENT ON COLUMN _supply.cause IS 'loss cause (none for publications)';
COMMENT ON COLUMN _supply.requester IS 'request whose allocation caused the loss';
COMMENT ON COLUMN _supply.request_id IS 'request the event is about (producer of a publication)';
