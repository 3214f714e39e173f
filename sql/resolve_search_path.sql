-- Which table an unqualified name reaches on this connection's search_path, and every other
-- table or view of that name, one the path hides or does not reach. $1 is the quoted name,
-- $2 the bare one. Always one row; its schema is NULL when the path reaches none.
SELECT n.nspname,
       current_setting('search_path'),
       ARRAY(SELECT quote_ident(o.nspname) || '.' || quote_ident(r.relname)
             FROM pg_class r
             JOIN pg_namespace o ON o.oid = r.relnamespace
             WHERE r.relname = $2
               AND r.relkind IN ('r', 'p', 'v')
               AND r.oid IS DISTINCT FROM to_regclass($1)
             ORDER BY 1)
FROM (SELECT to_regclass($1) AS oid) t
LEFT JOIN pg_class c ON c.oid = t.oid
LEFT JOIN pg_namespace n ON n.oid = c.relnamespace
