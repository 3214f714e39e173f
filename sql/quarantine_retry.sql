-- Re-drive quarantined rows: unsent again, attempts reset, available now, same event_id. The
-- last error is kept for the record until the next attempt replaces it. Selection: one id ($1),
-- one event_id ($2), or all ($3 = true), optionally narrowed to one reason ($4).
--
-- Each moved row says whether SQS may have accepted a copy of it within a FIFO destination's
-- 5-minute deduplication window: quarantined `max_attempts` (its claims ended without an
-- outcome, a send among them may have been accepted) less than 5 minutes ago.
WITH chosen AS (
    SELECT id, quarantine_reason = 'max_attempts'
               AND quarantined_at > now() - interval '5 minutes' AS maybe_accepted
    FROM {table}
    WHERE quarantined_at IS NOT NULL
      AND (id = $1 OR event_id = $2 OR $3)
      AND ($4::text IS NULL OR quarantine_reason = $4)
    FOR UPDATE
)
UPDATE {table} AS o
SET quarantined_at = NULL,
    quarantine_reason = NULL,
    attempts = 0,
    available_at = now()
FROM chosen
WHERE o.id = chosen.id
RETURNING o.id, chosen.maybe_accepted
