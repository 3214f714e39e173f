-- Of the rows a settlement acknowledged ($1), those still unsent after it: asked only when the
-- settlement, its claim's fence held, changed fewer rows than it meant to. A row still unsent
-- was not changed by it (a trigger that skipped it, a rule, a row-level security policy); a
-- row gone or settled was (or was deleted by someone else, which is no matter of the relay's).
SELECT count(*)
FROM {table}
WHERE id = ANY ($1::bigint[])
  AND coalesce(sent_at, quarantined_at) IS NULL
