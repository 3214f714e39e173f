-- What can make the relay's settlements of {table} change nothing while their claim holds: an
-- enabled BEFORE row trigger on DELETE or UPDATE (it skips the row by returning NULL, as
-- soft-delete tooling does), a rule on DELETE or UPDATE (DO INSTEAD, or DO INSTEAD NOTHING),
-- row-level security that applies to the relay's role (policies for DELETE, UPDATE or ALL;
-- none at all forbids every change). One line each, for the relay's error.
SELECT format('trigger %I (BEFORE %s, FOR EACH ROW, function %s): it skips a row by returning NULL',
              t.tgname,
              concat_ws(' OR ', CASE WHEN t.tgtype & 8 <> 0 THEN 'DELETE' END,
                                CASE WHEN t.tgtype & 16 <> 0 THEN 'UPDATE' END),
              t.tgfoid::regproc)
FROM pg_trigger AS t
WHERE t.tgrelid = {table_literal}::regclass
  AND NOT t.tgisinternal
  AND t.tgenabled IN ('O', 'A')
  AND t.tgtype & 1 = 1
  AND t.tgtype & 2 = 2
  AND t.tgtype & (8 | 16) <> 0
UNION ALL
SELECT format('rule %I (ON %s%s)',
              r.rulename,
              CASE r.ev_type WHEN '2' THEN 'UPDATE' ELSE 'DELETE' END,
              CASE WHEN r.is_instead THEN ' DO INSTEAD' ELSE '' END)
FROM pg_rewrite AS r
WHERE r.ev_class = {table_literal}::regclass
  AND r.ev_type IN ('2', '4')
  AND r.ev_enabled IN ('O', 'A')
UNION ALL
SELECT format('row-level security on %s for role %I (%s)',
              c.oid::regclass,
              current_user,
              coalesce((SELECT string_agg(format('policy %I FOR %s', p.policyname, p.cmd), ', ')
                        FROM pg_policies AS p
                        WHERE p.schemaname = n.nspname AND p.tablename = c.relname
                          AND p.cmd IN ('ALL', 'DELETE', 'UPDATE')),
                       'no policy for DELETE or UPDATE: every change is refused'))
FROM pg_class AS c
JOIN pg_namespace AS n ON n.oid = c.relnamespace
JOIN pg_roles AS me ON me.rolname = current_user
WHERE c.oid = {table_literal}::regclass
  AND c.relrowsecurity
  AND NOT me.rolbypassrls
  AND NOT me.rolsuper
  AND (c.relforcerowsecurity OR c.relowner <> me.oid)
