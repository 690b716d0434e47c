-- _supply: every publication or loss of an attention block or a complete recurrent checkpoint,
-- numbered per entry in seq order. A cache entry is keyed by (is_rec, hash): vLLM-style hybrids
-- reuse one block hash for the attention and the recurrent group, so the hash alone does not
-- name an entry. The state of an entry after a supply row is that row's is_pub (valid from a
-- publication until a loss), so the last row before a cut gives the validity at the cut; a row
-- whose is_pub differs from the state before it is a flip (a validity change):
--
--     entry (false, 7):  pub  pub  loss  loss  pub
--     sup_no             1    2    3     4     5
--     is_flip            yes  no   yes   no    yes
--
-- One sort per entry (this window) serves every later lookup; the view is materialized (by
-- lineage/supply.py, one NumPy sort, when the harness can; tests compare both).
CREATE OR REPLACE VIEW _supply AS
SELECT
    *,
    row_number() OVER w AS sup_no,
    is_pub <> coalesce(lag(is_pub) OVER w, false) AS is_flip,
    coalesce(lag(is_pub) OVER w, false) AS valid_before,
    lag(step) OVER w AS prev_step,
    lead(step) OVER w AS next_step,
    lead(seq) OVER w IS NULL AS is_last
FROM _supply_rows
WINDOW w AS (PARTITION BY is_rec, hash ORDER BY seq);

COMMENT ON VIEW _supply IS 'publication/loss rows of attention blocks and recurrent checkpoints, numbered per entry';
COMMENT ON COLUMN _supply.seq IS 'record sequence number (total order)';
COMMENT ON COLUMN _supply.step IS 'scheduler step of the event (-1 unknown)';
COMMENT ON COLUMN _supply.is_rec IS 'true: a recurrent checkpoint; false: an attention block';
COMMENT ON COLUMN _supply.hash IS '64-bit cache key; with is_rec it names the entry';
COMMENT ON COLUMN _supply.is_pub IS 'true for a publication, false for a loss';
COMMENT ON COLUMN _supply.depth IS 'tokens: boundary of the entry';
COMMENT ON COLUMN _supply.cause IS 'loss cause (none for publications)';
COMMENT ON COLUMN _supply.requester IS 'request whose allocation caused the loss';
COMMENT ON COLUMN _supply.request_id IS 'request the event is about (producer of a publication)';
COMMENT ON COLUMN _supply.sup_no IS '1-based number of the row among its entry''s supply rows, in seq order';
COMMENT ON COLUMN _supply.is_flip IS 'the row changes the entry''s validity (a publication of an invalid or a loss of a valid entry)';
COMMENT ON COLUMN _supply.next_step IS 'step of the entry''s next supply row (NULL for its last)';
COMMENT ON COLUMN _supply.valid_before IS 'the entry was valid just before this row';
COMMENT ON COLUMN _supply.prev_step IS 'step of the entry''s previous supply row (NULL for its first); step < prev_step: the entry''s steps go back here';
COMMENT ON COLUMN _supply.is_last IS 'the entry''s last supply row';
