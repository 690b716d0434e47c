-- class_counts: episodes per depth class and scope (ALL, INITIAL, RESUME), with the fraction of
-- the scope's classified episodes (like the paper's Table C-2, which reports INITIAL). Every
-- class appears in every scope, with 0 when empty.
CREATE OR REPLACE VIEW class_counts AS
WITH classes(class, class_order) AS (
    VALUES ('zero->zero', 1), ('positive-equal', 2), ('zero->positive', 3),
           ('deeper', 4), ('shallower', 5)
),
scopes(scope) AS (
    VALUES ('ALL'), ('INITIAL'), ('RESUME')
),
counted AS (
    SELECT s.scope, l.class, count(*) AS n
    FROM episode_lineage AS l
    JOIN scopes AS s ON s.scope = 'ALL' OR s.scope = l.episode
    WHERE l.class IS NOT NULL
    GROUP BY s.scope, l.class
)
SELECT
    s.scope,
    c.class,
    c.class_order,
    coalesce(n.n, 0) AS episodes,
    coalesce(n.n, 0) / nullif(sum(coalesce(n.n, 0)) OVER (PARTITION BY s.scope), 0) AS fraction
FROM scopes AS s
CROSS JOIN classes AS c
LEFT JOIN counted AS n ON n.scope = s.scope AND n.class = c.class;

COMMENT ON VIEW class_counts IS 'episodes per depth class and scope, with fractions (Table C-2)';
COMMENT ON COLUMN class_counts.scope IS 'ALL, INITIAL or RESUME episodes';
COMMENT ON COLUMN class_counts.class IS 'zero->zero, positive-equal, zero->positive, deeper, shallower';
COMMENT ON COLUMN class_counts.class_order IS '1..5, the paper''s column order';
COMMENT ON COLUMN class_counts.episodes IS 'classified episodes of the scope in the class';
COMMENT ON COLUMN class_counts.fraction IS 'episodes / classified episodes of the scope (NULL: none)';
