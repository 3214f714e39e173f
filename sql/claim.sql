-- The claim's second half, shared by every claim mode: lease the chosen `candidates` to owner
-- $2 for $3 seconds, as one row of {claims} listing their ids (sql/claims.sql); the outbox rows
-- themselves are not written. The first half (sql/claim_leased.sql, then a WITH list ending in
-- `candidates`) comes from one of the claim_candidates*.sql files; the statement runs after
-- sql/claim_start.sql in the same transaction.
--
-- A candidate with a `refusal` (see `measured` in claim.rs) is not leased: its payload is larger
-- than the relay can hold, or its claims kept ending without an outcome (its relays died
-- holding it; sql/takeover.sql counts each) until its attempts reached --max-attempts. It comes
-- back with its refusal and its measured `bytes`, without its payload (reading it may be what
-- killed the relays before), and the relay quarantines it right after this claim
-- (sql/refuse.sql). It spends no attempt.
--
-- `attempts` is returned as this claim's attempt: the attempts before it plus one. The row
-- keeps the count of attempts that ended; the settlement writes what this one came to.
--
-- The rows are returned from `candidates` as the strategy's `chosen` read them (it carries
-- their columns, `row_columns` in claim.rs), not looked up again: a second lookup of the same
-- rows by id was a fifth of the claim's execution. A payload is only carried there, never read
-- (a large one stays a pointer to its TOAST): a refused row's is never rendered.
lease AS (
    INSERT INTO {claims} (owner, until, ids)
    SELECT $2, now() + make_interval(secs => $3), array_agg(id ORDER BY id)
    FROM candidates
    WHERE refusal IS NULL
    HAVING count(*) > 0
    RETURNING token
),
claimed AS (
    SELECT o.id, o.event_id, o.aggregate_type, o.aggregate_id, o.event_type,
           CASE WHEN o.refusal IS NULL THEN o.payload::text END,
           o.headers, o.queue_url,
           coalesce((SELECT token FROM lease), 0) AS lease_token,
           o.attempts + CASE WHEN o.refusal IS NULL THEN 1 ELSE 0 END AS attempts,
           extract(epoch FROM o.created_at)::float8,
           to_char(o.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
           o.refusal,
           o.bytes::bigint,
           o.dedup_id,
           -- Where the row stands in its group's order: the relay keeps a group's rows so.
           {turn_o} AS turn,
           -- The lowest live claim's token, this one's included (src/outbox/floors.rs).
           least((SELECT token FROM live_from), (SELECT token FROM lease)) AS live_from,
           -- The lowest unsent id from the rows' floor $5 on, this claim's rows included: the
           -- next claim starts there (src/outbox/floors.rs), not at the floor the statistics
           -- raised seconds ago.
           (SELECT u.id FROM {table} AS u
            WHERE u.sent_at IS NULL AND u.quarantined_at IS NULL AND u.id >= $5::bigint
            ORDER BY u.id
            LIMIT 1) AS lowest_unsent
    FROM candidates AS o
)
