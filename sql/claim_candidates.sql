-- Up to $1 claimable rows in id order, as many as fit the byte budget $4 (the first always
-- does; a row quarantined at claim weighs nothing, see `weighed` in claim.rs). Rows under another unexpired lease, rows waiting for a retry and settled rows are
-- skipped; rows locked by a concurrent claim are skipped too (SKIP LOCKED), so replicas never
-- wait on each other. (No floor here, unlike the ordered and fair claims: given `id >= floor`
-- the planner may walk the primary key over sent rows, measured at half the throughput of
-- walking the unsent index's dead entries.) The ordered filter holds back rows bound for a FIFO
-- queue that are not their group's head (see claim.rs).
locked AS (
    SELECT id, attempts, {payload_bytes} AS bytes
    FROM {table} AS c
    WHERE sent_at IS NULL
      AND quarantined_at IS NULL
      AND available_at <= now()
      AND (lease_until IS NULL OR lease_until < now())
      {ordered_filter}
    ORDER BY id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
),
weighed AS (
    {weighed}
),
candidates AS (
    SELECT id, doom, bytes
    FROM (SELECT id, doom, bytes, sum(held) OVER (ORDER BY id) - held AS before FROM weighed) AS b
    WHERE b.before < $4
)
