-- Schema version 3: the deduplication ID `replay --new-dedup-id` gives a row (NULL: the row's
-- event_id, as always). A nullable column without a default is a catalog change only: no
-- rewrite, and the table's lock is held for a moment, under migrate's lock timeout.
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS dedup_id text;
