//! Operators' commands on quarantined rows: list and re-drive.

use super::{query_err, Outbox, OutboxError};

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
            .query(&self.sql.quarantine_list, &[&reason, &limit])
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
    pub async fn quarantine_retry(&self, which: &RetrySelection) -> Result<u64, OutboxError> {
        let mut client = self.raw_connect().await?;
        let channel = self.resolve_channel(&client).await?;
        let (id, event_id, all, reason) = match which {
            RetrySelection::Id(id) => (Some(*id), None, false, None),
            RetrySelection::EventId(e) => (None, Some(e.as_str()), false, None),
            RetrySelection::All { reason } => (None, None, true, reason.as_deref()),
        };
        let tx = client
            .transaction()
            .await
            .map_err(query_err("starting the re-drive"))?;
        let moved = tx
            .execute(&self.sql.quarantine_retry, &[&id, &event_id, &all, &reason])
            .await
            .map_err(query_err("re-driving quarantined rows"))?;
        if moved > 0 {
            // Delivered at commit, like the insert trigger's.
            tx.execute("SELECT pg_notify($1, '')", &[&channel])
                .await
                .map_err(query_err("waking the relays"))?;
        }
        tx.commit()
            .await
            .map_err(query_err("committing the re-drive"))?;
        Ok(moved)
    }
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
