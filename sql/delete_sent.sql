-- --delete-on-ack: SQS acknowledged these rows, so they go. Fenced like mark_sent; the returned
-- count tells which deletions were ours to make.
DELETE FROM {table} AS o
USING unnest($2::bigint[], $3::bigint[]) AS u(id, lease_token)
WHERE o.id = u.id
  AND o.lease_token = u.lease_token
  AND o.lease_owner = $1
  AND o.sent_at IS NULL
  AND o.quarantined_at IS NULL
