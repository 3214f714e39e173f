//! Running a migration's steps: the migration lock, lock retries, concurrent builds, backfill.

use std::time::Duration;

use tokio_postgres::error::SqlState;

use super::catalog::{index_in_progress, index_validity};
use super::plan::{DROP_INDEX, SESSION_LOCK, TRANSACTION_LOCK};
use super::{Step, BACKFILL_PAGES, RETRY_BASE, RETRY_CAP};
use crate::outbox::conn::{Access, Conn};
use crate::outbox::error::{query_err, OutboxError};
use crate::outbox::ident::TableName;
use crate::outbox::store::Outbox;
use crate::outbox::template::{render, Value};

impl Outbox {
    /// A connection holding the migration lock, with the session's timeouts set. The lock is
    /// the session's, not a transaction's, since a migration is many transactions; it goes
    /// with the connection, also when the process is killed.
    ///
    /// Through a pooler a session lock or setting would stay on a server connection (and the
    /// next statement may run on another one): there each step's transaction takes the lock
    /// and the timeouts for itself instead (`step_script`), and a build outside a transaction
    /// runs with the server's settings.
    pub(in crate::outbox) async fn migration_session(&self) -> Result<Conn, OutboxError> {
        let client = self.raw_connect().await?;
        if client.pooled() {
            return Ok(client);
        }
        // Waiting here is waiting for another migrate run: no timeout applies yet.
        client
            .batch_execute(&self.migration_lock(SESSION_LOCK)?)
            .await
            .map_err(query_err("taking the migration lock"))?;
        client
            .batch_execute(&self.session_settings())
            .await
            .map_err(query_err("setting the migration's timeouts"))?;
        Ok(client)
    }

    pub(super) async fn execute(&self, client: &Conn, step: &Step) -> Result<(), OutboxError> {
        match step {
            Step::Transaction { what, sql } => self.with_lock_retries(client, what, sql).await,
            Step::Index { what, index, sql } => self.build_index(client, what, index, sql).await,
            Step::Backfill { base, sql } => self.backfill(client, base, sql).await,
            Step::Unbounded { sql, .. } => unbounded(client, sql, &self.session_settings())
                .await
                .map_err(query_err("validating the constraint")),
        }
    }

    /// Runs `sql` in one transaction under the lock policy.
    pub(in crate::outbox) async fn with_lock_retries(
        &self,
        client: &Conn,
        what: &str,
        sql: &str,
    ) -> Result<(), OutboxError> {
        let script = self.step_script(client, sql)?;
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
    fn step_script(&self, client: &Conn, sql: &str) -> Result<String, OutboxError> {
        if !client.pooled() {
            return Ok(format!("{};\n{sql}\nCOMMIT;", Access::Write.begin()));
        }
        Ok(format!(
            "{};\n{}{}\n{sql}\nCOMMIT;",
            Access::Write.begin(),
            self.transaction_settings(),
            self.migration_lock(TRANSACTION_LOCK)?
        ))
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
            if !lock_not_granted(error.code()) {
                return Err(OutboxError::Query {
                    context: "applying a migration step",
                    detail: format!("{what}: {}", crate::outbox::error::describe(&error)),
                    source: error,
                });
            }
            if attempt >= self.locks().attempts {
                return Err(OutboxError::MigrationLock {
                    table: self.table().quoted(),
                    what: what.to_string(),
                    timeout: humantime::format_duration(self.locks().timeout).to_string(),
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
        index: &TableName,
        sql: &str,
    ) -> Result<(), OutboxError> {
        let drop =
            render(DROP_INDEX, &[("index", Value::Table(index))]).map_err(OutboxError::Template)?;
        let index = index.quoted();
        let index = index.as_str();
        let valid = loop {
            let valid = index_validity(client, index).await?;
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
                unbounded(client, &drop, &self.session_settings())
                    .await
                    .map_err(query_err("dropping an invalid index"))?;
            }
            None => {}
        }
        tracing::info!("{what}");
        unbounded(client, sql, &self.session_settings())
            .await
            .map_err(query_err("building an index"))
    }

    /// Numbers the rows still without a sequence value, a page range per statement, until a
    /// pass over the whole table finds none (a row the application updated during a pass may
    /// have moved to a page the pass had done). Every statement is bounded, unlike one
    /// `EXISTS (… IS NULL)` over the whole table.
    async fn backfill(
        &self,
        client: &Conn,
        base: &TableName,
        template: &str,
    ) -> Result<(), OutboxError> {
        let base = base.quoted();
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

/// Whether a step failed only for want of a lock: not granted within `lock_timeout`, or
/// chosen as a deadlock's victim. Such a step is tried again; any other failure is final.
fn lock_not_granted(code: Option<&SqlState>) -> bool {
    matches!(
        code,
        Some(&(SqlState::LOCK_NOT_AVAILABLE | SqlState::T_R_DEADLOCK_DETECTED))
    )
}

/// A statement outside any transaction with both timeouts off, then the session's back
/// (`session`, the migration's own: a RESET would go back to the role's, which may be a
/// `statement_timeout` of 50 ms). Through a pooler the statement runs alone with the server's
/// settings: a SET around it could stay on the server connection for the application's
/// sessions.
async fn unbounded(client: &Conn, sql: &str, session: &str) -> Result<(), tokio_postgres::Error> {
    if client.pooled() {
        return client.batch_execute(sql).await;
    }
    client
        .batch_execute("SET lock_timeout = 0; SET statement_timeout = 0")
        .await?;
    let result = client.batch_execute(sql).await;
    let restore = client.batch_execute(session).await;
    result?;
    restore
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_lock_not_granted_is_tried_again() {
        assert!(lock_not_granted(Some(&SqlState::LOCK_NOT_AVAILABLE)));
        assert!(lock_not_granted(Some(&SqlState::T_R_DEADLOCK_DETECTED)));
        for final_ in [
            SqlState::QUERY_CANCELED,
            SqlState::INSUFFICIENT_PRIVILEGE,
            SqlState::T_R_SERIALIZATION_FAILURE,
            SqlState::from_code("55P04"),
        ] {
            assert!(!lock_not_granted(Some(&final_)), "{final_:?}");
        }
        assert!(
            !lock_not_granted(None),
            "a lost connection is not a lock wait"
        );
    }
}
