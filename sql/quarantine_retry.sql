-- Re-drive quarantined rows: unsent again, attempts reset, available now, same event_id. The
-- last error is kept for the record until the next attempt replaces it. Selection: these ids
-- ($1), one event_id ($2), or all ($3 = true); narrowed to one reason ($4) and to one
-- destination ($5: a row's own queue_url, '' for rows without one, which go where the relays'
-- --queue-url and routes say). With $6 (a dry run) the rows are counted and left as they are.
--
-- The answer says how many rows were selected, how many moved, and of the selected how many
-- SQS may have accepted a copy of within a FIFO destination's 5-minute deduplication window:
-- quarantined `max_attempts` (its claims ended without an outcome, a send among them may have
-- been accepted) less than 5 minutes ago.
WITH chosen AS (
    SELECT id, quarantine_reason = 'max_attempts'
               AND quarantined_at > now() - interval '5 minutes' AS maybe_accepted
    FROM {table}
    WHERE quarantined_at IS NOT NULL
      AND (id = ANY ($1::bigint[]) OR event_id = $2 OR $3)
      AND ($4::text IS NULL OR quarantine_reason = $4)
      AND ($5::text IS NULL OR coalesce(queue_url, '') = $5)
    FOR UPDATE
), moved AS (
    UPDATE {table} AS o
    SET quarantined_at = NULL,
        quarantine_reason = NULL,
        attempts = 0,
        available_at = now()
    FROM chosen
    WHERE o.id = chosen.id
      AND NOT $6::boolean
    RETURNING o.id
)
SELECT count(*),
       count(*) FILTER (WHERE maybe_accepted),
       (SELECT count(*) FROM moved)
FROM chosen
