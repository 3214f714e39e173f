-- The claim's second half, shared by every claim mode: lease the chosen `candidates` to owner
-- $2 for $3 seconds. The lease token is bumped so that a replica whose lease expired can no
-- longer settle these rows. The first half (a WITH list ending in `candidates`) comes from one
-- of the claim_candidates*.sql files.
UPDATE {table} AS o
SET lease_owner = $2,
    lease_until = now() + make_interval(secs => $3),
    lease_token = o.lease_token + 1,
    attempts = o.attempts + 1
FROM candidates
WHERE o.id = candidates.id
RETURNING o.id, o.event_id, o.aggregate_type, o.aggregate_id, o.event_type, o.payload::text,
          o.headers, o.queue_url, o.lease_token, o.attempts,
          extract(epoch FROM o.created_at)::float8,
          to_char(o.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
