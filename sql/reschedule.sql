-- Give rows back: available again after their delay, lease cleared. `refund` is 1 where the
-- failure was not the row's fault (throttling, an outage, a shutdown), so the claim's attempt
-- is not counted against it. A null error keeps the previous one. Fenced like mark_sent.
UPDATE {table} AS o
SET available_at = now() + make_interval(secs => u.delay),
    lease_owner = NULL,
    lease_until = NULL,
    attempts = greatest(o.attempts - u.refund, 0),
    last_error = coalesce(u.error, o.last_error)
FROM unnest($2::bigint[], $3::bigint[], $4::float8[], $5::text[], $6::int[])
     AS u(id, lease_token, delay, error, refund)
WHERE o.id = u.id
  AND o.lease_token = u.lease_token
  AND o.lease_owner = $1
  AND o.sent_at IS NULL
  AND o.quarantined_at IS NULL
RETURNING o.id
