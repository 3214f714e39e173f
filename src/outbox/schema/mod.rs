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
//!
//! - `plan`: the steps of `migrate` and `migrate --adopt`, and their text (`--print-sql`).
//! - `apply`: running the steps: the migration lock, lock retries, concurrent builds, backfill.
//! - `catalog`: what the catalog says is there: the version, an adopted table's columns.
//! - `wakeup`: what each `--wakeup` mode installs (the NOTIFY trigger, the publication), and
//!   what is installed now.

use std::time::Duration;

use super::columns::ColumnMap;
use super::error::OutboxError;
use super::ident::{KeyIndex, TableName};
use super::store::Outbox;
use crate::row::KeyColumn;

mod apply;
mod catalog;
mod plan;
mod wakeup;

/// Schema version this build creates and understands, recorded in `outbox_relay_schema` by
/// `migrate` once every step of it is done (see [`schema`]); what it needs to claim is the
/// compatibility contract's ([`crate::version`]).
pub const SCHEMA_VERSION: i32 = crate::version::NEEDS_SCHEMA;

/// Result of `migrate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigrateReport {
    pub from: i32,
    pub to: i32,
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
    /// Statements in one short transaction under the lock policy. `what` says what the step
    /// does, in logs, errors and `--print-sql`.
    Transaction { what: String, sql: String },
    /// `CREATE [UNIQUE] INDEX CONCURRENTLY IF NOT EXISTS`; `index` is looked up in
    /// `pg_index` to skip a valid index and drop an invalid one first.
    Index {
        what: String,
        index: TableName,
        sql: String,
    },
    /// Numbers an adopted table's existing rows, page range by page range, until a pass over
    /// the whole table finds none left; `base`'s size says how many ranges a pass has, `sql`
    /// numbers one range ($1, $2: first page, end page).
    Backfill { base: TableName, sql: String },
    /// A long statement under a lock that lets writes through (VALIDATE CONSTRAINT): neither
    /// timeout applies.
    Unbounded { what: String, sql: String },
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

impl Outbox {
    /// Creates or upgrades the table and its indexes, online (see the module's documentation).
    /// Safe to run again, after an interruption, and from several processes at once.
    pub async fn migrate(
        &self,
        keys: &[(KeyColumn, KeyIndex)],
    ) -> Result<MigrateReport, OutboxError> {
        let client = self.migration_session().await?;
        let base = self.base_or_table();
        let partitioned: bool = client
            .query_one(
                include_str!("../../../sql/partitioned.sql"),
                &[&base.quoted()],
            )
            .await
            .map_err(crate::outbox::error::query_err(
                "looking up the outbox table",
            ))?
            .get(0);
        if partitioned {
            return Err(OutboxError::Partitioned(base.quoted()));
        }
        let found = self.read_version(&client).await?;
        if found > SCHEMA_VERSION {
            return Err(OutboxError::TooNew {
                table: self.table().quoted(),
                found,
            });
        }
        for step in self.migrate_plan(keys)? {
            self.execute(&client, &step).await?;
        }
        Ok(MigrateReport {
            from: found,
            to: SCHEMA_VERSION,
        })
    }

    /// `migrate --contract`: removes what no relay of [`crate::version::CONTRACTED`] reads any
    /// longer (the lease columns of schema version 1), once no relay it excludes may be alive.
    /// The requirement is recorded first, so that a relay of another version that starts
    /// meanwhile refuses to claim; the fleet is looked at before and after it. Returns the
    /// requirement now recorded.
    pub async fn contract(&self) -> Result<String, OutboxError> {
        if self.base().is_some() {
            return Err(OutboxError::ContractAdopted(self.table().quoted()));
        }
        let client = self.migration_session().await?;
        let contract = self.read_contract(&client).await?;
        if contract.schema < SCHEMA_VERSION {
            return Err(OutboxError::Refused(self.refusal(
                crate::version::Verdict::Migrate {
                    found: contract.schema,
                },
            )));
        }
        if contract.schema > SCHEMA_VERSION {
            return Err(OutboxError::TooNew {
                table: self.table().quoted(),
                found: contract.schema,
            });
        }
        let requirement = crate::version::raised(
            contract
                .relay_versions
                .as_ref()
                .map(ToString::to_string)
                .as_deref(),
            crate::version::CONTRACTED,
        );
        let req = semver::VersionReq::parse(&requirement).map_err(|e| {
            OutboxError::Contract(format!("the relay versions {requirement:?}: {e}"))
        })?;
        let blocked = |blockers: Vec<String>| OutboxError::ContractBlocked {
            table: self.table().quoted(),
            requirement: requirement.clone(),
            blockers: blockers.join(", "),
        };
        let blockers = self.contract_blockers(&client, &req).await?;
        if !blockers.is_empty() {
            return Err(blocked(blockers));
        }
        self.execute(
            &client,
            &Step::Transaction {
                what: "recording the relay versions that may claim".into(),
                sql: self.record_contract_sql(&requirement)?,
            },
        )
        .await?;
        // A relay of before that started between the look and the record reads no requirement.
        let blockers = self.contract_blockers(&client, &req).await?;
        if !blockers.is_empty() {
            return Err(blocked(blockers));
        }
        self.execute(&client, &self.contract_drop_step()?).await?;
        Ok(requirement)
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
            self.render(&steps)?
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
            self.render(&steps)?
        ))
    }

    /// The statements `migrate` would execute; needs no database.
    pub fn migrate_sql(&self, keys: &[(KeyColumn, KeyIndex)]) -> Result<String, OutboxError> {
        let mut out = String::from("-- outbox-relay migrate\n");
        out.push_str(&self.render(&self.migrate_plan(keys)?)?);
        Ok(out)
    }
}
