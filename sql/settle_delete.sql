-- --retention 0 (the default): acknowledged rows go (see sql/settle.sql).
acked AS MATERIALIZED (
    SELECT u.id
    FROM unnest($3::bigint[]) AS u(id)
    WHERE u.id IN (SELECT id FROM held)
),
sent AS (
    DELETE FROM {table} AS o
    USING acked AS u
    WHERE o.id = u.id
      AND o.id = ANY (ARRAY(SELECT id FROM acked))
      AND coalesce(o.sent_at, o.quarantined_at) IS NULL
    RETURNING o.id
)