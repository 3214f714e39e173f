-- Where `status` starts reading the unsent rows and the lease table: the lowest floors the live
-- relays published at their last renewal (sql/renew.sql, src/outbox/floors.rs), so that it
-- seeks past what settled rows and ended claims left in the indexes while a vacuum horizon is
-- held, as the relays' own statistics do. Like the gauges, a row that committed below them
-- since the relays' last sweep is counted from their next one.
--
-- A floor bounds what its relay can see; `status` may run as a role that sees more. So 0, the
-- start, where no relay is live, or a live one published none (a relay of before schema
-- version 5), or one does not claim: a relay that row-level security hides rows from (or that
-- a rule or a schema stopped) says so by not claiming, and its floor may lie above the rows
-- it cannot see.
SELECT coalesce(CASE WHEN bool_and(unsent_floor IS NOT NULL AND claiming) THEN min(unsent_floor) END, 0),
       coalesce(CASE WHEN bool_and(claims_floor IS NOT NULL AND claiming) THEN min(claims_floor) END, 0)
FROM {relays}
WHERE seen_until > now()
