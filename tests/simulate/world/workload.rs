//! The writers: rows written as the plan says, poisoned where it says, in transactions kept
//! open where it says.

use super::*;

/// The payload and headers of a row, poisoned as its spec says.
pub(super) fn row_values(event_id: &str, poison: Option<Poison>) -> (String, String) {
    let pad = match poison {
        Some(Poison::Oversized) => "x".repeat(MAX_PAYLOAD_BYTES + 500),
        _ => "p".repeat(24),
    };
    let payload = format!(r#"{{"ev":"{event_id}","pad":"{pad}"}}"#);
    let headers = match poison {
        // A header named like an attribute the relay sets itself.
        Some(Poison::Invalid) => r#"{"event_id":"not-mine"}"#.to_string(),
        // Not a JSON object: the relay cannot read the row's headers.
        Some(Poison::Unreadable) => "[1]".to_string(),
        _ => format!(r#"{{"trace":"t-{event_id}"}}"#),
    };
    (payload, headers)
}

/// Writes `txns` in turn, spread over `spread` from `start` (all at once with a zero spread).
pub(super) async fn write(url: &str, txns: &[crate::plan::Txn], start: Instant, spread: Duration) {
    let deadline = start + spread + Duration::from_secs(60);
    let mut client = own_session_retrying(url, deadline).await;
    let pace = spread / txns.len().max(1) as u32;
    for (k, txn) in txns.iter().enumerate() {
        tokio::time::sleep_until((start + pace * k as u32).into()).await;
        if client.is_none() {
            client = own_session_retrying(url, deadline).await;
        }
        let Some(c) = client.as_mut() else { return };
        let attempt = async {
            let tx = c.transaction().await?;
            for row in &txn.rows {
                let (payload, headers) = row_values(&row.event_id, row.poison);
                tx.execute(
                    "INSERT INTO public.outbox (event_id, aggregate_type, aggregate_id, event_type, \
                     payload, headers) VALUES ($1, $2, $3, 'sim.event', $4::text::jsonb, $5::text::jsonb)",
                    &[&row.event_id, &row.aggregate_type, &row.aggregate_id, &payload, &headers],
                )
                .await?;
            }
            if txn.hold_ms > 0 {
                tokio::time::sleep(Duration::from_millis(txn.hold_ms)).await;
            }
            tx.commit().await
        };
        // A transaction cut by a database restart may or may not have committed: the trigger
        // log, not this writer, says which rows exist.
        if attempt.await.is_err() {
            client = None;
        }
    }
}
