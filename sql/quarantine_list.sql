-- Quarantined rows, oldest first, optionally of one reason ($1 null = all) and one destination
-- ($4: a row's own queue_url, '' for rows without one; null = all), at most $2, after id $3 (a
-- page's last; 0 from the start): a seek on the quarantined partial index, however many rows
-- lie before it.
SELECT id, event_id, aggregate_type, aggregate_id, event_type, coalesce(quarantine_reason, ''),
       coalesce(last_error, ''), attempts, quarantined_at::text, created_at::text,
       coalesce(queue_url, '')
FROM {table}
WHERE quarantined_at IS NOT NULL
  AND id > $3::bigint
  AND ($1::text IS NULL OR quarantine_reason = $1)
  AND ($4::text IS NULL OR coalesce(queue_url, '') = $4)
ORDER BY id
LIMIT $2
