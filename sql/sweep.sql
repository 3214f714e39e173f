-- The floors' safety net (src/outbox/floors.rs): the lowest unsent row below the rows' floor
-- $1, one that committed after the floor passed its id (a long or prepared transaction, ids a
-- session cached from a sequence), or NULL. The one statement that reads the unsent index from
-- its start, and so the one whose cost grows with what a held vacuum horizon keeps there: it
-- runs every --sweep-interval, not per claim or look.
--
-- Also the seconds the server spent on it (statement_timestamp() is when the statement
-- arrived; the subquery in FROM, behind OFFSET 0, is done before the outer list reads the
-- clock): the next sweep is spaced by what the database spent, not by the round trip, which on
-- a slow link is mostly the network's and would push the sweep, and a late row, back for
-- minutes.
SELECT found,
       extract(epoch FROM clock_timestamp() - statement_timestamp())::float8
FROM (SELECT (SELECT id
              FROM {table}
              WHERE sent_at IS NULL
                AND quarantined_at IS NULL
                AND id < $1::bigint
              ORDER BY id
              LIMIT 1) AS found
      OFFSET 0) AS swept
