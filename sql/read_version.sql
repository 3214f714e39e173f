-- The schema version `migrate` recorded for a table ($1, quoted as in SQL).
SELECT version FROM {versions} WHERE table_name = $1
