-- Version 1 of the outbox table. Placeholders in braces are quoted identifiers filled in by
-- outbox/schema/plan.rs; nothing user-supplied is spliced in any other way. Statements end at a
-- line ending in `;`: the table in one short transaction, then each index built CONCURRENTLY
-- on its own (outside any transaction), so that a table already in use keeps taking writes.
CREATE TABLE IF NOT EXISTS {table} (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id          text NOT NULL UNIQUE CHECK (char_length(event_id) BETWEEN 1 AND 128),
    aggregate_type    text NOT NULL,
    aggregate_id      text NOT NULL,
    event_type        text NOT NULL,
    payload           jsonb NOT NULL,
    headers           jsonb NOT NULL DEFAULT '{}',
    queue_url         text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    available_at      timestamptz NOT NULL DEFAULT now(),
    attempts          integer NOT NULL DEFAULT 0,
    lease_owner       text,
    lease_until       timestamptz,
    lease_token       bigint NOT NULL DEFAULT 0,
    sent_at           timestamptz,
    message_id        text,
    quarantined_at    timestamptz,
    quarantine_reason text,
    last_error        text
)
-- fillfactor leaves room on each page so that a claim (which changes no indexed column) is a
-- HOT update; the autovacuum settings keep dead index entries of drained rows from piling up.
WITH (
    fillfactor = 80,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_insert_scale_factor = 0.01,
    autovacuum_analyze_scale_factor = 0.01
);

CREATE INDEX CONCURRENTLY IF NOT EXISTS {unsent_index} ON {table} (id)
    WHERE sent_at IS NULL AND quarantined_at IS NULL;

CREATE INDEX CONCURRENTLY IF NOT EXISTS {quarantined_index} ON {table} (id)
    WHERE quarantined_at IS NOT NULL;

-- Retention deletes sent rows oldest first; this index bounds each pass to the rows it removes.
CREATE INDEX CONCURRENTLY IF NOT EXISTS {sent_index} ON {table} (sent_at)
    WHERE sent_at IS NOT NULL;
