-- Re-drive quarantined rows: unsent again, attempts reset, available now, same event_id. The
-- last error is kept for the record until the next attempt replaces it. Selection: one id ($1),
-- one event_id ($2), or all ($3 = true), optionally narrowed to one reason ($4).
UPDATE {table}
SET quarantined_at = NULL,
    quarantine_reason = NULL,
    attempts = 0,
    available_at = now()
WHERE quarantined_at IS NOT NULL
  AND (id = $1 OR event_id = $2 OR $3)
  AND ($4::text IS NULL OR quarantine_reason = $4)
RETURNING id
