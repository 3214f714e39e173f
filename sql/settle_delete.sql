-- --retention 0 (the default): acknowledged rows go (see sql/settle.sql).
DELETE FROM {table} AS o
WHERE o.id = ANY ($3::bigint[])
  AND o.id IN (SELECT id FROM held)
  AND o.sent_at IS NULL
  AND o.quarantined_at IS NULL
RETURNING o.id
