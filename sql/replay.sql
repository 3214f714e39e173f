-- `outbox-relay replay`: rows kept by --retention (sent, not quarantined) become unsent again,
-- to be sent once more by the relays with the same event_id: attempts reset, available now,
-- the old message_id cleared (the new send records its own). Selection: event ids $1, created
-- at or after $2 and before $3, event types $4 (each NULL: any); at most $5 rows, lowest ids
-- first. $6: give each a fresh deduplication ID, so that a FIFO queue or topic does not drop
-- the copy as a duplicate of one it accepted within its 5-minute window (NULL keeps the
-- event_id, or an earlier replay's). $7: a dry run, which changes nothing.
--
-- Answers: rows selected, of them those sent less than 5 minutes ago (inside the FIFO
-- deduplication window of the copy SQS accepted), the lowest and highest id, rows replayed.
WITH chosen AS (
    SELECT id, sent_at
    FROM {table}
    WHERE sent_at IS NOT NULL
      AND quarantined_at IS NULL
      AND ($1::text[] IS NULL OR event_id = ANY ($1::text[]))
      AND ($2::timestamptz IS NULL OR created_at >= $2::timestamptz)
      AND ($3::timestamptz IS NULL OR created_at < $3::timestamptz)
      AND ($4::text[] IS NULL OR event_type = ANY ($4::text[]))
    ORDER BY id
    LIMIT $5
    FOR UPDATE
), replayed AS (
    UPDATE {table} AS o
    SET sent_at = NULL,
        message_id = NULL,
        attempts = 0,
        available_at = now(),
        last_error = NULL,
        dedup_id = CASE WHEN $6::bool THEN o.event_id || ':replay:' || gen_random_uuid()
                        ELSE o.dedup_id END
    FROM chosen
    WHERE o.id = chosen.id
      AND NOT $7::bool
    RETURNING o.id
)
SELECT count(*),
       count(*) FILTER (WHERE sent_at > now() - interval '5 minutes'),
       min(id),
       max(id),
       (SELECT count(*) FROM replayed)
FROM chosen
