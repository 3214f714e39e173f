-- Fair claims, plain and ordered: the values of the fair key with pending rows (neither sent
-- nor quarantined: what the key's pending index holds), one index probe each. The body of a
-- recursive CTE named {walk}. The start compares the key (`>= ''`, true of every text but
-- null) so that it implies the index's predicate, `key IS NOT NULL` (KeyIndex::predicate): an
-- `IS NOT NULL` of its own would not do, PostgreSQL 17 and later drop it on a NOT NULL column
-- before they match index predicates, and the start then walked the unsent index whole.
--
-- `id >= $5` is the rows' floor (src/outbox/floors.rs), as in the claims' own scans. Each step
-- still passes over the index entries of a key's settled rows, which a held vacuum horizon
-- keeps (they come first in the key's (key, id) order); the floor, a condition on the index's
-- second column, turns those away in the index itself, without reading their heap tuples to
-- learn that they are dead: a step over a settled key costs an index entry per row, not a
-- heap visit. A key whose only pending rows committed late below the floor joins the walk
-- when the sweep lowers it, like every other scan from the floor.
(SELECT {key_bare} FROM {table}
 WHERE sent_at IS NULL AND quarantined_at IS NULL AND {key_bare} >= '' AND id >= $5::bigint
 ORDER BY 1 LIMIT 1)
UNION ALL
SELECT (SELECT {key_bare} FROM {table}
        WHERE sent_at IS NULL AND quarantined_at IS NULL AND {key_bare} > {walk}.k
          AND id >= $5::bigint
        ORDER BY 1 LIMIT 1)
FROM {walk}
WHERE {walk}.k IS NOT NULL
