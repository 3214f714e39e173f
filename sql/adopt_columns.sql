-- Adopt an existing outbox table (for example Debezium's outbox-router shape), first step: the
-- columns the relay owns, in one short transaction. No column is added with a volatile
-- default, so nothing rewrites the table: the sequence column {seq} starts out empty (NULL)
-- and the constant or stable defaults (0, now()) are stored once in the catalog
-- (PostgreSQL 11+). The application's columns are never touched.
ALTER TABLE {base}
    ADD COLUMN IF NOT EXISTS {seq} bigint,
    ADD COLUMN IF NOT EXISTS created_at timestamptz NOT NULL DEFAULT now(),
    ADD COLUMN IF NOT EXISTS available_at timestamptz NOT NULL DEFAULT now(),
    ADD COLUMN IF NOT EXISTS attempts integer NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS lease_owner text,
    ADD COLUMN IF NOT EXISTS lease_until timestamptz,
    ADD COLUMN IF NOT EXISTS lease_token bigint NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS sent_at timestamptz,
    ADD COLUMN IF NOT EXISTS message_id text,
    ADD COLUMN IF NOT EXISTS quarantined_at timestamptz,
    ADD COLUMN IF NOT EXISTS quarantine_reason text,
    ADD COLUMN IF NOT EXISTS last_error text,
    ADD COLUMN IF NOT EXISTS dedup_id text;
