-- "Row c is its group's head" (see `group_head` in src/outbox/claim.rs): released by the
-- order, nothing of its group in flight, and the row just before it in its group, one step
-- back in the group's order index, done (sent, or poison under --on-poison skip), or none.
-- Comment lines are dropped and the rest joined into one line before rendering.
({released_c} AND {nothing_in_flight_c} AND coalesce((SELECT p.sent_at IS NOT NULL{or_poison_p} FROM {table} AS p
WHERE {key_p} >= {key_c} AND {key_p} <= {key_c} AND {position_p} < {position_c} AND {dest_p} = {dest_c}
ORDER BY {key_p} DESC, {order_p_desc} LIMIT 1), true))
