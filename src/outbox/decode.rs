//! Reading one claimed row without trusting the application's columns.
//!
//! Whatever the application wrote, reading it must not stop the relay: an adopted table's
//! payload may be NULL (Debezium's tombstones), a `SQL_ASCII` database may hold text that is
//! not UTF-8, headers may not be a JSON object. Such a row comes back with what could be read
//! and an [`Unreadable`] naming what could not: the planner quarantines it as `invalid` in its
//! place in its group, like any row it refuses, while the rest of its claim flows. Only the relay's
//! own `id` and `lease_token` failing fails the claim: without them the row cannot even be
//! quarantined, and it means the table is not the shape this relay was built for.

use tokio_postgres::types::FromSql;
use tokio_postgres::Row;

use super::claim::ClaimLimits;
use super::error::OutboxError;
use crate::destination::Destination;
use crate::row::{ClaimedRow, QuarantineReason, QuarantinedAtClaim, Unreadable};

/// Positions in the RETURNING list of sql/claim.sql.
const ID: usize = 0;
const EVENT_ID: usize = 1;
const AGGREGATE_TYPE: usize = 2;
const AGGREGATE_ID: usize = 3;
const EVENT_TYPE: usize = 4;
const PAYLOAD: usize = 5;
const HEADERS: usize = 6;
const QUEUE_URL: usize = 7;
const LEASE_TOKEN: usize = 8;
const ATTEMPTS: usize = 9;
const CREATED_AT_EPOCH: usize = 10;
const CREATED_AT: usize = 11;
/// Why the claim quarantined the row instead of leasing it; NULL for a leased row.
const REFUSAL: usize = 12;
/// The payload's size as the claim measured it: what a refused row's error names.
const BYTES: usize = 13;
/// The deduplication ID a replay gave the row; NULL: its event_id.
const DEDUP_ID: usize = 14;
/// The row's place in its group's order among the claim's rows (`--order-by`).
pub(super) const TURN: usize = 15;
/// The lowest live claim's token, for the claims' floor (src/outbox/floors.rs).
pub(super) const LIVE_FROM: usize = 16;
/// The lowest unsent id from the rows' floor on, for that floor (src/outbox/floors.rs).
pub(super) const LOWEST_UNSENT: usize = 17;
/// Full ordered claims: where the next claim's search for groups continues.
pub(super) const CURSOR: usize = 18;

/// One row of a claim.
pub(super) enum Decoded {
    /// Leased; possibly with columns the relay cannot use ([`ClaimedRow::unreadable`]).
    Row(Box<ClaimedRow>),
    /// Quarantined by the claim itself; its payload was not read.
    Quarantined(QuarantinedAtClaim),
}

/// One row of a claim: leased (with the columns that failed, if any), or quarantined by the
/// claim.
pub(super) fn decode(row: &Row, limits: &ClaimLimits) -> Result<Decoded, OutboxError> {
    let fenced = |index: usize, column: &'static str| {
        required::<i64>(row, index, column)
            .map_err(|detail| OutboxError::ClaimShape { column, detail })
    };
    let id = fenced(ID, "id")?;
    let lease_token = fenced(LEASE_TOKEN, "lease_token")?;
    let refusal: Option<String> =
        optional(row, REFUSAL, "refusal").map_err(|detail| OutboxError::ClaimShape {
            column: "refusal",
            detail,
        })?;
    if let Some(refusal) = refusal {
        let reason = match refusal.as_str() {
            "too_large" => QuarantineReason::TooLarge,
            _ => QuarantineReason::MaxAttempts,
        };
        let bytes: i64 = optional(row, BYTES, "bytes").ok().flatten().unwrap_or(0);
        let attempts: i32 = optional(row, ATTEMPTS, "attempts")
            .ok()
            .flatten()
            .unwrap_or(0);
        return Ok(Decoded::Quarantined(QuarantinedAtClaim {
            id,
            event_id: optional(row, EVENT_ID, "event_id").ok().flatten(),
            reason,
            error: limits.refusal_error(reason, bytes, attempts),
        }));
    }
    Ok(Decoded::Row(Box::new(read(row, id, lease_token))))
}

/// Everything but the fencing columns, each on its own: a column that fails is left empty and
/// recorded, and the first one that fails names the error.
fn read(row: &Row, id: i64, lease_token: i64) -> ClaimedRow {
    let mut failed = Failed::default();
    let claimed = ClaimedRow {
        id,
        event_id: failed.value("event_id", required(row, EVENT_ID, "event_id")),
        aggregate_type: failed.value(
            "aggregate_type",
            required(row, AGGREGATE_TYPE, "aggregate_type"),
        ),
        aggregate_id: failed.value("aggregate_id", required(row, AGGREGATE_ID, "aggregate_id")),
        event_type: failed.value("event_type", required(row, EVENT_TYPE, "event_type")),
        payload: failed.value("payload", required(row, PAYLOAD, "payload")),
        // Unread, `null`: no header, no traceparent, nothing that could be sent.
        headers: failed.value(
            "headers",
            optional(row, HEADERS, "headers").and_then(headers),
        ),
        // Parsed once, here: an empty text names no destination (the route or default applies).
        queue_url: failed
            .value("queue_url", optional::<String>(row, QUEUE_URL, "queue_url"))
            .filter(|url| !url.is_empty())
            .map(|url| Destination::of_row(&url)),
        lease_token,
        attempts: failed.value("attempts", required(row, ATTEMPTS, "attempts")),
        created_at_epoch: failed.value("created_at", required(row, CREATED_AT_EPOCH, "created_at")),
        created_at: failed.value("created_at", required(row, CREATED_AT, "created_at")),
        unreadable: None,
        dedup_id: failed.value("dedup_id", optional::<String>(row, DEDUP_ID, "dedup_id")),
    };
    ClaimedRow {
        unreadable: failed.into_unreadable(),
        ..claimed
    }
}

/// The columns of one row that failed, in reading order.
#[derive(Default)]
struct Failed {
    /// The first failure's message: the one `last_error` gets.
    first: Option<String>,
    /// Every column that failed.
    columns: Vec<&'static str>,
}

impl Failed {
    /// The column's value, or its type's empty value with the failure recorded.
    fn value<T: Default>(&mut self, column: &'static str, read: Result<T, String>) -> T {
        read.unwrap_or_else(|error| {
            self.first.get_or_insert(error);
            if !self.columns.contains(&column) {
                self.columns.push(column);
            }
            T::default()
        })
    }

    fn into_unreadable(self) -> Option<Unreadable> {
        self.first.map(|error| Unreadable {
            error,
            columns: self.columns,
        })
    }
}

/// A column the relay needs a value in.
fn required<'a, T: FromSql<'a>>(row: &'a Row, index: usize, column: &str) -> Result<T, String> {
    optional(row, index, column)?
        .ok_or_else(|| format!("column \"{column}\" is NULL; the relay needs a value there"))
}

fn optional<'a, T: FromSql<'a>>(
    row: &'a Row,
    index: usize,
    column: &str,
) -> Result<Option<T>, String> {
    row.try_get(index).map_err(|e| {
        // The driver's own text only gives the column's position; its cause says what failed
        // (a type mismatch, text that is not UTF-8), without quoting the value.
        let cause = std::error::Error::source(&e).map_or_else(|| e.to_string(), |c| c.to_string());
        format!("column \"{column}\" cannot be read: {cause}")
    })
}

/// Headers are a JSON object; NULL means none. An adopted text column's value that is not JSON
/// reaches the relay as a JSON string (see sql/adopt_try_jsonb.sql), so it lands here too.
fn headers(value: Option<serde_json::Value>) -> Result<serde_json::Value, String> {
    use serde_json::Value;
    let found = match value {
        None | Some(Value::Null) => return Ok(Value::Object(serde_json::Map::new())),
        Some(Value::Object(map)) => return Ok(Value::Object(map)),
        Some(Value::String(_)) => "a string (text that is not JSON reads as one)",
        Some(Value::Array(_)) => "an array",
        Some(Value::Number(_)) => "a number",
        Some(Value::Bool(_)) => "a boolean",
    };
    Err(format!(
        "column \"headers\" is not a JSON object but {found}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_failed_column_is_recorded_and_the_first_names_the_error() {
        let mut failed = Failed::default();
        let id: String = failed.value("event_id", Ok("e-1".to_string()));
        let payload: String = failed.value("payload", Err("column \"payload\" is NULL".into()));
        let headers: serde_json::Value = failed.value("headers", headers(Some(json!([1]))));
        assert_eq!((id.as_str(), payload.as_str()), ("e-1", ""));
        assert_eq!(headers, json!(null), "unread headers carry no header");
        let unreadable = failed.into_unreadable().unwrap();
        assert_eq!(unreadable.columns, ["payload", "headers"]);
        assert!(unreadable.error.starts_with("column \"payload\" is NULL"));
        assert!(Failed::default().into_unreadable().is_none());
    }

    #[test]
    fn headers_must_be_an_object_and_null_means_none() {
        assert_eq!(headers(None).unwrap(), json!({}));
        assert_eq!(headers(Some(json!(null))).unwrap(), json!({}));
        assert_eq!(
            headers(Some(json!({"traceparent": "00-1-2-01"}))).unwrap(),
            json!({"traceparent": "00-1-2-01"})
        );
        for (value, found) in [
            (json!("{not json"), "a string"),
            (json!([1]), "an array"),
            (json!(7), "a number"),
            (json!(true), "a boolean"),
        ] {
            let error = headers(Some(value.clone())).unwrap_err();
            assert!(
                error.starts_with("column \"headers\" is not a JSON object but ")
                    && error.contains(found),
                "{value}: {error}"
            );
        }
    }
}
