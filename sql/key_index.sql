-- A (key, id) index for one key (with --order-by transaction (key, xact_id, id)), of one of
-- the kinds of KeyIndex in ident.rs: over every
-- row for ordered delivery (no predicate), over rows not yet sent for fair claiming. The id
-- column is `id`, or an adopted table's sequence column; the key an expression on the table.
CREATE INDEX CONCURRENTLY IF NOT EXISTS {index} ON {table} ({key}, {order_columns}{id}){predicate};
