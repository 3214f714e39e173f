-- One row as an operator reads it, by primary key; its payload only when $2 (the console's
-- --payloads). Text casts: what the application's columns hold is shown as it is, whatever
-- its type on an adopted table.
SELECT id, event_id::text, aggregate_type::text, aggregate_id::text, event_type::text,
       headers::text, octet_length(payload::text), coalesce(queue_url, ''), created_at::text,
       available_at::text, attempts, sent_at::text, quarantined_at::text, quarantine_reason,
       last_error, CASE WHEN $2::boolean THEN payload::text END
FROM {table}
WHERE id = $1
