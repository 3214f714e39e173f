-- `outbox-relay check`: what the connected role may do with the lease table (sql/claims.sql).
-- $1 is its quoted, possibly schema-qualified name; no row when it does not exist.
SELECT has_table_privilege(c.oid, 'SELECT'),
       has_table_privilege(c.oid, 'INSERT'),
       has_table_privilege(c.oid, 'DELETE')
FROM pg_class c
WHERE c.oid = to_regclass($1)
