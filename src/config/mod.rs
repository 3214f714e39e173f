//! Command line and environment -> validated configuration.
//!
//! Parsing is clap's; the rules live in pure `validate` functions that unit tests call without
//! I/O. Every error is one line that says what to change.
//!
//! - `database`: the database flags every command shares, and their validated form.
//! - `run`: `run`'s (and `check`'s) flags as groups, and [`RunConfig`], their validated form;
//!   the groups live in `delivery` (claim, send, retry), `maintenance` (gauges, retention)
//!   and `order` (order and routing, message format, offload).
//! - `admin`: the flags of `migrate`, `status` and `quarantine`.
//! - `console`: the flags of `console` and the rules that keep it closed by default.
//! - `parse`: value parsers for flags whose values clap does not know.
//!
//! Validation reads no file and opens no connection; what the settings name is read once at
//! start-up ([`DatabaseConfig::read_secrets`], and the TLS files when the outbox is built).

use clap::{Parser, Subcommand, ValueEnum};

mod admin;
mod console;
mod database;
mod delivery;
mod maintenance;
mod order;
mod parse;
mod run;
#[cfg(test)]
mod tests;

pub use admin::{
    parse_when, MigrateArgs, QuarantineListArgs, QuarantineRetryArgs, ReplayArgs, StatusArgs,
};
pub use console::{ConsoleArgs, ConsoleConfig};
pub use database::{DatabaseArgs, DatabaseConfig, Secret};
pub use delivery::{
    check_db_timeouts, check_lease, ClaimArgs, ClaimConfig, RetryArgs, RetryConfig, SendArgs,
    SendConfig, SQS_MAX_REQUEST_BYTES,
};
pub use maintenance::{
    MaintenanceArgs, MaintenanceConfig, Retention, MAX_MAINTENANCE_TIMEOUT, RETENTION_BATCH,
};
pub use order::{
    Format, FormatArgs, OffloadArgs, OffloadConfig, OnPoison, OrderArgs, OrderConfig, Switch,
};
pub use run::{DestinationArgs, DestinationConfig, RunArgs, RunConfig};

#[derive(Debug, Parser)]
#[command(
    name = "outbox-relay",
    version = crate::version::short_version(),
    long_version = crate::version::long_version(),
    about = "Relays a PostgreSQL transactional outbox to Amazon SQS, at least once, with leases"
)]
pub struct Cli {
    /// Log line format.
    #[arg(long, env = "OUTBOX_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create or upgrade the outbox table and its indexes, and set up the chosen --wakeup
    /// (idempotent).
    Migrate(MigrateArgs),
    /// Run the relay until SIGTERM/SIGINT.
    Run(Box<RunArgs>),
    /// Unsent, leased and quarantined rows, oldest unsent age, rows sent in the last minute.
    Status(StatusArgs),
    /// Check what `run` with the same flags needs: configuration, database, table shape,
    /// privileges and queues. Exits 0 only when every check passes.
    Check(Box<RunArgs>),
    /// Inspect and re-drive quarantined rows.
    #[command(subcommand)]
    Quarantine(QuarantineCommand),
    /// Send sent rows kept by --retention again, same event_id: by event id, time range or
    /// type; --dry-run counts first.
    Replay(ReplayArgs),
    /// Serve the operators' console: every table's backlog and why it does not move, the
    /// fleet, quarantined rows and, where turned on, retry and replay (docs/console.md).
    Console(Box<ConsoleArgs>),
}

#[derive(Debug, Subcommand)]
pub enum QuarantineCommand {
    /// List quarantined rows, oldest first, with reason, last error and attempts.
    List(QuarantineListArgs),
    /// Put quarantined rows back to unsent (attempts reset, same event_id); prints how many.
    Retry(QuarantineRetryArgs),
}
