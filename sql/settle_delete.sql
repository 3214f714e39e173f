-- --retention 0 (the default): acknowledged rows go (see sql/settle.sql). Nothing of them is
-- carried but their ids, so the outbox rows are reached by one array of the acknowledged ids
-- the fence listed: no join, no list of its own (a quarter of the settlement's execution).
sent AS (
    DELETE FROM {table} AS o
    WHERE o.id = ANY (ARRAY(SELECT id FROM held WHERE id = ANY ($3::bigint[])))
      AND coalesce(o.sent_at, o.quarantined_at) IS NULL
    RETURNING o.id
)
