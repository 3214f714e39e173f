-- A relay renews its registration and reads the contract again, in one round trip every few
-- seconds (version::check_every) on its maintenance connection: what makes it stop claiming
-- within seconds of a schema that no longer admits it, and what `status` and `migrate
-- --contract` know of the fleet. $1 relay id, $2 its version, $3 host, $4 started, $5 its last
-- claim, $6 whether it claims, $7 --lease in seconds (a registration lasts that long: a relay
-- gone silent drops off after its lease), $8 the table's name in the version table, $9 and $10
-- its floors in this table (src/outbox/floors.rs): where `status` may start reading.
-- The answer is read from the statement's snapshot: the fleet as it was before this renewal.
WITH renewed AS (
    INSERT INTO {relays} AS r (relay_id, version, host, started_at, last_claim_at, claiming, seen_until,
                               unsent_floor, claims_floor)
    VALUES ($1, $2, $3, $4, $5, $6, now() + make_interval(secs => $7), $9, $10)
    ON CONFLICT (relay_id) DO UPDATE
        SET version = excluded.version, host = excluded.host, started_at = excluded.started_at,
            last_claim_at = excluded.last_claim_at, claiming = excluded.claiming,
            seen_until = excluded.seen_until, unsent_floor = excluded.unsent_floor,
            claims_floor = excluded.claims_floor
), lapsed AS (
    DELETE FROM {relays} WHERE seen_until < now() - make_interval(secs => $7) AND relay_id <> $1
)
SELECT (SELECT to_jsonb(v) FROM {versions} AS v WHERE v.table_name = $8),
       ARRAY(SELECT relay_id FROM {relays} WHERE seen_until > now() ORDER BY relay_id),
       ARRAY(SELECT version FROM {relays} WHERE seen_until > now() ORDER BY relay_id),
       ARRAY(SELECT claiming FROM {relays} WHERE seen_until > now() ORDER BY relay_id)
