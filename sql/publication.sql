-- The logical-decoding doorbell's publication: does it exist, and does it publish inserts into
-- the outbox table? $1 is the publication's name, $2 the quoted, possibly schema-qualified name
-- the relay reads: the table itself, or the view over an adopted table, whose base table is
-- the one published (views cannot be). pg_publication_tables also expands FOR ALL TABLES.
-- Tables are compared by name, not through to_regclass on each listed name, which would need
-- USAGE on every schema the planner might visit first (pg_toast).
WITH outbox AS (
    SELECT to_regclass($2)::oid AS oid
), published AS (
    SELECT o.oid FROM outbox o
    UNION ALL
    SELECT d.refobjid
    FROM outbox o
    JOIN pg_rewrite r ON r.ev_class = o.oid
    JOIN pg_depend d ON d.classid = 'pg_rewrite'::regclass AND d.objid = r.oid
    WHERE d.refclassid = 'pg_class'::regclass AND d.refobjid <> o.oid
)
SELECT p.pubinsert
       AND EXISTS (
           SELECT 1
           FROM pg_publication_tables t
           JOIN pg_namespace n ON n.nspname = t.schemaname
           JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = t.tablename
           WHERE t.pubname = p.pubname
             AND c.oid IN (SELECT oid FROM published)
       ) AS publishes_inserts
FROM pg_publication p
WHERE p.pubname = $1
