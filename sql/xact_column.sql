-- --order-by transaction (src/outbox/order_by.rs): every row records the ID of the transaction
-- that wrote it. Added with a constant default first, which is a catalog change only (no
-- rewrite; rows written before read as 0, earlier than every transaction), then given the
-- default new rows take. Each statement holds the table's lock for a moment, under migrate's
-- lock timeout; rerun, both are no-ops.
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS xact_id xid8 NOT NULL DEFAULT '0';
ALTER TABLE {table} ALTER COLUMN xact_id SET DEFAULT pg_current_xact_id();
