-- Up to $1 claimable rows in id order, as many as fit the byte budget $4 (the first always
-- does; a row quarantined at claim weighs nothing, see `measured` in claim.rs). Rows in a
-- claim (`leased`, sql/claim.sql), rows waiting for a retry and settled rows are skipped.
-- From the rows' floor $5 on (src/outbox/floors.rs): the entries settled rows left below it
-- are never read, however many a held vacuum horizon keeps. The ordered filter holds back rows
-- bound for a FIFO queue that are not their group's head (see claim.rs).
{leased}
chosen AS (
    SELECT id, c.attempts AS attempts, {payload_bytes} AS bytes, {row_c}
    FROM {table} AS c
    WHERE sent_at IS NULL
      AND quarantined_at IS NULL
      AND id >= $5::bigint
      AND available_at <= now()
      AND id NOT IN (SELECT id FROM leased)
      {ordered_filter}
    ORDER BY id
    LIMIT $1
),
measured AS (
    {measured}
),
candidates AS (
    SELECT b.*
    FROM (SELECT m.*, sum(m.held) OVER (ORDER BY m.id) - m.held AS before
          FROM measured AS m) AS b
    WHERE b.before < $4
)
