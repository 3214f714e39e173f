//! The flags of `migrate`, `status` and `quarantine`, the commands that run once.

use std::time::{Duration, SystemTime};

use clap::Args;

use super::DatabaseArgs;
use crate::batch::KeyColumn;
use crate::outbox::{KeyIndex, OrderBy, ReplaySelection, Wakeup};

#[derive(Debug, Clone, Args)]
pub struct QuarantineListArgs {
    /// Where the database is and which table.
    #[command(flatten)]
    pub database: DatabaseArgs,

    /// Print JSON (one array) instead of a table.
    #[arg(long)]
    pub json: bool,

    /// Only rows quarantined for this reason (too_large, invalid, sender_fault, rejected, max_attempts, blocked, destination).
    #[arg(long)]
    pub reason: Option<String>,

    /// At most this many rows.
    #[arg(long, default_value_t = 100)]
    pub limit: i64,
}

#[derive(Debug, Clone, Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["id", "event_id", "all"])))]
pub struct QuarantineRetryArgs {
    /// Where the database is and which table.
    #[command(flatten)]
    pub database: DatabaseArgs,

    /// The row with this id.
    #[arg(long)]
    pub id: Option<i64>,

    /// The row with this event_id.
    #[arg(long)]
    pub event_id: Option<String>,

    /// Every quarantined row (narrow with --reason).
    #[arg(long)]
    pub all: bool,

    /// With --all: only rows quarantined for this reason.
    #[arg(long, requires = "all")]
    pub reason: Option<String>,

    /// With --all: only rows whose own queue_url is this one (`""`: rows without one).
    #[arg(long, requires = "all")]
    pub destination: Option<String>,

    /// Count the rows that would move and change nothing.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Clone, Args)]
pub struct ReplayArgs {
    /// Where the database is and which table.
    #[command(flatten)]
    pub database: DatabaseArgs,

    /// The sent row with this event_id (repeatable).
    #[arg(long = "event-id")]
    pub event_ids: Vec<String>,

    /// Rows created at or after this time: RFC 3339 (2026-12-01T10:00:00Z) or a duration ago (2h).
    #[arg(long, value_parser = parse_when)]
    pub since: Option<SystemTime>,

    /// Rows created before this time: RFC 3339 or a duration ago.
    #[arg(long, value_parser = parse_when)]
    pub until: Option<SystemTime>,

    /// Rows of this event_type (repeatable).
    #[arg(long = "event-type")]
    pub event_types: Vec<String>,

    /// At most this many rows, lowest ids first; run again for more.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(i64).range(1..))]
    pub limit: i64,

    /// Give each row a fresh FIFO deduplication ID instead of its event_id, so that a FIFO queue
    /// or topic does not drop the copy as a duplicate of one it accepted in the last 5 minutes.
    #[arg(long)]
    pub new_dedup_id: bool,

    /// Count what would be replayed and change nothing.
    #[arg(long)]
    pub dry_run: bool,
}

impl ReplayArgs {
    /// At least one selector: a replay of every kept row is asked for by a range, not by default.
    pub fn selection(&self) -> Result<ReplaySelection, String> {
        let list = |v: &Vec<String>| (!v.is_empty()).then(|| v.clone());
        if self.event_ids.is_empty()
            && self.event_types.is_empty()
            && self.since.is_none()
            && self.until.is_none()
        {
            return Err("replay needs a selection: --event-id, --event-type, --since or --until (e.g. --since 2h)".into());
        }
        Ok(ReplaySelection {
            event_ids: list(&self.event_ids),
            since: self.since,
            until: self.until,
            event_types: list(&self.event_types),
            limit: self.limit,
            new_dedup_id: self.new_dedup_id,
            dry_run: self.dry_run,
        })
    }
}

/// A point in time: RFC 3339 (a UTC `Z` or an offset-free time read as UTC), or a duration
/// before now.
pub fn parse_when(text: &str) -> Result<SystemTime, String> {
    if let Ok(at) = humantime::parse_rfc3339_weak(text) {
        return Ok(at);
    }
    match humantime::parse_duration(text) {
        Ok(ago) => SystemTime::now()
            .checked_sub(ago)
            .ok_or_else(|| format!("{text:?} reaches before 1970")),
        Err(_) => Err(format!(
            "{text:?} is not a time: use RFC 3339 (2026-12-01T10:00:00Z) or a duration ago (90m, 2h)"
        )),
    }
}

#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    /// Where the database is and which table.
    #[command(flatten)]
    pub database: DatabaseArgs,

    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Args)]
pub struct MigrateArgs {
    /// Where the database is and which table.
    #[command(flatten)]
    pub database: DatabaseArgs,

    /// Also create the group index for this --group-by key (aggregate_id always has one).
    #[arg(long, env = "OUTBOX_GROUP_BY")]
    pub group_by: Option<KeyColumn>,

    /// With `transaction`, also add what --order-by transaction needs: the xact_id column
    /// (catalog only, no rewrite) and the group key's indexes in that order.
    #[arg(long, env = "OUTBOX_ORDER_BY", default_value = "id")]
    pub order_by: OrderBy,

    /// Also create the index that --fair-by with this key needs.
    #[arg(long, env = "OUTBOX_FAIR_BY")]
    pub fair_by: Option<KeyColumn>,

    /// Adopt an existing outbox table (e.g. Debezium's): add only the relay's columns, indexes
    /// and a view; the application's columns are named with --column.
    #[arg(long)]
    pub adopt: bool,

    /// The wake-up the relays will use: `notify` installs the NOTIFY trigger, `logical` the
    /// publication; anything the chosen mode does not use is removed.
    #[arg(long, env = "OUTBOX_WAKEUP", default_value = "poll")]
    pub wakeup: Wakeup,

    /// Print the statements a run would execute and change nothing (no database needed, except
    /// that --adopt reads the table's columns when --database-url is given).
    #[arg(long)]
    pub print_sql: bool,

    /// How long a step may wait for a lock that blocks the application's writes (the
    /// application's inserts queue behind it meanwhile) before it tries again later.
    #[arg(long, env = "OUTBOX_LOCK_TIMEOUT", default_value = "100ms", value_parser = humantime::parse_duration)]
    pub lock_timeout: Duration,

    /// Removes what no supported relay reads any longer (the lease columns of schema version
    /// 1); refuses while a relay older than 0.2.0 may be alive. Run it after a rollout, once
    /// `status` lists no older relay.
    #[arg(long, conflicts_with_all = ["adopt", "print_sql"])]
    pub contract: bool,

    /// Tries per step before migrate gives up with an error (capped backoff with jitter between).
    #[arg(long, env = "OUTBOX_LOCK_ATTEMPTS", default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..))]
    pub lock_attempts: u32,
}

impl MigrateArgs {
    /// How migrate takes the locks that block writes.
    pub fn lock_policy(&self) -> Result<crate::outbox::LockPolicy, String> {
        if self.lock_timeout.is_zero() {
            return Err("--lock-timeout must be above zero: without it a waiting step blocks the application's writes for as long as it waits".into());
        }
        Ok(crate::outbox::LockPolicy {
            timeout: self.lock_timeout,
            attempts: self.lock_attempts,
        })
    }

    /// The keys whose (key, id) index `migrate` creates besides the default one.
    pub fn keys(&self) -> Vec<(KeyColumn, KeyIndex)> {
        // Ordered claims need both of the group key's indexes (see KeyIndex); transaction
        // order its own two, for the default key too.
        let transaction = (self.order_by == OrderBy::Transaction).then(|| {
            let key = self.group_by.clone().unwrap_or(KeyColumn::AggregateId);
            KeyIndex::for_groups(OrderBy::Transaction).map(|kind| (key.clone(), kind))
        });
        let order = self
            .group_by
            .iter()
            .flat_map(|k| KeyIndex::for_groups(OrderBy::Id).map(|kind| (k.clone(), kind)))
            .chain(transaction.into_iter().flatten());
        let fair = self.fair_by.iter().map(|k| (k.clone(), KeyIndex::Fair));
        order.chain(fair).collect()
    }
}
