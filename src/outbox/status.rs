//! `outbox-relay status`: the table's backlog as an operator reads it.

use std::collections::BTreeMap;
use std::fmt;

use super::error::{query_err, OutboxError};
use super::order_by::{OrderBy, XACT_COLUMN};
use super::store::Outbox;
use super::template::{render, Value};

/// A snapshot of the outbox table. The JSON field names are part of the interface: scripts
/// and monitors read them.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TableStatus {
    /// The table (or adopted table's view) read, quoted as in SQL.
    pub table: String,
    /// Rows not sent yet: claimable, leased, and parked in quarantine (the
    /// `outbox_unsent_rows` gauge).
    pub unsent: i64,
    /// Unsent rows a relay holds a live lease on right now: being sent.
    pub leased: i64,
    /// Unsent rows the relay parked in quarantine (`blocked` behind a quarantined row of their
    /// group, `destination` while their queue refuses them): counted in `unsent` and in
    /// `quarantined` both, since they wait rather than being refused.
    pub parked: i64,
    /// Rows in quarantine, all reasons (the `outbox_quarantined_rows` gauge).
    pub quarantined: i64,
    /// Quarantined rows per reason (`too_large`, `invalid`, `sender_fault`, `rejected`,
    /// `max_attempts`, and the parked ones: `blocked`, `destination`).
    pub quarantined_by_reason: BTreeMap<String, i64>,
    /// now − created_at of the oldest unsent row, parked ones included; 0 when none (the
    /// alerting gauge).
    pub oldest_unsent_age_seconds: f64,
    /// now − quarantined_at of the row longest in quarantine; 0 when none
    /// (`outbox_oldest_quarantined_age_seconds`).
    pub oldest_quarantined_age_seconds: f64,
    /// Rows marked sent within the last minute: is anything moving?
    pub sent_last_minute: i64,
    /// Where the unsent rows were read from: the lowest floor the live relays published
    /// (sql/status_floors.sql), past what settled rows left in the index; 0, from the start.
    /// A row that committed below it since the relays' last sweep is not counted yet.
    pub unsent_counted_from_id: i64,
    /// A table migrated for `--order-by transaction`: unsent rows held back because a
    /// transaction older than theirs still runs (the claims' watermark), and now − created_at
    /// of the oldest of them (`outbox_order_watermark_age_seconds`). Absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_back: Option<HeldBack>,
    /// The live relays of the table (registered, lease not run out), newest version first.
    pub relays: Vec<super::registry::LiveRelay>,
    /// Signs of relays of before 0.2.0, which do not register: owners of live leases that are
    /// not registered, sessions named `outbox-relay`. What `migrate --contract` waits for.
    pub unregistered: Vec<String>,
    /// The table's triggers and rules, each with what it does to the relay; one that `undoes`
    /// can make the relay's settlements change nothing, and a relay that met it stopped
    /// claiming (its `claiming` is false, its metric `outbox_table_blocked` 1).
    pub triggers: Vec<super::inspect::TriggerFacts>,
    /// Row-level security hides rows from the role `status` ran as (the relay's, when run with
    /// its URL): the counts and ages above leave those rows out. Absent when it sees them all.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hidden: Option<String>,
}

/// One table of a `status` over several: its snapshot, or why it could not be read, so a
/// table dropped meanwhile or refused to the role is listed without hiding the others.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(untagged)]
pub enum TableReport {
    Read(TableStatus),
    /// The JSON object has the `table` field of a snapshot, and `error` in place of numbers.
    Failed {
        table: String,
        error: String,
    },
}

impl TableReport {
    pub fn failed(&self) -> bool {
        matches!(self, TableReport::Failed { .. })
    }
}

/// Orders tables worst first, as an operator triages them: a table that could not be read
/// first (its backlog is unknown, so it may be the worst), then the oldest unsent row, then
/// the most unsent rows, then the most quarantined; ties keep the selection's order.
pub fn worst_first(reports: &mut [TableReport]) {
    reports.sort_by(worse_first);
}

/// [`worst_first`]'s order of two tables (the console sorts its views by it).
pub fn worse_first(a: &TableReport, b: &TableReport) -> std::cmp::Ordering {
    use std::cmp::Reverse;
    match (a, b) {
        (TableReport::Failed { .. }, TableReport::Failed { .. }) => std::cmp::Ordering::Equal,
        (TableReport::Failed { .. }, TableReport::Read(_)) => std::cmp::Ordering::Less,
        (TableReport::Read(_), TableReport::Failed { .. }) => std::cmp::Ordering::Greater,
        (TableReport::Read(a), TableReport::Read(b)) => b
            .oldest_unsent_age_seconds
            .total_cmp(&a.oldest_unsent_age_seconds)
            .then_with(|| Reverse(a.unsent).cmp(&Reverse(b.unsent)))
            .then_with(|| Reverse(a.quarantined).cmp(&Reverse(b.quarantined))),
    }
}

impl fmt::Display for TableReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TableReport::Read(status) => status.fmt(f),
            TableReport::Failed { table, error } => writeln!(f, "{table}: {error}"),
        }
    }
}

/// Rows the transaction order's watermark holds back.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct HeldBack {
    pub rows: i64,
    pub oldest_age_seconds: f64,
}

impl Outbox {
    /// Reads the snapshot in one statement, so its numbers are consistent with each other.
    pub async fn status(&self) -> Result<TableStatus, OutboxError> {
        let client = self.raw_connect().await?;
        self.resolve_channel(&client).await?;
        let (unsent_floor, claims_floor) = self.published_floors(&client).await?;
        let row = client
            .query_one(&self.status_sql()?, &[&unsent_floor, &claims_floor])
            .await
            .map_err(query_err("reading the outbox status"))?;
        let held_back = self.held_back(&client, unsent_floor).await?;
        let (relays, unregistered) = self.registry_on(&client).await?;
        let triggers = self.triggers_on(&client).await?;
        let base = self.base_or_table().quoted();
        let hidden = client
            .query_opt(include_str!("../../sql/row_security.sql"), &[&base])
            .await
            .map_err(query_err("reading the table's row-level security"))?
            .and_then(|row| super::error::hidden_by_row_security(&row, base))
            .map(|refused| refused.to_string());
        let by_reason: serde_json::Value = row.get(4);
        let quarantined_by_reason: BTreeMap<String, i64> = by_reason
            .as_object()
            .into_iter()
            .flatten()
            .map(|(reason, n)| (reason.clone(), n.as_i64().unwrap_or_default()))
            .collect();
        Ok(TableStatus {
            table: self.table().quoted(),
            unsent: row.get(0),
            leased: row.get(1),
            parked: row.get(5),
            quarantined: quarantined_by_reason.values().sum(),
            quarantined_by_reason,
            oldest_unsent_age_seconds: row.get(2),
            oldest_quarantined_age_seconds: row.get(6),
            sent_last_minute: row.get(3),
            unsent_counted_from_id: unsent_floor,
            held_back,
            relays,
            unregistered,
            triggers,
            hidden,
        })
    }

    /// The statement of `status`'s numbers (sql/status.sql); its parameters are the unsent
    /// rows' floor and the claims' ([`Outbox::published_floors`]).
    pub fn status_sql(&self) -> Result<String, OutboxError> {
        render(
            include_str!("../../sql/status.sql"),
            &[
                ("table", Value::Table(self.table())),
                ("claims", Value::Table(&self.table().claims())),
            ],
        )
        .map_err(OutboxError::Template)
    }

    /// Where `status` reads the unsent index and the lease table from (sql/status_floors.sql):
    /// (0, 0) where the registry does not publish floors (schema version 4 and before).
    async fn published_floors(
        &self,
        client: &super::conn::Conn,
    ) -> Result<(i64, i64), OutboxError> {
        let relays = self.table().relays();
        if !self.has_column_in(client, &relays, "unsent_floor").await? {
            return Ok((0, 0));
        }
        let sql = render(
            include_str!("../../sql/status_floors.sql"),
            &[("relays", Value::Table(&relays))],
        )
        .map_err(OutboxError::Template)?;
        let row = client
            .query_one(&sql, &[])
            .await
            .map_err(query_err("reading the relays' published floors"))?;
        Ok((row.get(0), row.get(1)))
    }

    /// The watermark's hold-back, on a table that has the `xact_id` column.
    async fn held_back(
        &self,
        client: &super::conn::Conn,
        unsent_floor: i64,
    ) -> Result<Option<HeldBack>, OutboxError> {
        if !self.has_column(client, XACT_COLUMN).await? {
            return Ok(None);
        }
        let sql = render(
            include_str!("../../sql/status_held_back.sql"),
            &[
                ("table", Value::Table(self.table())),
                ("released", Value::Sql(&OrderBy::Transaction.released(None))),
            ],
        )
        .map_err(OutboxError::Template)?;
        let row = client
            .query_one(&sql, &[&unsent_floor])
            .await
            .map_err(query_err("reading the rows held back"))?;
        Ok(Some(HeldBack {
            rows: row.get(0),
            oldest_age_seconds: row.get(1),
        }))
    }
}

/// A small aligned table; the reasons are indented under `quarantined`.
impl fmt::Display for TableStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut lines: Vec<(String, String)> = vec![
            ("table".into(), self.table.clone()),
            ("unsent".into(), self.unsent.to_string()),
            ("  leased".into(), self.leased.to_string()),
            ("  parked in quarantine".into(), self.parked.to_string()),
            (
                "oldest unsent age".into(),
                format!("{:.1}s", self.oldest_unsent_age_seconds),
            ),
        ];
        if self.unsent_counted_from_id > 0 {
            lines.push((
                "  counted from id".into(),
                self.unsent_counted_from_id.to_string(),
            ));
        }
        lines.extend([
            (
                "sent in the last minute".into(),
                self.sent_last_minute.to_string(),
            ),
            ("quarantined".into(), self.quarantined.to_string()),
        ]);
        for (reason, n) in &self.quarantined_by_reason {
            lines.push((format!("  {reason}"), n.to_string()));
        }
        lines.push((
            "oldest quarantined age".into(),
            format!("{:.1}s", self.oldest_quarantined_age_seconds),
        ));
        if let Some(held) = &self.held_back {
            lines.push((
                "held back by an older transaction".into(),
                held.rows.to_string(),
            ));
            lines.push((
                "oldest held back age".into(),
                format!("{:.1}s", held.oldest_age_seconds),
            ));
        }
        let width = lines.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        let value_width = lines
            .iter()
            .skip(1)
            .map(|(_, v)| v.len())
            .max()
            .unwrap_or(0);
        for (i, (key, value)) in lines.iter().enumerate() {
            if i == 0 {
                writeln!(f, "{key:<width$}  {value}")?;
            } else {
                writeln!(f, "{key:<width$}  {value:>value_width$}")?;
            }
        }
        writeln!(f, "relays                   {}", self.relays.len())?;
        for r in &self.relays {
            let last = r
                .last_claim_seconds_ago
                .map_or_else(|| "never".to_string(), |s| format!("{s:.1}s ago"));
            writeln!(
                f,
                "  {}  {}  {}  {}  up {:.0}s  last claim {last}",
                r.relay_id,
                r.version,
                if r.claiming {
                    "claiming"
                } else {
                    "not claiming"
                },
                r.host,
                r.running_seconds
            )?;
        }
        for sign in &self.unregistered {
            writeln!(f, "  unregistered (a relay before 0.2.0?): {sign}")?;
        }
        if !self.triggers.is_empty() {
            writeln!(f, "triggers and rules       {}", self.triggers.len())?;
        }
        for t in &self.triggers {
            let mark = if t.undoes {
                "  (can undo settlements)"
            } else {
                ""
            };
            writeln!(f, "  {}: {}{mark}", t.what, t.effect)?;
        }
        if let Some(hidden) = &self.hidden {
            writeln!(
                f,
                "row-level security       hides rows from this role: the numbers above leave them out"
            )?;
            writeln!(f, "  {hidden}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backlog(table: &str, age: f64, unsent: i64, quarantined: i64) -> TableReport {
        TableReport::Read(TableStatus {
            table: table.into(),
            unsent,
            leased: 0,
            parked: 0,
            quarantined,
            quarantined_by_reason: BTreeMap::new(),
            oldest_unsent_age_seconds: age,
            oldest_quarantined_age_seconds: 0.0,
            sent_last_minute: 0,
            unsent_counted_from_id: 0,
            held_back: None,
            relays: vec![],
            unregistered: vec![],
            triggers: vec![],
            hidden: None,
        })
    }

    #[test]
    fn tables_are_listed_worst_first() {
        let mut reports = vec![
            backlog("idle", 0.0, 0, 0),
            backlog("few-old", 60.0, 1, 0),
            backlog("many-young", 5.0, 900, 0),
            TableReport::Failed {
                table: "dropped".into(),
                error: "relation does not exist".into(),
            },
            backlog("few-young", 5.0, 10, 0),
            backlog("few-young-quarantined", 5.0, 10, 3),
            backlog("idle-quarantined", 0.0, 0, 1),
        ];
        worst_first(&mut reports);
        let order: Vec<String> = reports
            .iter()
            .map(|r| match r {
                TableReport::Read(s) => s.table.clone(),
                TableReport::Failed { table, .. } => table.clone(),
            })
            .collect();
        assert_eq!(
            order,
            [
                "dropped",
                "few-old",
                "many-young",
                "few-young-quarantined",
                "few-young",
                "idle-quarantined",
                "idle"
            ]
        );
        let json = serde_json::to_value(&reports[0]).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"table": "dropped", "error": "relation does not exist"})
        );
        assert_eq!(reports[0].to_string(), "dropped: relation does not exist\n");
        assert_eq!(
            serde_json::to_value(&reports[1]).unwrap()["table"],
            "few-old",
            "a snapshot keeps its object as it was"
        );
    }

    #[test]
    fn the_text_form_aligns_keys_and_numbers() {
        let status = TableStatus {
            table: "\"outbox\"".into(),
            unsent: 1200,
            leased: 10,
            parked: 2,
            quarantined: 5,
            quarantined_by_reason: [
                ("blocked".to_string(), 2),
                ("invalid".to_string(), 1),
                ("max_attempts".to_string(), 2),
            ]
            .into_iter()
            .collect(),
            oldest_unsent_age_seconds: 12.34,
            oldest_quarantined_age_seconds: 3600.0,
            sent_last_minute: 56,
            unsent_counted_from_id: 4711,
            held_back: None,
            relays: vec![crate::outbox::registry::LiveRelay {
                relay_id: "relay-a".into(),
                version: "0.2.0".into(),
                host: "h1".into(),
                started_at: "2026-12-02 05:00:00+00".into(),
                running_seconds: 61.0,
                last_claim_seconds_ago: Some(0.25),
                claiming: true,
                unsent_floor: None,
                claims_floor: None,
            }],
            unregistered: vec!["lease owner 'old-1'".into()],
            triggers: vec![crate::outbox::inspect::TriggerFacts {
                what: "trigger keep_rows (BEFORE DELETE FOR EACH ROW, function keep_rows)".into(),
                effect: "can skip or change each row the relay settles".into(),
                undoes: true,
            }],
            hidden: Some("row-level security on \"outbox\" applies to ...".into()),
        };
        let text = status.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "table                    \"outbox\"");
        assert_eq!(lines[1], "unsent                      1200");
        assert_eq!(lines[2], "  leased                      10");
        assert_eq!(lines[3], "  parked in quarantine         2");
        assert_eq!(lines[4], "oldest unsent age          12.3s");
        assert_eq!(lines[5], "  counted from id           4711");
        assert_eq!(lines[8], "  blocked                      2");
        assert_eq!(lines[10], "  max_attempts                 2");
        assert_eq!(lines[11], "oldest quarantined age   3600.0s");
        assert_eq!(lines[12], "relays                   1");
        assert_eq!(
            lines[13],
            "  relay-a  0.2.0  claiming  h1  up 61s  last claim 0.2s ago"
        );
        assert_eq!(
            lines[14],
            "  unregistered (a relay before 0.2.0?): lease owner 'old-1'"
        );
        assert_eq!(lines[15], "triggers and rules       1");
        assert_eq!(
            lines[16],
            "  trigger keep_rows (BEFORE DELETE FOR EACH ROW, function keep_rows): can skip or change each row the relay settles  (can undo settlements)"
        );
        assert_eq!(
            lines[17],
            "row-level security       hides rows from this role: the numbers above leave them out"
        );
        assert_eq!(
            lines[18],
            "  row-level security on \"outbox\" applies to ..."
        );
        let json = serde_json::to_value(&status).unwrap();
        for field in [
            "table",
            "unsent",
            "leased",
            "parked",
            "quarantined",
            "quarantined_by_reason",
            "oldest_unsent_age_seconds",
            "unsent_counted_from_id",
            "oldest_quarantined_age_seconds",
            "sent_last_minute",
            "relays",
            "unregistered",
            "triggers",
            "hidden",
        ] {
            assert!(json.get(field).is_some(), "{field}");
        }
    }
}
