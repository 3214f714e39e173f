-- Up to $1 claimable rows in id order. Rows under another unexpired lease, rows waiting for a
-- retry and settled rows are skipped; rows locked by a concurrent claim are skipped too (SKIP
-- LOCKED), so replicas never wait on each other. (No floor here, unlike the ordered and fair
-- claims: given `id >= floor` the planner may walk the primary key over sent rows, measured
-- at half the throughput of walking the unsent index's dead entries.)
candidates AS (
    SELECT id
    FROM {table}
    WHERE sent_at IS NULL
      AND quarantined_at IS NULL
      AND available_at <= now()
      AND (lease_until IS NULL OR lease_until < now())
    ORDER BY id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
