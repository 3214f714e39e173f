-- The claim's second half, shared by every claim mode: lease the chosen `candidates` to owner
-- $2 for $3 seconds. The lease token is bumped so that a replica whose lease expired can no
-- longer settle these rows. The first half (a WITH list ending in `candidates`) comes from one
-- of the claim_candidates*.sql files.
--
-- A candidate with a `doom` (see `weighed` in claim.rs) is quarantined here instead, in the
-- same statement: its payload is larger than the relay can hold ({max_payload} bytes), or its
-- claims kept ending without an outcome (its relays died holding it) until its attempts reached
-- {max_attempts}. Such a row is not leased, spends no attempt, and its payload is not returned:
-- reading it may be what killed the relays before.
UPDATE {table} AS o
SET lease_owner = $2,
    lease_until = CASE WHEN candidates.doom IS NULL THEN now() + make_interval(secs => $3) END,
    lease_token = o.lease_token + 1,
    attempts = o.attempts + CASE WHEN candidates.doom IS NULL THEN 1 ELSE 0 END,
    quarantined_at = CASE WHEN candidates.doom IS NULL THEN NULL ELSE now() END,
    quarantine_reason = coalesce(candidates.doom, o.quarantine_reason),
    last_error = CASE candidates.doom
        WHEN 'too_large' THEN format(
            'payload of %s bytes is larger than the relay can hold (%s bytes, --max-payload-bytes); quarantined at claim without being read',
            candidates.bytes, {max_payload})
        WHEN 'max_attempts' THEN format(
            'claimed %s times (--max-attempts %s) and the last claim ended without an outcome: the relay holding it stopped or lost its lease; quarantined at claim, not sent again',
            o.attempts, {max_attempts})
        ELSE o.last_error END
FROM candidates
WHERE o.id = candidates.id
RETURNING o.id, o.event_id, o.aggregate_type, o.aggregate_id, o.event_type,
          CASE WHEN candidates.doom IS NULL THEN o.payload::text END,
          o.headers, o.queue_url, o.lease_token, o.attempts,
          extract(epoch FROM o.created_at)::float8,
          to_char(o.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
          candidates.doom,
          CASE WHEN candidates.doom IS NOT NULL THEN o.last_error END
