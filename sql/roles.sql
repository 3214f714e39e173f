-- Least-privilege roles for an outbox table: the relay's and the application's.
--
-- The relay reads, settles and deletes rows (once sent, or after --retention): SELECT,
-- UPDATE, DELETE on the table and USAGE on its schema. It leases rows in the lease table
-- beside it, <relay_table>_claims (sql/claims.sql): a claim reads it and inserts one row, a
-- settlement or the next claim deletes that row: SELECT, INSERT, DELETE there. It registers
-- itself in the registry beside them, <relay_table>_relays (sql/relays.sql), and renews its row
-- every few seconds: SELECT, INSERT, UPDATE, DELETE there; and it reads which relay versions
-- the schema admits in outbox_relay_schema: SELECT there. Nothing else.
-- With `--wakeup logical` its role also needs REPLICATION (ALTER ROLE outbox_relay
-- REPLICATION), which this file does not grant: the default wake-up, `poll`, needs no more than
-- the above. It never INSERTs into the outbox table. The application only INSERTs; the `id`
-- column (and the lease table's `token`) is GENERATED ALWAYS AS IDENTITY, whose sequence
-- PostgreSQL advances without checking the inserting role's sequence privileges, so INSERT
-- alone suffices (add SELECT on the columns it names in a RETURNING clause, if it uses one).
--
-- `outbox-relay migrate` creates and upgrades the table and needs its owner's rights: run it
-- separately (e.g. from the deploy pipeline) as the owner, then this file, as the owner or a
-- role with CREATEROLE, with psql 15 or later:
--
--   OUTBOX_RELAY_PASSWORD=... OUTBOX_APP_PASSWORD=... \
--   psql "$ADMIN_URL" -v ON_ERROR_STOP=1 -v schema=app -v table=outbox -f sql/roles.sql
--
-- Variables (psql -v NAME=VALUE), all optional:
--   schema          the table's schema                          (default public)
--   table           the outbox table                            (default outbox)
--   relay_table     what the relay reads: the table, or for a table adopted with
--                   `migrate --adopt` the view it created, <table>_relay  (default :table)
--   relay_claims    the relay's lease table        (default <relay_table>_claims; for a
--                   relay_table longer than 56 bytes the relay shortens the name with a
--                   hash: pass the name `outbox-relay check` shows)
--   relay_registry  the relay registry             (default <relay_table>_relays; shortened
--                   like relay_claims for a long relay_table)
--   relay_role      the relay's login role                      (default outbox_relay)
--   app_role        the application's role                      (default outbox_app)
--   relay_password, app_password
--                   only for roles this file creates; read from OUTBOX_RELAY_PASSWORD and
--                   OUTBOX_APP_PASSWORD when not given, so no secret is in this file, on a
--                   command line or in shell history. An existing role keeps its password
--                   unless one is given.
-- Every name is quoted as an identifier and every password as a literal by psql (:"x", :'x').
-- Running it again is harmless.

\set ON_ERROR_STOP on

\if :{?schema}
\else
\set schema public
\endif
\if :{?table}
\else
\set table outbox
\endif
\if :{?relay_table}
\else
\set relay_table :table
\endif
\if :{?relay_claims}
\else
\set relay_claims :relay_table '_claims'
\endif
\if :{?relay_registry}
\else
\set relay_registry :relay_table '_relays'
\endif
\if :{?relay_role}
\else
\set relay_role outbox_relay
\endif
\if :{?app_role}
\else
\set app_role outbox_app
\endif
\if :{?relay_password}
\else
\getenv relay_password OUTBOX_RELAY_PASSWORD
\endif
\if :{?app_password}
\else
\getenv app_password OUTBOX_APP_PASSWORD
\endif

SELECT current_database() AS database,
       NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'relay_role') AS create_relay,
       NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'app_role') AS create_app
\gset

BEGIN;

-- The relay.
\if :create_relay
\if :{?relay_password}
CREATE ROLE :"relay_role" LOGIN PASSWORD :'relay_password';
\else
DO $$ BEGIN RAISE EXCEPTION 'set OUTBOX_RELAY_PASSWORD (or psql -v relay_password=...) to create the relay role'; END $$;
\endif
\elif :{?relay_password}
ALTER ROLE :"relay_role" LOGIN PASSWORD :'relay_password';
\endif
GRANT CONNECT ON DATABASE :"database" TO :"relay_role";
GRANT USAGE ON SCHEMA :"schema" TO :"relay_role";
GRANT SELECT, UPDATE, DELETE ON TABLE :"schema".:"relay_table" TO :"relay_role";
GRANT SELECT, INSERT, DELETE ON TABLE :"schema".:"relay_claims" TO :"relay_role";
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE :"schema".:"relay_registry" TO :"relay_role";
GRANT SELECT ON TABLE :"schema".outbox_relay_schema TO :"relay_role";
-- Where row-level security is on for the table, a policy that lets the relay see and settle
-- every row: without it the relay would not see what the other policies hide, or could not
-- settle what it sent (the relay refuses to start then). Named after the role.
SELECT relrowsecurity AS row_security
FROM pg_class
WHERE oid = format('%I.%I', :'schema', :'table')::regclass
\gset
\if :row_security
DROP POLICY IF EXISTS :"relay_role" ON :"schema".:"table";
CREATE POLICY :"relay_role" ON :"schema".:"table" FOR ALL TO :"relay_role" USING (true) WITH CHECK (true);
\endif

-- The application: it writes outbox rows in its own transactions, and nothing more here.
\if :create_app
\if :{?app_password}
CREATE ROLE :"app_role" LOGIN PASSWORD :'app_password';
\else
DO $$ BEGIN RAISE EXCEPTION 'set OUTBOX_APP_PASSWORD (or psql -v app_password=...) to create the application role'; END $$;
\endif
\elif :{?app_password}
ALTER ROLE :"app_role" LOGIN PASSWORD :'app_password';
\endif
GRANT CONNECT ON DATABASE :"database" TO :"app_role";
GRANT USAGE ON SCHEMA :"schema" TO :"app_role";
GRANT INSERT ON TABLE :"schema".:"table" TO :"app_role";

COMMIT;
