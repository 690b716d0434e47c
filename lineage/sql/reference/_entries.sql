-- _entries: the first waiting-entry row of each episode (request_id, preemption_count), with its
-- hash chains and a dense integer id ep for the joins below. Later duplicate entries are counted
-- in entry_rows, not used. The adoption columns come from _adoptions (NULL: never adopted).
-- Supply counts only boundaries an engine could adopt (SPEC §5, §7): at most L - 1 for a prompt
-- of L tokens (vLLM caps a hit there), so the recurrent chain is cut to the checkpoints at
-- boundaries <= L - 1 when the entry records L (depth > 0); entry and adopted supply alike.
--     L = 1024, gr = 512: checkpoints at 512 (kept), 1024 (dropped: not adoptable)
CREATE OR REPLACE VIEW _entries AS
WITH first_rows AS (
    SELECT
        request_id,
        preemption_count,
        seq AS entry_seq,
        step AS entry_step,
        depth AS prompt_tokens,
        coalesce(chain, CAST([] AS UBIGINT[])) AS chain,
        coalesce(recurrent_chain, CAST([] AS UBIGINT[])) AS recurrent_chain,
        count(*) OVER (PARTITION BY request_id, preemption_count) AS entry_rows
    FROM events
    WHERE kind = 'waiting_entry' AND request_id <> ''
    QUALIFY row_number() OVER (PARTITION BY request_id, preemption_count ORDER BY seq) = 1
)
SELECT
    row_number() OVER (ORDER BY f.request_id, f.preemption_count) AS ep,
    f.* EXCLUDE (recurrent_chain),
    CASE WHEN f.prompt_tokens > 0
         THEN f.recurrent_chain[1 : (f.prompt_tokens - 1) // p.recurrent_grid_tokens]
         ELSE f.recurrent_chain
    END AS recurrent_chain,
    a.adopt_seq,
    a.adopt_step,
    a.j_adopt,
    coalesce(f.entry_seq < a.adopt_seq, false) AS has_window
FROM first_rows AS f
CROSS JOIN _params AS p
LEFT JOIN _adoptions AS a
    ON a.request_id = f.request_id AND a.preemption_count = f.preemption_count;

COMMENT ON VIEW _entries IS 'first waiting_entry row per episode, with its hash chains and adoption';
COMMENT ON COLUMN _entries.ep IS 'dense episode id (order of request_id, preemption_count)';
COMMENT ON COLUMN _entries.request_id IS 'request id';
COMMENT ON COLUMN _entries.preemption_count IS 'episode key: 0 INITIAL, >=1 RESUME';
COMMENT ON COLUMN _entries.entry_seq IS 'seq of the waiting-entry event (the J_enter cut)';
COMMENT ON COLUMN _entries.entry_step IS 'scheduler step of the waiting entry';
COMMENT ON COLUMN _entries.prompt_tokens IS 'tokens: prompt length recorded at waiting entry';
COMMENT ON COLUMN _entries.chain IS 'attention block keys, one per attention-grid block, in order';
COMMENT ON COLUMN _entries.recurrent_chain IS 'checkpoint keys, one per recurrent-grid boundary <= L - 1 (adoptable), in order';
COMMENT ON COLUMN _entries.entry_rows IS 'waiting_entry rows recorded for the episode (1 expected)';
COMMENT ON COLUMN _entries.adopt_seq IS 'seq of the first adoption (NULL: never adopted)';
COMMENT ON COLUMN _entries.adopt_step IS 'scheduler step of that adoption';
COMMENT ON COLUMN _entries.j_adopt IS 'tokens: adopted joint depth';
COMMENT ON COLUMN _entries.has_window IS 'adopted after the entry: the lookup cuts and the window exist';
