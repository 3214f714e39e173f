-- Gauges for /metrics. Each part walks a partial index, never the sent rows: the oldest
-- claimable row is the first entry of the unsent index, and everything about quarantined rows
-- comes from one pass over the quarantined index.
--
-- Rows the relay parked in quarantine are still unsent: `blocked` (waiting behind a
-- quarantined row of their group) and `destination` (their queue is missing or refused
-- access; retried on their own schedule). They count in the unsent gauges and in the
-- quarantine gauges both, so an undelivered row is never missing from the age an operator
-- alerts on. Only the claims' floor keeps to claimable rows.
WITH unsent AS (
    SELECT
        (SELECT created_at FROM {table}
         WHERE sent_at IS NULL AND quarantined_at IS NULL
         ORDER BY id
         LIMIT 1) AS oldest,
        (SELECT count(*) FROM {table} WHERE sent_at IS NULL AND quarantined_at IS NULL) AS n,
        -- The claims' floor: no claimable row has a smaller id (0 when none is).
        coalesce((SELECT id FROM {table}
                  WHERE sent_at IS NULL AND quarantined_at IS NULL
                  ORDER BY id
                  LIMIT 1), 0) AS floor
), quarantined AS (
    SELECT
        count(*) AS n,
        count(*) FILTER (WHERE quarantine_reason = 'blocked') AS blocked,
        count(*) FILTER (WHERE sent_at IS NULL
                           AND quarantine_reason IN ('blocked', 'destination')) AS parked,
        min(created_at) FILTER (WHERE sent_at IS NULL
                                  AND quarantine_reason IN ('blocked', 'destination'))
            AS oldest_parked,
        min(quarantined_at) AS oldest
    FROM {table}
    WHERE quarantined_at IS NOT NULL
)
-- least() skips a NULL side: the older of the two, whichever exists.
SELECT
    coalesce(greatest(extract(epoch FROM now() - least(u.oldest, q.oldest_parked)), 0)::float8, 0),
    u.n + q.parked,
    q.n,
    q.blocked,
    u.floor,
    coalesce(greatest(extract(epoch FROM now() - q.oldest), 0)::float8, 0)
FROM unsent AS u, quarantined AS q
