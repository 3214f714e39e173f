-- Whether row-level security on the table $1 (quoted, possibly schema-qualified) applies to
-- the relay's role, and if it does, whether a policy lets the role see and settle every row: a
-- permissive policy for every command (FOR ALL) of the role, one of its roles or PUBLIC, whose
-- USING (and WITH CHECK) is `true`. Without one, the relay would not see rows its policies hide
-- (nothing sent, an oldest-unsent age of 0) or not settle rows it sent (the same rows sent
-- again and again). Also the policies found, for the message.
SELECT c.relrowsecurity
       AND NOT me.rolbypassrls
       AND NOT me.rolsuper
       AND (c.relforcerowsecurity OR NOT pg_has_role(me.oid, c.relowner, 'USAGE')) AS applies,
       EXISTS (
           SELECT 1
           FROM pg_policy AS p
           WHERE p.polrelid = c.oid
             AND p.polpermissive
             AND p.polcmd = '*'
             AND EXISTS (SELECT 1 FROM unnest(p.polroles) AS r(oid)
                         WHERE r.oid = 0 OR pg_has_role(me.oid, r.oid, 'MEMBER'))
             AND pg_get_expr(p.polqual, p.polrelid) = 'true'
             AND (p.polwithcheck IS NULL OR pg_get_expr(p.polwithcheck, p.polrelid) = 'true')
       ) AS open,
       coalesce((SELECT string_agg(format('%I FOR %s TO %s USING (%s)', p.policyname, p.cmd,
                                          array_to_string(p.roles, ','), p.qual), '; ')
                 FROM pg_policies AS p
                 WHERE p.schemaname = n.nspname AND p.tablename = c.relname),
                'none') AS policies,
       current_user::text
FROM pg_class AS c
JOIN pg_namespace AS n ON n.oid = c.relnamespace
JOIN pg_roles AS me ON me.rolname = current_user
WHERE c.oid = to_regclass($1)
