-- `outbox-relay status` on a table migrated for --order-by transaction: the unsent rows the
-- claims' watermark holds back (a transaction older than the row's own still runs:
-- src/outbox/order_by.rs), and the age of the oldest of them. Reads the unsent index from $1,
-- the floor sql/status_floors.sql found.
SELECT count(*),
       coalesce(greatest(extract(epoch FROM now() - min(created_at)), 0)::float8, 0)
FROM {table}
WHERE sent_at IS NULL
  AND quarantined_at IS NULL
  AND id >= $1::bigint
  AND NOT ({released})
