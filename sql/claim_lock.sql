-- Claims of one table run one at a time, whichever replica makes them: each claim then sees
-- every row the claims before it took (a claim that committed after this one's snapshot would
-- otherwise be invisible to it, and the outbox rows carry no mark of it). A transaction-level
-- advisory lock: it writes no WAL, where locking each chosen row writes 54 bytes per row
-- (docs/benchmarks.md); it ends with the claim's transaction, pooler or not. The first key is
-- the relay's own ('outb'), the second the table's, so different tables claim side by side.
SELECT pg_advisory_xact_lock(1869968482, {claims_literal}::regclass::oid::int)
