-- The relays of this table, one narrow row each (schema version 4): who each is, its version,
-- since when it runs, when it last claimed, and whether the schema lets it claim; since schema
-- version 5 also where its scans of the table start (its floors, src/outbox/floors.rs), so
-- that `status` seeks from them rather than reading what settled rows left. Each relay
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
    seen_until    timestamptz NOT NULL,
    unsent_floor  bigint,
    claims_floor  bigint
)
WITH (
    fillfactor = 50,
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 200
);

-- A registry of schema version 4 gains the floors (NULL for relays that do not publish them:
-- `status` then reads from the start). Nullable and without a default: no rewrite, and the
-- lock is the registry's alone, which only relays' renewals touch.
ALTER TABLE {relays}
    ADD COLUMN IF NOT EXISTS unsent_floor bigint,
    ADD COLUMN IF NOT EXISTS claims_floor bigint;
