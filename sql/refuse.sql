-- The rows a claim refused (sql/claim.sql: too large to hold, or out of attempts), quarantined
-- with their reasons and errors: ids $1, reasons $2 and errors $3, in the same order. Run right
-- after that claim, in a transaction of its own after the claim lock (sql/claim_start.sql), so
-- that it cannot overlap a claim: a row that a claim of another relay (whose limits may differ)
-- leased meanwhile, or that is no longer unsent, is left alone. Answers the ids quarantined.
UPDATE {table} AS o
SET quarantined_at = now(),
    quarantine_reason = r.reason,
    last_error = r.error
FROM unnest($1::bigint[], $2::text[], $3::text[]) AS r(id, reason, error)
WHERE o.id = r.id
  -- An index condition whatever the join order (see sql/settle.sql).
  AND o.id = ANY ($1::bigint[])
  AND o.sent_at IS NULL
  AND o.quarantined_at IS NULL
  AND o.id NOT IN (SELECT unnest(l.ids) FROM {claims} AS l WHERE l.token >= $4::bigint)
RETURNING o.id
