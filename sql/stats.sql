-- Gauges for /metrics. Each part walks a partial index, never the sent rows: the oldest unsent
-- row is the first entry of the unsent index.
SELECT
    coalesce((SELECT greatest(extract(epoch FROM now() - created_at), 0)::float8
              FROM {table}
              WHERE sent_at IS NULL AND quarantined_at IS NULL
              ORDER BY id
              LIMIT 1), 0),
    (SELECT count(*) FROM {table} WHERE sent_at IS NULL AND quarantined_at IS NULL),
    (SELECT count(*) FROM {table} WHERE quarantined_at IS NOT NULL),
    (SELECT count(*) FROM {table} WHERE quarantined_at IS NOT NULL AND quarantine_reason = 'blocked'),
    -- The claims' floor: no unsent row has a smaller id (0 when none is unsent).
    coalesce((SELECT id FROM {table}
              WHERE sent_at IS NULL AND quarantined_at IS NULL
              ORDER BY id
              LIMIT 1), 0)
