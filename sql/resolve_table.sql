-- Does the table exist, and which NOTIFY channel does its trigger use? $1 is the quoted,
-- possibly schema-qualified name; the channel formula matches the trigger in migrate_v1.sql.
-- Also whether it is partitioned, which the relay does not serve (docs/operations.md).
SELECT 'outbox_relay_' || left(md5(n.nspname || '.' || c.relname), 16),
       c.relkind = 'p'
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = to_regclass($1)
