-- Retention: delete at most $2 sent rows whose sent_at is older than $1 seconds, oldest first,
-- from sent_at $3 on (NULL: from the first): each relay keeps where the last pass got to
-- (src/outbox/floors.rs), so a pass seeks past the entries the rows it deleted before left in
-- the index, which a held vacuum horizon keeps, instead of reading them every time.
-- One short statement per batch; SKIP LOCKED so it never waits on a row another statement holds.
-- Unsent and quarantined rows have no sent_at and are never touched. The ids are returned so
-- that the maintenance connection's unnamed statements can count them, with their sent_at, so
-- that the next batch starts there. The rows chosen are deleted by primary key from an array:
-- `id IN (...)` let the plan start from the outbox, its whole primary key, on a table the
-- planner sees as empty (see sql/settle.sql).
DELETE FROM {table}
WHERE id = ANY (ARRAY(
    SELECT id
    FROM {table}
    WHERE sent_at < now() - make_interval(secs => $1)
      AND sent_at >= coalesce($3::timestamptz, '-infinity')
    ORDER BY sent_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
))
RETURNING id, sent_at
