-- Up to $1 claimable rows in id order. Rows under another unexpired lease, rows waiting for a
-- retry and settled rows are skipped; rows locked by a concurrent claim are skipped too (SKIP
-- LOCKED), so replicas never wait on each other. $4 is a floor below which no row is unsent
-- (refreshed with the statistics): index entries of rows sent since the last VACUUM sit at
-- the front of the unsent index, and starting past them keeps a claim from walking them.
candidates AS (
    SELECT id
    FROM {table}
    WHERE sent_at IS NULL
      AND quarantined_at IS NULL
      AND id >= $4
      AND available_at <= now()
      AND (lease_until IS NULL OR lease_until < now())
    ORDER BY id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
