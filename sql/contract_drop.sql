-- `migrate --contract`, once the requirement excludes every relay that reads them: the lease
-- columns of schema version 1, which no relay since the lease table (schema version 2) reads
-- or writes. Dropping a column is a catalog change (no rewrite) under migrate's lock timeout;
-- VACUUM reclaims the space as rows are rewritten. Looked up first, so a rerun takes no lock.
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_attribute
               WHERE attrelid = to_regclass({table_literal})
                 AND attname IN ('lease_owner', 'lease_until', 'lease_token')
                 AND NOT attisdropped) THEN
        ALTER TABLE {table}
            DROP COLUMN IF EXISTS lease_owner,
            DROP COLUMN IF EXISTS lease_until,
            DROP COLUMN IF EXISTS lease_token;
    END IF;
END $$;
