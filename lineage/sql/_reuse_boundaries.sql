-- _reuse_boundaries: for each INITIAL episode that reused less than its shared prefix, every
-- recurrent boundary b it did not adopt inside the prefix (J_adopt < b <= shared), the tokens
-- that boundary would have added ([max(J_adopt, b - gr), b)) and why it was not a joint
-- restart point at the lookup (paper §2.1, §3.1; SPEC §5), in this precedence:
--   never-published    no other request published the checkpoint at b before the lookup, nor
--                      any earlier-entered one after it (the chunk that crossed b did not end
--                      on it, so no state was saved there)
--   not-yet-published  an earlier-entered request published it only after the lookup, or it
--                      was published within the lookup's own step (the producer was still
--                      computing; vLLM refuses a same-step hit)
--   lost               published, then lost before the lookup (the loss's cause and requester)
--   attention-lost     the checkpoint was valid but the attention prefix was not (A_max < b)
--   other              valid jointly at the lookup and still not adopted, or no key recorded
--     gr = 512, shared 1,300, J_adopt 0: b = 512 (tokens [0, 512)), b = 1024 ([512, 1024))
CREATE OR REPLACE VIEW _reuse_boundaries AS
WITH ep AS (
    SELECT
        s.ep,
        s.request_id,
        s.shared_tokens,
        e.entry_seq,
        e.j_adopt,
        e.adopt_seq,
        e.adopt_step,
        e.recurrent_chain,
        p.recurrent_grid_tokens AS gr,
        p.attention_grid_tokens AS ga
    FROM _shared_prefix AS s
    JOIN _entries AS e ON e.ep = s.ep
    CROSS JOIN _params AS p
    WHERE e.j_adopt IS NOT NULL AND s.shared_tokens > e.j_adopt
),
ks AS (
    SELECT
        ep, request_id, entry_seq, j_adopt, adopt_seq, adopt_step, recurrent_chain, gr, ga,
        unnest(range(j_adopt // gr + 1, shared_tokens // gr + 1)) AS k
    FROM ep
),
b AS (
    SELECT
        ep, request_id, entry_seq, adopt_seq, adopt_step, ga,
        true AS is_rec,
        k * gr AS boundary,
        k * gr - greatest(j_adopt, (k - 1) * gr) AS tokens,
        recurrent_chain[k] AS hash
    FROM ks
),
producers AS (
    SELECT request_id, entry_seq FROM _entries WHERE preemption_count = 0
),
pubs AS (  -- publications by another request than the episode's own (its own come later)
    SELECT
        b.ep,
        b.boundary,
        min(s.seq) AS first_pub,
        min(s.seq) FILTER (WHERE pr.entry_seq < b.entry_seq) AS first_pub_earlier,
        arg_min(s.step, s.seq) FILTER (WHERE pr.entry_seq < b.entry_seq) AS first_pub_step,
        arg_min(s.request_id, s.seq) FILTER (WHERE pr.entry_seq < b.entry_seq) AS first_pub_by
    FROM b
    JOIN _supply AS s ON s.is_rec AND s.is_pub AND s.hash = b.hash
    LEFT JOIN producers AS pr ON pr.request_id = s.request_id
    WHERE s.request_id <> b.request_id
    GROUP BY b.ep, b.boundary
),
last_row AS (  -- the checkpoint's last supply row before the lookup: its state there
    SELECT b.*, s.is_pub AS last_is_pub, s.step AS last_step, s.cause AS last_cause,
           s.requester AS last_requester
    FROM b
    ASOF LEFT JOIN _supply AS s
        ON s.is_rec = b.is_rec AND s.hash = b.hash AND b.adopt_seq > s.seq
),
att AS (  -- the first attention block not valid at the lookup
    SELECT
        ep,
        min(pos) FILTER (WHERE NOT valid_exact) AS bad_pos,
        arg_min(hash, pos) FILTER (WHERE NOT valid_exact) AS bad_hash
    FROM _chain_validity
    WHERE NOT is_rec AND ep IN (SELECT ep FROM b)
    GROUP BY ep
),
att_row AS (
    SELECT a.*, x.adopt_seq, false AS is_rec
    FROM att AS a
    JOIN (SELECT DISTINCT ep, adopt_seq FROM b) AS x ON x.ep = a.ep
    WHERE a.bad_pos IS NOT NULL
),
att_state AS (
    SELECT r.ep, r.bad_pos, s.is_pub AS att_is_pub, s.step AS att_step, s.cause AS att_cause,
           s.requester AS att_requester
    FROM att_row AS r
    ASOF LEFT JOIN _supply AS s
        ON s.is_rec = r.is_rec AND s.hash = r.bad_hash AND r.adopt_seq > s.seq
),
classified AS (
    SELECT
        l.ep,
        l.boundary,
        l.tokens,
        l.hash,
        CASE
            WHEN l.hash IS NULL THEN 'other'
            WHEN p.first_pub IS NULL THEN 'never-published'
            WHEN p.first_pub > l.adopt_seq AND p.first_pub_earlier IS NULL THEN 'never-published'
            WHEN p.first_pub > l.adopt_seq THEN 'not-yet-published'
            WHEN NOT l.last_is_pub THEN 'lost'
            WHEN d.a_max_exact IS NULL THEN 'other'
            WHEN d.a_max_exact < l.boundary THEN 'attention-lost'
            WHEN l.adopt_step >= 0 AND l.last_step >= l.adopt_step THEN 'not-yet-published'
            ELSE 'other'
        END AS cause,
        p.first_pub, p.first_pub_step, p.first_pub_by, l.last_step, l.last_cause,
        l.last_requester, l.adopt_seq, l.adopt_step, l.ga, d.a_max_exact,
        a.bad_pos, a.att_is_pub, a.att_step, a.att_cause, a.att_requester
    FROM last_row AS l
    LEFT JOIN pubs AS p ON p.ep = l.ep AND p.boundary = l.boundary
    LEFT JOIN _episode_depths AS d ON d.ep = l.ep
    LEFT JOIN att_state AS a ON a.ep = l.ep
)
SELECT
    ep,
    boundary,
    tokens,
    hash,
    cause,
    CASE cause
        WHEN 'never-published' THEN
            format('no earlier request published a checkpoint at {}', boundary)
        WHEN 'not-yet-published' THEN
            CASE WHEN first_pub < adopt_seq
                 THEN format('checkpoint at {} published within the lookup step {}',
                             boundary, adopt_step)
                 ELSE format('checkpoint at {} first published after the lookup (step {}, by {})',
                             boundary, first_pub_step, first_pub_by)
            END
        WHEN 'lost' THEN
            format('checkpoint at {} lost before the lookup{} ({}, step {})', boundary,
                   CASE WHEN coalesce(last_requester, '') <> ''
                        THEN format(' to {}''s allocation', last_requester) ELSE '' END,
                   last_cause, last_step)
        WHEN 'attention-lost' THEN
            format('checkpoint at {} valid, attention prefix only to {} (A_max {}): block [{}, {}) {}',
                   boundary, bad_pos * ga, a_max_exact, bad_pos * ga, (bad_pos + 1) * ga,
                   CASE WHEN att_is_pub IS NULL THEN 'never published before the lookup'
                        ELSE format('lost{} ({}, step {})',
                                    CASE WHEN coalesce(att_requester, '') <> ''
                                         THEN format(' to {}''s allocation', att_requester)
                                         ELSE '' END,
                                    att_cause, att_step)
                   END)
        ELSE
            CASE WHEN hash IS NULL THEN format('no checkpoint key recorded at {}', boundary)
                 ELSE format('joint boundary {} valid at the lookup, not adopted', boundary)
            END
    END AS detail
FROM classified;

COMMENT ON VIEW _reuse_boundaries IS 'per INITIAL episode: each recurrent boundary inside the shared prefix it did not adopt, and why';
COMMENT ON COLUMN _reuse_boundaries.ep IS 'episode id (_entries.ep)';
COMMENT ON COLUMN _reuse_boundaries.boundary IS 'tokens: the recurrent boundary (a multiple of the recurrent grid)';
COMMENT ON COLUMN _reuse_boundaries.tokens IS 'tokens the boundary would have added over the next lower one (or J_adopt)';
COMMENT ON COLUMN _reuse_boundaries.hash IS 'checkpoint key at the boundary (NULL: none recorded)';
COMMENT ON COLUMN _reuse_boundaries.cause IS 'never-published, not-yet-published, lost, attention-lost or other';
COMMENT ON COLUMN _reuse_boundaries.detail IS 'what the trace shows about that boundary at the lookup';
