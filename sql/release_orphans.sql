-- The claims of relay $1 that it gave up on: a claim whose answer did not come back within
-- --db-timeout (the wait for the connection, the COMMIT and the way back took longer than the
-- margin sql/claim_deadline.sql keeps) may still have committed on the server, and its lease
-- would hold its rows for a whole --lease with no relay to send them, the takeover counting an
-- attempt the rows never made. Claims of one relay run one after the other, so after such a
-- claim every live claim of the relay's is either one whose rows it is delivering ($2, the
-- tokens it holds) or one it gave up on: those are removed here, their rows free at once and
-- their attempt not counted. Runs after the claims' lock (src/outbox/upkeep.rs), so a claim
-- still running on the server is waited for, not missed. Read from the claims' floor $3 on
-- (src/outbox/floors.rs).
DELETE FROM {claims} AS l
WHERE l.owner = $1
  AND l.token >= $3::bigint
  AND NOT (l.token = ANY ($2::bigint[]))
RETURNING l.token
