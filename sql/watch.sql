-- One table's part of the full look a relay serving several tables takes at all of them at
-- once every --stats-interval (parts joined by UNION ALL, one statement for up to a hundred
-- tables; sql/watch_fast.sql is the look between): is a row claimable now (sql/probe.sql),
-- the age of the oldest unsent row (the first entry of the unsent partial index, or of a row
-- parked in quarantine: as sql/stats.sql), are rows parked for their queue due again, are sent
-- rows past retention ($3 seconds; NULL without retention). Read-only and lock-free; each
-- answer is one short index scan, none of which walks the backlog; the unsent rows are read
-- from the table's floor on ({floor}, src/outbox/floors.rs).
SELECT {index}::int4,
       ({probe}),
       coalesce((SELECT greatest(extract(epoch FROM now() - min(created_at)), 0)::float8
                 FROM ((SELECT created_at
                        FROM {table}
                        WHERE sent_at IS NULL AND quarantined_at IS NULL AND id >= {floor}
                        ORDER BY id
                        LIMIT 1)
                       UNION ALL
                       (SELECT created_at
                        FROM {table}
                        WHERE quarantined_at IS NOT NULL
                          AND sent_at IS NULL
                          AND quarantine_reason IN ('blocked', 'destination')
                        ORDER BY id
                        LIMIT 1)) AS oldest), 0),
       EXISTS (
           SELECT 1
           FROM {table}
           WHERE quarantined_at IS NOT NULL
             AND quarantine_reason = 'destination'
             AND available_at <= now()
       ),
       EXISTS (
           SELECT 1
           FROM {table}
           WHERE sent_at < now() - make_interval(secs => $3::float8)
       )
