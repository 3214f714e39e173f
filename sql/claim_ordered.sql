-- Ordered delivery: a group's events are claimed in its order (`id`, or with --order-by
-- transaction `(xact_id, id)`: src/outbox/order_by.rs; "earlier" below is that order), one
-- claim at a time per group.
-- A group is (destination, group key): the key's rows bound for one destination (the one
-- fragment sql/destination.sql); the same key on another destination is another group.
--
-- A row is a group's head when no earlier row of its group is unsent (the row just
-- before it in the group's order index is sent, or, with --on-poison skip, quarantined as
-- poison; rows parked as `blocked` or `destination` are not poison and hold the group) and
-- no row of its group is in flight (sql/in_flight.sql). A claim
-- takes heads and, behind each head, up to 9 more rows of its group (29 when there are few
-- heads) that are claimable one after the other, so a long group travels 10 events per FIFO
-- request, its requests one after the other; the group's next rows become heads only once
-- these are settled.
--
-- Heads come from three places, so that none can starve:
-- - `oldest`: among the first $6 unsent rows from the floor $5 on (one bounded walk of the
--   unsent index), each group's first: where most heads are;
-- - `others`: when `oldest` does not fill the claim, up to $8 further keys in key order
--   after the cursor $7, each with its first pending row (one probe each in the key's
--   pending-key index) when that row is its group's head; the relay moves the cursor on with
--   every claim, so every group with a head is reached within a few claims whatever the
--   backlog of other groups;
-- - `fair_heads` (with --fair-by): every value of the fair key with pending rows (one probe
--   each in the fair key's index), with the heads among its first few pending rows, whether or
--   not `oldest` filled the claim: the fair turn below puts them first, so a quiet tenant's
--   event rides in the next claim however many groups another tenant's backlog spans.
--
-- Every row is ordered here (--ordered on, or a FIFO default queue); with a standard default
-- queue only the rows bound for FIFO queues are, and the plain or fair claim holds back those
-- that are not their group's head instead (see claim.rs).
--
-- Claims run one at a time per table (sql/claim_lock.sql), so every claim sees the rows the
-- claims before it took (`leased`). A run is claimed only as a prefix: a row only together
-- with every earlier row of its run, so a group never has rows in two claims at once. The
-- rows that fit the byte budget $4 (in claim order, the first always) are leased to $2 for $3
-- seconds, at most $1 of them; rows too large to hold, or out of attempts, are quarantined by
-- the same statement (claim.sql).
--
-- The statement returns one row even when it claims nothing: its last column is where the
-- next claim's `others` starts (NULL: from the first key again).
WITH RECURSIVE
{leased}
window_rows AS (
    SELECT w.id{carried_w}, {key_w} AS k, {dest_w} AS d
    FROM {table} AS w
    WHERE w.sent_at IS NULL AND w.quarantined_at IS NULL AND w.id >= $5::bigint
    ORDER BY w.id
    LIMIT $6
),
-- Only a group's first row in the window can be its head (the window starts at the first
-- unsent row), so a long group costs one probe here, not one per row it has in the window.
-- Materialized, and looked up by primary key from an array: joined instead, a misestimate
-- (measured with --order-by transaction on a young table) made the window the inner side of a
-- nested loop, re-sorted for every unsent row, with the head probe run on each of them:
-- 0.3-5 s per claim.
window_firsts AS MATERIALIZED (
    SELECT f.id
    FROM (SELECT id, row_number() OVER (PARTITION BY k, d ORDER BY {order_bare}) AS nth
          FROM window_rows) AS f
    WHERE f.nth = 1
),
oldest AS (
    SELECT c.id
    FROM {table} AS c
    WHERE c.id = ANY (ARRAY(SELECT id FROM window_firsts))
      -- Not `sent_at IS NULL AND ...`: that matches the partial indexes' predicate, and a plan
      -- made while the table was small walked one of them whole instead of looking these ids
      -- up (see sql/settle.sql).
      AND coalesce(c.sent_at, c.quarantined_at) IS NULL
      AND c.available_at <= now()
      AND c.id NOT IN (SELECT id FROM leased)
      AND {head_c}
    ORDER BY c.id
    LIMIT $1
),
keys(k, n) AS (
    {keys_anchor}
    UNION ALL
    SELECT (SELECT {key_bare}
            FROM {table}
            WHERE sent_at IS NULL AND quarantined_at IS NULL AND {key_bare} > keys.k
              AND id >= $5::bigint
            ORDER BY 1
            LIMIT 1),
           keys.n + 1
    FROM keys
    WHERE keys.k IS NOT NULL AND keys.n < $8::bigint
),
-- The key's first pending row is a head unless an earlier row of its group (its own
-- destination's) is not done: quarantined rows are not in the pending index, so the group's
-- order index answers that, one step back.
-- The rows found are then looked up by primary key from an array, as everywhere a statement
-- reaches rows it found elsewhere: joined instead, a table the planner sees as empty made
-- starting from the outbox (its whole primary key) look as cheap (see sql/settle.sql).
others AS (
    SELECT c.id
    FROM {table} AS c
    WHERE c.id = ANY (ARRAY(
        SELECT f.id
        FROM keys
        CROSS JOIN LATERAL (
            SELECT f.id
            FROM {table} AS f
            WHERE {key_f} >= keys.k AND {key_f} <= keys.k
              AND f.id >= $5::bigint
              AND f.sent_at IS NULL
              AND f.quarantined_at IS NULL
            ORDER BY {key_f}, {order_f}
            LIMIT 1
        ) AS f
        WHERE keys.k IS NOT NULL))
      AND c.available_at <= now()
      AND c.id NOT IN (SELECT id FROM leased)
      AND {head_c}
),
fair_values(k) AS (
    {fair_values}
),
fair_heads AS (
    {fair_heads}
),
heads AS (
    SELECT id FROM oldest
    UNION
    SELECT id FROM others
    UNION
    SELECT id FROM fair_heads
),
runs AS (
    SELECT h.id AS head, h.id, 0::bigint AS pos, {fair_h} AS fair
    FROM {table} AS h
    WHERE h.id = ANY (ARRAY(SELECT id FROM heads))
    UNION ALL
    SELECT h.id, r.id, r.pos, {fair_h}
    FROM {table} AS h
    CROSS JOIN LATERAL (
        SELECT s.id, s.pos
        FROM (SELECT g.id,
                     row_number() OVER (ORDER BY {order_g}) AS pos,
                     -- A run stops at another head: a group's unsent rows need not be
                     -- one stretch (a replayed or re-driven row between sent ones, a new
                     -- row behind them), and a row goes in one run only.
                     bool_and(g.quarantined_at IS NULL
                              AND g.available_at <= now()
                              AND g.id NOT IN (SELECT id FROM leased)
                              AND g.id NOT IN (SELECT id FROM heads))
                         OVER (ORDER BY {order_g}) AS open
              FROM (SELECT c.id{carried_c}, c.quarantined_at, c.available_at
                    FROM {table} AS c
                    WHERE {key_c} >= {key_h} AND {key_c} <= {key_h}
                      AND {position_c} > {position_h}
                      AND c.sent_at IS NULL
                      AND {dest_c} = {dest_h}
                      {not_poison_c}
                    ORDER BY {key_c}, {order_c}
                    -- 9 rows behind each head, up to 29 when the claim found few heads: a
                    -- lone long group then sends up to three requests of 10, one after
                    -- the other, per claim and settlement.
                    LIMIT greatest(9, least(29, $1 / greatest((SELECT count(*) FROM heads), 1) - 1))) AS g) AS s
        WHERE s.open
    ) AS r
    WHERE h.id = ANY (ARRAY(SELECT id FROM heads))
),
picked AS (
    SELECT t.head, t.id, t.pos,
           row_number() OVER (ORDER BY t.fair_turn, t.head, t.pos) AS turn
    FROM (SELECT runs.*, {fair_turn} AS fair_turn FROM runs) AS t
    ORDER BY t.fair_turn, t.head, t.pos
    LIMIT $1
),
chosen AS (
    SELECT c.id, c.attempts AS attempts, {payload_bytes} AS bytes, {row_c}
    FROM {table} AS c
    -- An array, not IN (subquery): the chosen ids are looked up by primary key.
    WHERE c.id = ANY (ARRAY(SELECT id FROM picked))
      -- `others` offers a key's first pending row whoever holds it: a head some claim holds
      -- drops out here, and the rest of its run with it (`candidates` takes runs as prefixes).
      AND coalesce(c.sent_at, c.quarantined_at) IS NULL
      AND c.available_at <= now()
      AND c.id NOT IN (SELECT id FROM leased)
      -- --order-by transaction: not while an older transaction still runs (order_by.rs).
      AND {released_c}
),
measured AS (
    {measured}
),
-- A run stops at a row quarantined at claim (`refusal`): the rows behind it wait for the next
-- claim, where --on-poison decides whether it still holds its group.
candidates AS (
    SELECT b.*
    FROM (SELECT l.*, sum(l.held) OVER (ORDER BY p.turn) - l.held AS before
          FROM picked AS p
          JOIN measured AS l ON l.id = p.id
          WHERE NOT EXISTS (
              SELECT 1
              FROM picked AS q
              WHERE q.head = p.head
                AND q.pos < p.pos
                AND NOT EXISTS (SELECT 1 FROM measured AS m
                                WHERE m.id = q.id AND m.refusal IS NULL))) AS b
    WHERE b.before < $4
),
{claim_update}
SELECT claimed.*,
       (SELECT CASE WHEN count(*) = 0 THEN $7::text
                    WHEN count(k) >= $8::bigint THEN max(k)
               END
        FROM keys) AS next_cursor
FROM (SELECT 1) AS one
LEFT JOIN claimed ON true
