-- The tables a --tables pattern selects: ordinary or partitioned tables (never a partition)
-- whose schema and name match the LIKE patterns $1 and $2, with the two columns every outbox
-- has (event_id, payload): the relay's own tables beside each outbox (leases, registry,
-- versions) have neither, so `tenant_*.*` does not select them. System schemas never match.
SELECT n.nspname, c.relname
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p')
  AND NOT c.relispartition
  AND n.nspname LIKE $1
  AND c.relname LIKE $2
  AND n.nspname <> 'information_schema'
  AND n.nspname NOT LIKE 'pg\_%'
  AND (SELECT count(*)
       FROM pg_attribute a
       WHERE a.attrelid = c.oid
         AND a.attnum > 0
         AND NOT a.attisdropped
         AND a.attname IN ('event_id', 'payload')) = 2
ORDER BY n.nspname, c.relname
