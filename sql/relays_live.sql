-- The live relays of the table, for `status` and `migrate --contract`: registrations whose
-- lease has not run out, newest version first. Ages are the database's clock. The floors it
-- published (schema version 5) are read through to_jsonb, NULL on a registry without them.
SELECT relay_id, version, host,
       extract(epoch FROM now() - started_at)::float8,
       extract(epoch FROM now() - last_claim_at)::float8,
       claiming,
       started_at::text,
       (to_jsonb(r) ->> 'unsent_floor')::bigint,
       (to_jsonb(r) ->> 'claims_floor')::bigint
FROM {relays} AS r
WHERE seen_until > now()
ORDER BY version DESC, relay_id
