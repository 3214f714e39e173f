-- --retention other than 0: acknowledged rows are marked sent with their message id (the last parameter),
-- and kept until retention deletes them (see sql/settle.sql).
acked AS MATERIALIZED (
    SELECT u.*
    FROM unnest($3::bigint[], {message_ids}::text[]) AS u(id, message_id)
    WHERE u.id IN (SELECT id FROM held)
),
sent AS (
    UPDATE {table} AS o
    SET sent_at = now(),
        message_id = u.message_id,
        attempts = o.attempts + 1
    FROM acked AS u
    WHERE o.id = u.id
      AND o.id = ANY (ARRAY(SELECT id FROM acked))
      AND coalesce(o.sent_at, o.quarantined_at) IS NULL
    RETURNING o.id
)