-- Rows parked for their destination (reason `destination`), per destination: a row's own
-- queue_url, '' for the rows without one (they go where the relays' --queue-url and routes
-- say). Reads the quarantined partial index only; at most $1 destinations, the largest first.
SELECT coalesce(queue_url, '') AS destination,
       count(*),
       extract(epoch FROM now() - min(created_at))::float8,
       left(max(last_error), 500)
FROM {table}
WHERE quarantined_at IS NOT NULL
  AND quarantine_reason = 'destination'
GROUP BY 1
ORDER BY 2 DESC, 1
LIMIT $1
