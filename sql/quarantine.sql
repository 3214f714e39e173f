-- Park rows that must not be retried as they are, with the reason and the error. They stay in
-- the table until an operator re-drives them. Fenced like mark_sent. A row with a delay ($6 not
-- null) is parked for its destination instead: the relay's maintenance makes it unsent again
-- once `available_at` has passed, and the claim's attempt is given back (the queue, not the
-- row, failed).
UPDATE {table} AS o
SET quarantined_at = now(),
    quarantine_reason = u.reason,
    last_error = u.error,
    lease_until = NULL,
    available_at = CASE WHEN u.delay IS NULL THEN o.available_at
                        ELSE now() + make_interval(secs => u.delay) END,
    attempts = CASE WHEN u.delay IS NULL THEN o.attempts
                    ELSE greatest(o.attempts - 1, 0) END
FROM unnest($2::bigint[], $3::bigint[], $4::text[], $5::text[], $6::float8[])
     AS u(id, lease_token, reason, error, delay)
WHERE o.id = u.id
  AND o.lease_token = u.lease_token
  AND o.lease_owner = $1
  AND o.sent_at IS NULL
  AND o.quarantined_at IS NULL
RETURNING o.id
