-- Whether the table $1 (quoted, possibly schema-qualified) is partitioned: `migrate`, `check`
-- and `run` refuse a partitioned outbox (docs/operations.md, "Partitioned outbox tables").
SELECT coalesce((SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass($1)), false)
