-- What of the wake-up modes is installed for a table: the NOTIFY trigger on the base table
-- ($1, quoted), and the publication ($2) that the logical doorbell streams.
SELECT
    EXISTS (SELECT 1 FROM pg_trigger
            WHERE tgrelid = to_regclass($1) AND tgname = 'outbox_relay_notify'),
    EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $2)
