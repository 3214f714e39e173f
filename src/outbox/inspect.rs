//! What `outbox-relay check` reads about the table: its columns and the connected role's
//! privileges, on it and on its lease table. Judging them is `check`'s; this module only asks the catalog.

use super::error::{query_err, OutboxError};
use super::store::Outbox;

/// How a column must be typed for the relay's statements to work on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnKind {
    /// `bigint` exactly: read into an i64.
    Bigint,
    /// `integer` exactly: read into an i32.
    Integer,
    /// Any string type (`text`, `varchar`, ...): read into a String.
    Text,
    /// `jsonb` or `json`.
    Json,
    /// `timestamp with time zone`: compared with now().
    Timestamptz,
}

impl ColumnKind {
    /// Does a column of this SQL type (as `format_type` writes it, with its `typcategory`)
    /// serve?
    pub fn accepts(self, sql_type: &str, category: &str) -> bool {
        match self {
            ColumnKind::Bigint => sql_type == "bigint",
            ColumnKind::Integer => sql_type == "integer",
            ColumnKind::Text => category == "S",
            ColumnKind::Json => matches!(sql_type, "jsonb" | "json"),
            ColumnKind::Timestamptz => sql_type == "timestamp with time zone",
        }
    }

    pub fn as_sql(self) -> &'static str {
        match self {
            ColumnKind::Bigint => "bigint",
            ColumnKind::Integer => "integer",
            ColumnKind::Text => "text",
            ColumnKind::Json => "jsonb",
            ColumnKind::Timestamptz => "timestamptz",
        }
    }
}

/// Every column of sql/migrate_v1.sql the relay reads, whether it updates it, and its kind. The
/// lease columns of schema version 1 are not among them: no relay since the lease table
/// (sql/claims.sql) reads them, and `migrate --contract` drops them.
pub const RELAY_COLUMNS: &[(&str, ColumnKind, bool)] = &[
    ("id", ColumnKind::Bigint, false),
    ("event_id", ColumnKind::Text, false),
    ("aggregate_type", ColumnKind::Text, false),
    ("aggregate_id", ColumnKind::Text, false),
    ("event_type", ColumnKind::Text, false),
    ("payload", ColumnKind::Json, false),
    ("headers", ColumnKind::Json, false),
    ("queue_url", ColumnKind::Text, false),
    ("created_at", ColumnKind::Timestamptz, false),
    ("available_at", ColumnKind::Timestamptz, true),
    ("attempts", ColumnKind::Integer, true),
    ("sent_at", ColumnKind::Timestamptz, true),
    ("message_id", ColumnKind::Text, true),
    ("quarantined_at", ColumnKind::Timestamptz, true),
    ("quarantine_reason", ColumnKind::Text, true),
    ("last_error", ColumnKind::Text, true),
    // Written by `replay`, an operator's command, never by the relay.
    ("dedup_id", ColumnKind::Text, false),
];

/// One column as the catalog describes it to the connected role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnFacts {
    pub name: String,
    /// As `format_type` writes it, e.g. `timestamp with time zone`.
    pub sql_type: String,
    /// `pg_type.typcategory`: `S` for every string type.
    pub category: String,
    pub can_select: bool,
    pub can_update: bool,
}

/// The table as the connected role sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableFacts {
    /// `current_user`: the role whose privileges these are.
    pub role: String,
    /// A superuser passes every privilege check, which hides what a real deployment lacks.
    pub superuser: bool,
    /// The role owns the table (or is a member of its owner), so it holds every privilege.
    pub owner: bool,
    pub schema_usage: bool,
    pub can_delete: bool,
    /// Table privileges the relay never uses (INSERT, TRUNCATE, ...).
    pub extra: Vec<String>,
    pub columns: Vec<ColumnFacts>,
    /// The relay's own tables beside it that exist, each with what the role lacks there.
    pub beside: Vec<BesideFacts>,
    /// The triggers and rules on the table (an adopted table's base table).
    pub triggers: Vec<TriggerFacts>,
}

/// A trigger or rule on the outbox, and what it can do to the relay (sql/inspect_triggers.sql).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TriggerFacts {
    /// What it is: `trigger audit (AFTER DELETE FOR EACH ROW, function audit_copy)`.
    pub what: String,
    /// What it does to the relay, in a phrase.
    pub effect: String,
    /// It can make the relay's settlements change nothing, or fail.
    pub undoes: bool,
}

/// One of the relay's own tables beside the outbox, as the connected role sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BesideFacts {
    /// What it is, for the message: `the lease table`.
    pub what: &'static str,
    /// Its quoted, possibly schema-qualified name, for the GRANT that fixes what is missing.
    pub name: String,
    /// The privileges the relay needs there that the role does not hold, in [`BESIDE`]'s order.
    pub lacking: Vec<String>,
}

/// The relay's tables beside the outbox, what each is, and what the relay does there: a claim
/// reads the lease table and inserts its row, a settlement or the next claim deletes it; each
/// relay registers in the registry and renews its row; the schema version table says which
/// relay versions may claim.
pub const BESIDE: [(&str, &[&str]); 3] = [
    ("the lease table", &["SELECT", "INSERT", "DELETE"]),
    (
        "the relay registry",
        &["SELECT", "INSERT", "UPDATE", "DELETE"],
    ),
    ("the schema version table", &["SELECT"]),
];

impl Outbox {
    /// Connects and reads the table's facts; `Ok(None)` when the table does not exist.
    pub async fn inspect(&self) -> Result<Option<TableFacts>, OutboxError> {
        let client = self.raw_connect().await?;
        let name = self.table().quoted();
        let Some(row) = client
            .query_opt(include_str!("../../sql/inspect_table.sql"), &[&name])
            .await
            .map_err(query_err(
                "looking up the outbox table and the role's privileges",
            ))?
        else {
            return Ok(None);
        };
        let columns = client
            .query(include_str!("../../sql/inspect_columns.sql"), &[&name])
            .await
            .map_err(query_err("reading the outbox table's columns"))?
            .iter()
            .map(|r| ColumnFacts {
                name: r.get(0),
                sql_type: r.get(1),
                category: r.get(2),
                can_select: r.get(3),
                can_update: r.get(4),
            })
            .collect();
        let mut beside = Vec::new();
        let names = [
            self.table().claims(),
            self.table().relays(),
            self.table().versions(),
        ];
        for ((what, needs), table) in BESIDE.iter().zip(names) {
            let name = table.quoted();
            let row = client
                .query_opt(
                    include_str!("../../sql/inspect_beside.sql"),
                    &[&name, needs],
                )
                .await
                .map_err(query_err(
                    "looking up the privileges on the relay's own tables",
                ))?;
            if let Some(row) = row {
                beside.push(BesideFacts {
                    what,
                    name,
                    lacking: row.get(0),
                });
            }
        }
        let triggers = self.triggers_on(&client).await?;
        Ok(Some(TableFacts {
            role: row.get(0),
            superuser: row.get(1),
            owner: row.get(2),
            schema_usage: row.get(3),
            can_delete: row.get(4),
            extra: row.get(5),
            columns,
            beside,
            triggers,
        }))
    }
}

impl Outbox {
    /// The triggers and rules on the table (an adopted table's base table), each with what it
    /// can do to the relay (sql/inspect_triggers.sql): for `check` and `status`.
    pub(super) async fn triggers_on(
        &self,
        client: &super::conn::Conn,
    ) -> Result<Vec<TriggerFacts>, OutboxError> {
        let base = self.base_or_table().quoted();
        Ok(client
            .query(include_str!("../../sql/inspect_triggers.sql"), &[&base])
            .await
            .map_err(query_err("reading the outbox table's triggers and rules"))?
            .iter()
            .map(|r| TriggerFacts {
                what: r.get(0),
                effect: r.get(1),
                undoes: r.get(2),
            })
            .collect())
    }
}

/// A setting a database, a role or the URL's `options` can impose on the relay's sessions, as
/// a new connection of the relay's role gets it, before the relay sets anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImposedSetting {
    pub name: String,
    /// `current_setting(name)`: the value with its unit.
    pub value: String,
    /// `pg_settings.source`: `default`, `configuration file`, `database`, `user`, `client`...
    pub source: String,
}

/// The settings the relay relies on or is exposed to (issue 26, item 2), in `check`'s order.
pub const IMPOSED_SETTINGS: [&str; 13] = [
    "default_transaction_isolation",
    "default_transaction_read_only",
    "statement_timeout",
    "lock_timeout",
    "idle_in_transaction_session_timeout",
    "search_path",
    "TimeZone",
    "DateStyle",
    "IntervalStyle",
    "extra_float_digits",
    "bytea_output",
    "session_replication_role",
    "client_encoding",
];

impl Outbox {
    /// The server's values of [`IMPOSED_SETTINGS`] for the relay's role, on a connection of
    /// their own on which nothing was set, read with the simple protocol (no statement stays
    /// behind on a pooled server connection).
    pub async fn imposed_settings(&self) -> Result<Vec<ImposedSetting>, OutboxError> {
        let (client, connection) = self.connector().open().await?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        // The names are the relay's own constants, not input: quoted as literals all the same.
        let names = IMPOSED_SETTINGS
            .iter()
            .map(|n| format!("'{n}'"))
            .collect::<Vec<_>>()
            .join(", ");
        let sql = format!(
            "SELECT name, current_setting(name), source FROM pg_settings \
             WHERE name IN ({names}) ORDER BY array_position(ARRAY[{names}], name)"
        );
        let messages = client
            .simple_query(&sql)
            .await
            .map_err(query_err("reading the session's settings"))?;
        Ok(messages
            .iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(row) => Some(ImposedSetting {
                    name: row.get(0).unwrap_or_default().to_string(),
                    value: row.get(1).unwrap_or_default().to_string(),
                    source: row.get(2).unwrap_or_default().to_string(),
                }),
                _ => None,
            })
            .collect())
    }
}
