//! What can go wrong talking to the outbox, and which failures are worth retrying.

use tokio_postgres::error::SqlState;

use crate::version::NEEDS_SCHEMA as SCHEMA_VERSION;

#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    #[error("DATABASE_URL is not a valid PostgreSQL URL or key=value string: {0}")]
    InvalidUrl(String),
    #[error("cannot connect to PostgreSQL at {target}: {reason}")]
    Connect { target: String, reason: String },
    /// The server refused the relay itself: authentication failed, the database does not
    /// exist, its certificate cannot be verified. Trying again cannot help until someone fixes
    /// the configuration, so a relay that starts with it exits instead of waiting.
    #[error("cannot connect to PostgreSQL at {target}: {reason}")]
    Rejected { target: String, reason: String },
    /// TLS settings that cannot work (verification without a CA, an unreadable CA file).
    #[error("{0}")]
    Tls(String),
    /// The chosen `--wakeup` cannot work against this database as it is.
    #[error("{0}")]
    Wakeup(String),
    /// `--pooler` cannot work with what answers for PostgreSQL (see `pooler`).
    #[error("{0}")]
    Pooler(String),
    /// An unqualified `--table` that the connection's `search_path` does not reach, while a
    /// table of that name exists elsewhere: `migrate` would not help.
    #[error("table {table} is not on the search_path ({search_path}) of the relay's role; it exists as {found}: use --table {first}, or add its schema to the role's search_path")]
    TableHidden {
        table: String,
        search_path: String,
        found: String,
        first: String,
    },
    #[error("table {0} does not exist: run `outbox-relay migrate` with the same --table, or fix --table")]
    TableMissing(String),
    #[error("the index for {key} is missing on {table}: run `outbox-relay migrate --table {table} {flag} {key}{order}`")]
    KeyIndexMissing {
        table: String,
        key: String,
        flag: &'static str,
        /// ` --order-by transaction` when that order's indexes are the missing ones.
        order: &'static str,
    },
    #[error("table {table} has no column dedup_id (schema version 3; an install of an older relay): run `outbox-relay migrate --table {table}` (with --adopt and the same --column flags for an adopted table); the older relays keep working meanwhile")]
    DedupColumnMissing { table: String },
    #[error("the lease table {claims} of {table} is missing (an install of an older relay): stop the older relays, then run `outbox-relay migrate --table {table}` (with --adopt for an adopted table)")]
    ClaimsTableMissing { table: String, claims: String },
    #[error("table {table} has no column {column:?} for {relay}: fix --column {relay}=COLUMN")]
    AdoptColumn {
        table: String,
        relay: String,
        column: String,
    },
    #[error("column {column:?} of {table} has a default of its own but allows NULLs: make it NOT NULL, or let migrate --adopt add a column of its own (--column id=NEW_NAME)")]
    AdoptSequence { table: String, column: String },
    #[error("table {table} is at schema version {found}, newer than this relay understands ({SCHEMA_VERSION}); upgrade the relay")]
    TooNew { table: String, found: i32 },
    /// The schema's contract cannot be read, or says something this build cannot read.
    #[error("{0}")]
    Contract(String),
    /// The schema does not let this relay claim: too old (run migrate), or its recorded relay
    /// versions exclude this one.
    #[error("{0}")]
    Refused(crate::version::Refusal),
    /// `migrate --contract` would exclude relays that may still be alive.
    #[error("migrate --contract on {table} would exclude relays that may still be alive: {blockers}; replace them with relays of {requirement} first (`outbox-relay status` lists the live ones), then run it again")]
    ContractBlocked {
        table: String,
        requirement: String,
        blockers: String,
    },
    /// `migrate --contract` on an adopted table: its view reads the lease columns.
    #[error("migrate --contract does not support an adopted table yet ({0} reads the lease columns): nothing was changed; the columns stay and cost nothing but their space")]
    ContractAdopted(String),
    /// A migration step kept finding its table locked by other transactions.
    #[error("migrate gave up {what} on {table}: the lock was not granted within {timeout} in {attempts} tries (a long transaction holds it; see pg_stat_activity); run migrate again later (it resumes where it stopped) or raise --lock-timeout")]
    MigrationLock {
        table: String,
        what: String,
        timeout: String,
        attempts: u32,
    },
    /// A claimed row without the relay's own fencing columns: the table (or the adopted view)
    /// is not the shape this relay reads, so no row of the claim can be settled.
    #[error("a claimed row's {column} cannot be read ({detail}): the table is not the shape this relay expects; run `outbox-relay check` with the same flags")]
    ClaimShape {
        column: &'static str,
        detail: String,
    },
    /// A statement template with a placeholder left unfilled: a bug, refused before any SQL runs.
    #[error("row-level security on {table} applies to the relay's role {role} and no policy lets it see and settle every row (policies: {policies}): the relay would not see the rows it hides, or send rows again that it cannot settle; give the role a policy (`CREATE POLICY outbox_relay ON {table} FOR ALL TO {role} USING (true) WITH CHECK (true)`, as sql/roles.sql does) or BYPASSRLS")]
    RowSecurity {
        table: String,
        role: String,
        policies: String,
    },
    #[error("table {0} is partitioned, which the relay does not serve (its claims and indexes need one table; `migrate` cannot build them online on a partitioned table): give the relay an unpartitioned outbox and keep it flat with the default delete-on-acknowledgement, or a --retention duration (docs/operations.md, \"Partitioned outbox tables\")")]
    Partitioned(String),
    #[error("the relay's settlements cannot run on {table}: {causes}; the relay deletes the rows SQS acknowledged (with --retention it updates them): drop the rule, or make it leave the relay's DELETE and UPDATE as they are")]
    SettlementRewritten { table: String, causes: String },
    #[error("internal error in the relay's SQL: {0}")]
    Template(String),
    #[error("{context}: {detail}")]
    Query {
        context: &'static str,
        /// The server's message and SQLSTATE, or the client-side cause; never the password.
        detail: String,
        #[source]
        source: tokio_postgres::Error,
    },
    /// A round trip that got no answer within `--db-timeout`: its connection was dropped (a
    /// connection gone dark answers nothing, ever) and the next round trip opens a new one.
    #[error("no answer from the database within {} ({what}; --db-timeout)", humantime::format_duration(*after))]
    Unanswered {
        what: &'static str,
        after: std::time::Duration,
    },
    /// A failure on the logical wake-up's replication connection.
    #[error("{context}: {detail}")]
    Replication {
        context: &'static str,
        /// The server's message and SQLSTATE, or what happened to the connection.
        detail: String,
        /// The server's SQLSTATE; `None` when the connection itself failed.
        code: Option<SqlState>,
    },
}

impl OutboxError {
    /// Will the same work likely succeed if retried after a pause? Connection trouble and the
    /// server's transient states are; anything else (a missing table, a permission, a bug)
    /// needs a person, so it is logged as an error while the relay keeps backing off.
    /// Whether a statement that failed so may still have taken effect on the server: no
    /// answer in time, or the connection lost while it ran (a COMMIT may have been processed).
    /// A statement the server answered with an error, or whose answer the relay could not
    /// read, did or did not, and is known.
    pub fn outcome_unknown(&self) -> bool {
        match self {
            OutboxError::Unanswered { .. } => true,
            OutboxError::Query { source, .. } => {
                source.is_closed()
                    || std::error::Error::source(source)
                        .is_some_and(|cause| cause.is::<std::io::Error>())
            }
            _ => false,
        }
    }

    /// Whether the server refused the statement because a rule rewrites it: PostgreSQL cannot
    /// run the relay's `UPDATE ... RETURNING` or `DELETE ... RETURNING` on a table with a
    /// `DO INSTEAD` rule that lacks a RETURNING clause, nor a data-modifying `WITH` whose table
    /// has a `DO INSTEAD NOTHING`, conditional or `DO ALSO` rule. A rule created while the relay
    /// runs does this to every settlement; no retry changes it. Told by the message, since the
    /// SQLSTATE (0A000, feature not supported) is also a standby's refusal of a read-write
    /// transaction, which a failover ends.
    pub fn rewritten_by_rule(&self) -> bool {
        match self {
            OutboxError::SettlementRewritten { .. } => true,
            OutboxError::Query { source, .. } => source.as_db_error().is_some_and(|e| {
                *e.code() == SqlState::FEATURE_NOT_SUPPORTED && is_rule_refusal(e.message())
            }),
            _ => false,
        }
    }

    pub fn is_transient(&self) -> bool {
        match self {
            OutboxError::Connect { .. } => true,
            OutboxError::Unanswered { .. } => true,
            OutboxError::Query { source, .. } => match source.code() {
                Some(code) => sqlstate_is_transient(code),
                // No SQLSTATE: the failure is on the connection, not in the statement.
                None => true,
            },
            OutboxError::Replication { code, .. } => match code {
                Some(code) => sqlstate_is_transient(code),
                None => true,
            },
            _ => false,
        }
    }
}

/// PostgreSQL's messages (src/backend/rewrite/rewriteHandler.c) for a statement a rule keeps
/// from running: `cannot perform UPDATE RETURNING on relation "outbox"`, `DO INSTEAD NOTHING
/// rules are not supported for data-modifying statements in WITH`, and the conditional, `DO
/// ALSO` and multi-statement variants of the latter. A server whose `lc_messages` translates
/// them is not told: its settlements are retried and warned about as before, until a new
/// connection of the relay meets the rule in the catalog (`SettlementRewritten`).
fn is_rule_refusal(message: &str) -> bool {
    (message.starts_with("cannot perform ") && message.contains(" RETURNING on relation "))
        || message.contains("rules are not supported for data-modifying statements in WITH")
}

/// Whether a failed connection attempt was the server refusing the relay's configuration
/// (wrong password or role, a missing database) or a TLS handshake that failed (a certificate
/// that does not verify), rather than a server that is not there yet.
pub(crate) fn connect_rejected(e: &tokio_postgres::Error) -> bool {
    const REJECTED: [SqlState; 3] = [
        SqlState::INVALID_PASSWORD,
        SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
        SqlState::INVALID_CATALOG_NAME,
    ];
    match e.code() {
        Some(code) => REJECTED.contains(code),
        // tokio-postgres says which step failed only in its text; the TLS step fails on the
        // certificate, which no retry changes.
        None => e.to_string().starts_with("error performing TLS handshake"),
    }
}

/// SQLSTATEs worth retrying as they are: connection exceptions (class 08), serialization
/// failure and deadlock, the server shutting down or starting, too many connections, lock and
/// statement timeouts, and running out of memory or disk, which an operator fixes without the
/// relay restarting.
pub fn sqlstate_is_transient(code: &SqlState) -> bool {
    const TRANSIENT: [SqlState; 10] = [
        SqlState::T_R_SERIALIZATION_FAILURE,
        SqlState::T_R_DEADLOCK_DETECTED,
        SqlState::ADMIN_SHUTDOWN,
        SqlState::CRASH_SHUTDOWN,
        SqlState::CANNOT_CONNECT_NOW,
        SqlState::TOO_MANY_CONNECTIONS,
        SqlState::LOCK_NOT_AVAILABLE,
        SqlState::QUERY_CANCELED,
        SqlState::DISK_FULL,
        SqlState::OUT_OF_MEMORY,
    ];
    // A class, not one state: every connection exception, those tokio-postgres names and not.
    code.code().starts_with("08") || TRANSIENT.contains(code)
}

pub(crate) fn query_err(
    context: &'static str,
) -> impl FnOnce(tokio_postgres::Error) -> OutboxError {
    move |source| OutboxError::Query {
        context,
        detail: describe(&source),
        source,
    }
}

/// tokio-postgres displays a server error as just "db error"; the useful part (message and
/// SQLSTATE) is in its source, and a client-side error's cause is further down the chain.
pub fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{} (SQLSTATE {})", db.message(), db.code().code());
    }
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// What a row of sql/row_security.sql says of `table`: the refusal when row-level security
/// applies to the role and no policy lets it see and settle every row.
pub(super) fn hidden_by_row_security(
    row: &tokio_postgres::Row,
    table: String,
) -> Option<OutboxError> {
    (row.get::<_, bool>(0) && !row.get::<_, bool>(1)).then(|| OutboxError::RowSecurity {
        table,
        policies: row.get(2),
        role: row.get(3),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rules_refusal_is_told_from_a_standbys_by_its_message() {
        for rule in [
            "cannot perform UPDATE RETURNING on relation \"outbox\"",
            "cannot perform DELETE RETURNING on relation \"outbox\"",
            "DO INSTEAD NOTHING rules are not supported for data-modifying statements in WITH",
            "conditional DO INSTEAD rules are not supported for data-modifying statements in WITH",
            "DO ALSO rules are not supported for data-modifying statements in WITH",
        ] {
            assert!(is_rule_refusal(rule), "{rule}");
        }
        // The same SQLSTATE from a standby, or a read-only transaction: not a rule.
        for other in [
            "cannot set transaction read-write mode during recovery",
            "cannot execute UPDATE in a read-only transaction",
        ] {
            assert!(!is_rule_refusal(other), "{other}");
        }
    }

    #[test]
    fn sqlstates_are_classified_transient_or_not() {
        for transient in [
            SqlState::CONNECTION_FAILURE,
            SqlState::SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION,
            // A connection exception tokio-postgres has no name for still counts.
            SqlState::from_code("08999"),
            SqlState::T_R_SERIALIZATION_FAILURE,
            SqlState::T_R_DEADLOCK_DETECTED,
            SqlState::ADMIN_SHUTDOWN,
            SqlState::CANNOT_CONNECT_NOW,
            SqlState::TOO_MANY_CONNECTIONS,
            SqlState::QUERY_CANCELED,
        ] {
            assert!(sqlstate_is_transient(&transient), "{transient:?}");
        }
        for fatal in [
            SqlState::UNDEFINED_TABLE,
            SqlState::INSUFFICIENT_PRIVILEGE,
            SqlState::UNDEFINED_COLUMN,
            SqlState::UNIQUE_VIOLATION,
            SqlState::INVALID_TEXT_REPRESENTATION,
            SqlState::INTERNAL_ERROR,
        ] {
            assert!(!sqlstate_is_transient(&fatal), "{fatal:?}");
        }
    }
}
