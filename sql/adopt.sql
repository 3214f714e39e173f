-- Adopt an existing outbox table, last steps: the relay's indexes, each built CONCURRENTLY on
-- its own, then the view through which the relay reads the table with the standard column
-- names ({view}). The view is automatically updatable: the relay's UPDATEs and DELETEs reach
-- the table's own rows. It never shows a row whose sequence value is still missing.
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS {seq_index} ON {base} ({seq});

CREATE INDEX CONCURRENTLY IF NOT EXISTS {unsent_index} ON {base} ({seq})
    WHERE sent_at IS NULL AND quarantined_at IS NULL;

CREATE INDEX CONCURRENTLY IF NOT EXISTS {quarantined_index} ON {base} ({seq})
    WHERE quarantined_at IS NOT NULL;

CREATE INDEX CONCURRENTLY IF NOT EXISTS {sent_index} ON {base} (sent_at)
    WHERE sent_at IS NOT NULL;

CREATE OR REPLACE VIEW {view} AS
SELECT {view_columns},
       created_at, available_at, attempts, lease_owner, lease_until, lease_token,
       sent_at, message_id, quarantined_at, quarantine_reason, last_error, dedup_id
FROM {base}
WHERE {seq} IS NOT NULL;
