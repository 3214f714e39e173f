-- New rows number themselves from {sequence}; the rows already in the table are numbered by the
-- backfill from {backfill_sequence}, below every new row, in their physical order (what the
-- rewrite of an identity column gave them before). The start of {sequence} is computed while
-- this transaction holds the table's lock, so no row can arrive unseen: no more tuples than
-- pages times the most a page can hold, plus room for values a killed backfill batch spent.
-- Run in the same transaction as adopt_columns.sql when the column is new.
CREATE SEQUENCE IF NOT EXISTS {sequence} AS bigint OWNED BY {base}.{seq};
CREATE SEQUENCE IF NOT EXISTS {backfill_sequence} AS bigint OWNED BY {base}.{seq};
SELECT setval({sequence_literal},
              pg_relation_size({base_literal}) / current_setting('block_size')::bigint
                  * ((current_setting('block_size')::bigint - 24) / 28) + 1000000,
              false);
ALTER TABLE {base} ALTER COLUMN {seq} SET DEFAULT nextval({sequence_literal});
