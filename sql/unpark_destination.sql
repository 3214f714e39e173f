-- Rows parked for their destination (reason `destination`) whose time has come become unsent
-- again, so the next claim sends them; their `last_error` stays for the record. Walks the
-- quarantined partial index only, at most $1 rows a statement (a queue that refused us through
-- an outage may have parked millions), SKIP LOCKED so it never waits on a settlement. Every
-- replica may run it: it is idempotent. Updated by primary key from an array, as in
-- sql/delete_expired.sql.
UPDATE {table}
SET quarantined_at = NULL,
    quarantine_reason = NULL
WHERE id = ANY (ARRAY(
    SELECT id
    FROM {table}
    WHERE quarantined_at IS NOT NULL
      AND quarantine_reason = 'destination'
      AND available_at <= now()
    ORDER BY id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
))
RETURNING id
