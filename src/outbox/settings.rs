//! The validated database settings an [`Outbox`](super::store::Outbox) is built from: where the
//! database is, which table, how to authenticate, whether a pooler sits between. The
//! configuration builds them (`config::DatabaseArgs::validate`); the outbox only reads them.

use std::fmt;
use std::time::Duration;

use super::columns::ColumnMap;
use super::ident::TableName;
use super::pooler::Pooler;
use crate::dbauth::PasswordSource;

/// A value that must never be printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(
    /// The value itself, for the one place that uses it (the connection string's parser).
    pub String,
);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Where the database is and which table to use.
#[derive(Debug, Clone)]
pub struct DatabaseConfig {
    /// The connection string, with the TLS file flags appended; it may carry a password.
    pub url: Secret,
    /// What the relay reads and updates: the table, or an adopted table's view.
    pub table: TableName,
    /// Every table the command serves (`--table`, `--tables`); `table` is its one table when
    /// it names one.
    pub selection: super::selection::Selection,
    /// The bound of one connection attempt, where the URL sets none.
    pub connect_timeout: Duration,
    /// With --column: the application's own table and where its columns are.
    pub adopted: Option<(TableName, ColumnMap)>,
    /// Where each new connection's password comes from.
    pub password: PasswordSource,
    /// Whether a pooler shares the server connections with other clients.
    pub pooler: Pooler,
}

/// How long a step waits for a lock that blocks writes, and how often it tries.
///
/// While an `ALTER TABLE` waits in the lock queue, every insert the application issues queues
/// behind it; `timeout` bounds that stall (per try), the tries and the pauses between them
/// bound how long `migrate` keeps trying before it says why it gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockPolicy {
    /// `lock_timeout` of the steps that take an ACCESS EXCLUSIVE lock.
    pub timeout: Duration,
    /// Tries per step before giving up.
    pub attempts: u32,
}

impl Default for LockPolicy {
    fn default() -> Self {
        LockPolicy {
            timeout: Duration::from_millis(100),
            attempts: 30,
        }
    }
}
