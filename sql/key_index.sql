-- A (key, id) index for one key, of one of two kinds (see KeyIndex in outbox.rs): over every
-- row for ordered delivery (no predicate), over rows not yet sent for fair claiming. The id
-- column is `id`, or an adopted table's sequence column; the key an expression on the table.
CREATE INDEX CONCURRENTLY IF NOT EXISTS {index} ON {table} ({key}, {id}){predicate};
