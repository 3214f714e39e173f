-- Fair claiming: up to $1 rows (as many as fit the byte budget $4) taken round-robin across the values of the key (the first
-- unclaimed row of every key, then the second, ...), so a burst under one key cannot starve
-- the others. `keys` walks the distinct values with pending rows (sql/fair_values.sql) with
-- one index probe each. The per-key scan
-- compares with `>= k AND <= k` rather than `= k` on purpose: with `=` the planner treats the
-- key as constant, believes the primary key's id order serves as well, and walks a skewed
-- backlog row by row; the range keeps it on the (key, id) index.
{leased}
keys(k) AS (
    {keys}
),
ranked AS (
    SELECT picked.id, row_number() OVER (PARTITION BY keys.k ORDER BY picked.id) AS turn
    FROM keys
    CROSS JOIN LATERAL (
        SELECT c.id
        FROM {table} AS c
        WHERE {key_c} >= keys.k AND {key_c} <= keys.k
          AND c.id >= $5
          AND c.sent_at IS NULL
          AND c.quarantined_at IS NULL
          AND c.available_at <= now()
          AND c.id NOT IN (SELECT id FROM leased)
          {ordered_filter}
        ORDER BY {key_c}, c.id
        LIMIT $1
    ) AS picked
    WHERE keys.k IS NOT NULL
),
chosen AS (
    SELECT c.id, c.attempts AS attempts, {payload_bytes} AS bytes, {row_c}
    FROM {table} AS c
    -- An array, not IN (subquery): the chosen ids are looked up by primary key whatever the
    -- statistics say, never by a join over the table.
    WHERE c.id = ANY (ARRAY(SELECT id FROM ranked ORDER BY turn, id LIMIT $1))
    ORDER BY c.id
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
