-- A claim's first statement, in its transaction before the claim: the claim lock
-- (sql/claim_lock.sql), and whether a claim from the claims' floor $1 on has ended (`ended`):
-- the relay then takes it over once this claim is done (sql/takeover.sql). The look uses this
-- statement's snapshot, taken before the lock was granted: a claim that had ended then has
-- still ended, and one another relay took over meanwhile is found gone by the takeover.
-- Materialized, so that the lock is taken when the query reads it, whatever the planner does.
--
-- `server_started` is when the server started: a server that restarted after a crash (or a
-- standby promoted in its place) may have lost the last transactions the relay's asynchronous
-- commits made, and with them lease tokens, which the lease table's identity then hands out
-- again below the claims' floor. The relay then reads both tables from their start once
-- (src/outbox/floors.rs).
WITH locked AS MATERIALIZED (
    {claim_lock}
)
SELECT EXISTS (SELECT 1 FROM {claims} AS l WHERE l.token >= $1::bigint AND l.until < now()) AS ended,
       (extract(epoch FROM pg_postmaster_start_time()) * 1000000)::bigint AS server_started
FROM locked
