-- The other half of park_blocked.sql: rows parked as `blocked` whose group (destination and
-- group key) no longer has an earlier quarantined row (it was re-driven) become unsent again;
-- ordering still holds them behind the re-driven row until it is sent.
UPDATE {table} AS o
SET quarantined_at = NULL,
    quarantine_reason = NULL,
    available_at = now()
WHERE o.quarantined_at IS NOT NULL
  AND o.quarantine_reason = 'blocked'
  AND NOT EXISTS (
      SELECT 1
      FROM {table} AS p
      WHERE {key_p} = {key_o}
        AND {dest_p} = {dest_o}
        AND {position_p} < {position_o}
        AND p.sent_at IS NULL
        AND p.quarantined_at IS NOT NULL
        AND p.quarantine_reason IS DISTINCT FROM 'blocked'
  )
RETURNING o.id
