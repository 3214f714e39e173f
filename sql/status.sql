-- `outbox-relay status`. Each part walks one of the partial indexes the migration creates
-- (unsent, quarantined, sent), never the whole table, so it answers quickly on millions of
-- rows. Leased rows are a subset of the unsent ones: the lease check reads only those.
SELECT
    (SELECT count(*) FROM {table}
     WHERE sent_at IS NULL AND quarantined_at IS NULL),
    (SELECT count(*) FROM {table}
     WHERE sent_at IS NULL AND quarantined_at IS NULL AND lease_until > now()),
    coalesce((SELECT greatest(extract(epoch FROM now() - created_at), 0)::float8
              FROM {table}
              WHERE sent_at IS NULL AND quarantined_at IS NULL
              ORDER BY id
              LIMIT 1), 0),
    (SELECT count(*) FROM {table}
     WHERE sent_at IS NOT NULL AND sent_at > now() - interval '1 minute'),
    (SELECT coalesce(jsonb_object_agg(reason, n), '{}'::jsonb)
     FROM (SELECT coalesce(quarantine_reason, 'unknown') AS reason, count(*) AS n
           FROM {table}
           WHERE quarantined_at IS NOT NULL
           GROUP BY 1) AS by_reason)
