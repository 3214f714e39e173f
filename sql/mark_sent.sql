-- SQS acknowledged these rows. Fenced by (id, lease_owner, lease_token): a row another replica
-- has claimed since is not touched, and does not come back in RETURNING.
UPDATE {table} AS o
SET sent_at = now(),
    message_id = u.message_id,
    lease_until = NULL
FROM unnest($2::bigint[], $3::bigint[], $4::text[]) AS u(id, lease_token, message_id)
WHERE o.id = u.id
  AND o.lease_token = u.lease_token
  AND o.lease_owner = $1
  AND o.sent_at IS NULL
  AND o.quarantined_at IS NULL
RETURNING o.id
