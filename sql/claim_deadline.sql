-- A claim's first statement when the relay has a round-trip deadline (--db-timeout): what
-- sql/claim_start.sql does (the claim lock, and whether a claim from the claims' floor $1 on
-- has ended), and the budget the server gives the lock wait and the claim together. One
-- statement, prepared once, whose steps run in the order of their data: a materialized CTE
-- runs when the query above it reads it.
--
-- The relay gives a claim up once the deadline passes, counted over the lock wait and the claim
-- statement together; the server's statement_timeout (conn.rs) counts each statement alone. A
-- claim whose wait and statement each fit the deadline but together do not would be given up
-- while its COMMIT is already on its way: its lease would hold the rows for a whole --lease
-- with no relay to send them, and the takeover would count an attempt the rows never made.
-- So the server's bounds sum to less than the relay's: the lock wait gets at most the budget
-- (lock_timeout, milliseconds), and the claim statement what is left of it, measured on the
-- server's clock from the transaction's start (`now()`). A claim that runs out is cancelled
-- by the server and rolls back whole; the relay hears of it before its own deadline.
WITH bounded AS MATERIALIZED (
    SELECT set_config('lock_timeout', '{budget_ms}', true) AS lock_timeout
),
locked AS MATERIALIZED (
    {claim_lock}
    FROM bounded
)
SELECT set_config('statement_timeout',
                  greatest(1, {budget_ms} - floor(extract(epoch FROM clock_timestamp() - now()) * 1000))::bigint::text,
                  true),
       EXISTS (SELECT 1 FROM {claims} AS l WHERE l.token >= $1::bigint AND l.until < now()) AS ended,
       (extract(epoch FROM pg_postmaster_start_time()) * 1000000)::bigint AS server_started
FROM locked
