-- The rows a claim refused (sql/claim.sql: too large to hold, or out of attempts), quarantined
-- with their reasons and errors: ids $1, reasons $2 and errors $3, in the same order. Run right
-- after that claim, in a transaction of its own after the claim lock (sql/claim_start.sql), so
-- that it cannot overlap a claim: a row that a claim of another relay (whose limits may differ)
-- leased meanwhile, or that is no longer unsent, is left alone.
--
-- It answers the ids it quarantined, and the ids it meant to quarantine and did not. Such a row
-- that is still unsent and unquarantined after the commit (the application may have deleted it
-- meanwhile, or the parking parked it) was kept by something on the table, a row trigger that
-- skips the UPDATE or a policy: the relay names it and stops as for settlements that change
-- nothing (src/relay/deliver.rs). Unnamed, such a row would be refused again at every claim,
-- never sent and never in `quarantine list`, with only its age to say so.
WITH meant AS MATERIALIZED (
    SELECT r.id, r.reason, r.error
    FROM unnest($1::bigint[], $2::text[], $3::text[]) AS r(id, reason, error)
    JOIN {table} AS o ON o.id = r.id
    -- An index condition whatever the join order (see sql/settle.sql).
    WHERE o.id = ANY ($1::bigint[])
      AND o.sent_at IS NULL
      AND o.quarantined_at IS NULL
      AND o.id NOT IN (SELECT unnest(l.ids) FROM {claims} AS l WHERE l.token >= $4::bigint)
),
quarantined AS (
    UPDATE {table} AS o
    SET quarantined_at = now(),
        quarantine_reason = m.reason,
        last_error = m.error
    FROM meant AS m
    WHERE o.id = m.id
      AND o.id = ANY (ARRAY(SELECT id FROM meant))
      -- Checked again on the row as a concurrent change left it, should the UPDATE wait for one.
      AND o.sent_at IS NULL
      AND o.quarantined_at IS NULL
    RETURNING o.id
)
SELECT ARRAY(SELECT id FROM quarantined) AS quarantined,
       ARRAY(SELECT id FROM meant WHERE id NOT IN (SELECT id FROM quarantined)) AS kept
