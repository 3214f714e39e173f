//! The maintenance group of `run`'s flags: table gauges, retention of sent rows, and the
//! timeout of the statements that do them.

use std::time::Duration;

use clap::builder::BoolishValueParser;
use clap::Args;

use super::delivery::above_zero;
use super::parse::parse_retention;

/// Statistics and retention, on a connection of their own.
#[derive(Debug, Clone, Args)]
pub struct MaintenanceArgs {
    /// How often the table gauges (oldest unsent age, counts) are refreshed.
    #[arg(long, env = "OUTBOX_STATS_INTERVAL", default_value = "5s", value_parser = humantime::parse_duration)]
    pub stats_interval: Duration,

    /// How often the relay looks below its floor for rows that committed late with a low id (a
    /// long or prepared transaction, ids a session cached from a sequence): the longest such a
    /// row waits. The one look that reads the unsent index from its start, whose cost grows
    /// while the vacuum horizon is held; it runs at most 1 % of the time (docs/guarantees.md).
    #[arg(long, env = "OUTBOX_SWEEP_INTERVAL", default_value = "10s", value_parser = humantime::parse_duration)]
    pub sweep_interval: Duration,

    /// Longest a statistics or maintenance statement (gauges, retention deletes, unparking) may
    /// run: each runs on a connection of its own under this `statement_timeout`, so a large
    /// backlog never delays claims and settlements.
    #[arg(long, env = "OUTBOX_MAINTENANCE_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub maintenance_timeout: Duration,

    /// How long sent rows stay in the table: `0` deletes each row when SQS acknowledged it
    /// (nothing accumulates in the application's database), a duration keeps them that long
    /// (an audit trail, deleted in small batches), `off` keeps them forever.
    #[arg(long, env = "OUTBOX_RETENTION", default_value = "0", value_parser = parse_retention)]
    pub retention: Retention,

    /// How often the retention pass runs.
    #[arg(long, env = "OUTBOX_RETENTION_INTERVAL", default_value = "1m", value_parser = humantime::parse_duration)]
    pub retention_interval: Duration,

    /// The same as `--retention 0` (the default): delete rows as soon as SQS acknowledged them.
    // Boolean variables also take 1/0, yes/no, on/off: manifests write those as often.
    #[arg(long, env = "OUTBOX_DELETE_ON_ACK", value_parser = BoolishValueParser::new())]
    pub delete_on_ack: bool,
}

/// The maintenance group, validated.
#[derive(Debug, Clone)]
pub struct MaintenanceConfig {
    /// How often the table gauges are refreshed.
    pub stats_interval: Duration,
    /// How often the relay looks below its floor for rows that committed late.
    pub sweep_interval: Duration,
    /// `statement_timeout` of each statistics and maintenance statement.
    pub maintenance_timeout: Duration,
    /// How long sent rows are kept (`--delete-on-ack` folded in).
    pub retention: Retention,
    /// How often the retention pass runs.
    pub retention_interval: Duration,
}

/// How long sent rows are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retention {
    /// Deleted by the settlement itself, when SQS acknowledged them.
    OnAck,
    /// Marked sent, then deleted by the retention pass this long after sending.
    For(Duration),
    /// Marked sent and kept.
    Off,
}

impl Retention {
    /// Sent rows are deleted at settlement instead of being marked.
    pub fn deletes_on_ack(self) -> bool {
        self == Retention::OnAck
    }

    /// How long sent rows are kept, in seconds, where a pass deletes them.
    pub fn seconds(self) -> Option<f64> {
        match self {
            Retention::For(d) => Some(d.as_secs_f64()),
            Retention::OnAck | Retention::Off => None,
        }
    }
}

/// Rows deleted per retention statement: small enough that each DELETE holds its row locks
/// for milliseconds, large enough that a busy table keeps up.
pub const RETENTION_BATCH: i64 = 1000;

/// The longest `--maintenance-timeout`: a day, well inside PostgreSQL's limit (~24.8 days).
pub const MAX_MAINTENANCE_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

impl MaintenanceArgs {
    /// Intervals above zero, a timeout PostgreSQL can hold, and one retention.
    pub fn validate(&self) -> Result<MaintenanceConfig, String> {
        above_zero(&[
            ("--stats-interval", self.stats_interval),
            ("--sweep-interval", self.sweep_interval),
            ("--retention-interval", self.retention_interval),
            ("--maintenance-timeout", self.maintenance_timeout),
        ])?;
        // PostgreSQL's statement_timeout is a 32-bit count of milliseconds.
        if self.maintenance_timeout > MAX_MAINTENANCE_TIMEOUT {
            return Err(format!(
                "--maintenance-timeout {} is too long: use at most {}",
                humantime::format_duration(self.maintenance_timeout),
                humantime::format_duration(MAX_MAINTENANCE_TIMEOUT)
            ));
        }
        let retention = match (self.delete_on_ack, self.retention) {
            (false, retention) | (true, retention @ Retention::OnAck) => retention,
            (true, _) => {
                return Err("--delete-on-ack deletes rows when sent; it contradicts --retention: set one of them (--retention 0 is the same as --delete-on-ack)".to_string())
            }
        };
        Ok(MaintenanceConfig {
            stats_interval: self.stats_interval,
            sweep_interval: self.sweep_interval,
            maintenance_timeout: self.maintenance_timeout,
            retention,
            retention_interval: self.retention_interval,
        })
    }
}
