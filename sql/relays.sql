-- The relays of this table, one narrow row each (schema version 4): who each is, its version,
-- since when it runs, when it last claimed, and whether the schema lets it claim. Each relay
-- rewrites its own row every few seconds (sql/renew.sql), nothing per claim, so the registry
-- costs the database a one-row update per relay per renewal; no column is indexed but the key,
-- and fillfactor leaves each page room for those updates to stay HOT. A row whose seen_until
-- passed is a relay gone silent: listed no more, and deleted by the others' renewals.
CREATE TABLE IF NOT EXISTS {relays} (
    relay_id      text PRIMARY KEY,
    version       text NOT NULL,
    host          text NOT NULL,
    started_at    timestamptz NOT NULL,
    last_claim_at timestamptz,
    claiming      boolean NOT NULL,
    seen_until    timestamptz NOT NULL
)
WITH (
    fillfactor = 50,
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 200
);
