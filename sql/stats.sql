-- Gauges for /metrics, in bounded time however large the backlog: each side reads at most $1
-- entries of its partial index (never the sent rows), lowest ids first, and two index probes
-- for the highest id. Up to $1 rows the counts are exact; past it the relay extrapolates them
-- from the id span (src/outbox/upkeep.rs, `extrapolate`), and says so in the docs. The claims'
-- floor is the first index entry from the rows' floor $2 on (src/outbox/floors.rs): a row that
-- committed late below it counts from the next sweep. The oldest unsent row is the oldest
-- `created_at` of the entries read, not the first entry's: ids are not taken in `created_at`
-- order (a session that cached ids from the sequence inserts below rows older than its own,
-- and then hid them all from the age; simulation seed 381), and the entries are read anyway.
--
-- Rows the relay parked in quarantine are still unsent: `blocked` (waiting behind a
-- quarantined row of their group) and `destination` (their queue is missing or refused
-- access; retried on their own schedule). They count in the unsent gauges and in the
-- quarantine gauges both, so an undelivered row is never missing from the age an operator
-- alerts on. Only the claims' floor keeps to claimable rows.
WITH unsent_head AS (
    SELECT id, created_at{carried}
    FROM {table}
    WHERE sent_at IS NULL AND quarantined_at IS NULL AND id >= $2::bigint
    ORDER BY id
    LIMIT $1
), unsent AS (
    SELECT
        min(created_at) AS oldest,
        count(*) AS n,
        coalesce(min(id), 0) AS floor,
        coalesce(max(id), 0) AS head_last,
        coalesce((SELECT id FROM {table}
                  WHERE sent_at IS NULL AND quarantined_at IS NULL AND id >= $2::bigint
                  ORDER BY id DESC
                  LIMIT 1), 0) AS top
    FROM unsent_head
), quarantined_head AS (
    SELECT id, created_at, quarantined_at, quarantine_reason, sent_at
    FROM {table}
    WHERE quarantined_at IS NOT NULL
    ORDER BY id
    LIMIT $1
), quarantined AS (
    SELECT
        count(*) AS n,
        count(*) FILTER (WHERE quarantine_reason = 'blocked') AS blocked,
        count(*) FILTER (WHERE sent_at IS NULL
                           AND quarantine_reason IN ('blocked', 'destination')) AS parked,
        min(created_at) FILTER (WHERE sent_at IS NULL
                                  AND quarantine_reason IN ('blocked', 'destination'))
            AS oldest_parked,
        min(quarantined_at) AS oldest,
        coalesce(min(id), 0) AS head_first,
        coalesce(max(id), 0) AS head_last,
        coalesce((SELECT id FROM {table}
                  WHERE quarantined_at IS NOT NULL
                  ORDER BY id DESC
                  LIMIT 1), 0) AS top
    FROM quarantined_head
)
-- least() skips a NULL side: the older of the two, whichever exists.
SELECT
    coalesce(greatest(extract(epoch FROM now() - least(u.oldest, q.oldest_parked)), 0)::float8, 0),
    u.n,
    u.floor,
    u.head_last,
    u.top,
    q.n,
    q.blocked,
    q.parked,
    q.head_first,
    q.head_last,
    q.top,
    coalesce(greatest(extract(epoch FROM now() - q.oldest), 0)::float8, 0),
    -- --order-by transaction: of the first $1 unsent rows, those the claims' watermark holds
    -- back (an older transaction still runs, src/outbox/order_by.rs), and the age of the
    -- oldest of them; 0 and 0 otherwise.
    {watermark}
FROM unsent AS u, quarantined AS q
