//! Operators' commands on quarantined rows: list and re-drive.

use super::conn::Conn;
use super::error::{query_err, OutboxError};
use super::store::Outbox;
use super::template::{render, Value};

impl Outbox {
    /// Quarantined rows, oldest first, of a reason and a destination where given, after id
    /// `after` (0: from the first).
    pub async fn quarantine_list(
        &self,
        reason: Option<&str>,
        destination: Option<&str>,
        after: i64,
        limit: i64,
    ) -> Result<Vec<QuarantineEntry>, OutboxError> {
        let client = self.raw_connect().await?;
        self.resolve_channel(&client).await?;
        let rows = client
            .query(
                &self.statements().quarantine_list,
                &[&reason, &limit, &after, &destination],
            )
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
                destination: r.get(10),
            })
            .collect())
    }

    /// Rows parked for their destination, per destination, the most first; at most `limit`.
    pub async fn parked_destinations(
        &self,
        limit: i64,
    ) -> Result<Vec<ParkedDestination>, OutboxError> {
        let client = self.raw_connect().await?;
        self.resolve_channel(&client).await?;
        let rows = client
            .query(&self.statements().parked_destinations, &[&limit])
            .await
            .map_err(query_err("reading the parked destinations"))?;
        Ok(rows
            .iter()
            .map(|r| ParkedDestination {
                destination: r.get(0),
                rows: r.get(1),
                oldest_age_seconds: r.get(2),
                last_error: r.get::<_, Option<String>>(3).unwrap_or_default(),
            })
            .collect())
    }

    /// One row by id, its payload only `with_payload`; `None` when there is no such row.
    pub async fn event(
        &self,
        id: i64,
        with_payload: bool,
    ) -> Result<Option<EventDetail>, OutboxError> {
        let client = self.raw_connect().await?;
        self.resolve_channel(&client).await?;
        let row = client
            .query_opt(&self.statements().event, &[&id, &with_payload])
            .await
            .map_err(query_err("reading an event"))?;
        let text = |r: &tokio_postgres::Row, i: usize| r.get::<_, Option<String>>(i);
        Ok(row.map(|r| EventDetail {
            id: r.get(0),
            event_id: text(&r, 1),
            aggregate_type: text(&r, 2),
            aggregate_id: text(&r, 3),
            event_type: text(&r, 4),
            headers: text(&r, 5),
            payload_bytes: r.get::<_, Option<i32>>(6).map(i64::from),
            destination: r.get(7),
            created_at: r.get(8),
            available_at: r.get(9),
            attempts: r.get(10),
            sent_at: text(&r, 11),
            quarantined_at: text(&r, 12),
            quarantine_reason: text(&r, 13),
            last_error: text(&r, 14),
            payload: text(&r, 15),
        }))
    }

    /// Puts quarantined rows back to unsent (attempts reset, same event_id) and wakes the
    /// relays; with `dry_run` only counts them. The one re-drive of the CLI and the console.
    pub async fn quarantine_retry(
        &self,
        which: &RetrySelection,
        dry_run: bool,
    ) -> Result<Redriven, OutboxError> {
        let client = self.raw_connect().await?;
        let channel = self.resolve_channel(&client).await?;
        let (ids, event_id, all): (Option<&[i64]>, Option<&str>, bool) = match &which.rows {
            RetryRows::Ids(ids) => (Some(ids), None, false),
            RetryRows::EventId(e) => (None, Some(e.as_str()), false),
            RetryRows::All => (None, None, true),
        };
        let row = client
            .write_one_in_transaction(
                &self.statements().quarantine_retry,
                &[
                    &ids,
                    &event_id,
                    &all,
                    &which.reason,
                    &which.destination,
                    &dry_run,
                ],
            )
            .await
            .map_err(query_err("re-driving quarantined rows"))?;
        let count = |i: usize| row.get::<_, i64>(i) as u64;
        let redriven = Redriven {
            selected: count(0),
            maybe_accepted: count(1),
            moved: count(2),
        };
        if redriven.moved > 0 {
            wake_relays(&client, &channel).await?;
        }
        Ok(redriven)
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

/// What `quarantine retry` selected and moved (none on a dry run).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Redriven {
    pub selected: u64,
    pub moved: u64,
    /// Rows quarantined `max_attempts` less than 5 minutes ago: their claims ended without an
    /// outcome, so SQS may have accepted a copy within a FIFO destination's deduplication
    /// window, and the re-driven copy would be dropped as its duplicate.
    pub maybe_accepted: u64,
}

/// Which quarantined rows `quarantine retry` moves: some rows, narrowed to a reason and a
/// destination where given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetrySelection {
    pub rows: RetryRows,
    pub reason: Option<String>,
    /// A row's own `queue_url`; `""`: the rows without one (the relays' --queue-url or route).
    pub destination: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RetryRows {
    Ids(Vec<i64>),
    EventId(String),
    All,
}

impl RetrySelection {
    /// The rows given, whatever their reason and destination.
    pub fn rows(rows: RetryRows) -> RetrySelection {
        RetrySelection {
            rows,
            reason: None,
            destination: None,
        }
    }
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
    /// Its own `queue_url`; empty: where the relays' --queue-url and routes send it.
    pub destination: String,
}

/// Rows parked while one destination refuses them.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ParkedDestination {
    /// A row's own `queue_url`; empty: the relays' --queue-url or a route.
    pub destination: String,
    pub rows: i64,
    /// now − created_at of the oldest of them.
    pub oldest_age_seconds: f64,
    /// What the destination answered (one of the rows' last errors).
    pub last_error: String,
}

/// One row, every column an operator asks about; the payload only where asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct EventDetail {
    pub id: i64,
    pub event_id: Option<String>,
    pub aggregate_type: Option<String>,
    pub aggregate_id: Option<String>,
    pub event_type: Option<String>,
    pub headers: Option<String>,
    pub payload_bytes: Option<i64>,
    /// Its own `queue_url`; empty: the relays' --queue-url or a route.
    pub destination: String,
    pub created_at: String,
    pub available_at: String,
    pub attempts: i32,
    pub sent_at: Option<String>,
    pub quarantined_at: Option<String>,
    pub quarantine_reason: Option<String>,
    pub last_error: Option<String>,
    pub payload: Option<String>,
}
