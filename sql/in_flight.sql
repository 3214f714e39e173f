-- Ordered delivery: the groups (key and destination, sql/destination.sql) of the rows some
-- claim holds (`leased_ids`). The one definition of "a row of this group is in flight",
-- rendered into every ordered claim (after `leased`) and into the parking pass;
-- `nothing_in_flight` in claim.rs is the one test against it. Read at most once per statement
-- (a primary-key probe per leased id), and tested as a hashed lookup, not a scan per row.
in_flight AS MATERIALIZED (
    SELECT DISTINCT {key_e} AS k, {dest_e} AS d
    FROM {table} AS e
    WHERE e.id = ANY (ARRAY({leased_ids}))
)
