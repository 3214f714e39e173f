-- `outbox-relay check`: who the relay connects as and what it may do with the table beyond
-- its columns. $1 is the quoted, possibly schema-qualified name; no row when it does not exist.
SELECT current_user::text,
       coalesce((SELECT rolsuper FROM pg_roles WHERE rolname = current_user), false),
       pg_has_role(c.relowner, 'USAGE'),
       has_schema_privilege(c.relnamespace, 'USAGE'),
       has_table_privilege(c.oid, 'DELETE'),
       array_remove(ARRAY[
           CASE WHEN has_table_privilege(c.oid, 'INSERT') THEN 'INSERT' END,
           CASE WHEN has_table_privilege(c.oid, 'TRUNCATE') THEN 'TRUNCATE' END,
           CASE WHEN has_table_privilege(c.oid, 'REFERENCES') THEN 'REFERENCES' END,
           CASE WHEN has_table_privilege(c.oid, 'TRIGGER') THEN 'TRIGGER' END
       ], NULL)
FROM pg_class c
WHERE c.oid = to_regclass($1)
