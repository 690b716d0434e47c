-- _supply: every publication or loss of an attention block or a complete recurrent checkpoint,
-- numbered in (entry, seq) order. A cache entry is keyed by (is_rec, hash): vLLM-style hybrids
-- reuse one block hash for the attention and the recurrent group, so the hash alone does not
-- name an entry. The state of an entry after a supply row is that row's is_pub (valid from a
-- publication until a loss), so the last row before a cut gives the validity at the cut; a row
-- whose is_pub differs from the state before it is a flip (a validity change):
--
--     entry (false, 7):  pub  pub  loss  loss  pub     (entry (false, 9) next: pub ...)
--     sup_no             41   42   43    44    45                           46
--     is_flip            yes  no   yes   no    yes                          yes
--
-- sup_no numbers every supply row in one global order (is_rec, hash, seq), so each entry's rows
-- carry consecutive numbers: the rows of an entry between two cuts are the numbers between its
-- last row before the first cut and its last row before the second. The neighbouring rows'
-- columns (lag/lead) count only when they belong to the same entry. One sort without a
-- partition serves every later lookup (cheaper in DuckDB than a window partitioned by entry);
-- the view is materialized.
CREATE OR REPLACE VIEW _supply AS
WITH rows AS (
    SELECT
        e.seq,
        e.step,
        e.state_kind = 'recurrent' AS is_rec,
        e.hash,
        e.kind = 'publication' AS is_pub,
        e.depth,
        e.cause,
        e.requester,
        e.request_id,
        CASE WHEN e.request_id IS NOT NULL THEN coalesce(r.rid, 0) END AS rid
    FROM events AS e
    LEFT JOIN _requests AS r ON r.request_id = e.request_id
    WHERE e.kind IN ('publication', 'loss')
      AND e.state_kind IN ('attention', 'recurrent')
),
ordered AS (
    SELECT
        *,
        row_number() OVER w AS sup_no,
        coalesce(lag(is_rec) OVER w = is_rec AND lag(hash) OVER w IS NOT DISTINCT FROM hash,
                 false) AS same_prev,
        coalesce(lead(is_rec) OVER w = is_rec AND lead(hash) OVER w IS NOT DISTINCT FROM hash,
                 false) AS same_next,
        lag(is_pub) OVER w AS lag_pub,
        lag(step) OVER w AS lag_step,
        lead(step) OVER w AS lead_step
    FROM rows
    WINDOW w AS (ORDER BY is_rec, hash, seq)
)
SELECT
    seq, step, is_rec, hash, is_pub, depth, cause, requester, request_id, rid, sup_no,
    is_pub <> (same_prev AND lag_pub) AS is_flip,
    same_prev AND lag_pub AS valid_before,
    CASE WHEN same_prev THEN lag_step END AS prev_step,
    CASE WHEN same_next THEN lead_step END AS next_step,
    NOT same_next AS is_last
FROM ordered;

COMMENT ON VIEW _supply IS 'publication/loss rows of attention blocks and recurrent checkpoints, numbered in (entry, seq) order';
COMMENT ON COLUMN _supply.seq IS 'record sequence number (total order)';
COMMENT ON COLUMN _supply.step IS 'scheduler step of the event (-1 unknown)';
COMMENT ON COLUMN _supply.is_rec IS 'true: a recurrent checkpoint; false: an attention block';
COMMENT ON COLUMN _supply.hash IS '64-bit cache key; with is_rec it names the entry';
COMMENT ON COLUMN _supply.is_pub IS 'true for a publication, false for a loss';
COMMENT ON COLUMN _supply.depth IS 'tokens: boundary of the entry';
COMMENT ON COLUMN _supply.cause IS 'loss cause (none for publications)';
COMMENT ON COLUMN _supply.requester IS 'request whose allocation caused the loss';
COMMENT ON COLUMN _supply.request_id IS 'request the event is about (producer of a publication)';
COMMENT ON COLUMN _supply.rid IS 'the request''s _requests.rid (0: a request without an episode; NULL: no request id)';
COMMENT ON COLUMN _supply.sup_no IS '1-based number of the row in (is_rec, hash, seq) order: an entry''s rows are consecutive';
COMMENT ON COLUMN _supply.is_flip IS 'the row changes the entry''s validity (a publication of an invalid or a loss of a valid entry)';
COMMENT ON COLUMN _supply.next_step IS 'step of the entry''s next supply row (NULL for its last)';
COMMENT ON COLUMN _supply.valid_before IS 'the entry was valid just before this row';
COMMENT ON COLUMN _supply.prev_step IS 'step of the entry''s previous supply row (NULL for its first); step < prev_step: the entry''s steps go back here';
COMMENT ON COLUMN _supply.is_last IS 'the entry''s last supply row';
