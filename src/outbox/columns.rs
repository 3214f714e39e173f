//! Where the standard columns live in an adopted table.

use super::ident::MAX_IDENTIFIER_BYTES;

/// Where the standard columns live in an adopted table (`--column NAME=COLUMN`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnMap {
    /// The relay's own sequence column, added by `migrate --adopt` (delivery order).
    pub id: String,
    pub event_id: String,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub event_type: String,
    pub payload: String,
    /// Absent: messages carry no header attributes.
    pub headers: Option<String>,
    /// Absent: every row goes to its route or the default queue.
    pub queue_url: Option<String>,
}

impl ColumnMap {
    /// `NAME=COLUMN` pairs over the defaults (the standard names, the sequence as
    /// `outbox_seq` since adopted tables usually have an `id` of their own); `headers=` and
    /// `queue_url=` with nothing after `=` mean the table has no such column.
    pub fn from_pairs(pairs: &[(String, String)]) -> Result<ColumnMap, String> {
        let mut map = ColumnMap {
            id: "outbox_seq".into(),
            event_id: "event_id".into(),
            aggregate_type: "aggregate_type".into(),
            aggregate_id: "aggregate_id".into(),
            event_type: "event_type".into(),
            payload: "payload".into(),
            headers: Some("headers".into()),
            queue_url: Some("queue_url".into()),
        };
        for (name, column) in pairs {
            if column.len() > MAX_IDENTIFIER_BYTES {
                return Err(format!(
                    "--column {name}={column}: longer than {MAX_IDENTIFIER_BYTES} bytes"
                ));
            }
            let required = |c: &String| {
                if c.is_empty() {
                    Err(format!("--column {name}= needs a column name"))
                } else {
                    Ok(c.clone())
                }
            };
            match name.as_str() {
                "id" => map.id = required(column)?,
                "event_id" => map.event_id = required(column)?,
                "aggregate_type" => map.aggregate_type = required(column)?,
                "aggregate_id" => map.aggregate_id = required(column)?,
                "event_type" => map.event_type = required(column)?,
                "payload" => map.payload = required(column)?,
                "headers" => map.headers = (!column.is_empty()).then(|| column.clone()),
                "queue_url" => map.queue_url = (!column.is_empty()).then(|| column.clone()),
                other => {
                    return Err(format!(
                        "--column {other}=...: unknown name; use id, event_id, aggregate_type, aggregate_id, event_type, payload, headers or queue_url"
                    ))
                }
            }
        }
        Ok(map)
    }
}
