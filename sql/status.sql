-- `outbox-relay status`. Each part reads one of the partial indexes the migration creates
-- (unsent, quarantined, sent), never the whole table, so it answers quickly on millions of
-- rows; the unsent index from $1 and the lease table from $2 on, the floors the live relays
-- published (sql/status_floors.sql), not what a held vacuum horizon keeps below them. Leased
-- rows are the unsent ones a claim that has not ended lists (sql/claims.sql).
-- Rows parked in quarantine (`blocked`, `destination`) are waiting, not refused: they count
-- as unsent (as in sql/stats.sql, the gauges) and under their reason in quarantine.
WITH unsent AS (
    SELECT
        (SELECT count(*) FROM {table}
         WHERE sent_at IS NULL AND quarantined_at IS NULL AND id >= $1::bigint) AS n,
        (SELECT count(*) FROM {table}
         WHERE sent_at IS NULL AND quarantined_at IS NULL AND id >= $1::bigint
           AND id IN (SELECT unnest(l.ids) FROM {claims} AS l
                      WHERE l.token >= $2::bigint AND l.until > now())) AS leased,
        (SELECT created_at FROM {table}
         WHERE sent_at IS NULL AND quarantined_at IS NULL AND id >= $1::bigint
         ORDER BY id
         LIMIT 1) AS oldest
), quarantined AS (
    SELECT
        count(*) FILTER (WHERE sent_at IS NULL
                           AND quarantine_reason IN ('blocked', 'destination')) AS parked,
        min(created_at) FILTER (WHERE sent_at IS NULL
                                  AND quarantine_reason IN ('blocked', 'destination'))
            AS oldest_parked,
        min(quarantined_at) AS oldest
    FROM {table}
    WHERE quarantined_at IS NOT NULL
)
SELECT
    u.n + q.parked,
    u.leased,
    -- least() skips a NULL side: the older of the two, whichever exists.
    coalesce(greatest(extract(epoch FROM now() - least(u.oldest, q.oldest_parked)), 0)::float8, 0),
    (SELECT count(*) FROM {table}
     WHERE sent_at IS NOT NULL AND sent_at > now() - interval '1 minute'),
    (SELECT coalesce(jsonb_object_agg(reason, n), '{}'::jsonb)
     FROM (SELECT coalesce(quarantine_reason, 'unknown') AS reason, count(*) AS n
           FROM {table}
           WHERE quarantined_at IS NOT NULL
           GROUP BY 1) AS by_reason),
    q.parked,
    coalesce(greatest(extract(epoch FROM now() - q.oldest), 0)::float8, 0)
FROM unsent AS u, quarantined AS q
