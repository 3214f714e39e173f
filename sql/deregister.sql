-- A relay that stops removes its registration (sql/relays.sql), rather than being listed until
-- its lease runs out.
DELETE FROM {relays} WHERE relay_id = $1
