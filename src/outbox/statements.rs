//! The table's statements, rendered once from the files in `sql/` with its quoted name filled
//! in: what each claim strategy claims and parks with, each acknowledgement mode's settlement,
//! the gauges, the probe and the maintenance's statements. Pure: no connection is touched here.

use std::time::Duration;

use super::claim::{self, ClaimStrategy};
use super::error::OutboxError;
use super::ident::TableName;
use super::order_by::{OrderBy, XACT_COLUMN};
use super::settle::{Acknowledge, SettleSql};
use super::template::{fragment, render, Value};

/// The table's statements with its quoted name filled in; built once.
#[derive(Debug)]
pub(super) struct Statements {
    pub(super) claim: String,
    /// Ordered delivery with poison blocking: park and unpark rows behind quarantined heads.
    pub(super) park_blocked: Option<String>,
    pub(super) unpark_blocked: Option<String>,
    /// Claims of the table one at a time (sql/claim_lock.sql): what a claim's transaction and
    /// the maintenance's statements that must see every lease start with.
    pub(super) claim_lock: String,
    /// A claim's first statement: the lock, and whether a claim has ended
    /// (sql/claim_start.sql); under the claim's budget with a round-trip deadline
    /// ([`Statements::bounded`]).
    pub(super) claim_start: String,
    /// Claims that ended, taken over (sql/takeover.sql): run after a claim that found one.
    pub(super) takeover: String,
    /// Rows a claim refused, quarantined (sql/refuse.sql): run after a claim that refused one.
    pub(super) refuse: String,
    /// A claim's outcomes in one statement, acknowledged rows marked sent (sql/settle.sql).
    pub(super) settle_mark: SettleSql,
    /// The same, acknowledged rows deleted.
    pub(super) settle_delete: SettleSql,
    /// Which rows of a settlement whose claim is gone another claim holds.
    pub(super) lost_leases: String,
    /// Rows parked for their destination whose time has come become unsent again.
    pub(super) unpark_destination: String,
    pub(super) stats: String,
    pub(super) probe: String,
    /// The floors' safety net: an unsent row below the rows' floor (src/outbox/floors.rs).
    pub(super) sweep: String,
    /// A relay's claims that it gave up on and does not hold (sql/release_orphans.sql).
    pub(super) release_orphans: String,
    pub(super) delete_expired: String,
    pub(super) quarantine_list: String,
    pub(super) quarantine_retry: String,
    /// Rows parked for their destination, per destination (the console's overview).
    pub(super) parked_destinations: String,
    /// One row by id (the console's event page).
    pub(super) event: String,
}

impl Statements {
    /// `mode`'s settlement statements.
    pub(super) fn settle(&self, mode: Acknowledge) -> &SettleSql {
        match mode {
            Acknowledge::MarkSent => &self.settle_mark,
            Acknowledge::Delete => &self.settle_delete,
        }
    }

    /// The plain claim's statements for `table` (see [`Statements::claiming`]).
    pub(super) fn new(table: &TableName) -> Result<Statements, OutboxError> {
        let claims = table.claims();
        let fill = |template: &str| {
            render(
                template,
                &[
                    ("table", Value::Table(table)),
                    ("claims", Value::Table(&claims)),
                    ("claims_literal", Value::TableLiteral(&claims)),
                ],
            )
            .map_err(OutboxError::Template)
        };
        let claim_lock = fill(include_str!("../../sql/claim_lock.sql"))?;
        Ok(Statements {
            claim: ClaimStrategy::Plain
                .sql(table)
                .map_err(OutboxError::Template)?,
            park_blocked: None,
            unpark_blocked: None,
            claim_lock: claim_lock.clone(),
            claim_start: render(
                include_str!("../../sql/claim_start.sql"),
                &[
                    ("claims", Value::Table(&claims)),
                    ("claim_lock", Value::Sql(claim_lock.trim_end())),
                ],
            )
            .map_err(OutboxError::Template)?,
            takeover: fill(include_str!("../../sql/takeover.sql"))?,
            refuse: fill(include_str!("../../sql/refuse.sql"))?,
            settle_mark: SettleSql::render(table, Acknowledge::MarkSent)
                .map_err(OutboxError::Template)?,
            settle_delete: SettleSql::render(table, Acknowledge::Delete)
                .map_err(OutboxError::Template)?,
            lost_leases: fill(include_str!("../../sql/lost_leases.sql"))?,
            unpark_destination: fill(include_str!("../../sql/unpark_destination.sql"))?,
            stats: stats_sql(table, OrderBy::Id)?,
            probe: probe_sql(table, OrderBy::Id)?,
            sweep: fill(include_str!("../../sql/sweep.sql"))?,
            release_orphans: fill(include_str!("../../sql/release_orphans.sql"))?,
            delete_expired: fill(include_str!("../../sql/delete_expired.sql"))?,
            quarantine_list: fill(include_str!("../../sql/quarantine_list.sql"))?,
            quarantine_retry: fill(include_str!("../../sql/quarantine_retry.sql"))?,
            parked_destinations: fill(include_str!("../../sql/parked_destinations.sql"))?,
            event: fill(include_str!("../../sql/event.sql"))?,
        })
    }

    /// A claim's first statement with a round-trip deadline: the server's bounds for the lock
    /// wait and the claim together (sql/claim_deadline.sql), within [`claim_budget`].
    pub(super) fn bounded(
        &mut self,
        table: &TableName,
        deadline: Duration,
    ) -> Result<(), OutboxError> {
        let claims = table.claims();
        let budget_ms = claim_budget(deadline).as_millis().max(1).to_string();
        self.claim_start = render(
            include_str!("../../sql/claim_deadline.sql"),
            &[
                ("budget_ms", Value::Sql(&budget_ms)),
                ("claim_lock", Value::Sql(self.claim_lock.trim_end())),
                ("claims", Value::Table(&claims)),
            ],
        )
        .map_err(OutboxError::Template)?;
        Ok(())
    }

    /// The statements `strategy` claims, parks and reads the table with.
    pub(super) fn claiming(
        &mut self,
        table: &TableName,
        strategy: &ClaimStrategy,
    ) -> Result<(), OutboxError> {
        self.claim = strategy.sql(table).map_err(OutboxError::Template)?;
        let park = |template: &str, aliases| match strategy.ordered().filter(|o| !o.skip_poison) {
            Some(blocking) => claim::park_sql(table, blocking, template, aliases)
                .map(Some)
                .map_err(OutboxError::Template),
            None => Ok(None),
        };
        self.park_blocked = park(include_str!("../../sql/park_blocked.sql"), ["q", "o"])?;
        self.unpark_blocked = park(include_str!("../../sql/unpark_blocked.sql"), ["p", "o"])?;
        self.probe = probe_sql(table, strategy.order_by())?;
        self.stats = stats_sql(table, strategy.order_by())?;
        Ok(())
    }
}

/// The server's share of a claim's round-trip deadline: the lock wait and the claim statement
/// together end within it, or the claim rolls back. The rest is the margin for what the
/// server's clock does not see: the wait for the shared connection and for the requests ahead
/// of the claim on it, the COMMIT, and the answer's trip back (docs/failure-handling.md).
pub(super) fn claim_budget(deadline: Duration) -> Duration {
    deadline - deadline / 4
}

/// The idle relay's look for work (sql/probe.sql): rows an order holds back are not work yet.
/// Its parameters: the rows' floor, then the claims' (src/outbox/floors.rs).
fn probe_sql(table: &TableName, by: OrderBy) -> Result<String, OutboxError> {
    probe_sql_with(table, by, ("$1::bigint", "$2::bigint"))
}

/// The probe with the floors as the SQL `floors` gives: parameters of its own, or one table's
/// elements of the many-table look's arrays (sql/watch.sql).
pub(super) fn probe_sql_with(
    table: &TableName,
    by: OrderBy,
    (floor, claims_floor): (&str, &str),
) -> Result<String, OutboxError> {
    let claims = table.claims();
    render(
        include_str!("../../sql/probe.sql"),
        &[
            ("table", Value::Table(table)),
            ("claims", Value::Table(&claims)),
            ("released", Value::Sql(&by.released(None))),
            ("floor", Value::Sql(floor)),
            ("claims_floor", Value::Sql(claims_floor)),
        ],
    )
    .map_err(OutboxError::Template)
}

/// The gauges (sql/stats.sql); under transaction order also the first unsent rows the claims'
/// watermark holds back, and the age of the oldest of them.
fn stats_sql(table: &TableName, by: OrderBy) -> Result<String, OutboxError> {
    let (carried, watermark) = match by {
        OrderBy::Id => (String::new(), "0::bigint, 0::float8".to_string()),
        OrderBy::Transaction => (
            format!(", {XACT_COLUMN}"),
            render(
                &fragment(include_str!("../../sql/stats_held_back.sql")),
                &[("released", Value::Sql(&by.released(None)))],
            )
            .map_err(OutboxError::Template)?,
        ),
    };
    render(
        include_str!("../../sql/stats.sql"),
        &[
            ("table", Value::Table(table)),
            ("carried", Value::Sql(&carried)),
            ("watermark", Value::Sql(&watermark)),
        ],
    )
    .map_err(OutboxError::Template)
}
