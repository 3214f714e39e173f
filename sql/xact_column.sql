-- --order-by transaction (src/outbox/order_by.rs): every row records the ID of the transaction
-- that wrote it. Added with a constant default first, which is a catalog change only (no
-- rewrite; rows written before read as 0, earlier than every transaction), then given the
-- default new rows take; both in this one transaction, holding the table's lock for a moment,
-- under migrate's lock timeout. Looked up first, so that a rerun takes no lock at all.
DO $migrate$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = {table_literal}::regclass
                     AND attname = 'xact_id' AND NOT attisdropped) THEN
        ALTER TABLE {table} ADD COLUMN xact_id xid8 NOT NULL DEFAULT '0';
        ALTER TABLE {table} ALTER COLUMN xact_id SET DEFAULT pg_current_xact_id();
    END IF;
END
$migrate$;
