-- Claim up to $1 rows for owner $2 for $3 seconds. Rows under another unexpired lease, rows
-- waiting for a retry and rows already settled are skipped; rows locked by a concurrent claim
-- are skipped too (SKIP LOCKED), so replicas never wait on each other. The lease token is
-- bumped so that a replica whose lease expired can no longer settle these rows.
WITH candidates AS (
    SELECT id
    FROM {table}
    WHERE sent_at IS NULL
      AND quarantined_at IS NULL
      AND available_at <= now()
      AND (lease_until IS NULL OR lease_until < now())
    ORDER BY id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE {table} AS o
SET lease_owner = $2,
    lease_until = now() + make_interval(secs => $3),
    lease_token = o.lease_token + 1,
    attempts = o.attempts + 1
FROM candidates
WHERE o.id = candidates.id
RETURNING o.id, o.event_id, o.aggregate_type, o.aggregate_id, o.event_type, o.payload::text,
          o.headers, o.queue_url, o.lease_token, o.attempts,
          extract(epoch FROM o.created_at)::float8
