//! `migrate` and `migrate --adopt`, online: the table keeps taking the application's writes.
//!
//! A migration is a list of [`Step`]s planned from the templates in `sql/` (and, for an
//! adoption, from what the catalog says is already there), so that `--print-sql` shows exactly
//! what a run executes. Each step is one of: a short transaction that needs a strong lock
//! (taken under `lock_timeout`, retried with capped, jittered backoff, then one clear error);
//! an index built `CONCURRENTLY` outside any transaction (an INVALID leftover of an interrupted
//! build is dropped and rebuilt); the backfill of an adopted table's sequence column in
//! bounded batches; or the validation of a constraint, a long scan that lets writes through.
//! Every step is idempotent and the version is recorded last, so a run killed at any point is
//! completed by the next one. A session-level advisory lock serialises concurrent runs.

use std::fmt::Write as _;
use std::time::Duration;

use super::Conn;

use super::template::{render, Value};
use super::{
    ident::key_sql, query_err, quote_ident, ColumnMap, KeyIndex, MigrateReport, Outbox,
    OutboxError, TableName, SCHEMA_VERSION,
};
use crate::batch::KeyColumn;

/// How long a step waits for a lock that blocks writes, and how often it tries.
///
/// While an `ALTER TABLE` waits in the lock queue, every insert the application issues queues
/// behind it; `timeout` bounds that stall (per try), the tries and the pauses between them
/// bound how long `migrate` keeps trying before it says why it gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockPolicy {
    /// `lock_timeout` of the steps that take an ACCESS EXCLUSIVE lock.
    pub timeout: Duration,
    /// Tries per step before giving up.
    pub attempts: u32,
}

impl Default for LockPolicy {
    fn default() -> Self {
        LockPolicy {
            timeout: Duration::from_millis(100),
            attempts: 30,
        }
    }
}

/// `statement_timeout` of every statement but the concurrent index builds and the validation,
/// whose length is the table's size, not a lock's. Backfill batches stay far below it.
const STATEMENT_TIMEOUT: &str = "30s";

/// Pages per backfill batch: at most 256 × 291 tuples whatever the rows' size, a few
/// thousand ordinary rows, a fraction of a second each.
const BACKFILL_PAGES: i64 = 256;

/// Pause between tries of a step that did not get its lock: capped exponential, full jitter.
const RETRY_BASE: Duration = Duration::from_millis(200);
const RETRY_CAP: Duration = Duration::from_secs(5);

/// One unit of a migration; see the module's documentation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Statements in one short transaction under the lock policy.
    Transaction { what: String, sql: String },
    /// `CREATE [UNIQUE] INDEX CONCURRENTLY IF NOT EXISTS`; `index` is the qualified name
    /// looked up in `pg_index` to skip a valid index and drop an invalid one first.
    Index {
        what: String,
        index: String,
        sql: String,
    },
    /// Numbers an adopted table's existing rows, page range by page range, until a pass over
    /// the whole table finds none left.
    Backfill { base: String, sql: String },
    /// A long statement under a lock that lets writes through (VALIDATE CONSTRAINT): neither
    /// timeout applies.
    Unbounded { what: String, sql: String },
}

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

/// Fills `{name}` placeholders; a placeholder left over is a bug in the caller, caught here
/// rather than as a syntax error on a production database.
fn fill(template: &str, values: &[(&str, &str)]) -> String {
    let values: Vec<_> = values.iter().map(|(n, v)| (*n, Value::Sql(v))).collect();
    match render(template, &values) {
        Ok(sql) => sql,
        Err(e) => panic!("{e}"),
    }
}

/// A string literal (for regclass arguments): quotes doubled.
fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

fn is_index(statement: &str) -> bool {
    statement
        .lines()
        .find(|l| !l.trim_start().starts_with("--"))
        .is_some_and(|l| l.contains("INDEX CONCURRENTLY"))
}

/// What an adopted table already has, read from the catalog; `fresh()` for a table the relay
/// never touched (what `--print-sql` assumes without a database).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdoptState {
    /// Some of the relay's columns are missing.
    pub columns_missing: bool,
    /// The sequence column has no default yet (missing, or added by an interrupted run).
    pub needs_sequence: bool,
    /// The sequence column may still hold NULLs (not yet NOT NULL).
    pub nullable: bool,
    /// The NOT VALID check of an interrupted run is there already.
    pub has_check: bool,
}

impl AdoptState {
    pub fn fresh() -> Self {
        AdoptState {
            columns_missing: true,
            needs_sequence: true,
            nullable: true,
            has_check: false,
        }
    }
}

/// The relay's own columns on an adopted table (besides the sequence column).
const RELAY_COLUMNS: [&str; 11] = [
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
];

/// A column of the table to adopt, as the catalog describes it.
#[derive(Debug, Clone)]
struct Column {
    name: String,
    ty: String,
    /// `pg_type.typcategory`: "S" for text-like types.
    category: String,
    not_null: bool,
    has_default: bool,
    identity: bool,
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

    fn versions_table(&self) -> String {
        self.table.qualify("outbox_relay_schema")
    }

    /// The session settings every step starts from.
    fn session_settings(&self) -> String {
        self.settings("SET")
    }

    /// The same for one transaction (`SET LOCAL`): what a step does through a pooler.
    fn transaction_settings(&self) -> String {
        self.settings("SET LOCAL")
    }

    fn settings(&self, set: &str) -> String {
        format!(
            "{set} lock_timeout = '{}ms';\n{set} statement_timeout = '{STATEMENT_TIMEOUT}';\n\
             {set} idle_in_transaction_session_timeout = '{STATEMENT_TIMEOUT}';\n",
            self.locks.timeout.as_millis().max(1)
        )
    }

    fn advisory_lock_sql(&self) -> String {
        self.migration_lock("pg_advisory_lock")
    }

    /// `function`: `pg_advisory_lock` for the session, `pg_advisory_xact_lock` for one
    /// transaction.
    fn migration_lock(&self, function: &str) -> String {
        format!(
            "SELECT {function}(hashtext('outbox-relay migrate ' || {}));",
            literal(&self.table.quoted())
        )
    }

    fn version_table_sql(&self) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {} (\n    table_name text PRIMARY KEY,\n    \
             version integer NOT NULL,\n    migrated_at timestamptz NOT NULL DEFAULT now()\n);",
            self.versions_table()
        )
    }

    fn record_version_sql(&self) -> String {
        format!(
            "INSERT INTO {} (table_name, version) VALUES ({}, {SCHEMA_VERSION})\n    \
             ON CONFLICT (table_name) DO UPDATE SET version = {SCHEMA_VERSION}, migrated_at = now();",
            self.versions_table(),
            literal(&self.table.name)
        )
    }

    /// The steps of `migrate` for a table of the default shape. Needs no database: every
    /// statement is idempotent (`IF NOT EXISTS`), and index validity is checked when run.
    pub fn migrate_plan(&self, keys: &[(KeyColumn, KeyIndex)]) -> Vec<Step> {
        let mut setup = String::new();
        if let Some(schema) = &self.table.schema {
            let _ = writeln!(
                setup,
                "CREATE SCHEMA IF NOT EXISTS {};",
                quote_ident(schema)
            );
        }
        setup.push_str(&self.version_table_sql());
        let mut steps = vec![Step::Transaction {
            what: "creating the schema version table".into(),
            sql: setup,
        }];
        let table = self.table.quoted();
        let names = [
            ("unsent_index", self.table.derived("unsent_idx")),
            ("quarantined_index", self.table.derived("quarantined_idx")),
            ("sent_index", self.table.derived("sent_idx")),
        ];
        let quoted: Vec<(&str, String)> = names.iter().map(|(k, n)| (*k, quote_ident(n))).collect();
        let mut values: Vec<(&str, &str)> = vec![("table", &table)];
        values.extend(quoted.iter().map(|(k, v)| (*k, v.as_str())));
        for statement in paragraphs(include_str!("../../sql/migrate_v1.sql")) {
            let sql = fill(&statement, &values);
            if is_index(&statement) {
                let name = names
                    .iter()
                    .find(|(k, _)| statement.contains(&format!("{{{k}}}")))
                    .map(|(_, n)| n.clone())
                    .expect("every index statement names its index");
                steps.push(Step::Index {
                    what: format!("building index {}", quote_ident(&name)),
                    index: self.table.qualify(&name),
                    sql,
                });
            } else {
                steps.push(Step::Transaction {
                    what: "creating the table".into(),
                    sql,
                });
            }
        }
        for (key, kind) in Self::with_default_index(keys) {
            let name = self.key_index_name(&key, kind);
            steps.push(self.key_index_step(&self.table, &name, &key_sql(&key, None), "id", kind));
            steps.extend(self.replaced_index_step(&self.table, &key, kind));
        }
        steps.push(Step::Transaction {
            what: "recording the schema version".into(),
            sql: self.record_version_sql(),
        });
        steps
    }

    fn key_index_step(
        &self,
        table: &TableName,
        name: &str,
        key: &str,
        id: &str,
        kind: KeyIndex,
    ) -> Step {
        let sql = fill(
            include_str!("../../sql/key_index.sql").trim_end(),
            &[
                ("index", &quote_ident(name)),
                ("table", &table.quoted()),
                ("key", key),
                ("id", id),
                ("predicate", kind.predicate()),
            ],
        );
        Step::Index {
            what: format!("building index {}", quote_ident(name)),
            index: table.qualify(name),
            sql,
        }
    }

    /// Drops the index `kind` replaced, once the new one is built: concurrently, so the
    /// application's writes go on; `IF EXISTS`, so a rerun or a fresh install skips it.
    fn replaced_index_step(
        &self,
        table: &TableName,
        key: &KeyColumn,
        kind: KeyIndex,
    ) -> Option<Step> {
        let old = self
            .table
            .derived(&format!("{}_{}_idx", kind.replaces()?, key.slug()));
        Some(Step::Unbounded {
            what: format!("dropping index {}, replaced", quote_ident(&old)),
            sql: format!("DROP INDEX CONCURRENTLY IF EXISTS {};", table.qualify(&old)),
        })
    }

    /// Creates or upgrades the table and its indexes, online (see the module's documentation).
    /// Safe to run again, after an interruption, and from several processes at once.
    pub async fn migrate(
        &self,
        keys: &[(KeyColumn, KeyIndex)],
    ) -> Result<MigrateReport, OutboxError> {
        let client = self.migration_session().await?;
        let found = self.read_version(&client).await?;
        if found > SCHEMA_VERSION {
            return Err(OutboxError::TooNew {
                table: self.table.quoted(),
                found,
            });
        }
        for step in self.migrate_plan(keys) {
            self.execute(&client, &step).await?;
        }
        Ok(MigrateReport {
            from: found,
            to: SCHEMA_VERSION,
        })
    }

    /// A connection holding the migration lock, with the session's timeouts set. The lock is
    /// the session's, not a transaction's, since a migration is many transactions; it goes
    /// with the connection, also when the process is killed.
    ///
    /// Through a pooler a session lock or setting would stay on a server connection (and the
    /// next statement may run on another one): there each step's transaction takes the lock
    /// and the timeouts for itself instead (`step_script`), and a build outside a transaction
    /// runs with the server's settings.
    pub(super) async fn migration_session(&self) -> Result<Conn, OutboxError> {
        let client = self.raw_connect().await?;
        if client.pooled() {
            return Ok(client);
        }
        // Waiting here is waiting for another migrate run: no timeout applies yet.
        client
            .batch_execute(&self.advisory_lock_sql())
            .await
            .map_err(query_err("taking the migration lock"))?;
        client
            .batch_execute(&self.session_settings())
            .await
            .map_err(query_err("setting the migration's timeouts"))?;
        Ok(client)
    }

    /// The schema version recorded for this table (0: none yet).
    async fn read_version(&self, client: &Conn) -> Result<i32, OutboxError> {
        let row = client
            .query_one(
                "SELECT to_regclass($1) IS NOT NULL",
                &[&self.versions_table()],
            )
            .await
            .map_err(query_err("looking up the schema version table"))?;
        if !row.get::<_, bool>(0) {
            return Ok(0);
        }
        Ok(client
            .query_opt(
                &format!(
                    "SELECT version FROM {} WHERE table_name = $1",
                    self.versions_table()
                ),
                &[&self.table.name],
            )
            .await
            .map_err(query_err("reading the schema version"))?
            .map(|r| r.get(0))
            .unwrap_or(0))
    }

    async fn execute(&self, client: &Conn, step: &Step) -> Result<(), OutboxError> {
        match step {
            Step::Transaction { what, sql } => self.with_lock_retries(client, what, sql).await,
            Step::Index { what, index, sql } => self.build_index(client, what, index, sql).await,
            Step::Backfill { base, sql } => self.backfill(client, base, sql).await,
            Step::Unbounded { sql, .. } => unbounded(client, sql)
                .await
                .map_err(query_err("validating the constraint")),
        }
    }

    /// Runs `sql` in one transaction under the lock policy.
    pub(super) async fn with_lock_retries(
        &self,
        client: &Conn,
        what: &str,
        sql: &str,
    ) -> Result<(), OutboxError> {
        let script = self.step_script(client, sql);
        self.retry_on_lock(what, || async {
            let result = client.batch_execute(&script).await;
            if result.is_err() {
                // The transaction is aborted (or was never opened); end it first.
                let _ = client.batch_execute("ROLLBACK").await;
            }
            result
        })
        .await
    }

    /// One step's transaction. Through a pooler it holds the migration lock and the timeouts
    /// itself, so that none of them outlives it on the server connection.
    fn step_script(&self, client: &Conn, sql: &str) -> String {
        if !client.pooled() {
            return format!("BEGIN;\n{sql}\nCOMMIT;");
        }
        format!(
            "BEGIN;\n{}{}\n{sql}\nCOMMIT;",
            self.transaction_settings(),
            self.migration_lock("pg_advisory_xact_lock")
        )
    }

    /// Runs `op` again after a pause when a lock was not granted within the lock timeout (or
    /// a deadlock chose it), up to the policy's number of tries; then one clear error.
    async fn retry_on_lock<T, F, Fut>(&self, what: &str, mut op: F) -> Result<T, OutboxError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let error = match op().await {
                Ok(done) => return Ok(done),
                Err(e) => e,
            };
            if !matches!(error.code().map(|c| c.code()), Some("55P03" | "40P01")) {
                return Err(OutboxError::Query {
                    context: "applying a migration step",
                    detail: format!("{what}: {}", super::describe(&error)),
                    source: error,
                });
            }
            if attempt >= self.locks.attempts {
                return Err(OutboxError::MigrationLock {
                    table: self.table.quoted(),
                    what: what.to_string(),
                    timeout: humantime::format_duration(self.locks.timeout).to_string(),
                    attempts: attempt,
                });
            }
            let pause = crate::retry::backoff(attempt, RETRY_BASE, RETRY_CAP, fastrand::f64());
            tracing::info!(
                step = what,
                attempt,
                pause_ms = pause.as_millis() as u64,
                "lock not granted within the lock timeout; trying again"
            );
            tokio::time::sleep(pause).await;
        }
    }

    /// Builds an index CONCURRENTLY unless a valid one of that name exists; an invalid one (an
    /// interrupted build) is dropped CONCURRENTLY first. Neither timeout applies: these lock
    /// the table only against other schema changes (SHARE UPDATE EXCLUSIVE), never against the
    /// application's writes, and they wait for older transactions to finish by design.
    async fn build_index(
        &self,
        client: &Conn,
        what: &str,
        index: &str,
        sql: &str,
    ) -> Result<(), OutboxError> {
        let valid = loop {
            let valid: Option<bool> = client
                .query_opt(
                    "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)",
                    &[&index],
                )
                .await
                .map_err(query_err("looking up an index"))?
                .map(|r| r.get(0));
            // Without the session's migration lock (through a pooler) an invalid index may be
            // another migrate's build in progress rather than an interrupted one: wait for it
            // to end instead of dropping it under that build.
            if valid == Some(false) && client.pooled() && index_in_progress(client, index).await? {
                tracing::info!(
                    index,
                    "another migrate is building this index; waiting for it"
                );
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            break valid;
        };
        match valid {
            Some(true) => return Ok(()),
            Some(false) => {
                tracing::info!(
                    index,
                    "dropping the invalid index an interrupted build left"
                );
                unbounded(
                    client,
                    &format!("DROP INDEX CONCURRENTLY IF EXISTS {index};"),
                )
                .await
                .map_err(query_err("dropping an invalid index"))?;
            }
            None => {}
        }
        tracing::info!("{what}");
        unbounded(client, sql)
            .await
            .map_err(query_err("building an index"))
    }

    /// Numbers the rows still without a sequence value, a page range per statement, until a
    /// pass over the whole table finds none (a row the application updated during a pass may
    /// have moved to a page the pass had done). Every statement is bounded, unlike one
    /// `EXISTS (… IS NULL)` over the whole table.
    async fn backfill(&self, client: &Conn, base: &str, template: &str) -> Result<(), OutboxError> {
        for pass in 1..=5 {
            let pages: i64 = client
                .query_one(
                    "SELECT pg_relation_size($1::text::regclass) / current_setting('block_size')::bigint",
                    &[&base],
                )
                .await
                .map_err(query_err("measuring the table"))?
                .get(0);
            let mut numbered = 0u64;
            let mut first = 0;
            while first < pages {
                let end = first + BACKFILL_PAGES;
                numbered += self
                    .retry_on_lock("numbering existing rows", || async move {
                        if client.pooled() {
                            return client
                                .execute_in_transaction(
                                    &self.transaction_settings(),
                                    template,
                                    &[&first, &end],
                                )
                                .await;
                        }
                        client.execute(template, &[&first, &end]).await
                    })
                    .await?;
                first = end;
            }
            tracing::info!(pass, pages, numbered, "backfill pass done");
            if numbered == 0 {
                return Ok(());
            }
        }
        // Rows still unnumbered make the validation below fail with PostgreSQL's message;
        // running migrate again resumes here.
        Ok(())
    }
}

/// Whether a backend is building `index` now (its role's own builds, or any with
/// pg_read_all_stats).
async fn index_in_progress(client: &Conn, index: &str) -> Result<bool, OutboxError> {
    Ok(client
        .query_one(
            "SELECT EXISTS (SELECT FROM pg_stat_progress_create_index WHERE index_relid = to_regclass($1))",
            &[&index],
        )
        .await
        .map_err(query_err("looking for an index build in progress"))?
        .get(0))
}

/// A statement outside any transaction with both timeouts off, then the session's back.
/// Through a pooler the statement runs alone with the server's settings: a SET around it
/// could stay on the server connection for the application's sessions.
async fn unbounded(client: &Conn, sql: &str) -> Result<(), tokio_postgres::Error> {
    if client.pooled() {
        return client.batch_execute(sql).await;
    }
    client
        .batch_execute("SET lock_timeout = 0; SET statement_timeout = 0")
        .await?;
    let result = client.batch_execute(sql).await;
    let restore = client
        .batch_execute("RESET lock_timeout; RESET statement_timeout")
        .await;
    result?;
    restore
}

impl Outbox {
    /// The steps of `migrate --adopt` for `state`. `types` are the table's columns from the
    /// catalog; without them (`--print-sql` without a database) text-like types are assumed.
    fn adopt_plan(
        &self,
        base: &TableName,
        map: &ColumnMap,
        keys: &[(KeyColumn, KeyIndex)],
        columns: Option<&[Column]>,
        state: &AdoptState,
    ) -> Result<Vec<Step>, OutboxError> {
        let view = self.table.quoted();
        let base_q = base.quoted();
        let seq = quote_ident(&map.id);
        let sequence = base.qualify(&self.table.derived("seq"));
        let backfill_sequence = base.qualify(&self.table.derived("backfill_seq"));
        let check = quote_ident(&self.table.derived("seq_not_null"));
        let try_jsonb = base.qualify(&self.table.derived("try_jsonb"));
        let exprs = view_expressions(base, map, columns, &try_jsonb)?;
        let values: Vec<(&str, String)> = vec![
            ("base", base_q.clone()),
            ("base_literal", literal(&base_q)),
            ("seq", seq.clone()),
            ("sequence", sequence.clone()),
            ("sequence_literal", literal(&sequence)),
            ("backfill_sequence", backfill_sequence.clone()),
            ("backfill_sequence_literal", literal(&backfill_sequence)),
            ("check", check),
            ("blocks", BACKFILL_PAGES.to_string()),
            ("view", view),
            ("view_columns", exprs.view_columns.clone()),
            ("seq_index", quote_ident(&self.table.derived("seq_idx"))),
            (
                "unsent_index",
                quote_ident(&self.table.derived("unsent_idx")),
            ),
            (
                "quarantined_index",
                quote_ident(&self.table.derived("quarantined_idx")),
            ),
            ("sent_index", quote_ident(&self.table.derived("sent_idx"))),
            ("try_jsonb", try_jsonb),
        ];
        let values: Vec<(&str, &str)> = values.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let render = |template: &str| -> Vec<String> {
            paragraphs(template)
                .iter()
                .map(|p| fill(p, &values))
                .collect()
        };

        let mut steps = vec![Step::Transaction {
            what: "creating the schema version table".into(),
            sql: self.version_table_sql(),
        }];
        let mut first = String::new();
        if state.columns_missing {
            first.push_str(&render(include_str!("../../sql/adopt_columns.sql")).join("\n\n"));
        }
        if state.needs_sequence {
            if !first.is_empty() {
                first.push_str("\n\n");
            }
            first.push_str(&render(include_str!("../../sql/adopt_sequence.sql")).join("\n\n"));
        }
        if !first.is_empty() {
            steps.push(Step::Transaction {
                what: "adding the relay's columns".into(),
                sql: first,
            });
        }
        if state.nullable {
            let backfill = render(include_str!("../../sql/adopt_backfill.sql"));
            steps.push(Step::Backfill {
                base: base_q.clone(),
                sql: backfill.join("\n"),
            });
            let mut not_null = render(include_str!("../../sql/adopt_not_null.sql")).into_iter();
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
                sql: render(include_str!("../../sql/adopt_try_jsonb.sql")).join("\n\n"),
            });
        }
        let last = render(include_str!("../../sql/adopt.sql"));
        let index_names = [
            self.table.derived("seq_idx"),
            self.table.derived("unsent_idx"),
            self.table.derived("quarantined_idx"),
            self.table.derived("sent_idx"),
        ];
        let mut names = index_names.iter();
        for statement in last {
            if is_index(&statement) {
                let name = names.next().expect("adopt.sql: four indexes");
                steps.push(Step::Index {
                    what: format!("building index {}", quote_ident(name)),
                    index: base.qualify(name),
                    sql: statement,
                });
            } else {
                for (key, kind) in Self::with_default_index(keys) {
                    let expression = match &key {
                        KeyColumn::AggregateId => exprs.aggregate_id.clone(),
                        KeyColumn::AggregateType => exprs.aggregate_type.clone(),
                        KeyColumn::EventType => exprs.event_type.clone(),
                        KeyColumn::Header(name) => format!(
                            "coalesce({} ->> '{}', '')",
                            exprs.headers,
                            name.replace('\'', "''")
                        ),
                    };
                    let name = self.key_index_name(&key, kind);
                    steps.push(self.key_index_step(
                        base,
                        &name,
                        &format!("({expression})"),
                        &seq,
                        kind,
                    ));
                    steps.extend(self.replaced_index_step(base, &key, kind));
                }
                steps.push(Step::Transaction {
                    what: "creating the relay's view".into(),
                    sql: statement,
                });
            }
        }
        steps.push(Step::Transaction {
            what: "recording the schema version".into(),
            sql: self.record_version_sql(),
        });
        Ok(steps)
    }

    /// The table's columns, or `TableMissing`.
    async fn read_columns(
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

    async fn read_adopt_state(
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
                        &[&base.qualify(&self.table.derived("backfill_seq"))],
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
                &[&base.quoted(), &self.table.derived("seq_not_null")],
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

    /// `migrate --adopt`: makes an existing outbox table relayable without changing the
    /// application's columns or writes, and without blocking them for longer than a lock
    /// timeout. `self` is built on the view the relay will read (`TableName::relay_view`).
    pub async fn adopt(
        &self,
        base: &TableName,
        map: &ColumnMap,
        keys: &[(KeyColumn, KeyIndex)],
    ) -> Result<MigrateReport, OutboxError> {
        let client = self.migration_session().await?;
        let columns = self.read_columns(&client, base).await?;
        let state = self.read_adopt_state(&client, base, map, &columns).await?;
        let steps = self.adopt_plan(base, map, keys, Some(&columns), &state)?;
        let found = self.read_version(&client).await?;
        for step in steps {
            self.execute(&client, &step).await?;
        }
        Ok(MigrateReport {
            from: found,
            to: SCHEMA_VERSION,
        })
    }

    /// The statements `migrate --adopt` would execute, planned from the catalog (the column
    /// types, what an earlier run already did); reads only.
    pub async fn adopt_sql(
        &self,
        base: &TableName,
        map: &ColumnMap,
        keys: &[(KeyColumn, KeyIndex)],
    ) -> Result<String, OutboxError> {
        let client = self.raw_connect().await?;
        let columns = self.read_columns(&client, base).await?;
        let state = self.read_adopt_state(&client, base, map, &columns).await?;
        let steps = self.adopt_plan(base, map, keys, Some(&columns), &state)?;
        Ok(format!(
            "-- outbox-relay migrate --adopt: column types and progress read from the catalog\n{}",
            self.render(&steps)
        ))
    }

    /// The statements `migrate --adopt` would execute on a table the relay never touched,
    /// without a database: the application's columns are taken as text-like, payload and
    /// headers as jsonb (a uuid or varchar column would be read through a cast instead).
    pub fn adopt_sql_assumed(
        &self,
        base: &TableName,
        map: &ColumnMap,
        keys: &[(KeyColumn, KeyIndex)],
    ) -> Result<String, OutboxError> {
        let steps = self.adopt_plan(base, map, keys, None, &AdoptState::fresh())?;
        Ok(format!(
            "-- outbox-relay migrate --adopt: no database given; the application's columns are\n\
             -- assumed text-like (payload and headers jsonb) and nothing adopted yet\n{}",
            self.render(&steps)
        ))
    }

    /// The statements `migrate` would execute; needs no database.
    pub fn migrate_sql(&self, keys: &[(KeyColumn, KeyIndex)]) -> String {
        let mut out = String::from("-- outbox-relay migrate\n");
        out.push_str(&self.render(&self.migrate_plan(keys)));
        out
    }

    /// Steps as one SQL script, with the session settings and transactions a run uses.
    pub fn render(&self, steps: &[Step]) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "{}", self.advisory_lock_sql());
        out.push_str(&self.session_settings());
        for step in steps {
            out.push('\n');
            match step {
                Step::Transaction { what, sql } => {
                    let _ = writeln!(
                        out,
                        "-- {what}: one transaction; a lock not granted within lock_timeout is tried again \
                         (at most {} tries)\nBEGIN;\n{sql}\nCOMMIT;",
                        self.locks.attempts
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
        out
    }
}

/// How the view exposes the application's columns under the standard names.
struct ViewExpressions {
    view_columns: String,
    aggregate_id: String,
    aggregate_type: String,
    event_type: String,
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
        let steps = o.migrate_plan(&[]);
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
            assert!(index.starts_with("\"app\"."), "{index}");
        }
        assert!(
            matches!(steps.last(), Some(Step::Transaction { what, .. }) if what.contains("version"))
        );
        let sql = o.migrate_sql(&[]);
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
        let text = o.render(&steps);
        assert!(
            text.contains("ADD COLUMN IF NOT EXISTS \"outbox_seq\" bigint,"),
            "{text}"
        );
        assert!(
            !text.contains("IDENTITY"),
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
                // The last "validate": dropping the fair index schema version 1 named `key_`.
                "tx", "tx", "backfill", "tx", "validate", "tx", "index", "index", "index", "index",
                "index", "index", "validate", "tx", "tx"
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
        let text = o.render(&o.adopt_plan(&base, &debezium(), &[], None, &done).unwrap());
        assert!(!text.contains("ALTER TABLE"), "{text}");
        assert!(!text.contains("UPDATE \"outboxevent\""), "{text}");
        let resumed = AdoptState {
            columns_missing: false,
            needs_sequence: false,
            nullable: true,
            has_check: true,
        };
        let text = o.render(
            &o.adopt_plan(&base, &debezium(), &[], None, &resumed)
                .unwrap(),
        );
        assert!(!text.contains("ADD COLUMN"), "{text}");
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
        let text = o.render(&plan(&columns));
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
        let text = o.render(&plan(&columns));
        assert!(text.contains("\"headers\" AS headers"), "{text}");
        assert!(!text.contains("FUNCTION"), "jsonb needs no reader: {text}");
    }

    #[test]
    fn names_with_quotes_stay_quoted_in_literals() {
        let o = outbox("we'ird_relay");
        let base: TableName = "we'ird".parse().unwrap();
        let text = o.render(
            &o.adopt_plan(&base, &debezium(), &[], None, &AdoptState::fresh())
                .unwrap(),
        );
        assert!(text.contains("nextval('\"we''ird_relay_seq\"')"), "{text}");
    }
}
