-- A (key, id) index for one key, of one of two kinds (see KeyIndex in outbox.rs): over every
-- row for ordered delivery (`{predicate}` empty), over rows not yet sent for fair claiming.
CREATE INDEX IF NOT EXISTS {index} ON {table} ({key_bare}, id){predicate}
