//! Operators' commands on quarantined rows: list and re-drive.

use super::conn::Conn;
use super::error::{query_err, OutboxError};
use super::store::Outbox;
use super::template::{render, Value};

impl Outbox {
    /// Quarantined rows, oldest first.
    pub async fn quarantine_list(
        &self,
        reason: Option<&str>,
        limit: i64,
    ) -> Result<Vec<QuarantineEntry>, OutboxError> {
        let client = self.raw_connect().await?;
        self.resolve_channel(&client).await?;
        let rows = client
            .query(&self.statements().quarantine_list, &[&reason, &limit])
            .await
            .map_err(query_err("listing quarantined rows"))?;
        // The application's columns are what a quarantined row most often has wrong (NULL,
        // text that is not UTF-8): shown as absent rather than failing the listing of the very
        // rows it exists for. The relay's own columns are NOT NULL or coalesced.
        let app =
            |r: &tokio_postgres::Row, i: usize| r.try_get::<_, Option<String>>(i).ok().flatten();
        Ok(rows
            .iter()
            .map(|r| QuarantineEntry {
                id: r.get(0),
                event_id: app(r, 1),
                aggregate_type: app(r, 2),
                aggregate_id: app(r, 3),
                event_type: app(r, 4),
                reason: r.get(5),
                last_error: r.get(6),
                attempts: r.get(7),
                quarantined_at: r.get(8),
                created_at: r.get(9),
            })
            .collect())
    }

    /// Puts quarantined rows back to unsent (attempts reset, same event_id) and wakes the
    /// relays; returns how many rows moved.
    pub async fn quarantine_retry(&self, which: &RetrySelection) -> Result<Redriven, OutboxError> {
        let client = self.raw_connect().await?;
        let channel = self.resolve_channel(&client).await?;
        let (id, event_id, all, reason) = match which {
            RetrySelection::Id(id) => (Some(*id), None, false, None),
            RetrySelection::EventId(e) => (None, Some(e.as_str()), false, None),
            RetrySelection::All { reason } => (None, None, true, reason.as_deref()),
        };
        let rows = client
            .write_in_transaction(
                &self.statements().quarantine_retry,
                &[&id, &event_id, &all, &reason],
            )
            .await
            .map_err(query_err("re-driving quarantined rows"))?;
        let moved = Redriven {
            moved: rows.len() as u64,
            maybe_accepted: rows.iter().filter(|r| r.get::<_, bool>(1)).count() as u64,
        };
        if moved.moved > 0 {
            wake_relays(&client, &channel).await?;
        }
        Ok(moved)
    }
}

impl Outbox {
    /// `replay`: sent rows kept by `--retention` become unsent again (same event_id) and the
    /// relays are woken; with `dry_run` nothing changes and the answer says what would.
    pub async fn replay(&self, which: &ReplaySelection) -> Result<Replayed, OutboxError> {
        let client = self.raw_connect().await?;
        let channel = self.resolve_channel(&client).await?;
        let sql = render(
            include_str!("../../sql/replay.sql"),
            &[("table", Value::Table(self.table()))],
        )
        .map_err(OutboxError::Template)?;
        let row = client
            .write_one_in_transaction(
                &sql,
                &[
                    &which.event_ids,
                    &which.since,
                    &which.until,
                    &which.event_types,
                    &which.limit,
                    &which.new_dedup_id,
                    &which.dry_run,
                ],
            )
            .await
            .map_err(query_err("replaying sent rows"))?;
        let replayed = Replayed {
            selected: row.get(0),
            sent_within_dedup_window: row.get(1),
            first_id: row.get(2),
            last_id: row.get(3),
            replayed: row.get(4),
        };
        if replayed.replayed > 0 {
            wake_relays(&client, &channel).await?;
        }
        Ok(replayed)
    }
}

/// Wakes the relays waiting on `channel` (`--wakeup notify`) for rows a command just made
/// unsent; relays that poll find them by their next look.
async fn wake_relays(client: &Conn, channel: &str) -> Result<(), OutboxError> {
    client
        .execute_in_transaction("", "SELECT pg_notify($1, '')", &[&channel])
        .await
        .map_err(query_err("waking the relays"))?;
    Ok(())
}

/// Which sent rows `replay` sends again; `None` selects any.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReplaySelection {
    pub event_ids: Option<Vec<String>>,
    /// `created_at` at or after.
    pub since: Option<std::time::SystemTime>,
    /// `created_at` before.
    pub until: Option<std::time::SystemTime>,
    pub event_types: Option<Vec<String>>,
    pub limit: i64,
    /// A fresh FIFO deduplication ID per row instead of its event_id.
    pub new_dedup_id: bool,
    pub dry_run: bool,
}

/// What `replay` found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Replayed {
    pub selected: i64,
    /// Of the selected rows, those SQS accepted less than 5 minutes ago: a FIFO destination
    /// drops a copy with the same deduplication ID within that window.
    pub sent_within_dedup_window: i64,
    pub first_id: Option<i64>,
    pub last_id: Option<i64>,
    /// 0 on a dry run.
    pub replayed: i64,
}

/// What `quarantine retry` moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Redriven {
    pub moved: u64,
    /// Rows quarantined `max_attempts` less than 5 minutes ago: their claims ended without an
    /// outcome, so SQS may have accepted a copy within a FIFO destination's deduplication
    /// window, and the re-driven copy would be dropped as its duplicate.
    pub maybe_accepted: u64,
}

/// Which quarantined rows `quarantine retry` moves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RetrySelection {
    Id(i64),
    EventId(String),
    All { reason: Option<String> },
}

/// One quarantined row, as operators see it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct QuarantineEntry {
    pub id: i64,
    /// `None` where the row holds NULL or a value that cannot be read (reason `invalid`).
    pub event_id: Option<String>,
    pub aggregate_type: Option<String>,
    pub aggregate_id: Option<String>,
    pub event_type: Option<String>,
    pub reason: String,
    pub last_error: String,
    pub attempts: i32,
    pub quarantined_at: String,
    pub created_at: String,
}
