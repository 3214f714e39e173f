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
--
-- Each head's rows are found by the group's key (one probe of the key's index per head), in a
-- LATERAL so that the probe is the plan; then updated by primary key from an array. Written as
-- one join, the plan started from the outbox instead (a hash join over a whole key index: on a
-- table the planner sees as empty every index looks one page long), and read every entry a held
-- vacuum horizon keeps, 11,000 buffers a pass after two minutes at 1,000 events/s.
--
-- It answers how many rows it parked, and the ids it meant to park and did not. Such a row
-- that is still unsent and unparked after the commit (the application may have deleted it
-- meanwhile; no claim took it: its group is behind a quarantined head) was kept by something
-- on the table, a row trigger that skips the UPDATE or a policy: the relay names it and stops
-- as for settlements that change nothing (src/relay/deliver.rs). Unnamed, those rows would
-- wait unparked, out of `quarantine list`, and nothing would say why.
WITH {in_flight},
head AS MATERIALIZED (
    SELECT DISTINCT ON ({key_q}, {dest_q}) {key_q} AS k, {dest_q} AS d, q.id{carried_q}, q.event_id
    FROM {table} AS q
    WHERE q.quarantined_at IS NOT NULL
      AND q.quarantine_reason IS DISTINCT FROM 'blocked'
    ORDER BY {key_q}, {dest_q}, {order_q}
),
behind AS MATERIALIZED (
    SELECT o.id, head.event_id AS head_event_id, head.id AS head_id
    FROM head
    CROSS JOIN LATERAL (
        SELECT o.id
        FROM {table} AS o
        WHERE {key_o} = head.k
          AND {dest_o} = head.d
          AND {position_o} > {position_head}
          AND o.sent_at IS NULL
          AND o.quarantined_at IS NULL
          AND {nothing_in_flight_o}
          AND {ordered_o}
    ) AS o
),
parked AS (
    UPDATE {table} AS o
    SET quarantined_at = now(),
        quarantine_reason = 'blocked',
        last_error = 'waiting behind quarantined event ' || b.head_event_id || ' (id ' || b.head_id || ') of its group'
    FROM behind AS b
    WHERE o.id = b.id
      AND o.id = ANY (ARRAY(SELECT id FROM behind))
      AND o.sent_at IS NULL
      AND o.quarantined_at IS NULL
    RETURNING o.id
)
SELECT (SELECT count(*) FROM parked) AS parked,
       ARRAY(SELECT b.id FROM behind AS b LEFT JOIN parked AS p ON p.id = b.id WHERE p.id IS NULL)
           AS not_parked
