-- The (key, id) index that ordered delivery probes and fair claiming walks, for one key. It
-- covers every row not yet sent, quarantined ones included: a quarantined row still holds
-- its group back.
CREATE INDEX IF NOT EXISTS {index} ON {table} ({key_bare}, id)
    WHERE sent_at IS NULL
