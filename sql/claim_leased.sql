-- The first CTEs of every claim: which ids claims hold (`leased`), after removing the claims
-- that ended (`expired`: their owner stopped, or took longer than its lease). Removing one
-- waits for a settlement of it that is under way; once removed, no settlement of it can apply
-- (sql/settle.sql deletes the claim's row as its fence), so its rows (`taken`) are this claim's
-- to take. A claim that its owner settled before this one got to it is not among `expired`, and
-- its ids stay in `leased` for this statement, which still sees them unsettled.
--
-- The lease table is read from the claims' floor {claims_floor} on (src/outbox/floors.rs): no
-- live claim has a smaller token, and the rows of settled claims below it, which stay until
-- VACUUM can remove them, are never read. `live_from` is the floor the next claim may use.
expired AS (
    DELETE FROM {claims} AS l
    WHERE l.token >= {claims_floor}
      AND l.until < now()
    RETURNING l.token, l.ids
),
taken AS (
    SELECT DISTINCT unnest(e.ids) AS id FROM expired AS e
),
leased AS (
    SELECT unnest(l.ids) AS id
    FROM {claims} AS l
    WHERE l.token >= {claims_floor}
      AND l.token NOT IN (SELECT e.token FROM expired AS e)
),
live_from AS (
    SELECT min(l.token) AS token
    FROM {claims} AS l
    WHERE l.token >= {claims_floor}
      AND l.token NOT IN (SELECT e.token FROM expired AS e)
),
