-- The logical-decoding doorbell's publication: does it exist, and does it publish inserts into
-- the table the application writes? $1 is the publication's name, $2 the quoted, possibly
-- schema-qualified base table (an adopted table, not the relay's view over it).
-- pg_publication_tables also expands FOR ALL TABLES and FOR TABLES IN SCHEMA. Tables are
-- compared by name, not through to_regclass on each listed name, which would need USAGE on
-- every schema the planner might visit first (pg_toast).
SELECT p.pubinsert
       AND EXISTS (
           SELECT 1
           FROM pg_publication_tables t
           JOIN pg_namespace n ON n.nspname = t.schemaname
           JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = t.tablename
           WHERE t.pubname = p.pubname
             AND c.oid = to_regclass($2)
       ) AS publishes_inserts
FROM pg_publication p
WHERE p.pubname = $1
