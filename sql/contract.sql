-- What the table's schema says of the relays that may claim on it: the row `migrate` recorded
-- (schema version, relay_versions), read at every new connection of a relay. The whole row as
-- JSON, so that a version table of before (no relay_versions column yet) reads the same way
-- and the relay can say "run migrate" instead of failing on a missing column. $1: the table's
-- name.
SELECT to_jsonb(v) FROM {versions} AS v WHERE v.table_name = $1
