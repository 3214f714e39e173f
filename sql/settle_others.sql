-- The part of sql/settle.sql for rows given back and rows parked, in settlements that have any.
given_back AS MATERIALIZED (
    SELECT u.*
    FROM unnest($4::bigint[], $5::float8[], $6::text[], $7::int[]) AS u(id, delay, error, refund)
    WHERE u.id IN (SELECT id FROM held)
),
rescheduled AS (
    UPDATE {table} AS o
    SET available_at = now() + make_interval(secs => u.delay),
        attempts = greatest(o.attempts + 1 - u.refund, 0),
        last_error = coalesce(u.error, o.last_error)
    FROM given_back AS u
    WHERE o.id = u.id
      AND o.id = ANY (ARRAY(SELECT id FROM given_back))
      AND coalesce(o.sent_at, o.quarantined_at) IS NULL
    RETURNING o.id
),
parked AS MATERIALIZED (
    SELECT u.*
    FROM unnest($8::bigint[], $9::text[], $10::text[], $11::float8[]) AS u(id, reason, error, delay)
    WHERE u.id IN (SELECT id FROM held)
),
quarantined AS (
    UPDATE {table} AS o
    SET quarantined_at = now(),
        quarantine_reason = u.reason,
        last_error = u.error,
        available_at = CASE WHEN u.delay IS NULL THEN o.available_at
                            ELSE now() + make_interval(secs => u.delay) END,
        attempts = o.attempts + CASE WHEN u.delay IS NULL THEN 1 ELSE 0 END
    FROM parked AS u
    WHERE o.id = u.id
      AND o.id = ANY (ARRAY(SELECT id FROM parked))
      AND coalesce(o.sent_at, o.quarantined_at) IS NULL
    RETURNING o.id
)
