-- Up to $1 claimable rows in id order, as many as fit the byte budget $4 (the first always
-- does; a row quarantined at claim weighs nothing, see `weighed` in claim.rs). Rows in a
-- claim (`leased`, sql/claim.sql), rows waiting for a retry and settled rows are skipped. (No floor here, unlike the ordered and fair claims: given `id >= floor`
-- the planner may walk the primary key over sent rows, measured at half the throughput of
-- walking the unsent index's dead entries.) The ordered filter holds back rows bound for a FIFO
-- queue that are not their group's head (see claim.rs).
{leased}
chosen AS (
    SELECT id, {attempts_c} AS attempts, {payload_bytes} AS bytes
    FROM {table} AS c
    WHERE sent_at IS NULL
      AND quarantined_at IS NULL
      AND available_at <= now()
      AND id NOT IN (SELECT id FROM leased)
      {ordered_filter}
    ORDER BY id
    LIMIT $1
),
weighed AS (
    {weighed}
),
candidates AS (
    SELECT id, doom, bytes, attempts
    FROM (SELECT id, doom, bytes, attempts, sum(held) OVER (ORDER BY id) - held AS before
          FROM weighed) AS b
    WHERE b.before < $4
)
