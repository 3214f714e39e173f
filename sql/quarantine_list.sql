-- Quarantined rows, oldest first, optionally of one reason ($1 null = all), at most $2.
SELECT id, event_id, aggregate_type, aggregate_id, event_type, coalesce(quarantine_reason, ''),
       coalesce(last_error, ''), attempts, quarantined_at::text, created_at::text
FROM {table}
WHERE quarantined_at IS NOT NULL
  AND ($1::text IS NULL OR quarantine_reason = $1)
ORDER BY id
LIMIT $2
