-- `outbox-relay check`: the table's columns, their types, and whether the connected role may
-- read and update each (granted on the table or on the column).
SELECT a.attname::text,
       format_type(a.atttypid, a.atttypmod),
       t.typcategory::text,
       has_column_privilege(a.attrelid, a.attnum, 'SELECT'),
       has_column_privilege(a.attrelid, a.attnum, 'UPDATE')
FROM pg_attribute a
JOIN pg_type t ON t.oid = a.atttypid
WHERE a.attrelid = to_regclass($1)
  AND a.attnum > 0
  AND NOT a.attisdropped
ORDER BY a.attnum
