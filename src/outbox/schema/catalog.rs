//! What the catalog says is there: the recorded version, an adopted table's columns and progress.

use super::AdoptState;
use crate::outbox::columns::ColumnMap;
use crate::outbox::conn::Conn;
use crate::outbox::error::{query_err, OutboxError};
use crate::outbox::ident::TableName;
use crate::outbox::store::Outbox;
use crate::outbox::template::{render, Value};

/// The version `migrate` recorded for a table.
const READ_VERSION: &str = include_str!("../../../sql/read_version.sql");

/// The relay's own columns on an adopted table (besides the sequence column).
const RELAY_COLUMNS: [&str; 12] = [
    "created_at",
    "available_at",
    "attempts",
    "lease_owner",
    "lease_until",
    "lease_token",
    "sent_at",
    "message_id",
    "quarantined_at",
    "quarantine_reason",
    "last_error",
    "dedup_id",
];

/// A column of the table to adopt, as the catalog describes it.
#[derive(Debug, Clone)]
pub(super) struct Column {
    /// Matched against the column map's names.
    pub(super) name: String,
    /// `format_type`'s text: a headers column that is not `jsonb` is read through `try_jsonb`.
    pub(super) ty: String,
    /// `pg_type.typcategory`: "S" for text-like types.
    pub(super) category: String,
    /// A sequence column already NOT NULL needs no backfill.
    pub(super) not_null: bool,
    /// A sequence column with a default (of ours, or the application's) needs no sequence.
    pub(super) has_default: bool,
    /// An identity column numbers its rows itself.
    pub(super) identity: bool,
}

impl Outbox {
    /// The schema version recorded for this table (0: none yet).
    pub(super) async fn read_version(&self, client: &Conn) -> Result<i32, OutboxError> {
        let versions = self.versions_table();
        let row = client
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[&versions.quoted()])
            .await
            .map_err(query_err("looking up the schema version table"))?;
        if !row.get::<_, bool>(0) {
            return Ok(0);
        }
        let read = render(READ_VERSION, &[("versions", Value::Table(&versions))])
            .map_err(OutboxError::Template)?;
        Ok(client
            .query_opt(&read, &[&self.table().name])
            .await
            .map_err(query_err("reading the schema version"))?
            .map(|r| r.get(0))
            .unwrap_or(0))
    }

    /// The table's columns, or `TableMissing`.
    pub(super) async fn read_columns(
        &self,
        client: &Conn,
        base: &TableName,
    ) -> Result<Vec<Column>, OutboxError> {
        let columns: Vec<Column> = client
            .query(
                "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), t.typcategory::text,
                        a.attnotnull, a.atthasdef, a.attidentity <> ''
                 FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
                 WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped",
                &[&base.quoted()],
            )
            .await
            .map_err(query_err("reading the table's columns"))?
            .iter()
            .map(|r| Column {
                name: r.get(0),
                ty: r.get(1),
                category: r.get(2),
                not_null: r.get(3),
                has_default: r.get(4),
                identity: r.get(5),
            })
            .collect();
        if columns.is_empty() {
            return Err(OutboxError::TableMissing(base.quoted()));
        }
        Ok(columns)
    }

    pub(super) async fn read_adopt_state(
        &self,
        client: &Conn,
        base: &TableName,
        map: &ColumnMap,
        columns: &[Column],
    ) -> Result<AdoptState, OutboxError> {
        let find = |name: &str| columns.iter().find(|c| c.name == name);
        let seq = find(&map.id);
        if let Some(c) = seq {
            // A column with a default of its own (an application's serial, say) that allows
            // NULLs: its NULL rows could only be numbered from a sequence of ours, whose values
            // may collide with its own.
            if c.has_default && !c.identity && !c.not_null {
                let ours: bool = client
                    .query_one(
                        "SELECT to_regclass($1) IS NOT NULL",
                        &[&base.qualify(&self.table().derived("backfill_seq"))],
                    )
                    .await
                    .map_err(query_err("looking up the backfill sequence"))?
                    .get(0);
                if !ours {
                    return Err(OutboxError::AdoptSequence {
                        table: base.quoted(),
                        column: map.id.clone(),
                    });
                }
            }
        }
        let has_check: bool = client
            .query_one(
                "SELECT EXISTS (SELECT FROM pg_constraint WHERE conrelid = to_regclass($1) AND conname = $2)",
                &[&base.quoted(), &self.table().derived("seq_not_null")],
            )
            .await
            .map_err(query_err("looking up the NOT NULL check"))?
            .get(0);
        Ok(AdoptState {
            columns_missing: seq.is_none() || RELAY_COLUMNS.iter().any(|c| find(c).is_none()),
            needs_sequence: seq.is_none_or(|c| !c.has_default && !c.identity),
            nullable: seq.is_none_or(|c| !c.not_null),
            has_check,
        })
    }
}

/// Whether a backend is building `index` now (its role's own builds, or any with
/// pg_read_all_stats).
pub(super) async fn index_in_progress(client: &Conn, index: &str) -> Result<bool, OutboxError> {
    Ok(client
        .query_one(
            "SELECT EXISTS (SELECT FROM pg_stat_progress_create_index WHERE index_relid = to_regclass($1))",
            &[&index],
        )
        .await
        .map_err(query_err("looking for an index build in progress"))?
        .get(0))
}

/// Whether `index` (quoted) is valid; `None` when there is no such index.
pub(super) async fn index_validity(
    client: &Conn,
    index: &str,
) -> Result<Option<bool>, OutboxError> {
    Ok(client
        .query_opt(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)",
            &[&index],
        )
        .await
        .map_err(query_err("looking up an index"))?
        .map(|r| r.get(0)))
}
