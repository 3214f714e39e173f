-- The live relays of the table, for `status` and `migrate --contract`: registrations whose
-- lease has not run out, newest version first. Ages are the database's clock.
SELECT relay_id, version, host,
       extract(epoch FROM now() - started_at)::float8,
       extract(epoch FROM now() - last_claim_at)::float8,
       claiming,
       started_at::text
FROM {relays}
WHERE seen_until > now()
ORDER BY version DESC, relay_id
