-- The roles that claim on this table (they may INSERT into its lease table) get what a relay of
-- schema version 4 also needs: its row in the registry, and a look at the contract in the
-- version table. A relay of the new version then starts under a role set up for the previous
-- one, without a GRANT between `migrate` and the rolling update. The names come from the
-- catalog (regrole quotes them); nothing here is spliced from input.
DO $$
DECLARE
    grantee regrole;
BEGIN
    FOR grantee IN
        SELECT DISTINCT a.grantee::regrole
        FROM pg_class AS c, aclexplode(c.relacl) AS a
        WHERE c.oid = to_regclass({claims_literal})
          AND a.privilege_type = 'INSERT'
          AND a.grantee <> 0
          AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %s TO %s', {relays_literal}, grantee);
        EXECUTE format('GRANT SELECT ON %s TO %s', {versions_literal}, grantee);
    END LOOP;
END $$;
