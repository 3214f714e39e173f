-- Ordered + fair claims: each fair value's heads among its first 4 pending rows (a few, so a
-- value whose oldest row is in flight still offers its other groups; few, so a claim costs a
-- few probes per value). The range comparison keeps the planner on the (key, id) index (see
-- claim_candidates_fair.sql). The rows found are looked up by primary key from an array (see
-- `others` in claim_ordered.sql).
SELECT c.id
FROM {table} AS c
WHERE c.id = ANY (ARRAY(
    SELECT f.id
    FROM fair_values
    CROSS JOIN LATERAL (
        SELECT f.id
        FROM {table} AS f
        WHERE {fair_f} >= fair_values.k AND {fair_f} <= fair_values.k
          AND f.id >= $5::bigint
          AND f.sent_at IS NULL
          AND f.quarantined_at IS NULL
        ORDER BY {fair_f}, f.id
        LIMIT 4
    ) AS f
    WHERE fair_values.k IS NOT NULL))
  AND c.available_at <= now()
  AND c.id NOT IN (SELECT id FROM leased)
  AND {head_c}
