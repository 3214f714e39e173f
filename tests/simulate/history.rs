//! The database side of the history: a trigger log the simulation installs on the outbox table
//! and on its lease table, read back whole at the end.
//!
//! Each logged change carries the transaction that made it (`txid_current()`), the time
//! (`clock_timestamp()`, the same host's clock the faults are timed by) and the session's
//! `application_name`, which the simulation sets to the relay id in each relay's URL, so every
//! change ties to the claim (lease row) deleted or inserted in the same transaction. The log is
//! transactional: a change that rolled back left no entry, a committed one always did.

use tokio_postgres::Client;

/// Installed after `migrate`, on `table` (as the relay names it, quoted parts) and on
/// `claims`. `ENABLE ALWAYS`: under `session_replication_role = replica` ordinary triggers do
/// not fire, and that setting is one the simulation imposes.
pub fn install_sql(table: &str, claims: &str) -> String {
    format!(
        r#"
CREATE SCHEMA sim;
CREATE TABLE sim.log (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at double precision NOT NULL DEFAULT extract(epoch FROM clock_timestamp()),
    txid bigint NOT NULL DEFAULT txid_current(),
    app text NOT NULL DEFAULT current_setting('application_name'),
    pid int NOT NULL DEFAULT pg_backend_pid(),
    tbl text NOT NULL,
    op text NOT NULL,
    id bigint,
    event_id text,
    group_key text,
    old_sent boolean,
    new_sent boolean,
    old_reason text,
    new_reason text,
    old_attempts int,
    new_attempts int,
    token bigint,
    owner text,
    until double precision,
    ids bigint[],
    -- The outbox row's created_at: the age signal's bounds (world/signal.rs) need it of rows
    -- deleted on acknowledgement too.
    created double precision
);
CREATE FUNCTION sim.outbox_changed() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO sim.log (tbl, op, id, event_id, group_key, created)
        VALUES ('outbox', 'I', NEW.id, NEW.event_id, NEW.aggregate_id,
                extract(epoch FROM NEW.created_at));
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO sim.log (tbl, op, id, event_id, old_sent, old_reason, old_attempts, created)
        VALUES ('outbox', 'D', OLD.id, OLD.event_id, OLD.sent_at IS NOT NULL,
                CASE WHEN OLD.quarantined_at IS NOT NULL THEN coalesce(OLD.quarantine_reason, '?') END,
                OLD.attempts, extract(epoch FROM OLD.created_at));
    ELSIF (OLD.sent_at IS NULL) IS DISTINCT FROM (NEW.sent_at IS NULL)
       OR OLD.quarantined_at IS DISTINCT FROM NEW.quarantined_at
       OR OLD.quarantine_reason IS DISTINCT FROM NEW.quarantine_reason
       OR OLD.attempts IS DISTINCT FROM NEW.attempts THEN
        INSERT INTO sim.log (tbl, op, id, event_id, old_sent, new_sent, old_reason, new_reason,
                             old_attempts, new_attempts, created)
        VALUES ('outbox', 'U', NEW.id, NEW.event_id, OLD.sent_at IS NOT NULL, NEW.sent_at IS NOT NULL,
                CASE WHEN OLD.quarantined_at IS NOT NULL THEN coalesce(OLD.quarantine_reason, '?') END,
                CASE WHEN NEW.quarantined_at IS NOT NULL THEN coalesce(NEW.quarantine_reason, '?') END,
                OLD.attempts, NEW.attempts, extract(epoch FROM NEW.created_at));
    END IF;
    RETURN NULL;
END $$;
-- The slow-claims fault: while claim_sleep_ms > 0, each claim's lease insert takes that long
-- in the server, as a claim on a young or contended table does. Claims take turns on one lock,
-- so the others wait that long too.
CREATE TABLE sim.control (claim_sleep_ms int NOT NULL);
INSERT INTO sim.control VALUES (0);
CREATE FUNCTION sim.claims_changed() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM pg_sleep(c.claim_sleep_ms / 1000.0) FROM sim.control AS c WHERE c.claim_sleep_ms > 0;
        INSERT INTO sim.log (tbl, op, token, owner, until, ids)
        VALUES ('claims', 'I', NEW.token, NEW.owner, extract(epoch FROM NEW.until), NEW.ids);
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO sim.log (tbl, op, token, owner, until, ids)
        VALUES ('claims', 'D', OLD.token, OLD.owner, extract(epoch FROM OLD.until), OLD.ids);
    ELSE
        INSERT INTO sim.log (tbl, op, token, owner, until, ids)
        VALUES ('claims', 'U', NEW.token, NEW.owner, extract(epoch FROM NEW.until), NEW.ids);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER sim_log AFTER INSERT OR UPDATE OR DELETE ON {table}
    FOR EACH ROW EXECUTE FUNCTION sim.outbox_changed();
ALTER TABLE {table} ENABLE ALWAYS TRIGGER sim_log;
CREATE TRIGGER sim_log AFTER INSERT OR UPDATE OR DELETE ON {claims}
    FOR EACH ROW EXECUTE FUNCTION sim.claims_changed();
ALTER TABLE {claims} ENABLE ALWAYS TRIGGER sim_log;
"#
    )
}

/// Turns the slow-claims fault on (`ms` > 0) or off.
pub async fn set_claim_sleep(client: &Client, ms: u64) -> Result<u64, tokio_postgres::Error> {
    let ms = i32::try_from(ms).unwrap_or(i32::MAX);
    client
        .execute("UPDATE sim.control SET claim_sleep_ms = $1", &[&ms])
        .await
}

/// One logged change.
#[derive(Clone, Debug, Default)]
pub struct Change {
    /// Seconds since the epoch, database clock.
    pub at: f64,
    pub txid: i64,
    pub app: String,
    /// `outbox` or `claims`.
    pub tbl: String,
    /// `I`, `U` or `D`.
    pub op: String,
    pub id: Option<i64>,
    pub event_id: Option<String>,
    pub group_key: Option<String>,
    pub old_sent: Option<bool>,
    pub new_sent: Option<bool>,
    pub old_reason: Option<String>,
    pub new_reason: Option<String>,
    pub old_attempts: Option<i32>,
    pub new_attempts: Option<i32>,
    pub token: Option<i64>,
    pub owner: Option<String>,
    pub until: Option<f64>,
    pub ids: Vec<i64>,
}

impl Change {
    pub fn is_outbox(&self) -> bool {
        self.tbl == "outbox"
    }
}

pub async fn read_log(client: &Client) -> Vec<Change> {
    client
        .query(
            "SELECT at, txid, app, tbl, op, id, event_id, group_key, old_sent, new_sent, \
             old_reason, new_reason, old_attempts, new_attempts, token, owner, until, \
             coalesce(ids, '{}') FROM sim.log ORDER BY seq",
            &[],
        )
        .await
        .expect("read the trigger log")
        .into_iter()
        .map(|r| Change {
            at: r.get(0),
            txid: r.get(1),
            app: r.get(2),
            tbl: r.get(3),
            op: r.get(4),
            id: r.get(5),
            event_id: r.get(6),
            group_key: r.get(7),
            old_sent: r.get(8),
            new_sent: r.get(9),
            old_reason: r.get(10),
            new_reason: r.get(11),
            old_attempts: r.get(12),
            new_attempts: r.get(13),
            token: r.get(14),
            owner: r.get(15),
            until: r.get(16),
            ids: r.get(17),
        })
        .collect()
}

/// Of the late writers' rows (`late-…`) that committed: how many, and how many committed
/// below the id of a row already acknowledged then (sent, or deleted on acknowledgement).
/// Needs `track_commit_timestamp`; `None` where the server cannot say.
pub async fn late_below(client: &Client) -> Option<(i64, i64)> {
    let row = client
        .query_one(
            "WITH late AS (                SELECT l.id, extract(epoch FROM                  pg_xact_commit_timestamp(((l.txid % 4294967296)::text)::xid)) AS committed                FROM sim.log l                WHERE l.tbl = 'outbox' AND l.op = 'I' AND l.event_id LIKE 'late-%'),              acked AS (                SELECT id, at FROM sim.log                WHERE tbl = 'outbox' AND ((op = 'U' AND new_sent AND NOT old_sent)                  OR (op = 'D' AND NOT old_sent AND old_reason IS NULL)))              SELECT count(*), count(*) FILTER (WHERE EXISTS (                SELECT 1 FROM acked a WHERE a.id > late.id AND a.at < late.committed))              FROM late",
            &[],
        )
        .await
        .ok()?;
    Some((row.get(0), row.get(1)))
}

/// The final state of one row still in the table.
#[derive(Clone, Debug)]
pub struct FinalRow {
    pub event_id: String,
    pub reason: Option<String>,
}

pub async fn read_rows(client: &Client, table: &str) -> Vec<FinalRow> {
    client
        .query(
            &format!(
                "SELECT event_id, \
                 CASE WHEN quarantined_at IS NOT NULL THEN coalesce(quarantine_reason, '?') END \
                 FROM {table} ORDER BY id"
            ),
            &[],
        )
        .await
        .expect("read the outbox rows")
        .into_iter()
        .map(|r| FinalRow {
            event_id: r.get(0),
            reason: r.get(1),
        })
        .collect()
}
