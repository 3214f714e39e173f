-- `outbox-relay check`: of the privileges the relay needs on a table of its own beside the
-- outbox (the lease table, the relay registry, the schema version table), those the connected
-- role lacks. $1 is its quoted, possibly schema-qualified name, $2 the privileges it needs; no
-- row when it does not exist.
SELECT ARRAY(SELECT p FROM unnest($2::text[]) AS p WHERE NOT has_table_privilege(c.oid, p))
FROM pg_class c
WHERE c.oid = to_regclass($1)
