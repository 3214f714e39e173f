-- The ordered claim's first group key past the cursor $7 with an unsent row from the rows'
-- floor $5 on, while the claim has fewer than $1 rows (sql/claim_ordered.sql, `keys`).
-- `>= ''` implies the key index's predicate, `key IS NOT NULL` (KeyIndex::predicate), which
-- the `OR` does not; the floor turns away settled rows' entries in the index (see
-- sql/fair_values.sql). Comment lines are dropped and the rest joined into one line.
SELECT (SELECT {key_bare} FROM {table}
WHERE sent_at IS NULL AND quarantined_at IS NULL AND {key_bare} >= ''
AND ($7::text IS NULL OR {key_bare} > $7::text) AND id >= $5::bigint
ORDER BY 1 LIMIT 1), 1::bigint
WHERE (SELECT count(*) FROM oldest) < $1
