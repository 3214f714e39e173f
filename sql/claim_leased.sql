-- The first CTEs of every claim: which ids claims hold (`leased`), every claim's whether its
-- lease runs or ended. A claim that ended (its owner stopped, or took longer than its lease)
-- is taken over by a statement of its own (sql/takeover.sql), which the relay runs when the
-- claim's first statement finds one (sql/claim_start.sql): until then its rows stay out of
-- claims. So a claim writes nothing for a takeover, and every claim runs the few plan nodes of
-- the usual case, where no claim has ended (docs/benchmarks.md, "A claim cycle").
--
-- The lease table is read from the claims' floor {claims_floor} on (src/outbox/floors.rs): no
-- claim has a smaller token, and the rows of settled claims below it, which stay until VACUUM
-- can remove them, are never read. `live_from` is the floor the next claim may use.
leased AS (
    SELECT unnest(l.ids) AS id
    FROM {claims} AS l
    WHERE l.token >= {claims_floor}
),
live_from AS (
    SELECT min(l.token) AS token
    FROM {claims} AS l
    WHERE l.token >= {claims_floor}
),
