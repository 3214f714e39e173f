-- Ordered delivery: a row is claimable only while it is the first unsent row of its group
-- ({ordered_filter}): no earlier row of the group may be unsent, whoever holds it and whatever
-- it waits for (a lease, a retry or, unless poison is skipped, a quarantine). So one claim
-- takes at most one row per group, and a group's next row is claimed only after the previous
-- one was acknowledged. Only the first $5 unsent rows from the floor $4 on are looked at
-- (both bounds computed once), which caps a claim's cost when a few groups hold a long
-- backlog, and skips the rows already sent; rows parked behind a quarantined head are not
-- unsent and so never fill that window.
candidates AS (
    SELECT c.id
    FROM {table} AS c
    WHERE c.sent_at IS NULL
      AND c.quarantined_at IS NULL
      AND c.available_at <= now()
      AND (c.lease_until IS NULL OR c.lease_until < now())
      AND c.id >= $4
      AND c.id <= (SELECT max(w.id)
                   FROM (SELECT id FROM {table}
                         WHERE sent_at IS NULL AND quarantined_at IS NULL AND id >= $4
                         ORDER BY id LIMIT $5) AS w)
      {ordered_filter}
    ORDER BY c.id
    LIMIT $1
    FOR UPDATE OF c SKIP LOCKED
)
