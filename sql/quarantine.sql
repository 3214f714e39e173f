-- Park rows that must not be retried as they are, with the reason and the error. They stay in
-- the table until an operator re-drives them. Fenced like mark_sent.
UPDATE {table} AS o
SET quarantined_at = now(),
    quarantine_reason = u.reason,
    last_error = u.error,
    lease_until = NULL
FROM unnest($2::bigint[], $3::bigint[], $4::text[], $5::text[]) AS u(id, lease_token, reason, error)
WHERE o.id = u.id
  AND o.lease_token = u.lease_token
  AND o.lease_owner = $1
  AND o.sent_at IS NULL
  AND o.quarantined_at IS NULL
RETURNING o.id
