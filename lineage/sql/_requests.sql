-- _requests: a dense integer per request id that has an episode (the smallest ep of its
-- episodes). The heavy joins carry this integer instead of the request id string: a supply
-- row's rid is its request's number, 0 for a request without an episode, NULL for NULL. Two
-- request ids are equal exactly when their rids are (0 only ever meets episode rids >= 1).
CREATE OR REPLACE VIEW _requests AS
SELECT request_id, min(ep) AS rid
FROM _entries
GROUP BY request_id;

COMMENT ON VIEW _requests IS 'integer id of each request that has an episode';
COMMENT ON COLUMN _requests.request_id IS 'request id';
COMMENT ON COLUMN _requests.rid IS 'smallest ep of the request''s episodes (>= 1)';
