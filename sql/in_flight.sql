-- Ordered delivery: the rows some claim holds (`leased_ids`), each with its group (key and
-- destination, sql/destination.sql) and its place in the group's order. The one definition of
-- "a row of this group is in flight", rendered into every ordered claim (after `leased`) and
-- into the parking pass; `in_flight_up_to` in claim.rs is the one test against it. Read at
-- most once per statement: a primary-key probe per leased id.
in_flight AS MATERIALIZED (
    SELECT {key_e} AS k, {dest_e} AS d, e.id{carried_e}
    FROM {table} AS e
    WHERE e.id = ANY (ARRAY({leased_ids}))
)
