//! The steps of `migrate` and `migrate --adopt`, planned without a database, and their text.
//!
//! Every statement is rendered by the one template renderer (`template`): names are
//! quoted once, there, and a placeholder left without a value is an error, not SQL.

use std::fmt::Write as _;

use super::catalog::Column;
use super::{AdoptState, Step, BACKFILL_PAGES, STATEMENT_TIMEOUT};
use crate::outbox::columns::ColumnMap;
use crate::outbox::error::OutboxError;
use crate::outbox::ident::key_sql;
use crate::outbox::ident::{quote_ident, KeyIndex, TableName};
use crate::outbox::order_by::OrderBy;
use crate::outbox::schema::SCHEMA_VERSION;
use crate::outbox::store::Outbox;
use crate::outbox::template::{literal, render, Value};
use crate::row::KeyColumn;

/// Drops an index that another replaces, and what an interrupted concurrent build left
/// behind before the build starts again.
pub(super) const DROP_INDEX: &str = "DROP INDEX CONCURRENTLY IF EXISTS {index};";

/// The statements of a migration too small for a file in `sql/` of their own; rendered like
/// those.
const CREATE_SCHEMA: &str = "CREATE SCHEMA IF NOT EXISTS {schema};\n";
const MIGRATION_LOCK: &str = "SELECT {function}(hashtext('outbox-relay migrate ' || {table}));";
const VERSION_TABLE: &str = "CREATE TABLE IF NOT EXISTS {versions} (\n    \
    table_name text PRIMARY KEY,\n    version integer NOT NULL,\n    \
    migrated_at timestamptz NOT NULL DEFAULT now(),\n    relay_versions text\n);";
/// Schema version 4's contract column on a version table of before (looked up first, so a
/// rerun takes no lock): which relay versions may claim, a semver requirement (`version`).
const CONTRACT_COLUMN: &str = "DO $migrate$\nBEGIN\n    \
    IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = {versions_literal}::regclass\n                   \
    AND attname = 'relay_versions' AND NOT attisdropped) THEN\n        \
    ALTER TABLE {versions} ADD COLUMN relay_versions text;\n    END IF;\nEND\n$migrate$;";
/// The version last, with the relay versions that may claim: an expanding migrate keeps a
/// requirement already recorded (a `--contract` raised it; a migrate never lowers it) and
/// records its own where there is none.
const RECORD_VERSION: &str =
    "INSERT INTO {versions} AS v (table_name, version, relay_versions) VALUES ({table_name}, {version}, {relay_versions})\n    \
    ON CONFLICT (table_name) DO UPDATE SET version = {version}, migrated_at = now(),\n        \
    relay_versions = coalesce(v.relay_versions, excluded.relay_versions);";
/// What `migrate --contract` records, before it removes anything: from then on only relays of
/// the requirement claim (a relay of another version stops within seconds).
const RECORD_CONTRACT: &str =
    "UPDATE {versions} SET relay_versions = {relay_versions}, migrated_at = now()\n    \
    WHERE table_name = {table_name};";

/// The migration lock's function: the session's, held across a migration's many transactions.
pub(super) const SESSION_LOCK: &str = "pg_advisory_lock";
/// The same lock for one transaction: what a step takes through a pooler.
pub(super) const TRANSACTION_LOCK: &str = "pg_advisory_xact_lock";

/// A template's steps: paragraphs separated by blank lines; a paragraph of comments only is
/// kept with the statement after it.
fn paragraphs(template: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut pending = String::new();
    for block in template.split("\n\n") {
        let block = block.trim_matches('\n');
        if block.is_empty() {
            continue;
        }
        if !pending.is_empty() {
            pending.push('\n');
        }
        pending.push_str(block);
        if block.lines().all(|l| l.trim_start().starts_with("--")) {
            continue;
        }
        out.push(std::mem::take(&mut pending));
    }
    out
}

/// Renders a statement of the migration; a placeholder left over is refused before any SQL
/// runs.
fn fill_in(template: &str, values: &[(&str, Value<'_>)]) -> Result<String, OutboxError> {
    render(template, values).map_err(OutboxError::Template)
}

fn is_index(statement: &str) -> bool {
    statement
        .lines()
        .find(|l| !l.trim_start().starts_with("--"))
        .is_some_and(|l| l.contains("INDEX CONCURRENTLY"))
}

/// `name`, an object of the relay's (a sequence, a function, an index), in `table`'s schema.
pub(super) fn in_schema(table: &TableName, name: String) -> TableName {
    TableName {
        schema: table.schema.clone(),
        name,
    }
}

impl Outbox {
    /// The default group key's two indexes (ordered claims need both), plus the ones asked for.
    fn with_default_index(keys: &[(KeyColumn, KeyIndex)]) -> Vec<(KeyColumn, KeyIndex)> {
        let mut keys = keys.to_vec();
        for (i, kind) in [KeyIndex::Order, KeyIndex::Fair].into_iter().enumerate() {
            let default = (KeyColumn::AggregateId, kind);
            if !keys.contains(&default) {
                keys.insert(i, default);
            }
        }
        keys
    }

    pub(super) fn versions_table(&self) -> TableName {
        self.table().versions()
    }

    /// The session settings every step starts from.
    pub(super) fn session_settings(&self) -> String {
        self.settings("SET")
    }

    /// The same for one transaction (`SET LOCAL`): what a step does through a pooler.
    pub(super) fn transaction_settings(&self) -> String {
        self.settings("SET LOCAL")
    }

    /// Names nothing: a setting and numbers of the relay's own.
    fn settings(&self, set: &str) -> String {
        format!(
            "{set} lock_timeout = '{}ms';\n{set} statement_timeout = '{STATEMENT_TIMEOUT}';\n\
             {set} idle_in_transaction_session_timeout = '{STATEMENT_TIMEOUT}';\n",
            self.locks().timeout.as_millis().max(1)
        )
    }

    /// Serialises migrate runs on this table; `function` is [`SESSION_LOCK`] or
    /// [`TRANSACTION_LOCK`].
    pub(super) fn migration_lock(&self, function: &'static str) -> Result<String, OutboxError> {
        fill_in(
            MIGRATION_LOCK,
            &[
                ("function", Value::Sql(function)),
                ("table", Value::TableLiteral(self.table())),
            ],
        )
    }

    fn version_table_sql(&self) -> Result<String, OutboxError> {
        let versions = self.versions_table();
        let values = [
            ("versions", Value::Table(&versions)),
            ("versions_literal", Value::TableLiteral(&versions)),
        ];
        Ok(format!(
            "{}\n{}",
            fill_in(VERSION_TABLE, &values)?,
            fill_in(CONTRACT_COLUMN, &values)?
        ))
    }

    fn record_version_sql(&self) -> Result<String, OutboxError> {
        fill_in(
            RECORD_VERSION,
            &[
                ("versions", Value::Table(&self.versions_table())),
                ("table_name", Value::Literal(&self.table().name)),
                ("version", Value::Sql(&SCHEMA_VERSION.to_string())),
                ("relay_versions", Value::Literal(crate::version::EXPANDED)),
            ],
        )
    }

    /// `migrate --contract`'s record of `requirement` (see [`RECORD_CONTRACT`]).
    pub(super) fn record_contract_sql(&self, requirement: &str) -> Result<String, OutboxError> {
        fill_in(
            RECORD_CONTRACT,
            &[
                ("versions", Value::Table(&self.versions_table())),
                ("table_name", Value::Literal(&self.table().name)),
                ("relay_versions", Value::Literal(requirement)),
            ],
        )
    }

    /// `migrate --contract`'s removal of the lease columns (sql/contract_drop.sql).
    pub(super) fn contract_drop_step(&self) -> Result<Step, OutboxError> {
        self.column_step(
            "dropping the lease columns of schema version 1",
            include_str!("../../../sql/contract_drop.sql"),
        )
    }

    /// The steps of `migrate` for a table of the default shape. Needs no database: every
    /// statement is idempotent (`IF NOT EXISTS`), and index validity is checked when run.
    pub fn migrate_plan(&self, keys: &[(KeyColumn, KeyIndex)]) -> Result<Vec<Step>, OutboxError> {
        let mut setup = String::new();
        if let Some(schema) = &self.table().schema {
            setup.push_str(&fill_in(
                CREATE_SCHEMA,
                &[("schema", Value::Ident(schema))],
            )?);
        }
        setup.push_str(&self.version_table_sql()?);
        let mut steps = vec![Step::Transaction {
            what: "creating the schema version table".into(),
            sql: setup,
        }];
        let names = [
            ("unsent_index", self.table().derived("unsent_idx")),
            ("quarantined_index", self.table().derived("quarantined_idx")),
            ("sent_index", self.table().derived("sent_idx")),
        ];
        let mut values = vec![("table", Value::Table(self.table()))];
        values.extend(names.iter().map(|(k, n)| (*k, Value::Ident(n))));
        for statement in paragraphs(include_str!("../../../sql/migrate_v1.sql")) {
            let sql = fill_in(&statement, &values)?;
            if is_index(&statement) {
                let name = names
                    .iter()
                    .find(|(k, _)| statement.contains(&format!("{{{k}}}")))
                    .map(|(_, n)| n.clone())
                    .expect("every index statement names its index");
                steps.push(Step::Index {
                    what: format!("building index {}", quote_ident(&name)),
                    index: in_schema(self.table(), name),
                    sql,
                });
            } else {
                steps.push(Step::Transaction {
                    what: "creating the table".into(),
                    sql,
                });
            }
        }
        if keys
            .iter()
            .any(|(_, kind)| kind.order_by() == OrderBy::Transaction)
        {
            steps.push(self.column_step(
                "adding the xact_id column (--order-by transaction)",
                include_str!("../../../sql/xact_column.sql"),
            )?);
        }
        for (key_column, kind) in Self::with_default_index(keys) {
            let name = self.key_index_name(&key_column, kind);
            let key = key_sql(&key_column, None);
            // The column's own name, as every query of the relay writes it.
            let id = Value::Sql("id");
            steps.push(self.key_index_step(self.table(), name, &key, id, kind)?);
            steps.extend(self.replaced_index_steps(self.table(), &key_column, kind)?);
        }
        steps.push(self.claims_step()?);
        steps.push(self.column_step(
            "adding the dedup_id column",
            include_str!("../../../sql/dedup_column.sql"),
        )?);
        steps.push(self.relays_step()?);
        steps.push(Step::Transaction {
            what: "recording the schema version".into(),
            sql: self.record_version_sql()?,
        });
        Ok(steps)
    }

    /// A column added to the table, `sql` a DO block that looks it up first (a rerun takes no
    /// lock), in a transaction under the lock policy.
    fn column_step(&self, what: &str, sql: &str) -> Result<Step, OutboxError> {
        Ok(Step::Transaction {
            what: what.into(),
            sql: fill_in(
                sql.trim_end(),
                &[
                    ("table", Value::Table(self.table())),
                    ("table_literal", Value::TableLiteral(self.table())),
                ],
            )?,
        })
    }

    /// The lease table beside the relay's table (or view), sql/claims.sql: created in a
    /// transaction of its own, which takes no lock the application's writes wait for.
    fn claims_step(&self) -> Result<Step, OutboxError> {
        Ok(Step::Transaction {
            what: "creating the lease table".into(),
            sql: fill_in(
                include_str!("../../../sql/claims.sql").trim_end(),
                &[("claims", Value::Table(&self.table().claims()))],
            )?,
        })
    }

    /// Schema version 4: the relay registry beside the lease table (sql/relays.sql), and its
    /// grants to the roles that claim (sql/relays_grants.sql); new tables, so nothing waits.
    fn relays_step(&self) -> Result<Step, OutboxError> {
        let (relays, claims, versions) = (
            self.table().relays(),
            self.table().claims(),
            self.versions_table(),
        );
        let values = [
            ("relays", Value::Table(&relays)),
            ("relays_literal", Value::TableLiteral(&relays)),
            ("claims_literal", Value::TableLiteral(&claims)),
            ("versions_literal", Value::TableLiteral(&versions)),
        ];
        Ok(Step::Transaction {
            what: "creating the relay registry".into(),
            sql: format!(
                "{}\n\n{}",
                fill_in(include_str!("../../../sql/relays.sql").trim_end(), &values)?,
                fill_in(
                    include_str!("../../../sql/relays_grants.sql").trim_end(),
                    &values
                )?
            ),
        })
    }

    /// Drops the indexes `kind` replaced, once the new one is built: concurrently, so the
    /// application's writes go on; `IF EXISTS`, so a rerun or a fresh install skips them.
    fn replaced_index_steps(
        &self,
        table: &TableName,
        key: &KeyColumn,
        kind: KeyIndex,
    ) -> Result<Vec<Step>, OutboxError> {
        kind.replaces()
            .iter()
            .map(|replaces| {
                let old = in_schema(
                    table,
                    self.table()
                        .derived(&format!("{replaces}_{}_idx", key.slug())),
                );
                Ok(Step::Unbounded {
                    what: format!("dropping index {}, replaced", quote_ident(&old.name)),
                    sql: fill_in(DROP_INDEX, &[("index", Value::Table(&old))])?,
                })
            })
            .collect()
    }

    /// A (key, id) index on `table`; `key` is an expression the relay built from quoted parts.
    fn key_index_step(
        &self,
        table: &TableName,
        name: String,
        key: &str,
        id: Value<'_>,
        kind: KeyIndex,
    ) -> Result<Step, OutboxError> {
        let sql = fill_in(
            include_str!("../../../sql/key_index.sql").trim_end(),
            &[
                ("index", Value::Ident(&name)),
                ("table", Value::Table(table)),
                ("key", Value::Sql(key)),
                ("id", id),
                ("order_columns", Value::Sql(kind.order_by().index_columns())),
                ("predicate", Value::Sql(&kind.predicate(key))),
            ],
        )?;
        Ok(Step::Index {
            what: format!("building index {}", quote_ident(&name)),
            index: in_schema(table, name),
            sql,
        })
    }
}

impl Outbox {
    /// The steps of `migrate --adopt` for `state`. `types` are the table's columns from the
    /// catalog; without them (`--print-sql` without a database) text-like types are assumed.
    pub(super) fn adopt_plan(
        &self,
        base: &TableName,
        map: &ColumnMap,
        keys: &[(KeyColumn, KeyIndex)],
        columns: Option<&[Column]>,
        state: &AdoptState,
    ) -> Result<Vec<Step>, OutboxError> {
        let sequence = in_schema(base, self.table().derived("seq"));
        let backfill_sequence = in_schema(base, self.table().derived("backfill_seq"));
        let check = self.table().derived("seq_not_null");
        let try_jsonb = in_schema(base, self.table().derived("try_jsonb"));
        let exprs = view_expressions(base, map, columns, &try_jsonb.quoted())?;
        let blocks = BACKFILL_PAGES.to_string();
        let index_names = [
            ("seq_index", self.table().derived("seq_idx")),
            ("unsent_index", self.table().derived("unsent_idx")),
            ("quarantined_index", self.table().derived("quarantined_idx")),
            ("sent_index", self.table().derived("sent_idx")),
        ];
        let mut values = vec![
            ("base", Value::Table(base)),
            ("base_literal", Value::TableLiteral(base)),
            ("seq", Value::Ident(&map.id)),
            ("sequence", Value::Table(&sequence)),
            ("sequence_literal", Value::TableLiteral(&sequence)),
            ("backfill_sequence", Value::Table(&backfill_sequence)),
            (
                "backfill_sequence_literal",
                Value::TableLiteral(&backfill_sequence),
            ),
            ("check", Value::Ident(&check)),
            ("blocks", Value::Sql(&blocks)),
            ("view", Value::Table(self.table())),
            ("view_columns", Value::Sql(&exprs.view_columns)),
            ("try_jsonb", Value::Table(&try_jsonb)),
        ];
        values.extend(index_names.iter().map(|(k, n)| (*k, Value::Ident(n))));
        let statements = |template: &str| -> Result<Vec<String>, OutboxError> {
            paragraphs(template)
                .iter()
                .map(|p| fill_in(p, &values))
                .collect()
        };

        let mut steps = vec![Step::Transaction {
            what: "creating the schema version table".into(),
            sql: self.version_table_sql()?,
        }];
        let mut first = String::new();
        if state.columns_missing {
            first.push_str(
                &statements(include_str!("../../../sql/adopt_columns.sql"))?.join("\n\n"),
            );
        }
        if state.needs_sequence {
            if !first.is_empty() {
                first.push_str("\n\n");
            }
            first.push_str(
                &statements(include_str!("../../../sql/adopt_sequence.sql"))?.join("\n\n"),
            );
        }
        if !first.is_empty() {
            steps.push(Step::Transaction {
                what: "adding the relay's columns".into(),
                sql: first,
            });
        }
        if state.nullable {
            let backfill = statements(include_str!("../../../sql/adopt_backfill.sql"))?;
            steps.push(Step::Backfill {
                base: base.clone(),
                sql: backfill.join("\n"),
            });
            let mut not_null =
                statements(include_str!("../../../sql/adopt_not_null.sql"))?.into_iter();
            let (add, validate, set) = (
                not_null.next().expect("adopt_not_null.sql: ADD CONSTRAINT"),
                not_null.next().expect("adopt_not_null.sql: VALIDATE"),
                not_null.next().expect("adopt_not_null.sql: SET NOT NULL"),
            );
            if !state.has_check {
                steps.push(Step::Transaction {
                    what: "adding the NOT NULL check (NOT VALID)".into(),
                    sql: add,
                });
            }
            steps.push(Step::Unbounded {
                what: "validating the NOT NULL check".into(),
                sql: validate,
            });
            steps.push(Step::Transaction {
                what: "setting NOT NULL".into(),
                sql: set,
            });
        }
        if exprs.reads_headers_as_text {
            // Before the header-key indexes and the view, which call it.
            steps.push(Step::Transaction {
                what: "creating the function that reads the headers column".into(),
                sql: statements(include_str!("../../../sql/adopt_try_jsonb.sql"))?.join("\n\n"),
            });
        }
        let last = statements(include_str!("../../../sql/adopt.sql"))?;
        let mut names = index_names.iter();
        for statement in last {
            if is_index(&statement) {
                let (_, name) = names.next().expect("adopt.sql: four indexes");
                steps.push(Step::Index {
                    what: format!("building index {}", quote_ident(name)),
                    index: in_schema(base, name.clone()),
                    sql: statement,
                });
            } else {
                for (key, kind) in Self::with_default_index(keys) {
                    let expression = match &key {
                        KeyColumn::AggregateId => exprs.aggregate_id.clone(),
                        KeyColumn::AggregateType => exprs.aggregate_type.clone(),
                        KeyColumn::EventType => exprs.event_type.clone(),
                        // As `key_sql` writes it, so that the claims' expression matches.
                        KeyColumn::Header(name) => {
                            format!("coalesce({} ->> {}, '')", exprs.headers, literal(name))
                        }
                    };
                    let name = self.key_index_name(&key, kind);
                    let replaced = self.replaced_index_steps(base, &key, kind)?;
                    let key = format!("({expression})");
                    let id = Value::Ident(&map.id);
                    steps.push(self.key_index_step(base, name, &key, id, kind)?);
                    steps.extend(replaced);
                }
                steps.push(Step::Transaction {
                    what: "creating the relay's view".into(),
                    sql: statement,
                });
            }
        }
        steps.push(self.claims_step()?);
        steps.push(self.relays_step()?);
        steps.push(Step::Transaction {
            what: "recording the schema version".into(),
            sql: self.record_version_sql()?,
        });
        Ok(steps)
    }

    /// Steps as one SQL script, with the session settings and transactions a run uses.
    pub fn render(&self, steps: &[Step]) -> Result<String, OutboxError> {
        let mut out = String::new();
        let _ = writeln!(out, "{}", self.migration_lock(SESSION_LOCK)?);
        out.push_str(&self.session_settings());
        for step in steps {
            out.push('\n');
            match step {
                Step::Transaction { what, sql } => {
                    let _ = writeln!(
                        out,
                        "-- {what}: one transaction; a lock not granted within lock_timeout is tried again \
                         (at most {} tries)\n{};\n{sql}\nCOMMIT;",
                        self.locks().attempts,
                        crate::outbox::conn::Access::Write.begin()
                    );
                }
                Step::Index { what, index, sql } => {
                    let _ = writeln!(
                        out,
                        "-- {what}: skipped when valid; an INVALID leftover is dropped first with\n\
                         -- DROP INDEX CONCURRENTLY IF EXISTS {index};\n\
                         SET lock_timeout = 0;\nSET statement_timeout = 0;\n{sql}\n\
                         RESET lock_timeout;\nRESET statement_timeout;"
                    );
                }
                Step::Backfill { sql, .. } => {
                    let _ = writeln!(
                        out,
                        "-- numbering the existing rows: this statement for each range of {BACKFILL_PAGES} pages \
                         (0, {BACKFILL_PAGES}, ... up to the table's size), each in its own transaction,\n\
                         -- passes repeated until one numbers nothing; $1, $2 = first page, end page\n{sql}"
                    );
                }
                Step::Unbounded { what, sql } => {
                    let _ = writeln!(
                        out,
                        "-- {what}: a scan that lets writes through (SHARE UPDATE EXCLUSIVE)\n\
                         SET lock_timeout = 0;\nSET statement_timeout = 0;\n{sql}\n\
                         RESET lock_timeout;\nRESET statement_timeout;"
                    );
                }
            }
        }
        Ok(out)
    }
}

/// How the view exposes the application's columns under the standard names.
struct ViewExpressions {
    /// The view's select list: every standard name, from the application's columns.
    view_columns: String,
    /// The key expressions, which the key indexes on the table must repeat exactly: the
    /// aggregate id's,
    aggregate_id: String,
    /// the aggregate type's,
    aggregate_type: String,
    /// and the event type's.
    event_type: String,
    /// The headers as jsonb, which header-key indexes read.
    headers: String,
    /// The headers column is not jsonb: it is read through the function of
    /// sql/adopt_try_jsonb.sql, which `migrate --adopt` creates first.
    reads_headers_as_text: bool,
}

/// Text-like columns are exposed as they are, so indexes on them serve the relay's queries;
/// anything else (a uuid event id, say) is exposed as its text. Headers that are not jsonb are
/// read through `try_jsonb` (sql/adopt_try_jsonb.sql), never cast: one value that is not JSON
/// must not fail every claim. Without `columns`, every column is taken as text-like and payload
/// and headers as jsonb.
fn view_expressions(
    base: &TableName,
    map: &ColumnMap,
    columns: Option<&[Column]>,
    try_jsonb: &str,
) -> Result<ViewExpressions, OutboxError> {
    let find = |column: &str| columns.map(|cs| cs.iter().find(|c| c.name == column));
    let missing = |relay: &str, column: &str| OutboxError::AdoptColumn {
        table: base.quoted(),
        relay: relay.to_string(),
        column: column.to_string(),
    };
    let as_text = |relay: &str, column: &str| -> Result<String, OutboxError> {
        match find(column) {
            None => Ok(quote_ident(column)),
            Some(Some(c)) if c.category == "S" => Ok(quote_ident(column)),
            Some(Some(_)) => Ok(format!("{}::text", quote_ident(column))),
            Some(None) => Err(missing(relay, column)),
        }
    };
    // The expression, and whether it goes through `try_jsonb`.
    let json = |relay: &str, column: &Option<String>| -> Result<(String, bool), OutboxError> {
        let Some(column) = column else {
            return Ok(("'{}'::jsonb".to_string(), false));
        };
        match find(column) {
            None => Ok((quote_ident(column), false)),
            Some(Some(c)) if c.ty == "jsonb" => Ok((quote_ident(column), false)),
            Some(Some(_)) => Ok((format!("{try_jsonb}({}::text)", quote_ident(column)), true)),
            Some(None) => Err(missing(relay, column)),
        }
    };
    let event_id = as_text("event_id", &map.event_id)?;
    let aggregate_type = as_text("aggregate_type", &map.aggregate_type)?;
    let aggregate_id = as_text("aggregate_id", &map.aggregate_id)?;
    let event_type = as_text("event_type", &map.event_type)?;
    if let Some(None) = find(&map.payload) {
        return Err(missing("payload", &map.payload));
    }
    // The optional columns under their standard names count as absent when the table does
    // not have them (Debezium's has neither, which is also what is assumed without the
    // catalog); a name given with --column must exist.
    let present = |column: &Option<String>, standard: &str| {
        column.clone().filter(|c| {
            c != standard
                || match find(c) {
                    None => false,
                    Some(found) => found.is_some(),
                }
        })
    };
    let (headers, reads_headers_as_text) = json("headers", &present(&map.headers, "headers"))?;
    let queue_url = match present(&map.queue_url, "queue_url") {
        Some(column) => as_text("queue_url", &column)?,
        None => "NULL::text".to_string(),
    };
    let view_columns = format!(
        "{} AS id, {event_id} AS event_id, {aggregate_type} AS aggregate_type, \
         {aggregate_id} AS aggregate_id, {event_type} AS event_type, {} AS payload, \
         {headers} AS headers, {queue_url} AS queue_url",
        quote_ident(&map.id),
        quote_ident(&map.payload),
    );
    Ok(ViewExpressions {
        view_columns,
        aggregate_id,
        aggregate_type,
        event_type,
        headers,
        reads_headers_as_text,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn outbox(table: &str) -> Outbox {
        Outbox::new(
            "postgres://u:p@127.0.0.1:5/db",
            table.parse().unwrap(),
            Duration::from_secs(1),
        )
        .unwrap()
    }

    fn debezium() -> ColumnMap {
        ColumnMap::from_pairs(&[
            ("event_id".into(), "id".into()),
            ("aggregate_type".into(), "aggregatetype".into()),
            ("aggregate_id".into(), "aggregateid".into()),
            ("event_type".into(), "type".into()),
        ])
        .unwrap()
    }

    #[test]
    fn a_placeholder_left_over_is_an_error_not_sql() {
        let table: TableName = "outbox".parse().unwrap();
        let err = fill_in(
            "CREATE INDEX {index} ON {table} (id);",
            &[("table", Value::Table(&table))],
        )
        .unwrap_err();
        assert!(
            matches!(&err, OutboxError::Template(text) if text.contains("{index}")),
            "{err}"
        );
    }

    #[test]
    fn templates_split_into_statements_with_their_comments() {
        let steps = paragraphs("-- head\n\n-- about a\nA;\n\nB\n  more;\n\n\n-- c\nC;\n");
        assert_eq!(
            steps,
            vec!["-- head\n-- about a\nA;", "B\n  more;", "-- c\nC;"]
        );
    }

    #[test]
    fn migrate_builds_every_index_concurrently_and_records_the_version_last() {
        let o = outbox("app.\"out\"\"box\"");
        let steps = o.migrate_plan(&[]).unwrap();
        let indexes: Vec<&Step> = steps
            .iter()
            .filter(|s| matches!(s, Step::Index { .. }))
            .collect();
        // unsent, quarantined, sent, and the default group key's two (order, unsent key).
        assert_eq!(indexes.len(), 5);
        for step in &indexes {
            let Step::Index { sql, index, .. } = step else {
                unreachable!()
            };
            assert!(
                sql.contains("CREATE INDEX CONCURRENTLY IF NOT EXISTS"),
                "{sql}"
            );
            assert!(index.quoted().starts_with("\"app\"."), "{index}");
        }
        assert!(
            matches!(steps.last(), Some(Step::Transaction { what, .. }) if what.contains("version"))
        );
        let sql = o.migrate_sql(&[]).unwrap();
        assert!(!sql.contains('{') || !sql.contains("_index}"), "{sql}");
        assert!(sql.contains("CREATE TABLE IF NOT EXISTS \"app\".\"out\"\"box\""));
        assert!(sql.contains("SET lock_timeout = '100ms'"));
        assert!(!sql.to_lowercase().contains("notify"));
        assert!(
            !sql.contains("BEGIN;\nCREATE INDEX"),
            "no index inside a transaction"
        );
    }

    #[test]
    fn a_fresh_adoption_adds_a_nullable_column_backfills_and_proves_not_null() {
        let o = outbox("outboxevent_relay");
        let base: TableName = "outboxevent".parse().unwrap();
        let steps = o
            .adopt_plan(&base, &debezium(), &[], None, &AdoptState::fresh())
            .unwrap();
        let text = o.render(&steps).unwrap();
        assert!(
            text.contains("ADD COLUMN IF NOT EXISTS \"outbox_seq\" bigint,"),
            "{text}"
        );
        // The lease table is new, and its own identity column rewrites nothing.
        let lease_table = fill_in(
            include_str!("../../../sql/claims.sql").trim_end(),
            &[("claims", Value::Table(&o.table().claims()))],
        )
        .unwrap();
        assert!(text.contains(&lease_table), "{text}");
        assert!(
            !text.replace(&lease_table, "").contains("IDENTITY"),
            "an identity column rewrites the table"
        );
        assert!(text.contains("SET DEFAULT nextval('\"outboxevent_relay_seq\"')"));
        assert!(text.contains("NOT VALID"));
        assert!(text.contains("VALIDATE CONSTRAINT"));
        assert!(
            text.contains("WHERE \"outbox_seq\" IS NOT NULL;"),
            "the view hides unnumbered rows"
        );
        let kinds: Vec<&str> = steps
            .iter()
            .map(|s| match s {
                Step::Transaction { .. } => "tx",
                Step::Index { .. } => "index",
                Step::Backfill { .. } => "backfill",
                Step::Unbounded { .. } => "validate",
            })
            .collect();
        assert_eq!(
            kinds,
            [
                // Each key index, then dropping what it replaced: 0.2.0's `order_` index, and
                // schema version 1's `key_` and 0.2.0's `pending_` fair indexes; then the view,
                // the lease table, the relay registry and the version.
                "tx", "tx", "backfill", "tx", "validate", "tx", "index", "index", "index", "index",
                "index", "validate", "index", "validate", "validate", "tx", "tx", "tx", "tx"
            ]
        );
    }

    #[test]
    fn an_adopted_table_is_only_given_what_it_lacks() {
        let o = outbox("outboxevent_relay");
        let base: TableName = "outboxevent".parse().unwrap();
        let done = AdoptState {
            columns_missing: false,
            needs_sequence: false,
            nullable: false,
            has_check: false,
        };
        let text = o
            .render(&o.adopt_plan(&base, &debezium(), &[], None, &done).unwrap())
            .unwrap();
        // Only the relay's own tables may be altered (the version table's contract column, the
        // registry's floors), never the application's table.
        assert!(!text.contains("ALTER TABLE \"outboxevent\""), "{text}");
        assert!(!text.contains("UPDATE \"outboxevent\""), "{text}");
        let resumed = AdoptState {
            columns_missing: false,
            needs_sequence: false,
            nullable: true,
            has_check: true,
        };
        let text = o
            .render(
                &o.adopt_plan(&base, &debezium(), &[], None, &resumed)
                    .unwrap(),
            )
            .unwrap();
        assert!(
            !text.contains("ALTER TABLE \"outboxevent\"\n    ADD COLUMN"),
            "{text}"
        );
        assert!(
            !text.contains("NOT VALID"),
            "the check of the interrupted run is kept"
        );
        assert!(text.contains("IS NULL"), "the backfill resumes");
    }

    #[test]
    fn text_headers_are_read_through_a_function_that_never_fails_not_a_cast() {
        let o = outbox("app.outboxevent_relay");
        let base: TableName = "app.outboxevent".parse().unwrap();
        let column = |name: &str, ty: &str, category: &str| Column {
            name: name.into(),
            ty: ty.into(),
            category: category.into(),
            not_null: false,
            has_default: false,
            identity: false,
        };
        let mut columns = vec![
            column("id", "uuid", "U"),
            column("aggregatetype", "character varying(255)", "S"),
            column("aggregateid", "character varying(255)", "S"),
            column("type", "character varying(255)", "S"),
            column("payload", "jsonb", "U"),
            column("headers", "text", "S"),
        ];
        let tenant = [(KeyColumn::Header("tenant".into()), KeyIndex::Fair)];
        let plan = |columns: &[Column]| {
            o.adopt_plan(
                &base,
                &debezium(),
                &tenant,
                Some(columns),
                &AdoptState::fresh(),
            )
            .unwrap()
        };
        let text = o.render(&plan(&columns)).unwrap();
        let reader = "\"app\".\"outboxevent_relay_try_jsonb\"(\"headers\"::text)";
        assert!(!text.contains("::jsonb AS headers"), "{text}");
        assert!(text.contains(&format!("{reader} AS headers")), "{text}");
        assert!(
            text.contains(&format!(
                "((coalesce({reader} ->> 'tenant', '')), \"outbox_seq\")"
            )),
            "the header-key index reads the headers as the view does: {text}"
        );
        let function = text
            .find("CREATE OR REPLACE FUNCTION \"app\".\"outboxevent_relay_try_jsonb\"(value text)")
            .expect("the function is created");
        assert!(function < text.find("_h_tenant_idx").unwrap());
        assert!(
            !text.contains("PARALLEL SAFE"),
            "its exception block cannot run in a parallel query"
        );
        assert!(function < text.find("CREATE OR REPLACE VIEW").unwrap());

        columns[5] = column("headers", "jsonb", "U");
        let text = o.render(&plan(&columns)).unwrap();
        assert!(text.contains("\"headers\" AS headers"), "{text}");
        assert!(!text.contains("FUNCTION"), "jsonb needs no reader: {text}");
    }

    #[test]
    fn names_with_quotes_stay_quoted_in_literals() {
        let o = outbox("we'ird_relay");
        let base: TableName = "we'ird".parse().unwrap();
        let text = o
            .render(
                &o.adopt_plan(&base, &debezium(), &[], None, &AdoptState::fresh())
                    .unwrap(),
            )
            .unwrap();
        assert!(text.contains("nextval('\"we''ird_relay_seq\"')"), "{text}");
    }
}
