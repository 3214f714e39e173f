-- A claim's outcomes, all in one statement and one transaction: the rows SQS acknowledged
-- ($3: deleted or marked sent, sql/settle_*.sql), those given back for a retry ($4..$7) and
-- those parked ($8..$11).
--
-- Fenced by the claims' own rows (tokens $2, owner $1, sql/claims.sql; the relay settles one
-- claim at a time): the statement deletes them and applies the outcomes only to the ids they
-- listed. A claim that ended and was taken over is gone, and then nothing here changes
-- anything; deleting it also waits for (or makes wait) the next claim's removal of ended
-- claims, so the two never both apply. Deleting it releases the rows given back: they are
-- claimable again once their delay has passed.
--
-- Given back: available again after their delay. `refund` is 1 where the failure was not the
-- row's fault (throttling, an outage, a shutdown), so this attempt is not counted against it.
-- A null error keeps the previous one.
--
-- Parked: rows that must not be retried as they are, with the reason and the error, until an
-- operator re-drives them. A row with a delay ($11 not null) is parked for its destination
-- instead: the relay's maintenance makes it unsent again once `available_at` has passed, and
-- this attempt is not counted (the queue, not the row, failed).
WITH fence AS (
    DELETE FROM {claims} AS l
    WHERE l.token = ANY ($2::bigint[])
      AND l.owner = $1
    RETURNING l.token, l.ids
),
-- Each outcome's rows are first narrowed to the ids the fence listed, in a CTE of their own,
-- and the outbox then joined to that by primary key: any plan that starts from the outbox
-- (an `IN (held)` on it, or `id = ANY`) walked the whole unsent index, 100,000 entries for 15
-- rows when the plan was made before the table was analyzed.
held AS MATERIALIZED (
    SELECT DISTINCT unnest(f.ids) AS id FROM fence AS f
),
{acknowledge},
given_back AS MATERIALIZED (
    SELECT u.*
    FROM unnest($4::bigint[], $5::float8[], $6::text[], $7::int[]) AS u(id, delay, error, refund)
    WHERE u.id IN (SELECT id FROM held)
),
rescheduled AS (
    UPDATE {table} AS o
    SET available_at = now() + make_interval(secs => u.delay),
        attempts = greatest(o.attempts + 1 - u.refund, 0),
        last_error = coalesce(u.error, o.last_error)
    FROM given_back AS u
    WHERE o.id = u.id
      AND o.sent_at IS NULL
      AND o.quarantined_at IS NULL
    RETURNING o.id
),
parked AS MATERIALIZED (
    SELECT u.*
    FROM unnest($8::bigint[], $9::text[], $10::text[], $11::float8[]) AS u(id, reason, error, delay)
    WHERE u.id IN (SELECT id FROM held)
),
quarantined AS (
    UPDATE {table} AS o
    SET quarantined_at = now(),
        quarantine_reason = u.reason,
        last_error = u.error,
        available_at = CASE WHEN u.delay IS NULL THEN o.available_at
                            ELSE now() + make_interval(secs => u.delay) END,
        attempts = o.attempts + CASE WHEN u.delay IS NULL THEN 1 ELSE 0 END
    FROM parked AS u
    WHERE o.id = u.id
      AND o.sent_at IS NULL
      AND o.quarantined_at IS NULL
    RETURNING o.id
)
SELECT ARRAY(SELECT token FROM fence),
       (SELECT count(*) FROM sent),
       ARRAY(SELECT id FROM rescheduled),
       ARRAY(SELECT id FROM quarantined)
