//! The only owner of SQL: the outbox table's shape, claims, settlements and statistics.
//!
//! Every statement that names the table is rendered once from a file in `sql/` by
//! [`template`], which quotes every identifier and refuses a placeholder left over; every
//! value is a bind parameter.
//!
//! - this file: the [`Outbox`] (connection settings, the table's statements).
//! - `error`: what fails, and which failures are transient.
//! - `ident`: the table name and the names derived from it, key columns as SQL.
//! - `template`: the one SQL template renderer.
//! - `claim`: claim strategies (plain, fair, ordered, ordered + fair), their SQL and parameters.
//! - `session`: a connection with the relay's prepared statements; claims and settlements.
//! - `upkeep`: statistics and maintenance on a connection of their own, each under a timeout.
//! - `pooler`: `--pooler`, what a connection pooler in between allows; `conn`: one connection
//!   used as it allows (prepared or unnamed statements, per-transaction settings).
//! - `decode`: a claimed row read column by column; what cannot be read is `Unreadable`.
//! - `listen`: `--wakeup notify`'s LISTEN connection.
//! - `liveness`: round-trip deadlines, keepalives, and which failures replace a connection.
//! - `admin`: `quarantine list` and `quarantine retry`.
//! - `columns`: an adopted table's column map.
//! - `search_path`: which table an unqualified `--table` reaches, and the others of its name.
//! - `settings`: the validated database settings an [`Outbox`] is built from.
//! - [`schema`]: `migrate` and `migrate --adopt`, online (lock timeouts, concurrent indexes).
//! - `wakeup`: the `--wakeup` modes and what each installs (trigger, publication).
//! - `doorbell`: the `logical` mode's replication-protocol client.
//! - [`inspect`], `status`: the catalog facts `check` judges, and `status`.
//! - `fleet`: the relay registry `<table>_relays` and the schema's contract (who may claim).
//! - `floors`: where a relay's scans of a table start, so they seek past settled rows.
//! - `order_by`: `--order-by`, what "earlier" means within a group, as SQL fragments.
//! - `selection`: which tables a command serves (`--table`, `--tables` patterns, discovery).
//! - `shared`: one connection the sessions of several tables share.
//! - `watch`: the look a relay serving several tables takes at all of them at once.
//! - `rendered` (tests only): every statement as rendered, kept whole in `sql/rendered/`.

use std::str::FromStr;
use std::time::Duration;

use crate::dbauth::{PasswordSource, Passwords};
use crate::row::KeyColumn;
use crate::tls::{PgTls, PgTlsStream};

mod admin;
mod claim;
mod columns;
mod conn;
mod decode;
mod doorbell;
mod error;
mod fleet;
mod floors;
mod ident;
pub mod inspect;
mod listen;
pub(crate) mod liveness;
mod order_by;
mod pooler;
#[cfg(test)]
mod rendered;
pub mod schema;
mod search_path;
mod selection;
mod session;
mod settings;
mod shared;
mod status;
mod template;
mod upkeep;
mod wakeup;
mod watch;

use ident::key_sql;
use template::{render, Value};

pub use admin::{QuarantineEntry, Redriven, ReplaySelection, Replayed, RetrySelection};
pub use claim::{ClaimLimits, ClaimRequest, ClaimStrategy, OrderScope, Ordered};
pub use columns::ColumnMap;
pub use conn::Conn;
pub(crate) use error::query_err;
pub use error::{describe, sqlstate_is_transient, OutboxError};
pub use fleet::{LiveRelay, Registration, Renewed};
pub use floors::{Floors, FULL_RETENTION_PASS};
pub use ident::{quote_ident, KeyIndex, TableName};
pub use liveness::{reconnect_delay, replacement, Replace};
pub use order_by::{OrderBy, NOT_ON_ADOPTED, XACT_COLUMN};
pub use pooler::Pooler;
pub use schema::LockPolicy;
pub use search_path::Resolved;
pub use selection::{Pattern, Selection};
pub use session::{RelayStatement, Session, SharedSession, Stats, PLANS};
pub use settings::{DatabaseConfig, Secret};
pub use shared::SharedConn;
pub use status::{worst_first, TableReport, TableStatus};
pub use upkeep::{extrapolate, Count, Swept, Upkeep, STATS_EXACT_UP_TO};
pub use wakeup::{Installed, Wakeup};
pub use watch::{Answer, Look, Watch};

/// Schema version this build creates and understands, recorded in `outbox_relay_schema` by
/// `migrate` once every step of it is done (see [`schema`]); what it needs to claim is the
/// compatibility contract's ([`crate::version`]).
pub const SCHEMA_VERSION: i32 = crate::version::NEEDS_SCHEMA;

/// The table's statements with its quoted name filled in; built once.
#[derive(Debug)]
struct Sql {
    claim: String,
    /// Ordered delivery with poison blocking: park and unpark rows behind quarantined heads.
    park_blocked: Option<String>,
    unpark_blocked: Option<String>,
    /// Runs before every claim, in its transaction: claims of the table one at a time.
    claim_lock: String,
    /// A claim's outcomes in one statement, acknowledged rows marked sent (sql/settle.sql).
    settle_mark: SettleSql,
    /// The same, acknowledged rows deleted.
    settle_delete: SettleSql,
    /// Which rows of a settlement whose claim is gone another claim holds.
    lost_leases: String,
    /// Rows parked for their destination whose time has come become unsent again.
    unpark_destination: String,
    stats: String,
    probe: String,
    /// The floors' safety net: an unsent row below the rows' floor (src/outbox/floors.rs).
    sweep: String,
    /// A relay's claims that it gave up on and does not hold (sql/release_orphans.sql).
    release_orphans: String,
    delete_expired: String,
    quarantine_list: String,
    quarantine_retry: String,
}

/// One acknowledgement mode's settlement statements.
#[derive(Debug)]
struct SettleSql {
    /// Every kind of outcome.
    full: String,
    /// Every row acknowledged (the usual settlement): the same without the given-back and
    /// parked parts, a cheaper plan.
    sent_only: String,
}

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

/// How to reach the outbox: connection settings and the table's statements.
#[derive(Debug)]
pub struct Outbox {
    table: TableName,
    /// An adopted table behind the relay's view `table`: where triggers and publications go.
    base: Option<TableName>,
    pg: tokio_postgres::Config,
    /// Where each new connection's password comes from (the URL, a file, an IAM token).
    passwords: Passwords,
    /// The handshake `sslmode` asks for; tokio-postgres alone cannot verify certificates.
    tls: PgTls,
    sql: Sql,
    /// What acknowledged rows become: marked sent, or deleted.
    acknowledge: session::Acknowledge,
    strategy: ClaimStrategy,
    /// Which rows claims quarantine instead of leasing (too large, out of attempts).
    limits: claim::ClaimLimits,
    /// How `migrate` takes the locks that block the application's writes.
    locks: LockPolicy,
    /// `run`'s deadline for one round trip (`--db-timeout`); `None` for the one-shot commands.
    round_trip: Option<Duration>,
    /// Set once a server refused a write as read-only (SQLSTATE 25006): from then on new
    /// connections skip read-only hosts, as `target_session_attrs=read-write` would.
    /// Shared by the tables of a relay serving several ([`Outbox::sharing_hosts_with`]): they
    /// share connections, so what one learnt of a host holds for all.
    writable_only: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Whether server connections are shared with other clients (a pooler in between), as
    /// configured (`--pooler`).
    pooler: Pooler,
    /// The mode in use, once the first connection decided it (see `pooler`).
    pooler_detected: std::sync::OnceLock<Pooler>,
    /// The latest contract read from the schema (at a new connection, or a renewal).
    observed: fleet::Observed,
    /// Where this relay's scans of the table start; shared by its connections to it.
    floors: std::sync::Arc<Floors>,
}

impl Outbox {
    /// Parses the URL (no I/O). `connect_timeout` bounds each connection attempt.
    pub fn new(
        database_url: &str,
        table: TableName,
        connect_timeout: Duration,
    ) -> Result<Self, OutboxError> {
        let (database_url, tls) =
            crate::tls::split(database_url).map_err(OutboxError::InvalidUrl)?;
        // describe() reaches the cause ("unknown option `sslcert`"); its own text is only
        // "invalid connection string". Neither quotes the password.
        let mut pg = tokio_postgres::Config::from_str(&database_url)
            .map_err(|e| OutboxError::InvalidUrl(describe(&e)))?;
        pg.ssl_mode(tls.effective_mode().map_err(OutboxError::Tls)?.wire());
        let tls = PgTls::new(&tls).map_err(OutboxError::Tls)?;
        if pg.get_connect_timeout().is_none() {
            pg.connect_timeout(connect_timeout);
        }
        if pg.get_application_name().is_none() {
            pg.application_name(crate::version::application_name());
        }
        let claims = table.claims();
        let fill = |template: &str| {
            render(
                template,
                &[
                    ("table", Value::Table(&table)),
                    ("claims", Value::Table(&claims)),
                    ("claims_literal", Value::TableLiteral(&claims)),
                ],
            )
            .map_err(OutboxError::Template)
        };
        // The message ids of rows marked sent come last: $12 after the others' parameters, $4
        // without them.
        let settle = |acknowledge: &str| {
            let statement = |message_ids: &str, others: &str, (r, q): (&str, &str)| {
                let acknowledge = render(
                    acknowledge,
                    &[
                        ("table", Value::Table(&table)),
                        ("message_ids", Value::Sql(message_ids)),
                    ],
                )?;
                render(
                    include_str!("../sql/settle.sql"),
                    &[
                        ("table", Value::Table(&table)),
                        ("claims", Value::Table(&claims)),
                        ("acknowledge", Value::Sql(&acknowledge)),
                        ("others", Value::Sql(others)),
                        ("rescheduled", Value::Sql(r)),
                        ("quarantined", Value::Sql(q)),
                    ],
                )
            };
            let others = format!(
                ",\n{}",
                render(
                    include_str!("../sql/settle_others.sql"),
                    &[("table", Value::Table(&table))]
                )
                .map_err(OutboxError::Template)?
                .trim_end()
            );
            let full = statement(
                "$12",
                &others,
                (
                    "ARRAY(SELECT id FROM rescheduled)",
                    "ARRAY(SELECT id FROM quarantined)",
                ),
            );
            let none = "'{}'::bigint[]";
            let sent_only = statement("$4", "", (none, none));
            Ok::<_, OutboxError>(SettleSql {
                full: full.map_err(OutboxError::Template)?,
                sent_only: sent_only.map_err(OutboxError::Template)?,
            })
        };
        let sql = Sql {
            claim: ClaimStrategy::Plain
                .sql(&table)
                .map_err(OutboxError::Template)?,
            park_blocked: None,
            unpark_blocked: None,
            claim_lock: fill(include_str!("../sql/claim_lock.sql"))?,
            settle_mark: settle(include_str!("../sql/settle_mark.sql"))?,
            settle_delete: settle(include_str!("../sql/settle_delete.sql"))?,
            lost_leases: fill(include_str!("../sql/lost_leases.sql"))?,
            unpark_destination: fill(include_str!("../sql/unpark_destination.sql"))?,
            stats: stats_sql(&table, OrderBy::Id)?,
            probe: probe_sql(&table, OrderBy::Id)?,
            sweep: fill(include_str!("../sql/sweep.sql"))?,
            release_orphans: fill(include_str!("../sql/release_orphans.sql"))?,
            delete_expired: fill(include_str!("../sql/delete_expired.sql"))?,
            quarantine_list: fill(include_str!("../sql/quarantine_list.sql"))?,
            quarantine_retry: fill(include_str!("../sql/quarantine_retry.sql"))?,
        };
        Ok(Outbox {
            table,
            base: None,
            pg,
            passwords: Passwords::default(),
            tls,
            sql,
            acknowledge: session::Acknowledge::MarkSent,
            strategy: ClaimStrategy::Plain,
            limits: claim::ClaimLimits::default(),
            locks: LockPolicy::default(),
            round_trip: None,
            writable_only: std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
            pooler: Pooler::Auto,
            pooler_detected: std::sync::OnceLock::new(),
            observed: fleet::Observed::default(),
            floors: std::sync::Arc::default(),
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

    /// This table's connections skip read-only hosts once `other`'s learnt to (they share
    /// connections: a relay serving several tables).
    pub fn sharing_hosts_with(mut self, other: &Outbox) -> Self {
        self.writable_only = std::sync::Arc::clone(&other.writable_only);
        self
    }

    /// Chooses how claims pick rows (ordered per group, fair across keys).
    pub fn claim_strategy(mut self, strategy: ClaimStrategy) -> Result<Self, OutboxError> {
        let table = &self.table;
        self.sql.claim = strategy.sql(table).map_err(OutboxError::Template)?;
        let blocking = strategy.ordered().filter(|o| !o.skip_poison);
        let claims = table.claims();
        let park = |template: &str, aliases: [&str; 2]| {
            let (a, b) = (aliases[0], aliases[1]);
            let ordered = blocking.expect("blocking");
            let key = &ordered.key;
            // Every claim's rows, expired or not: a claim that ended may still be settling.
            let leased_ids = render(
                "SELECT unnest(l.ids) FROM {claims} AS l",
                &[("claims", Value::Table(&claims))],
            )
            .map_err(OutboxError::Template)?;
            let in_flight =
                claim::in_flight(table, ordered, &leased_ids).map_err(OutboxError::Template)?;
            let nothing_in_flight =
                claim::nothing_in_flight(ordered, b).map_err(OutboxError::Template)?;
            render(
                template,
                &[
                    ("table", Value::Table(table)),
                    ("claims", Value::Table(&claims)),
                    ("in_flight", Value::Sql(&in_flight)),
                    (
                        &format!("nothing_in_flight_{b}"),
                        Value::Sql(&nothing_in_flight),
                    ),
                    (&format!("key_{a}"), Value::Sql(&key_sql(key, Some(a)))),
                    (&format!("key_{b}"), Value::Sql(&key_sql(key, Some(b)))),
                    (
                        &format!("dest_{a}"),
                        Value::Sql(
                            &claim::destination_sql(ordered, a).map_err(OutboxError::Template)?,
                        ),
                    ),
                    (
                        &format!("dest_{b}"),
                        Value::Sql(
                            &claim::destination_sql(ordered, b).map_err(OutboxError::Template)?,
                        ),
                    ),
                    (
                        "ordered_o",
                        Value::Sql(&claim::fifo_bound(&ordered.scope, "o", "$1")),
                    ),
                    (&format!("carried_{a}"), Value::Sql(&ordered.by.carried(a))),
                    (
                        &format!("order_{a}"),
                        Value::Sql(&ordered.by.columns(Some(a))),
                    ),
                    (
                        &format!("position_{a}"),
                        Value::Sql(&ordered.by.position(a)),
                    ),
                    (
                        &format!("position_{b}"),
                        Value::Sql(&ordered.by.position(b)),
                    ),
                    ("position_head", Value::Sql(&ordered.by.position("head"))),
                ],
            )
            .map_err(OutboxError::Template)
        };
        if blocking.is_some() {
            self.sql.park_blocked =
                Some(park(include_str!("../sql/park_blocked.sql"), ["q", "o"])?);
            self.sql.unpark_blocked =
                Some(park(include_str!("../sql/unpark_blocked.sql"), ["p", "o"])?);
        } else {
            self.sql.park_blocked = None;
            self.sql.unpark_blocked = None;
        }
        self.sql.probe = probe_sql(table, strategy.order_by())?;
        self.sql.stats = stats_sql(table, strategy.order_by())?;
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
            session::Acknowledge::Delete
        } else {
            session::Acknowledge::MarkSent
        };
        self
    }

    /// Where new connections take their password from; the URL's own by default.
    pub fn password_source(mut self, source: PasswordSource) -> Self {
        self.passwords = Passwords::new(source);
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
        liveness::apply_keepalives(&mut self.pg, deadline);
        self.round_trip = Some(deadline);
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
        self.pooler = pooler;
        self
    }

    pub fn table(&self) -> &TableName {
        &self.table
    }

    /// Where this relay's scans of the table start (src/outbox/floors.rs).
    pub fn floors(&self) -> &std::sync::Arc<Floors> {
        &self.floors
    }

    /// Where we connect, for messages: host and port, never the password.
    pub fn target(&self) -> String {
        use tokio_postgres::config::Host;
        let host = match self.pg.get_hosts().first() {
            Some(Host::Tcp(h)) => h.clone(),
            Some(Host::Unix(p)) => p.display().to_string(),
            None => "localhost".to_string(),
        };
        let port = self.pg.get_ports().first().copied().unwrap_or(5432);
        let db = self.pg.get_dbname().unwrap_or("(default database)");
        format!("{host}:{port}/{db}")
    }
}

/// The idle relay's look for work (sql/probe.sql): rows an order holds back are not work yet.
/// Its parameters: the rows' floor, then the claims' (src/outbox/floors.rs).
fn probe_sql(table: &TableName, by: OrderBy) -> Result<String, OutboxError> {
    probe_sql_with(table, by, ("$1::bigint", "$2::bigint"))
}

/// The probe with the floors as the SQL `floors` gives: parameters of its own, or one table's
/// elements of the many-table look's arrays (sql/watch.sql).
fn probe_sql_with(
    table: &TableName,
    by: OrderBy,
    (floor, claims_floor): (&str, &str),
) -> Result<String, OutboxError> {
    let claims = table.claims();
    render(
        include_str!("../sql/probe.sql"),
        &[
            ("table", Value::Table(table)),
            ("claims", Value::Table(&claims)),
            ("released", Value::Sql(&by.released(None))),
            ("floor", Value::Sql(floor)),
            ("claims_floor", Value::Sql(claims_floor)),
        ],
    )
    .map_err(OutboxError::Template)
}

/// The gauges (sql/stats.sql); under transaction order also the first unsent rows the claims'
/// watermark holds back, and the age of the oldest of them.
fn stats_sql(table: &TableName, by: OrderBy) -> Result<String, OutboxError> {
    let (carried, watermark) = match by {
        OrderBy::Id => (String::new(), "0::bigint, 0::float8".to_string()),
        OrderBy::Transaction => {
            let held = format!("FROM unsent_head WHERE NOT {}", by.released(None));
            (
                format!(", {XACT_COLUMN}"),
                format!(
                    "(SELECT count(*) {held}), \
                     coalesce(greatest(extract(epoch FROM now() - (SELECT min(created_at) {held})), 0)::float8, 0)"
                ),
            )
        }
    };
    render(
        include_str!("../sql/stats.sql"),
        &[
            ("table", Value::Table(table)),
            ("carried", Value::Sql(&carried)),
            ("watermark", Value::Sql(&watermark)),
        ],
    )
    .map_err(OutboxError::Template)
}

/// Connecting: the handshake within its bound, the session's settings, and the checks a new
/// connection makes of the table (its key indexes, its wake-up channel).
impl Outbox {
    /// Connects within the connect timeout. tokio-postgres applies its own timeout to the TCP
    /// connect only; a server that accepts and then never answers would hang the start-up
    /// handshake, so the whole handshake is bounded here.
    async fn open(
        &self,
    ) -> Result<
        (
            tokio_postgres::Client,
            tokio_postgres::Connection<tokio_postgres::Socket, PgTlsStream<tokio_postgres::Socket>>,
        ),
        OutboxError,
    > {
        let limit = self
            .pg
            .get_connect_timeout()
            .copied()
            .unwrap_or(Duration::from_secs(10));
        // The password is fetched within the limit too: a token needs credentials, which may
        // come from the network (web identity, container or instance roles).
        let connect = async {
            let pg = self.connect_settings().await?;
            pg.connect(self.tls.clone()).await.map_err(|e| {
                let (target, reason) = (self.target(), describe(&e));
                match error::connect_rejected(&e) {
                    true => OutboxError::Rejected { target, reason },
                    false => OutboxError::Connect { target, reason },
                }
            })
        };
        match tokio::time::timeout(limit, connect).await {
            Ok(result) => result,
            Err(_) => Err(OutboxError::Connect {
                target: self.target(),
                reason: format!(
                    "no answer within {} (--connect-timeout)",
                    humantime::format_duration(limit)
                ),
            }),
        }
    }

    /// The connection settings for one new connection, with its password fetched now.
    async fn connect_settings(
        &self,
    ) -> Result<std::borrow::Cow<'_, tokio_postgres::Config>, OutboxError> {
        let mut pg = self
            .passwords
            .apply(&self.pg)
            .await
            .map_err(|e| OutboxError::Connect {
                target: self.target(),
                reason: e.to_string(),
            })?;
        use tokio_postgres::config::TargetSessionAttrs;
        if self
            .writable_only
            .load(std::sync::atomic::Ordering::Relaxed)
            && pg.get_target_session_attrs() == TargetSessionAttrs::Any
        {
            pg.to_mut()
                .target_session_attrs(TargetSessionAttrs::ReadWrite);
        }
        Ok(pg)
    }

    async fn raw_connect(&self) -> Result<Conn, OutboxError> {
        let (client, connection) = self.open().await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "database connection ended");
            }
        });
        let pooler = self.detect_pooler(&client).await?;
        let conn = Conn::new(client, pooler).with_deadline(self.round_trip);
        if !pooler.pooled() {
            conn.batch_execute(&conn::session_baseline(self.round_trip))
                .await
                .map_err(query_err("setting up the relay's session"))?;
        }
        Ok(conn)
    }

    /// The lease table and the (key, id) indexes the claim mode needs; without the indexes
    /// every claim would scan the backlog, so their absence stops the start-up with the
    /// command that creates them.
    async fn check_key_indexes(&self, client: &Conn) -> Result<(), OutboxError> {
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

    fn key_index_name(&self, key: &KeyColumn, kind: KeyIndex) -> String {
        self.table
            .derived(&format!("{}_{}_idx", kind.prefix(), key.slug()))
    }

    /// The table's wake-up channel (and publication) name; fails clearly when the table is
    /// missing, or hidden by the search_path.
    async fn resolve_channel(&self, client: &Conn) -> Result<String, OutboxError> {
        let row = client
            .query_opt(RESOLVE_TABLE, &[&self.table.quoted()])
            .await;
        match self.channel(row) {
            Err(OutboxError::TableMissing(_)) => Err(self.missing(client).await),
            other => other,
        }
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
const RESOLVE_TABLE: &str = include_str!("../sql/resolve_table.sql");

/// Result of `migrate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigrateReport {
    pub from: i32,
    pub to: i32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_quote_the_table_and_keep_values_as_parameters() {
        let t: TableName = "app.\"out\"\"box\"".parse().unwrap();
        let outbox =
            Outbox::new("postgres://u:p@127.0.0.1:5/db", t, Duration::from_secs(1)).unwrap();
        assert!(outbox.sql.claim.contains("FROM \"app\".\"out\"\"box\""));
        assert!(outbox.sql.claim.contains("LIMIT $1"));
        assert!(!outbox.sql.claim.contains("{table}"));
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
            assert_eq!(outbox.sql.park_blocked.is_some(), !skip_poison);
            for sql in [&outbox.sql.claim]
                .into_iter()
                .chain(outbox.sql.park_blocked.iter())
                .chain(outbox.sql.unpark_blocked.iter())
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
        assert_eq!(admin.pooler, Pooler::Transaction);
        assert_eq!(
            admin.pg.get_connect_timeout(),
            Some(&Duration::from_secs(3))
        );
        assert_eq!(admin.round_trip, None);
        assert_eq!(admin.acknowledge, session::Acknowledge::MarkSent);

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
        assert_eq!(relay.acknowledge, session::Acknowledge::Delete);
        assert_eq!(relay.round_trip, Some(Duration::from_secs(2)));
        assert_eq!(relay.limits, limits);
        assert_eq!(relay.strategy, strategy);
        assert!(relay.sql.park_blocked.is_some(), "blocking order parks");
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
        assert_eq!(outbox.target(), "db.internal:6543/app");
        assert!(!format!("{outbox:?}").contains("s3cret-pw"));
    }
}
