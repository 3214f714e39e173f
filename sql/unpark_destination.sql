-- Rows parked for their destination (reason `destination`) whose time has come become unsent
-- again, so the next claim sends them; their `last_error` stays for the record. Walks the
-- quarantined partial index only. Every replica may run it: it is idempotent.
UPDATE {table}
SET quarantined_at = NULL,
    quarantine_reason = NULL
WHERE quarantined_at IS NOT NULL
  AND quarantine_reason = 'destination'
  AND available_at <= now()
RETURNING id
