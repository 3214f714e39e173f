-- A claim's outcomes, all in one statement and one transaction: the rows SQS acknowledged
-- ($3: deleted or marked sent, sql/settle_delete.sql or sql/settle_mark.sql), those given back
-- for a retry ($4..$7) and those parked ($8..$11) (sql/settle_others.sql). A claim whose rows
-- were all acknowledged, the usual one, is settled by the same statement without the others:
-- a third of the work.
--
-- Fenced by the claims' own rows (tokens $2, owner $1, sql/claims.sql): the statement deletes
-- them and applies the outcomes only to the ids they listed. And by the server the claims were
-- made on (when it started, and their lease: the last two parameters): the relay commits
-- asynchronously, so a server that restarted after a crash may have lost the claims, and its
-- lease table's identity hands their tokens out again, to the same relay's later claims, whose
-- rows this must not touch. On a server that started since the claims, a claim row made before
-- it started (its `until` less the lease) is theirs, kept by a clean restart; one made since
-- is another claim under a token handed out again. A claim that ended and was taken over is gone, and then nothing here changes
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
      AND ({server}::bigint IS NULL
           OR (extract(epoch FROM pg_postmaster_start_time()) * 1000000)::bigint = {server}::bigint
           OR l.until - make_interval(secs => {lease}::float8) < pg_postmaster_start_time())
    RETURNING l.token, l.ids
),
-- Each outcome's rows are first narrowed to the ids the fence listed (`held`), and the outbox
-- rows are then looked up by those ids as an array (`o.id = ANY (ARRAY(...))`, an index
-- condition), besides the join that carries each row's values where an outcome has any (a
-- message id, an error; deleting acknowledged rows has none, so no join): a join alone let a
-- plan start from the outbox and filter, and plans made before the table was analyzed did so,
-- walking the whole unsent index (100,000 entries for 15 rows, 22–39 ms). The array is one
-- value to the planner, never a relation to scan, so the lookup is the plan at any size, and
-- the plan can be made once and reused (`session::PLANS`).
held AS MATERIALIZED (
    SELECT DISTINCT unnest(f.ids) AS id FROM fence AS f
),
{acknowledge}{others}
SELECT ARRAY(SELECT token FROM fence),
       (SELECT count(*) FROM sent),
       {rescheduled},
       {quarantined}
