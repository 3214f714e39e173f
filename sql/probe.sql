-- The idle relay's look for work: is any row claimable now? Read-only and lock-free, so it
-- costs the application nothing but one short index scan: the first claimable entry of the
-- unsent partial index ends it. Same conditions as claim_candidates.sql.
SELECT EXISTS (
    SELECT 1
    FROM {table}
    WHERE sent_at IS NULL
      AND quarantined_at IS NULL
      AND available_at <= now()
      AND (lease_until IS NULL OR lease_until < now())
)
