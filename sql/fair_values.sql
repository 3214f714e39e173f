-- Fair claims, plain and ordered: the values of the fair key with pending rows (neither sent
-- nor quarantined: what the key's pending index holds), one index probe each. The body of a
-- recursive CTE named {walk}. `IS NOT NULL` as in the index's predicate (KeyIndex::predicate),
-- which a start with no comparison of the key would not imply.
(SELECT {key_bare} FROM {table}
 WHERE sent_at IS NULL AND quarantined_at IS NULL AND {key_bare} IS NOT NULL ORDER BY 1 LIMIT 1)
UNION ALL
SELECT (SELECT {key_bare} FROM {table}
        WHERE sent_at IS NULL AND quarantined_at IS NULL AND {key_bare} > {walk}.k
        ORDER BY 1 LIMIT 1)
FROM {walk}
WHERE {walk}.k IS NOT NULL
