-- The floors' safety net (src/outbox/floors.rs): the lowest unsent row below the rows' floor
-- $1, one that committed after the floor passed its id (a long or prepared transaction, ids a
-- session cached from a sequence), or NULL. The one statement that reads the unsent index from
-- its start, and so the one whose cost grows with what a held vacuum horizon keeps there: it
-- runs every --sweep-interval, not per claim or look.
SELECT (SELECT id
        FROM {table}
        WHERE sent_at IS NULL
          AND quarantined_at IS NULL
          AND id < $1::bigint
        ORDER BY id
        LIMIT 1)
