-- Ordered delivery with --on-poison block: unsent rows waiting behind (in the group's order,
-- src/outbox/order_by.rs) a quarantined row of
-- their group (destination and group key; the destination is sql/destination.sql) are parked
-- as quarantined with reason `blocked`, so they show up in `quarantine list` and stop being
-- walked by every claim. A group with a row in flight is left alone (the one test of
-- sql/in_flight.sql; the next pass, after its settlement, decides), and so are rows that are
-- not ordered (bound for a standard queue while the default queue is standard: their FIFO
-- routes' keys are $1).
--
-- Claims write no outbox row this could conflict with, so "in flight" is only as good as the
-- snapshot that reads the claims: the statement runs after the claim lock
-- (sql/claim_lock.sql) in a READ COMMITTED transaction (upkeep.rs), so its snapshot, taken
-- after the lock, holds every committed lease, and no claim runs until it commits.
WITH {in_flight}
UPDATE {table} AS o
SET quarantined_at = now(),
    quarantine_reason = 'blocked',
    last_error = 'waiting behind quarantined event ' || head.event_id || ' (id ' || head.id || ') of its group'
FROM (
    SELECT DISTINCT ON ({key_q}, {dest_q}) {key_q} AS k, {dest_q} AS d, q.id{carried_q}, q.event_id
    FROM {table} AS q
    WHERE q.quarantined_at IS NOT NULL
      AND q.quarantine_reason IS DISTINCT FROM 'blocked'
    ORDER BY {key_q}, {dest_q}, {order_q}
) AS head
WHERE {key_o} = head.k
  AND {dest_o} = head.d
  AND {position_o} > {position_head}
  AND o.sent_at IS NULL
  AND o.quarantined_at IS NULL
  AND {nothing_in_flight_o}
  AND {ordered_o}
RETURNING o.id
