//! The table's statements, rendered once from the files in `sql/` with its quoted name filled
//! in: what each claim strategy claims and parks with, each acknowledgement mode's settlement,
//! the gauges, the probe and the upkeep's statements. Pure: no connection is touched here.

use super::claim::{self, ClaimStrategy};
use super::error::OutboxError;
use super::ident::TableName;
use super::order_by::{OrderBy, XACT_COLUMN};
use super::template::{render, Value};

/// The table's statements with its quoted name filled in; built once.
#[derive(Debug)]
pub(super) struct Statements {
    pub(super) claim: String,
    /// Ordered delivery with poison blocking: park and unpark rows behind quarantined heads.
    pub(super) park_blocked: Option<String>,
    pub(super) unpark_blocked: Option<String>,
    /// Runs before every claim, in its transaction: claims of the table one at a time.
    pub(super) claim_lock: String,
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
}

/// One acknowledgement mode's settlement statements.
#[derive(Debug)]
pub(super) struct SettleSql {
    /// Every kind of outcome.
    pub(super) full: String,
    /// Every row acknowledged (the usual settlement): the same without the given-back and
    /// parked parts, a cheaper plan.
    pub(super) sent_only: String,
}

/// What becomes of a row its destination acknowledged. A mode, not a flag: each names its
/// statement and binds that statement's parameters, so the two cannot be paired wrongly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Acknowledge {
    /// mark_sent.sql: the row stays, with its message id, until retention deletes it.
    MarkSent,
    /// delete_sent.sql (`--delete-on-ack`): no history, but no bloat and the cheapest
    /// settlement.
    Delete,
}

impl Acknowledge {
    /// This mode's settlement statements among the table's.
    pub(super) fn sql(self, sql: &Statements) -> &SettleSql {
        match self {
            Acknowledge::MarkSent => &sql.settle_mark,
            Acknowledge::Delete => &sql.settle_delete,
        }
    }

    /// How many parameters [`Session::settle`] binds to this mode's statement, with or without
    /// the given-back and parked rows: the message ids of the rows marked sent come last.
    pub(super) fn param_count(self, others: bool) -> usize {
        let base = if others { 11 } else { 3 };
        match self {
            Acknowledge::MarkSent => base + 1,
            Acknowledge::Delete => base,
        }
    }

    /// What a failed settlement was doing, for its error.
    pub(super) fn context(self) -> &'static str {
        match self {
            Acknowledge::MarkSent => "recording outcomes (marking rows sent)",
            Acknowledge::Delete => "recording outcomes (deleting acknowledged rows)",
        }
    }
}

impl Statements {
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
        // The message ids of rows marked sent come last: $12 after the others' parameters, $4
        // without them.
        let settle = |acknowledge: &str| {
            let statement = |message_ids: &str, others: &str, (r, q): (&str, &str)| {
                let acknowledge = render(
                    acknowledge,
                    &[
                        ("table", Value::Table(table)),
                        ("message_ids", Value::Sql(message_ids)),
                    ],
                )?;
                render(
                    include_str!("../../sql/settle.sql"),
                    &[
                        ("table", Value::Table(table)),
                        ("claims", Value::Table(&claims)),
                        ("acknowledge", Value::Sql(&acknowledge)),
                        ("others", Value::Sql(others)),
                        ("rescheduled", Value::Sql(r)),
                        ("quarantined", Value::Sql(q)),
                    ],
                )
            };
            let others = format!(
                ",\n{}",
                render(
                    include_str!("../../sql/settle_others.sql"),
                    &[("table", Value::Table(table))]
                )
                .map_err(OutboxError::Template)?
                .trim_end()
            );
            let full = statement(
                "$12",
                &others,
                (
                    "ARRAY(SELECT id FROM rescheduled)",
                    "ARRAY(SELECT id FROM quarantined)",
                ),
            );
            let none = "'{}'::bigint[]";
            let sent_only = statement("$4", "", (none, none));
            Ok::<_, OutboxError>(SettleSql {
                full: full.map_err(OutboxError::Template)?,
                sent_only: sent_only.map_err(OutboxError::Template)?,
            })
        };
        Ok(Statements {
            claim: ClaimStrategy::Plain
                .sql(table)
                .map_err(OutboxError::Template)?,
            park_blocked: None,
            unpark_blocked: None,
            claim_lock: fill(include_str!("../../sql/claim_lock.sql"))?,
            settle_mark: settle(include_str!("../../sql/settle_mark.sql"))?,
            settle_delete: settle(include_str!("../../sql/settle_delete.sql"))?,
            lost_leases: fill(include_str!("../../sql/lost_leases.sql"))?,
            unpark_destination: fill(include_str!("../../sql/unpark_destination.sql"))?,
            stats: stats_sql(table, OrderBy::Id)?,
            probe: probe_sql(table, OrderBy::Id)?,
            sweep: fill(include_str!("../../sql/sweep.sql"))?,
            release_orphans: fill(include_str!("../../sql/release_orphans.sql"))?,
            delete_expired: fill(include_str!("../../sql/delete_expired.sql"))?,
            quarantine_list: fill(include_str!("../../sql/quarantine_list.sql"))?,
            quarantine_retry: fill(include_str!("../../sql/quarantine_retry.sql"))?,
        })
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
        OrderBy::Transaction => {
            let held = format!("FROM unsent_head WHERE NOT {}", by.released(None));
            (
                format!(", {XACT_COLUMN}"),
                format!(
                    "(SELECT count(*) {held}), \
                     coalesce(greatest(extract(epoch FROM now() - (SELECT min(created_at) {held})), 0)::float8, 0)"
                ),
            )
        }
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
