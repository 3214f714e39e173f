-- Retention: delete at most $2 sent rows whose sent_at is older than $1 seconds, oldest first.
-- One short statement per batch; SKIP LOCKED so it never waits on a row another statement holds.
-- Unsent and quarantined rows have no sent_at and are never touched. The ids are returned so
-- that the maintenance connection's unnamed statements can count them.
DELETE FROM {table}
WHERE id IN (
    SELECT id
    FROM {table}
    WHERE sent_at < now() - make_interval(secs => $1)
    ORDER BY sent_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
RETURNING id
