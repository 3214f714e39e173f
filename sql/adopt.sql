-- Adopt an existing outbox table (for example Debezium's outbox-router shape): add only the
-- columns and indexes the relay owns, never touch the application's columns, and expose the
-- table to the relay through a view with the standard column names ({view}). The view is
-- automatically updatable: the relay's UPDATEs and DELETEs reach the table's own rows.
-- Placeholders are quoted identifiers or, for {channel}, a quoted literal built from hex.
ALTER TABLE {base}
    ADD COLUMN IF NOT EXISTS {seq} bigint GENERATED ALWAYS AS IDENTITY,
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
    ADD COLUMN IF NOT EXISTS last_error text;

CREATE UNIQUE INDEX IF NOT EXISTS {seq_index} ON {base} ({seq});

CREATE INDEX IF NOT EXISTS {unsent_index} ON {base} ({seq})
    WHERE sent_at IS NULL AND quarantined_at IS NULL;

CREATE INDEX IF NOT EXISTS {quarantined_index} ON {base} ({seq})
    WHERE quarantined_at IS NOT NULL;

CREATE INDEX IF NOT EXISTS {sent_index} ON {base} (sent_at)
    WHERE sent_at IS NOT NULL;

CREATE OR REPLACE VIEW {view} AS
SELECT {view_columns},
       created_at, available_at, attempts, lease_owner, lease_until, lease_token,
       sent_at, message_id, quarantined_at, quarantine_reason, last_error
FROM {base};

-- The relay listens on the channel of the view it reads; the trigger on the table names it.
CREATE OR REPLACE FUNCTION {notify_function}() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM pg_notify(TG_ARGV[0], '');
    RETURN NULL;
END
$fn$;

CREATE OR REPLACE TRIGGER outbox_relay_notify
    AFTER INSERT ON {base}
    FOR EACH STATEMENT EXECUTE FUNCTION {notify_function}({channel});
