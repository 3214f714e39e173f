-- The start of a claim's transaction when the relay has a round-trip deadline (--db-timeout):
-- the claim lock, and the budget the server gives the lock wait and the claim together.
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
SET LOCAL lock_timeout = {budget_ms};
{claim_lock};
SELECT set_config('statement_timeout',
                  greatest(1, {budget_ms} - floor(extract(epoch FROM clock_timestamp() - now()) * 1000))::bigint::text,
                  true)
