-- The idle relay's look for work: is any row claimable now? Read-only and lock-free, so it
-- costs the application nothing but one short index scan: the first claimable entry of the
-- unsent partial index ends it. Same conditions as claim_candidates.sql, except that rows of a
-- claim that ended count as claimable: the claim that removes that claim must run. Both
-- tables are read from the relay's floors on ({floor} and {claims_floor},
-- src/outbox/floors.rs), never from their start.
SELECT EXISTS (
    SELECT 1
    FROM {table}
    WHERE sent_at IS NULL
      AND quarantined_at IS NULL
      AND id >= {floor}
      AND available_at <= now()
      AND id NOT IN (SELECT unnest(l.ids) FROM {claims} AS l
                     WHERE l.token >= {claims_floor} AND l.until >= now())
      -- --order-by transaction: rows behind a running older transaction are not work yet.
      AND {released}
)
