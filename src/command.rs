//! What the commands share: the outbox of one table, the tables of a selection, and why a
//! command could not do its work on one of them.

use crate::config::DatabaseConfig;
use crate::outbox::{Outbox, OutboxError, Purpose, TableName};

/// Why a command could not do its work on a table, kept as a value so that a command over
/// several tables can report it with the table and go on to the next; a command over one
/// exits with it (2 for `Config`, 1 otherwise).
#[derive(Debug)]
pub enum Failure {
    /// A setting that cannot work: exit 2.
    Config(String),
    /// Doing the work failed: exit 1.
    Runtime(String),
    /// The database is not there yet (refused, reset, starting up, too many clients, no
    /// answer): exit 1 for a one-shot command; `run` waits for it.
    Unavailable(String),
}

impl Failure {
    pub fn runtime(e: impl std::fmt::Display) -> Failure {
        Failure::Runtime(e.to_string())
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Config(message)
            | Failure::Runtime(message)
            | Failure::Unavailable(message) => f.write_str(message),
        }
    }
}

/// The outbox of `db`'s table: the files the settings name (password, CA, client
/// certificate and key) are read here, once, so an unusable one is a configuration error in
/// every command.
///
/// A `--table` without a schema is resolved once, on the role's search_path, and the outbox
/// built on the schema-qualified name: every connection then uses that one table, whatever
/// its own search_path. Where it cannot be resolved (no such table, no connection) the
/// command goes on with the name as given and says what is wrong where it first needs it; a
/// database it cannot reach, or a `--pooler` that cannot work there, ends it here.
pub async fn open(db: &DatabaseConfig, purpose: Purpose) -> Result<Outbox, Failure> {
    db.read_secrets().map_err(Failure::Config)?;
    let given =
        Outbox::from_config(db, purpose.clone()).map_err(|e| Failure::Config(e.to_string()))?;
    match given.resolve_table().await {
        Ok(Some(resolved)) => Outbox::from_config(&resolved.apply(db), purpose)
            .map(|outbox| outbox.pooler_as(&given))
            .map_err(|e| Failure::Config(e.to_string())),
        // What the command's own first connection would meet again, a connect timeout later.
        Err(e @ (OutboxError::Connect { .. } | OutboxError::Unanswered { .. })) => {
            Err(Failure::Unavailable(e.to_string()))
        }
        Err(e @ (OutboxError::Rejected { .. } | OutboxError::Pooler(_))) => {
            Err(Failure::runtime(e))
        }
        _ => Ok(given),
    }
}

/// The tables of a selection that is not a single table: the named ones and those its
/// patterns match now. A pattern that matches none is an error: a mistyped pattern would
/// otherwise do nothing and succeed.
pub async fn selected_tables(
    db: &DatabaseConfig,
    purpose: Purpose,
) -> Result<Vec<TableName>, Failure> {
    db.read_secrets().map_err(Failure::Config)?;
    let outbox = Outbox::from_config(db, purpose).map_err(|e| Failure::Config(e.to_string()))?;
    let tables = outbox
        .connector()
        .select(&db.selection)
        .await
        .map_err(Failure::runtime)?;
    match db.selection.unmatched(&tables).first() {
        Some(pattern) => Err(Failure::Runtime(format!(
            "--tables '{pattern}' matches no table"
        ))),
        None => Ok(tables),
    }
}
