-- episodes: one row per admission episode, bound by (request_id, preemption_count): INITIAL is
-- count 0, RESUME a later count. An episode is known from its waiting entry, its adoption, or
-- both; the waiting window is (entry_seq, adopt_seq).
CREATE OR REPLACE VIEW episodes AS
SELECT
    coalesce(e.request_id, a.request_id) AS request_id,
    coalesce(e.preemption_count, a.preemption_count) AS preemption_count,
    CASE WHEN coalesce(e.preemption_count, a.preemption_count) = 0
         THEN 'INITIAL' ELSE 'RESUME' END AS episode,
    e.ep,
    e.entry_seq,
    e.entry_step,
    e.prompt_tokens,
    len(e.chain) AS attention_keys,
    len(e.recurrent_chain) AS recurrent_keys,
    a.adopt_seq,
    a.adopt_step,
    a.j_adopt,
    coalesce(e.entry_rows, 0) AS entry_rows,
    coalesce(a.adoption_rows, 0) AS adoption_rows,
    coalesce(e.has_window, false) AS has_window
FROM _entries AS e
FULL OUTER JOIN _adoptions AS a
    ON a.request_id = e.request_id AND a.preemption_count = e.preemption_count;

COMMENT ON VIEW episodes IS 'admission episodes (request_id, preemption_count) with entry and adoption';
COMMENT ON COLUMN episodes.request_id IS 'request id';
COMMENT ON COLUMN episodes.preemption_count IS 'episode key: 0 INITIAL, >=1 RESUME after that many preemptions';
COMMENT ON COLUMN episodes.episode IS 'INITIAL or RESUME';
COMMENT ON COLUMN episodes.ep IS 'dense episode id of episodes with a waiting entry (NULL: none)';
COMMENT ON COLUMN episodes.entry_seq IS 'seq of the first waiting entry (NULL: no entry recorded)';
COMMENT ON COLUMN episodes.entry_step IS 'scheduler step of the waiting entry';
COMMENT ON COLUMN episodes.prompt_tokens IS 'tokens: prompt length at waiting entry';
COMMENT ON COLUMN episodes.attention_keys IS 'attention block keys in the entry chain';
COMMENT ON COLUMN episodes.recurrent_keys IS 'recurrent checkpoint keys in the entry chain';
COMMENT ON COLUMN episodes.adopt_seq IS 'seq of the first adoption (NULL: never adopted)';
COMMENT ON COLUMN episodes.adopt_step IS 'scheduler step of the adoption lookup';
COMMENT ON COLUMN episodes.j_adopt IS 'tokens: J_adopt, the joint depth the scheduler adopted';
COMMENT ON COLUMN episodes.entry_rows IS 'waiting_entry rows for the episode (1 expected)';
COMMENT ON COLUMN episodes.adoption_rows IS 'adoption rows for the episode (1 expected)';
COMMENT ON COLUMN episodes.has_window IS 'entry recorded and adoption after it: lookup values and window counts exist';
