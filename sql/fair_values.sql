-- Fair claims, plain and ordered: the values of the fair key with pending rows (neither sent
-- nor quarantined: what the key's pending index holds), one index probe each. The body of a
-- recursive CTE named {walk}. The start compares the key (`>= ''`, true of every text but
-- null) so that it implies the index's predicate, `key IS NOT NULL` (KeyIndex::predicate): an
-- `IS NOT NULL` of its own would not do, PostgreSQL 17 and later drop it on a NOT NULL column
-- before they match index predicates, and the start then walked the unsent index whole.
(SELECT {key_bare} FROM {table}
 WHERE sent_at IS NULL AND quarantined_at IS NULL AND {key_bare} >= '' ORDER BY 1 LIMIT 1)
UNION ALL
SELECT (SELECT {key_bare} FROM {table}
        WHERE sent_at IS NULL AND quarantined_at IS NULL AND {key_bare} > {walk}.k
        ORDER BY 1 LIMIT 1)
FROM {walk}
WHERE {walk}.k IS NOT NULL
