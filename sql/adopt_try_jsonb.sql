-- Adopt an existing outbox table whose headers column is not jsonb (text, say): the function
-- through which the relay's view and header-key indexes read it. A plain cast would let one
-- value that is not JSON fail every statement that reads the column: every claim of the relay,
-- for ever, and, through a header-key index, the application's own INSERT of that row. Such a
-- value is returned as a JSON string of itself instead; headers must be a JSON object, so the
-- relay quarantines that row alone as `invalid`. IMMUTABLE, like the text-to-jsonb cast it
-- wraps, so that indexes may use it. Only data errors (invalid syntax, an unsupported escape,
-- a number out of range) and nesting too deep for the parser are caught. PARALLEL UNSAFE (the
-- default, said here on purpose): the exception block is a subtransaction, which PostgreSQL
-- refuses to start during a parallel query.
CREATE OR REPLACE FUNCTION {try_jsonb}(value text) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE PARALLEL UNSAFE AS $$
BEGIN
    RETURN value::jsonb;
EXCEPTION WHEN data_exception OR program_limit_exceeded THEN
    RETURN to_jsonb(value);
END
$$;
