//! What can go wrong talking to the outbox, and which failures are worth retrying.

use super::SCHEMA_VERSION;

#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    #[error("DATABASE_URL is not a valid PostgreSQL URL or key=value string: {0}")]
    InvalidUrl(String),
    #[error("cannot connect to PostgreSQL at {target}: {reason}")]
    Connect { target: String, reason: String },
    /// TLS settings that cannot work (verification without a CA, an unreadable CA file).
    #[error("{0}")]
    Tls(String),
    /// The chosen `--wakeup` cannot work against this database as it is.
    #[error("{0}")]
    Wakeup(String),
    #[error("table {0} does not exist: run `outbox-relay migrate` with the same --table, or fix --table")]
    TableMissing(String),
    #[error("the index for {key} is missing on {table}: run `outbox-relay migrate --table {table} {flag} {key}`")]
    KeyIndexMissing {
        table: String,
        key: String,
        flag: &'static str,
    },
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
    /// A failure on the logical-decoding doorbell's replication connection.
    #[error("{context}: {detail}")]
    Replication {
        context: &'static str,
        /// The server's message and SQLSTATE, or what happened to the connection.
        detail: String,
        /// The server's SQLSTATE; `None` when the connection itself failed.
        code: Option<String>,
    },
}

impl OutboxError {
    /// Will the same work likely succeed if retried after a pause? Connection trouble and the
    /// server's transient states are; anything else (a missing table, a permission, a bug)
    /// needs a person, so it is logged as an error while the relay keeps backing off.
    pub fn is_transient(&self) -> bool {
        match self {
            OutboxError::Connect { .. } => true,
            OutboxError::Unanswered { .. } => true,
            OutboxError::Query { source, .. } => match source.code() {
                Some(code) => sqlstate_is_transient(code.code()),
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

/// SQLSTATEs worth retrying as they are: connection exceptions (class 08), serialization
/// failure and deadlock (40001, 40P01), the server shutting down or starting (57P01–57P03),
/// too many connections (53300), lock and statement timeouts (55P03, 57014), and running out
/// of memory or disk (53100, 53200), which an operator fixes without the relay restarting.
pub fn sqlstate_is_transient(code: &str) -> bool {
    code.starts_with("08")
        || matches!(
            code,
            "40001"
                | "40P01"
                | "57P01"
                | "57P02"
                | "57P03"
                | "53300"
                | "55P03"
                | "57014"
                | "53100"
                | "53200"
        )
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlstates_are_classified_transient_or_not() {
        for transient in [
            "08006", "08001", "40001", "40P01", "57P01", "57P03", "53300", "57014",
        ] {
            assert!(sqlstate_is_transient(transient), "{transient}");
        }
        for fatal in ["42P01", "42501", "42703", "23505", "22P02", "XX000"] {
            assert!(!sqlstate_is_transient(fatal), "{fatal}");
        }
    }
}
