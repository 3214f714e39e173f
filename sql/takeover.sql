-- Claims that ended (their owner stopped, or took longer than its lease) are taken over: their
-- rows of the lease table go, from the claims' floor $1 on (src/outbox/floors.rs), and their
-- rows become claimable again, each with the attempt that ended without an outcome counted
-- (a row whose attempts reach --max-attempts is then quarantined by the claim that finds it,
-- sql/claim.sql). The relay runs this after a claim whose first statement found an ended claim
-- (sql/claim_start.sql), on its own: claims never pay for it (sql/claim_leased.sql).
--
-- Removing a claim waits for a settlement of it that is under way; once removed, no settlement
-- of it can apply (sql/settle.sql deletes the claim's row as its fence, and finds it gone), so
-- its rows are the next claim's to take. Two relays taking over the same claim both try to
-- remove it, and only the one that did counts its rows' attempt. No claim lock is needed: a
-- claim whose snapshot still holds the ended claim leaves its rows alone, one after it sees
-- them free. Answers how many claims it ended and how many rows it freed.
WITH expired AS (
    DELETE FROM {claims} AS l
    WHERE l.token >= $1::bigint
      AND l.until < now()
    RETURNING l.ids
),
taken AS MATERIALIZED (
    SELECT DISTINCT unnest(e.ids) AS id FROM expired AS e
),
abandoned AS (
    UPDATE {table} AS o
    SET attempts = o.attempts + 1
    FROM taken AS t
    WHERE o.id = t.id
      -- An index condition whatever the join order (see sql/settle.sql).
      AND o.id = ANY (ARRAY(SELECT id FROM taken))
      AND coalesce(o.sent_at, o.quarantined_at) IS NULL
    RETURNING o.id
)
SELECT (SELECT count(*) FROM expired) AS claims,
       (SELECT count(*) FROM abandoned) AS rows
