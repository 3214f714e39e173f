//! The [`Outbox`]: one table as the relay reaches it, built once per command from the validated
//! settings ([`Outbox::from_config`]). The layer between the connections below (`connector`)
//! and the hot path and commands above, which use it through its accessors.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::dbauth::PasswordSource;
use crate::row::KeyColumn;
use crate::version::{self, Contract, Verdict};

use super::claim::{ClaimLimits, ClaimStrategy, OrderScope};
use super::conn::Conn;
use super::connector::Connector;
use super::error::{query_err, OutboxError};
use super::floors::Floors;
use super::ident::{KeyIndex, TableName};
use super::pooler::Pooler;
use super::settings::{DatabaseConfig, LockPolicy};
use super::settle::Acknowledge;
use super::statements::Statements;

/// What a command asks of the outbox besides where it is ([`Outbox::from_config`]).
#[derive(Debug, Clone)]
pub enum Purpose {
    /// `status` and `quarantine`: one-shot reads and re-drives with the defaults.
    Admin,
    /// `migrate`: how its steps wait for the locks that block the application's writes.
    Migrate(LockPolicy),
    /// `run`, and `check`, which tries what `run` will do.
    Relay(RelaySettings),
}

/// How `run` claims and settles rows.
#[derive(Debug, Clone)]
pub struct RelaySettings {
    /// Acknowledged rows are deleted rather than marked sent (`--retention 0`).
    pub delete_on_ack: bool,
    /// The deadline of every round trip (`--db-timeout`), and the sockets' keepalives.
    pub round_trip: Duration,
    /// Which rows claims quarantine instead of leasing.
    pub limits: ClaimLimits,
    /// How claims choose rows.
    pub strategy: ClaimStrategy,
}

/// One outbox table as the relay reaches it: its connector, its statements and where its
/// scans start, with what a command set (claim strategy, acknowledgement, lock policy). Every
/// field is this file's: the rest of `outbox` asks through the accessors below.
#[derive(Debug)]
pub struct Outbox {
    table: TableName,
    /// An adopted table behind the relay's view `table`: where triggers and publications go.
    base: Option<TableName>,
    connector: Connector,
    statements: Statements,
    /// What acknowledged rows become: marked sent, or deleted.
    acknowledge: Acknowledge,
    strategy: ClaimStrategy,
    /// Which rows claims quarantine instead of leasing (too large, out of attempts).
    limits: ClaimLimits,
    /// How `migrate` takes the locks that block the application's writes.
    locks: LockPolicy,
    /// The latest contract read from the schema (at a new connection, or a renewal).
    observed: Observed,
    /// Where this relay's scans of the table start; shared by its connections to it.
    floors: Arc<Floors>,
}

impl Outbox {
    /// Parses the URL (no I/O). `connect_timeout` bounds each connection attempt.
    pub fn new(
        database_url: &str,
        table: TableName,
        connect_timeout: Duration,
    ) -> Result<Self, OutboxError> {
        Ok(Outbox {
            connector: Connector::new(database_url, connect_timeout)?,
            statements: Statements::new(&table)?,
            table,
            base: None,
            acknowledge: Acknowledge::MarkSent,
            strategy: ClaimStrategy::Plain,
            limits: ClaimLimits::default(),
            locks: LockPolicy::default(),
            observed: Observed::default(),
            floors: Arc::default(),
        })
    }

    /// The outbox a command uses: the one place the validated database settings and what the
    /// command needs become an [`Outbox`]. Reads the TLS files the settings name.
    pub fn from_config(database: &DatabaseConfig, purpose: Purpose) -> Result<Self, OutboxError> {
        let outbox = Outbox::new(
            &database.url.0,
            database.table.clone(),
            database.connect_timeout,
        )?
        .adopted_from(database.adopted.as_ref().map(|(base, _)| base.clone()))
        .password_source(database.password.clone())
        .pooler(database.pooler);
        match purpose {
            Purpose::Admin => Ok(outbox),
            Purpose::Migrate(locks) => Ok(outbox.migration_locks(locks)),
            Purpose::Relay(relay) => outbox
                .delete_on_ack(relay.delete_on_ack)
                .round_trip_deadline(relay.round_trip)
                .claim_limits(relay.limits)
                .claim_strategy(relay.strategy),
        }
    }

    /// The pooler mode `other` (an outbox of the same database) detected, so that it is not
    /// detected (and logged) twice.
    pub fn pooler_as(mut self, other: &Outbox) -> Self {
        self.connector = self.connector.pooler_as(&other.connector);
        self
    }

    /// This table's connections skip read-only hosts once `other`'s learnt to, and use the
    /// pooler mode it detected (they share connections: a relay serving several tables).
    pub fn sharing_hosts_with(mut self, other: &Outbox) -> Self {
        self.connector = self.connector.sharing_hosts_with(&other.connector);
        self
    }

    /// Chooses how claims pick rows (ordered per group, fair across keys).
    pub fn claim_strategy(mut self, strategy: ClaimStrategy) -> Result<Self, OutboxError> {
        self.statements.claiming(&self.table, &strategy)?;
        self.strategy = strategy;
        Ok(self)
    }

    /// Rows too large to hold, or out of attempts, are quarantined by the claim itself.
    pub fn claim_limits(mut self, limits: ClaimLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Delete rows once SQS acknowledged them instead of marking them sent: no history, but no
    /// bloat and the cheapest settlement (see docs/benchmarks.md).
    pub fn delete_on_ack(mut self, yes: bool) -> Self {
        self.acknowledge = if yes {
            Acknowledge::Delete
        } else {
            Acknowledge::MarkSent
        };
        self
    }

    /// Where new connections take their password from; the URL's own by default.
    pub fn password_source(mut self, source: PasswordSource) -> Self {
        self.connector = self.connector.password_source(source);
        self
    }

    /// The table whose rows the relay reads: an adopted table's base table, or the table.
    pub fn base_or_table(&self) -> &TableName {
        self.base.as_ref().unwrap_or(&self.table)
    }

    /// The relay reads `table`, a view over this adopted table (`migrate --adopt`).
    pub fn adopted_from(mut self, base: Option<TableName>) -> Self {
        self.base = base;
        self
    }

    /// Every round trip of `run` gets this deadline, and the relay's sockets keepalives and a
    /// `tcp_user_timeout` derived from it where the URL sets none (see `liveness`).
    pub fn round_trip_deadline(mut self, deadline: Duration) -> Self {
        self.connector = self.connector.round_trip_deadline(deadline);
        self.statements
            .bounded(&self.table, deadline)
            .expect("sql/claim_deadline.sql renders (src/outbox/rendered.rs)");
        self
    }

    /// How `migrate` waits for locks that block writes (lock timeout, tries).
    pub fn migration_locks(mut self, locks: LockPolicy) -> Self {
        self.locks = locks;
        self
    }

    /// A connection pooler between the relay and PostgreSQL: nothing may stay on a server
    /// connection (see `pooler`).
    pub fn pooler(mut self, pooler: Pooler) -> Self {
        self.connector = self.connector.pooler(pooler);
        self
    }

    pub fn table(&self) -> &TableName {
        &self.table
    }

    /// Where this relay's scans of the table start (src/outbox/floors.rs).
    pub fn floors(&self) -> &std::sync::Arc<Floors> {
        &self.floors
    }

    /// How this table's connections are opened.
    pub fn connector(&self) -> &Connector {
        &self.connector
    }

    /// The table's statements, as rendered for this strategy.
    pub(super) fn statements(&self) -> &Statements {
        &self.statements
    }

    /// What acknowledged rows become.
    pub(super) fn acknowledge(&self) -> Acknowledge {
        self.acknowledge
    }

    /// How claims choose rows.
    pub fn strategy(&self) -> &ClaimStrategy {
        &self.strategy
    }

    /// Which rows claims quarantine instead of leasing.
    pub(super) fn limits(&self) -> &ClaimLimits {
        &self.limits
    }

    /// How `migrate` takes the locks that block the application's writes.
    pub(super) fn locks(&self) -> &LockPolicy {
        &self.locks
    }

    /// The latest contract read from the schema.
    pub(super) fn observed(&self) -> &Observed {
        &self.observed
    }

    /// The adopted table behind the relay's view, if the table was adopted.
    pub(super) fn base(&self) -> Option<&TableName> {
        self.base.as_ref()
    }

    /// A new connection to the table's database; nothing of the table is checked.
    pub(super) async fn raw_connect(&self) -> Result<Conn, OutboxError> {
        self.connector.raw_connect().await
    }

    /// `run`'s deadline for one round trip, if it set one.
    pub(crate) fn round_trip(&self) -> Option<Duration> {
        self.connector.round_trip()
    }
}

/// This relay's verdict on the latest contract it read, and when: every new connection and
/// every renewal reads it, and the latest read is the one that counts. Judged when read, so
/// the claim loop's look before each claim is a lock and a copy.
#[derive(Debug, Default)]
pub(super) struct Observed(Mutex<Option<(Verdict, Instant)>>);

impl Observed {
    pub(super) fn record(&self, contract: &Contract) {
        let verdict = version::judge(version::this_relay(), contract);
        *self.0.lock().expect("contract lock") = Some((verdict, Instant::now()));
    }

    pub(super) fn latest(&self) -> Option<(Verdict, Instant)> {
        self.0.lock().expect("contract lock").clone()
    }
}

/// Connecting: the checks a new connection makes of the table (its key indexes, its wake-up
/// channel).
impl Outbox {
    /// The lease table and the (key, id) indexes the claim mode needs; without the indexes
    /// every claim would scan the backlog, so their absence stops the start-up with the
    /// command that creates them.
    pub(super) async fn check_key_indexes(&self, client: &Conn) -> Result<(), OutboxError> {
        let mut needed = Vec::new();
        if let Some(o) = self.strategy.ordered() {
            let [order, pending] = KeyIndex::for_groups(o.by);
            needed.push((&o.key, order, "--group-by"));
            // The ordered claim's `others` walks the groups with unsent rows in this index.
            if o.scope == OrderScope::Every {
                needed.push((&o.key, pending, "--group-by"));
            }
        }
        if let Some(k) = self.strategy.fair() {
            needed.push((k, KeyIndex::Fair, "--fair-by"));
        }
        let claims = self.table.claims();
        let found = client
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[&claims.quoted()])
            .await
            .map_err(query_err("looking up the lease table"))?;
        if !found.get::<_, bool>(0) {
            return Err(OutboxError::ClaimsTableMissing {
                table: self.table.to_string(),
                claims: claims.to_string(),
            });
        }
        if !self.has_column(client, "dedup_id").await? {
            return Err(OutboxError::DedupColumnMissing {
                table: self.table.to_string(),
            });
        }
        for (key, kind, flag) in needed {
            let index = self.table.qualify(&self.key_index_name(key, kind));
            let found = client
                .query_one("SELECT to_regclass($1) IS NOT NULL", &[&index])
                .await
                .map_err(query_err("looking up the key index"))?;
            if !found.get::<_, bool>(0) {
                return Err(OutboxError::KeyIndexMissing {
                    table: self.table.to_string(),
                    key: key.to_string(),
                    flag,
                    order: kind.order_by().migrate_flag(),
                });
            }
        }
        Ok(())
    }

    /// Whether the table (or adopted table's view) has `column`: what an older install lacks.
    pub(crate) async fn has_column(
        &self,
        client: &Conn,
        column: &str,
    ) -> Result<bool, OutboxError> {
        self.has_column_in(client, &self.table, column).await
    }

    /// Whether `table` (one of the relay's, beside the outbox) exists and has `column`.
    pub(crate) async fn has_column_in(
        &self,
        client: &Conn,
        table: &TableName,
        column: &str,
    ) -> Result<bool, OutboxError> {
        Ok(client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_attribute \
                 WHERE attrelid = to_regclass($1) AND attname = $2 AND NOT attisdropped)",
                &[&table.quoted(), &column],
            )
            .await
            .map_err(query_err("looking up a column of the table"))?
            .get(0))
    }

    pub(super) fn key_index_name(&self, key: &KeyColumn, kind: KeyIndex) -> String {
        self.table
            .derived(&format!("{}_{}_idx", kind.prefix(), key.slug()))
    }

    /// The table's wake-up channel (and publication) name; fails clearly when the table is
    /// missing, or hidden by the search_path.
    pub(super) async fn resolve_channel(&self, client: &Conn) -> Result<String, OutboxError> {
        let row = client
            .query_opt(RESOLVE_TABLE, &[&self.table.quoted()])
            .await;
        match self.channel(row) {
            Err(OutboxError::TableMissing(_)) => Err(self.missing(client).await),
            other => other,
        }
    }

    /// The publication's name: the table's wake-up channel name, unique per table in a
    /// database (publications are not schema-qualified).
    /// On a connection of the caller's own (tools, tests).
    pub async fn publication_name(
        &self,
        client: &tokio_postgres::Client,
    ) -> Result<String, OutboxError> {
        self.channel(
            client
                .query_opt(RESOLVE_TABLE, &[&self.table.quoted()])
                .await,
        )
    }

    /// The channel name from sql/resolve_table.sql's answer.
    fn channel(
        &self,
        row: Result<Option<tokio_postgres::Row>, tokio_postgres::Error>,
    ) -> Result<String, OutboxError> {
        match row.map_err(query_err("looking up the outbox table"))? {
            Some(row) if row.get::<_, bool>(1) => {
                Err(OutboxError::Partitioned(self.table.quoted()))
            }
            Some(row) => Ok(row.get(0)),
            None => Err(OutboxError::TableMissing(self.table.quoted())),
        }
    }
}

/// The table's channel name, or no row when the table is missing.
const RESOLVE_TABLE: &str = include_str!("../../sql/resolve_table.sql");

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbox::claim::Ordered;
    use crate::outbox::columns::ColumnMap;
    use crate::outbox::selection::Selection;
    use crate::outbox::settings::Secret;

    #[test]
    fn statements_quote_the_table_and_keep_values_as_parameters() {
        let t: TableName = "app.\"out\"\"box\"".parse().unwrap();
        let outbox =
            Outbox::new("postgres://u:p@127.0.0.1:5/db", t, Duration::from_secs(1)).unwrap();
        assert!(outbox
            .statements
            .claim
            .contains("FROM \"app\".\"out\"\"box\""));
        assert!(outbox.statements.claim.contains("LIMIT $1"));
        assert!(!outbox.statements.claim.contains("{table}"));
        let migration = outbox.migrate_sql(&[]).unwrap();
        for placeholder in [
            "{table}",
            "{unsent_index}",
            "{quarantined_index}",
            "{sent_index}",
        ] {
            assert!(
                !migration.contains(placeholder),
                "{placeholder} left in the migration"
            );
        }
        assert!(
            migration.contains("CREATE INDEX CONCURRENTLY IF NOT EXISTS \"out\"\"box_unsent_idx\"")
        );
        // The key indexes replace those of earlier versions: built first, then the old ones
        // dropped.
        for (index, replaced) in [
            ("unsent_aggregate_id", "key_aggregate_id"),
            ("unsent_aggregate_id", "pending_aggregate_id"),
            ("ordered_aggregate_id", "order_aggregate_id"),
        ] {
            let built = migration
                .find(&format!("IF NOT EXISTS \"out\"\"box_{index}_idx\""))
                .expect(index);
            let dropped = migration
                .find(&format!(
                    "DROP INDEX CONCURRENTLY IF EXISTS \"app\".\"out\"\"box_{replaced}_idx\";"
                ))
                .expect(replaced);
            assert!(built < dropped, "{migration}");
        }
    }

    #[test]
    fn every_claim_strategy_renders_with_its_parking_statements() {
        for skip_poison in [false, true] {
            let strategy = ClaimStrategy::OrderedFair {
                ordered: Ordered {
                    key: "header:tenant".parse().unwrap(),
                    routing: Default::default(),
                    skip_poison,
                    scope: OrderScope::Every,
                    by: Default::default(),
                },
                fair: KeyColumn::EventType,
            };
            let outbox = Outbox::new(
                "postgres://u:p@127.0.0.1:5/db",
                "app.outbox".parse().unwrap(),
                Duration::from_secs(1),
            )
            .unwrap()
            .claim_strategy(strategy)
            .unwrap();
            assert_eq!(outbox.statements.park_blocked.is_some(), !skip_poison);
            for sql in [&outbox.statements.claim]
                .into_iter()
                .chain(outbox.statements.park_blocked.iter())
                .chain(outbox.statements.unpark_blocked.iter())
            {
                assert!(sql.contains("\"app\".\"outbox\""), "{sql}");
            }
        }
    }

    #[test]
    fn from_config_gives_each_purpose_what_it_asks_for_and_the_adopted_table_always() {
        let database = DatabaseConfig {
            url: Secret("postgres://relay@127.0.0.1:5/db".into()),
            table: "app.outboxevent_relay".parse().unwrap(),
            selection: Selection {
                named: vec!["app.outboxevent".parse().unwrap()],
                patterns: vec![],
            },
            connect_timeout: Duration::from_secs(3),
            adopted: Some((
                "app.outboxevent".parse().unwrap(),
                ColumnMap::from_pairs(&[("event_id".into(), "id".into())]).unwrap(),
            )),
            password: PasswordSource::Url,
            pooler: Pooler::Transaction,
        };
        let admin = Outbox::from_config(&database, Purpose::Admin).unwrap();
        assert_eq!(
            admin.base.as_ref().map(TableName::quoted).as_deref(),
            Some("\"app\".\"outboxevent\"")
        );
        assert_eq!(admin.connector.pooler_in_use(), Pooler::Transaction);
        assert_eq!(
            admin.connector.config().get_connect_timeout(),
            Some(&Duration::from_secs(3))
        );
        assert_eq!(admin.round_trip(), None);
        assert_eq!(admin.acknowledge, Acknowledge::MarkSent);

        let locks = LockPolicy {
            timeout: Duration::from_millis(250),
            attempts: 7,
        };
        let migrate = Outbox::from_config(&database, Purpose::Migrate(locks)).unwrap();
        assert_eq!(migrate.locks.attempts, 7);
        assert_eq!(migrate.locks.timeout, Duration::from_millis(250));

        let limits = ClaimLimits {
            max_payload_bytes: 4096,
            max_attempts: 3,
        };
        let strategy = ClaimStrategy::new(
            Some(Ordered {
                key: KeyColumn::AggregateId,
                routing: Default::default(),
                skip_poison: false,
                scope: OrderScope::Every,
                by: Default::default(),
            }),
            None,
        );
        let relay = Outbox::from_config(
            &database,
            Purpose::Relay(RelaySettings {
                delete_on_ack: true,
                round_trip: Duration::from_secs(2),
                limits,
                strategy: strategy.clone(),
            }),
        )
        .unwrap();
        assert_eq!(relay.acknowledge, Acknowledge::Delete);
        assert_eq!(relay.round_trip(), Some(Duration::from_secs(2)));
        assert_eq!(relay.limits, limits);
        assert_eq!(relay.strategy, strategy);
        assert!(
            relay.statements.park_blocked.is_some(),
            "blocking order parks"
        );
        assert_eq!(
            relay.base.as_ref().map(TableName::quoted).as_deref(),
            Some("\"app\".\"outboxevent\"")
        );
    }

    #[test]
    fn the_connection_target_never_shows_the_password() {
        let outbox = Outbox::new(
            "postgres://relay:s3cret-pw@db.internal:6543/app",
            "outbox".parse().unwrap(),
            Duration::from_secs(1),
        )
        .unwrap();
        assert_eq!(outbox.connector.target(), "db.internal:6543/app");
        assert!(!format!("{outbox:?}").contains("s3cret-pw"));
    }
}
