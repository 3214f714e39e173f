-- A row's destination, the half of its group that is not its key (a group is (destination,
-- group key); see src/group.rs): its own queue_url, else the route of its route key, else the
-- default, as the planner decides it (batch.rs, `queue_for`). Rendered wherever two rows'
-- groups are compared; the routes come from the configuration as quoted literals (the
-- template's Literal), never spliced text. Comment lines are dropped before rendering.
coalesce(nullif({alias}.queue_url, ''), ({route_destinations})[array_position({route_keys}, {route_key})], {default_destination})
