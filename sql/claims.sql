-- The relay's leases, one row per claim: the ids it holds, who holds them and until when (the
-- database's clock). A claim writes this one narrow row instead of a new version of every wide
-- outbox row it takes: measured, the relay wrote 868 bytes of WAL per event leasing on the row
-- and 105 this way (docs/benchmarks.md, "Where the lease lives"). `token` is the fencing
-- generation: a settlement applies only while its claim's row is still here, and it deletes the
-- row as it applies, so a replica whose lease ended and was taken over changes nothing.
-- Rows come and go with claims; the autovacuum settings keep the dead ones from piling up
-- under a table that every claim reads whole.
CREATE TABLE IF NOT EXISTS {claims} (
    token bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    owner text NOT NULL,
    until timestamptz NOT NULL,
    ids   bigint[] NOT NULL
)
WITH (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 200,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 200,
    autovacuum_vacuum_cost_delay = 0
);
