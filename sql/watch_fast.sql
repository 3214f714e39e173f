-- One table's part of the look a relay serving several tables takes at all of them every
-- --poll-interval: only whether a row is claimable now (sql/probe.sql), one index probe of the
-- unsent partial index; the rest of the full look (sql/watch.sql) waits for --stats-interval.
-- The columns are the full look's, so both read alike.
SELECT {index}::int4,
       ({probe}),
       0::float8,
       false,
       false
