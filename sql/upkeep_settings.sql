-- The maintenance connection's settings, for the current transaction only (set_config's
-- `is_local`, which is SET LOCAL): nothing stays on a server connection a pooler hands to the
-- application next. $1 is statement_timeout in milliseconds. The relay's own writes (retention
-- deletes, unparking) need not wait for their WAL flush: a lost one is done again next pass.
-- Nor are they worth JIT compiling (see session.rs). A transaction left idle by a connection
-- gone dark ends after the same time: the parking pass holds the claims' lock.
SELECT set_config('statement_timeout', $1, true),
       set_config('idle_in_transaction_session_timeout', $1, true),
       set_config('synchronous_commit', 'off', true),
       set_config('jit', 'off', true)
