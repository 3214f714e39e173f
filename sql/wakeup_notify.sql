-- `--wakeup notify`: one NOTIFY per inserting statement (not per row; PostgreSQL also folds
-- identical notifications within a transaction). Opt-in only: PostgreSQL serializes the
-- commits of every transaction that queued a notification (docs/operations.md has the cost).
-- {channel} is a literal built from hex digits; the other placeholders are quoted identifiers.
CREATE OR REPLACE FUNCTION {notify_function}() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM pg_notify(TG_ARGV[0], '');
    RETURN NULL;
END
$fn$;

CREATE OR REPLACE TRIGGER outbox_relay_notify
    AFTER INSERT ON {base}
    FOR EACH STATEMENT EXECUTE FUNCTION {notify_function}({channel});
