-- Schema version 3: the deduplication ID `replay --new-dedup-id` gives a row (NULL: the row's
-- event_id, as always). A nullable column without a default is a catalog change only: no
-- rewrite, and the table's lock is held for a moment, under migrate's lock timeout. Looked up
-- first, so that a rerun takes no lock at all (an open transaction of the application's holds
-- no migrate that has nothing to do).
DO $migrate$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = {table_literal}::regclass
                     AND attname = 'dedup_id' AND NOT attisdropped) THEN
        ALTER TABLE {table} ADD COLUMN dedup_id text;
    END IF;
END
$migrate$;
