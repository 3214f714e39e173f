//! The only owner of SQL: the outbox table's shape, claims, settlements and statistics.
//!
//! Every statement that names the table is built once from a file in `sql/`, with the table
//! name quoted as an identifier; every value is a bind parameter.
//!
//! - this file: connections, claims, settlements, statistics, quarantine commands.
//! - [`schema`]: `migrate` and `migrate --adopt`, online (lock timeouts, concurrent indexes).
//! - `wakeup`: the `--wakeup` modes and what each installs (trigger, publication).
//! - `doorbell`: the `logical` mode's replication-protocol client.
//! - [`inspect`], `status`: the catalog facts `check` judges, and `status`.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::Mutex;
use tokio_postgres::{AsyncMessage, Client, Statement};

use crate::batch::KeyColumn;
use crate::tls::{PgTls, PgTlsStream};

mod doorbell;
pub mod inspect;
pub mod schema;
mod status;
mod wakeup;

pub use schema::LockPolicy;
pub use status::TableStatus;
pub use wakeup::{Installed, Wakeup};

/// Schema version this build creates and understands, recorded in `outbox_relay_schema` by
/// `migrate` once every step of it is done (see [`schema`]).
pub const SCHEMA_VERSION: i32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    #[error("DATABASE_URL is not a valid PostgreSQL URL or key=value string: {0}")]
    InvalidUrl(String),
    #[error("cannot connect to PostgreSQL at {target}: {reason}")]
    Connect { target: String, reason: String },
    /// TLS settings that cannot work (verification without a CA, an unreadable CA file).
    #[error("{0}")]
    Tls(String),
    /// The chosen `--wakeup` cannot work against this database as it is.
    #[error("{0}")]
    Wakeup(String),
    #[error("table {0} does not exist: run `outbox-relay migrate` with the same --table, or fix --table")]
    TableMissing(String),
    #[error("the index for {key} is missing on {table}: run `outbox-relay migrate --table {table} {flag} {key}`")]
    KeyIndexMissing {
        table: String,
        key: String,
        flag: &'static str,
    },
    #[error("table {table} has no column {column:?} for {relay}: fix --column {relay}=COLUMN")]
    AdoptColumn {
        table: String,
        relay: String,
        column: String,
    },
    #[error("column {column:?} of {table} has a default of its own but allows NULLs: make it NOT NULL, or let migrate --adopt add a column of its own (--column id=NEW_NAME)")]
    AdoptSequence { table: String, column: String },
    #[error("table {table} is at schema version {found}, newer than this relay understands ({SCHEMA_VERSION}); upgrade the relay")]
    TooNew { table: String, found: i32 },
    /// A migration step kept finding its table locked by other transactions.
    #[error("migrate gave up {what} on {table}: the lock was not granted within {timeout} in {attempts} tries (a long transaction holds it; see pg_stat_activity); run migrate again later (it resumes where it stopped) or raise --lock-timeout")]
    MigrationLock {
        table: String,
        what: String,
        timeout: String,
        attempts: u32,
    },
    #[error("{context}: {detail}")]
    Query {
        context: &'static str,
        /// The server's message and SQLSTATE, or the client-side cause; never the password.
        detail: String,
        #[source]
        source: tokio_postgres::Error,
    },
    /// A failure on the logical-decoding doorbell's replication connection.
    #[error("{context}: {detail}")]
    Replication {
        context: &'static str,
        /// The server's message and SQLSTATE, or what happened to the connection.
        detail: String,
        /// The server's SQLSTATE; `None` when the connection itself failed.
        code: Option<String>,
    },
}

impl OutboxError {
    /// Will the same work likely succeed if retried after a pause? Connection trouble and the
    /// server's transient states are; anything else (a missing table, a permission, a bug)
    /// needs a person, so it is logged as an error while the relay keeps backing off.
    pub fn is_transient(&self) -> bool {
        match self {
            OutboxError::Connect { .. } => true,
            OutboxError::Query { source, .. } => match source.code() {
                Some(code) => sqlstate_is_transient(code.code()),
                // No SQLSTATE: the failure is on the connection, not in the statement.
                None => true,
            },
            OutboxError::Replication { code, .. } => match code {
                Some(code) => sqlstate_is_transient(code),
                None => true,
            },
            _ => false,
        }
    }
}

/// SQLSTATEs worth retrying as they are: connection exceptions (class 08), serialization
/// failure and deadlock (40001, 40P01), the server shutting down or starting (57P01–57P03),
/// too many connections (53300), lock and statement timeouts (55P03, 57014), and running out
/// of memory or disk (53100, 53200), which an operator fixes without the relay restarting.
pub fn sqlstate_is_transient(code: &str) -> bool {
    code.starts_with("08")
        || matches!(
            code,
            "40001"
                | "40P01"
                | "57P01"
                | "57P02"
                | "57P03"
                | "53300"
                | "55P03"
                | "57014"
                | "53100"
                | "53200"
        )
}

fn query_err(context: &'static str) -> impl FnOnce(tokio_postgres::Error) -> OutboxError {
    move |source| OutboxError::Query {
        context,
        detail: describe(&source),
        source,
    }
}

/// tokio-postgres displays a server error as just "db error"; the useful part (message and
/// SQLSTATE) is in its source, and a client-side error's cause is further down the chain.
pub fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{} (SQLSTATE {})", db.message(), db.code().code());
    }
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// A possibly schema-qualified table name from configuration.
///
/// Parts are separated by dots outside double quotes; a part in double quotes may contain dots
/// and doubled quotes. Parts are used exactly as written (case-sensitive) and always quoted
/// when they reach SQL, so no configuration value is ever spliced into SQL raw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableName {
    pub schema: Option<String>,
    pub name: String,
}

/// PostgreSQL truncates identifiers beyond this many bytes, which could silently merge names.
const MAX_IDENTIFIER_BYTES: usize = 63;

impl FromStr for TableName {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut chars = s.chars().peekable();
        loop {
            let mut part = String::new();
            if chars.peek() == Some(&'"') {
                chars.next();
                loop {
                    match chars.next() {
                        Some('"') if chars.peek() == Some(&'"') => {
                            chars.next();
                            part.push('"');
                        }
                        Some('"') => break,
                        Some(c) => part.push(c),
                        None => return Err(format!("--table {s:?}: unterminated double quote")),
                    }
                }
                if !matches!(chars.peek(), None | Some('.')) {
                    return Err(format!("--table {s:?}: expected a dot after a quoted name"));
                }
            } else {
                while let Some(&c) = chars.peek() {
                    if c == '.' {
                        break;
                    }
                    part.push(c);
                    chars.next();
                }
            }
            if part.is_empty() {
                return Err(format!("--table {s:?}: empty name part"));
            }
            if part.len() > MAX_IDENTIFIER_BYTES {
                return Err(format!(
                    "--table {s:?}: a name part is longer than PostgreSQL's {MAX_IDENTIFIER_BYTES} bytes"
                ));
            }
            if part.contains('\0') {
                return Err(format!("--table {s:?}: names cannot contain NUL"));
            }
            parts.push(part);
            match chars.next() {
                None => break,
                Some('.') => continue,
                Some(_) => unreachable!("parts end at a dot or the end"),
            }
        }
        match parts.len() {
            1 => Ok(TableName {
                schema: None,
                name: parts.remove(0),
            }),
            2 => {
                let name = parts.remove(1);
                Ok(TableName {
                    schema: Some(parts.remove(0)),
                    name,
                })
            }
            _ => Err(format!(
                "--table {s:?}: use `table` or `schema.table` (quote a name that contains a dot)"
            )),
        }
    }
}

/// Quotes one identifier the way PostgreSQL's quote_ident does, always.
pub fn quote_ident(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

impl TableName {
    /// The table as SQL: `"schema"."name"` or `"name"`.
    pub fn quoted(&self) -> String {
        self.qualify(&self.name)
    }

    /// The view through which the relay reads an adopted table: `<name>_relay`, same schema.
    pub fn relay_view(&self) -> TableName {
        TableName {
            schema: self.schema.clone(),
            name: self.derived("relay"),
        }
    }

    /// Another object in the table's schema (function, version table), quoted.
    fn qualify(&self, object: &str) -> String {
        match &self.schema {
            Some(schema) => format!("{}.{}", quote_ident(schema), quote_ident(object)),
            None => quote_ident(object),
        }
    }

    /// A name derived from the table's, kept within PostgreSQL's identifier length by
    /// shortening the table part and adding a hash of it, so two long names never collide.
    fn derived(&self, suffix: &str) -> String {
        let full = format!("{}_{suffix}", self.name);
        if full.len() <= MAX_IDENTIFIER_BYTES {
            return full;
        }
        let hash = crate::batch::fifo_id(&format!("{}\u{1}{}", self.name, suffix));
        let mut head: String = String::new();
        for c in self.name.chars() {
            if head.len() + c.len_utf8() + 1 + 8 + 1 + suffix.len() > MAX_IDENTIFIER_BYTES {
                break;
            }
            head.push(c);
        }
        format!("{head}_{}_{suffix}", &hash[..8])
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.quoted())
    }
}

/// Why a row was quarantined; a bounded set, used as a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuarantineReason {
    /// The message can never fit SQS's size limit.
    TooLarge,
    /// The row cannot be expressed as an SQS message (bad header, bad characters).
    Invalid,
    /// SQS refused the entry as bad input (`SenderFault`).
    SenderFault,
    /// SQS refused a request holding only this entry, as bad input.
    Rejected,
    /// Retryable failures went on past `--max-attempts`.
    MaxAttempts,
}

impl QuarantineReason {
    pub fn as_str(self) -> &'static str {
        match self {
            QuarantineReason::TooLarge => "too_large",
            QuarantineReason::Invalid => "invalid",
            QuarantineReason::SenderFault => "sender_fault",
            QuarantineReason::Rejected => "rejected",
            QuarantineReason::MaxAttempts => "max_attempts",
        }
    }
}

/// A row this relay holds a lease on.
#[derive(Debug, Clone)]
pub struct ClaimedRow {
    pub id: i64,
    pub event_id: String,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub event_type: String,
    /// The payload as JSON text, which becomes the message body.
    pub payload: String,
    pub headers: serde_json::Value,
    pub queue_url: Option<String>,
    /// Fencing generation: settlements only apply while the row still carries it.
    pub lease_token: i64,
    /// Attempts including this claim.
    pub attempts: i32,
    /// `created_at` as Unix seconds, for the delivery-lag histogram.
    pub created_at_epoch: f64,
    /// `created_at` in RFC 3339 (UTC), for envelopes such as CloudEvents' `time`.
    pub created_at: String,
}

/// Outcomes of one claim, one statement per class.
#[derive(Debug, Default)]
pub struct Settlement {
    pub sent: Vec<SentRow>,
    pub reschedule: Vec<RescheduledRow>,
    pub quarantine: Vec<QuarantinedRow>,
}

#[derive(Debug)]
pub struct SentRow {
    pub id: i64,
    pub lease_token: i64,
    pub message_id: String,
}

#[derive(Debug)]
pub struct RescheduledRow {
    pub id: i64,
    pub lease_token: i64,
    pub delay: Duration,
    /// Kept in `last_error`; `None` keeps the previous error (a plain release).
    pub error: Option<String>,
    /// Give the claim's attempt back: the failure was not the row's.
    pub refund: bool,
}

#[derive(Debug)]
pub struct QuarantinedRow {
    pub id: i64,
    pub lease_token: i64,
    pub reason: QuarantineReason,
    pub error: String,
}

impl Settlement {
    pub fn is_empty(&self) -> bool {
        self.sent.is_empty() && self.reschedule.is_empty() && self.quarantine.is_empty()
    }
}

/// How many rows each statement actually changed; the rest had been taken over.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Settled {
    pub sent: u64,
    pub rescheduled: u64,
    /// The reasons of the rows actually quarantined (for the per-reason counter).
    pub quarantined_reasons: Vec<QuarantineReason>,
    pub lost: u64,
}

/// Gauges read from the table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stats {
    pub oldest_unsent_age_seconds: f64,
    pub unsent: i64,
    pub quarantined: i64,
    /// Quarantined rows parked behind a quarantined row of their group (ordered delivery).
    pub blocked: i64,
    /// The smallest unsent id (0 when none): no claim needs to look below it.
    pub claim_floor: i64,
}

/// How claims choose rows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimMode {
    /// Per-group order: never claim a row while an earlier row of its group is unsent.
    pub ordered: Option<Ordered>,
    /// Round-robin across the values of this key instead of strict id order.
    pub fair: Option<KeyColumn>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ordered {
    /// The group: the same key as the FIFO MessageGroupId.
    pub key: KeyColumn,
    /// `--on-poison skip`: a quarantined row no longer holds its group back.
    pub skip_poison: bool,
}

/// The SQL for a key's value on a row (`alias` = None inside index definitions, where the
/// expression must match the queries' exactly). Header names are restricted to letters,
/// digits, `_ - .` by `KeyColumn::from_str`, so the literal below cannot break out of its
/// quotes; it is escaped all the same.
fn key_sql(key: &KeyColumn, alias: Option<&str>) -> String {
    let column = |name: &str| match alias {
        Some(a) => format!("{a}.{name}"),
        None => name.to_string(),
    };
    match key {
        KeyColumn::AggregateId => column("aggregate_id"),
        KeyColumn::AggregateType => column("aggregate_type"),
        KeyColumn::EventType => column("event_type"),
        KeyColumn::Header(name) => format!(
            "coalesce({} ->> '{}', '')",
            column("headers"),
            name.replace('\'', "''")
        ),
    }
}

/// The two (key, id) indexes a claim mode may need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyIndex {
    /// Ordered delivery: over every row, so that "the row just before this one in its group"
    /// is one step in the index, however many of the group's rows were sent before.
    Order,
    /// Fair claiming: over rows not yet sent, so that walking the distinct keys never visits
    /// keys whose rows are all sent.
    Fair,
}

impl KeyIndex {
    fn prefix(self) -> &'static str {
        match self {
            KeyIndex::Order => "order",
            KeyIndex::Fair => "key",
        }
    }

    /// The `migrate` flag that creates it.
    fn flag(self) -> &'static str {
        match self {
            KeyIndex::Order => "--group-by",
            KeyIndex::Fair => "--fair-by",
        }
    }

    fn predicate(self) -> &'static str {
        match self {
            KeyIndex::Order => "",
            KeyIndex::Fair => " WHERE sent_at IS NULL",
        }
    }
}

/// Rows an ordered claim looks at, at most: enough to find a claim's worth of group heads
/// when groups interleave, and a bound on the probes when a few groups hold a long backlog.
fn ordered_window(limit: i64) -> i64 {
    (limit * 10).max(1000)
}

/// The table's statements with its quoted name filled in; built once.
#[derive(Debug)]
struct Sql {
    claim: String,
    /// Ordered delivery with poison blocking: park and unpark rows behind quarantined heads.
    park_blocked: Option<String>,
    unpark_blocked: Option<String>,
    mark_sent: String,
    delete_sent: String,
    reschedule: String,
    quarantine: String,
    stats: String,
    probe: String,
    delete_expired: String,
    quarantine_list: String,
    quarantine_retry: String,
}

/// How to reach the outbox: connection settings and the table's statements.
#[derive(Debug)]
pub struct Outbox {
    table: TableName,
    /// An adopted table behind the relay's view `table`: where triggers and publications go.
    base: Option<TableName>,
    pg: tokio_postgres::Config,
    /// The handshake `sslmode` asks for; tokio-postgres alone cannot verify certificates.
    tls: PgTls,
    sql: Sql,
    /// Acknowledged rows are deleted rather than marked sent.
    delete_on_ack: bool,
    mode: ClaimMode,
    /// How `migrate` takes the locks that block the application's writes.
    locks: LockPolicy,
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
            pg.application_name("outbox-relay");
        }
        let quoted = table.quoted();
        let fill = |template: &str| template.replace("{table}", &quoted);
        let sql = Sql {
            claim: claim_sql(&quoted, &ClaimMode::default()),
            park_blocked: None,
            unpark_blocked: None,
            mark_sent: fill(include_str!("../sql/mark_sent.sql")),
            delete_sent: fill(include_str!("../sql/delete_sent.sql")),
            reschedule: fill(include_str!("../sql/reschedule.sql")),
            quarantine: fill(include_str!("../sql/quarantine.sql")),
            stats: fill(include_str!("../sql/stats.sql")),
            probe: fill(include_str!("../sql/probe.sql")),
            delete_expired: fill(include_str!("../sql/delete_expired.sql")),
            quarantine_list: fill(include_str!("../sql/quarantine_list.sql")),
            quarantine_retry: fill(include_str!("../sql/quarantine_retry.sql")),
        };
        Ok(Outbox {
            table,
            base: None,
            pg,
            tls,
            sql,
            delete_on_ack: false,
            mode: ClaimMode::default(),
            locks: LockPolicy::default(),
        })
    }

    /// Chooses how claims pick rows (ordered per group, fair across keys).
    pub fn claim_mode(mut self, mode: ClaimMode) -> Self {
        let quoted = self.table.quoted();
        self.sql.claim = claim_sql(&quoted, &mode);
        let blocking = mode.ordered.as_ref().filter(|o| !o.skip_poison);
        self.sql.park_blocked = blocking.map(|o| {
            include_str!("../sql/park_blocked.sql")
                .replace("{table}", &quoted)
                .replace("{key_q}", &key_sql(&o.key, Some("q")))
                .replace("{key_o}", &key_sql(&o.key, Some("o")))
        });
        self.sql.unpark_blocked = blocking.map(|o| {
            include_str!("../sql/unpark_blocked.sql")
                .replace("{table}", &quoted)
                .replace("{key_p}", &key_sql(&o.key, Some("p")))
                .replace("{key_o}", &key_sql(&o.key, Some("o")))
        });
        self.mode = mode;
        self
    }

    /// Delete rows once SQS acknowledged them instead of marking them sent: no history, but no
    /// bloat and the cheapest settlement (see docs/benchmarks.md).
    pub fn delete_on_ack(mut self, yes: bool) -> Self {
        self.delete_on_ack = yes;
        self
    }

    /// The relay reads `table`, a view over this adopted table (`migrate --adopt`).
    pub fn adopted_from(mut self, base: Option<TableName>) -> Self {
        self.base = base;
        self
    }

    /// How `migrate` waits for locks that block writes (lock timeout, tries).
    pub fn migration_locks(mut self, locks: LockPolicy) -> Self {
        self.locks = locks;
        self
    }

    pub fn table(&self) -> &TableName {
        &self.table
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

    /// Connects within the connect timeout. tokio-postgres applies its own timeout to the TCP
    /// connect only; a server that accepts and then never answers would hang the start-up
    /// handshake, so the whole handshake is bounded here.
    async fn open(
        &self,
    ) -> Result<
        (
            Client,
            tokio_postgres::Connection<tokio_postgres::Socket, PgTlsStream<tokio_postgres::Socket>>,
        ),
        OutboxError,
    > {
        let limit = self
            .pg
            .get_connect_timeout()
            .copied()
            .unwrap_or(Duration::from_secs(10));
        match tokio::time::timeout(limit, self.pg.connect(self.tls.clone())).await {
            Ok(Ok(pair)) => Ok(pair),
            Ok(Err(e)) => Err(OutboxError::Connect {
                target: self.target(),
                reason: describe(&e),
            }),
            Err(_) => Err(OutboxError::Connect {
                target: self.target(),
                reason: format!(
                    "no answer within {} (--connect-timeout)",
                    humantime::format_duration(limit)
                ),
            }),
        }
    }

    async fn raw_connect(&self) -> Result<Client, OutboxError> {
        let (client, connection) = self.open().await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "database connection ended");
            }
        });
        Ok(client)
    }

    /// A working connection with the relay's statements prepared.
    pub async fn connect(&self) -> Result<Session, OutboxError> {
        let client = self.raw_connect().await?;
        // A claim prepared while the table is small gets a generic plan that later scans and
        // sorts the whole table (measured: 880 ms per claim at 100k rows). Custom plans cost a
        // planning step per call and stay on the index.
        //
        // The relay's own commits (claims, settlements, retention) do not wait for their WAL
        // flush: waiting made each of them queue with the application's commits for the same
        // flushes, and made the relay's connection, not the database, its limit on durable
        // clusters (docs/benchmarks.md). Nothing the relay writes needs to survive a database
        // crash: a lost claim or settlement only means the row is sent again, with the same
        // event_id, which at-least-once delivery allows. The application's commits are
        // untouched.
        client
            .batch_execute("SET plan_cache_mode = force_custom_plan; SET synchronous_commit = off")
            .await
            .map_err(query_err("setting up the relay's session"))?;
        self.resolve_channel(&client).await?;
        self.check_key_indexes(&client).await?;
        let settle_sent = if self.delete_on_ack {
            &self.sql.delete_sent
        } else {
            &self.sql.mark_sent
        };
        let (claim, mark_sent, reschedule, quarantine, stats, probe, delete_expired) = tokio::try_join!(
            client.prepare(&self.sql.claim),
            client.prepare(settle_sent),
            client.prepare(&self.sql.reschedule),
            client.prepare(&self.sql.quarantine),
            client.prepare(&self.sql.stats),
            client.prepare(&self.sql.probe),
            client.prepare(&self.sql.delete_expired),
        )
        .map_err(query_err("preparing the relay's statements (is the table at the current schema version? run `outbox-relay migrate`)"))?;
        let park = match (&self.sql.park_blocked, &self.sql.unpark_blocked) {
            (Some(park), Some(unpark)) => Some((
                client
                    .prepare(park)
                    .await
                    .map_err(query_err("preparing park_blocked"))?,
                client
                    .prepare(unpark)
                    .await
                    .map_err(query_err("preparing unpark_blocked"))?,
            )),
            _ => None,
        };
        Ok(Session {
            client,
            statements: Statements {
                claim,
                mark_sent,
                reschedule,
                quarantine,
                stats,
                probe,
                delete_expired,
                park,
            },
            delete_on_ack: self.delete_on_ack,
            ordered: self.mode.ordered.is_some(),
            fair: self.mode.fair.is_some(),
        })
    }

    /// The (key, id) indexes the claim mode needs; without them every claim would scan the
    /// backlog, so their absence stops the start-up with the command that creates them.
    async fn check_key_indexes(&self, client: &Client) -> Result<(), OutboxError> {
        let mut needed = Vec::new();
        if let Some(o) = &self.mode.ordered {
            needed.push((&o.key, KeyIndex::Order));
        }
        if let Some(k) = &self.mode.fair {
            needed.push((k, KeyIndex::Fair));
        }
        for (key, kind) in needed {
            let flag = kind.flag();
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
                });
            }
        }
        Ok(())
    }

    fn key_index_name(&self, key: &KeyColumn, kind: KeyIndex) -> String {
        self.table
            .derived(&format!("{}_{}_idx", kind.prefix(), key.slug()))
    }

    /// The table's wake-up channel (and publication) name; fails clearly when the table is
    /// missing.
    async fn resolve_channel(&self, client: &Client) -> Result<String, OutboxError> {
        let row = client
            .query_opt(
                include_str!("../sql/resolve_table.sql"),
                &[&self.table.quoted()],
            )
            .await
            .map_err(query_err("looking up the outbox table"))?;
        match row {
            Some(row) => Ok(row.get(0)),
            None => Err(OutboxError::TableMissing(self.table.quoted())),
        }
    }

    /// A connection that LISTENs on the table's channel and calls `wake` on each notification.
    /// Returns when the connection ends, so the caller can reconnect; `on_listening` runs once
    /// LISTEN is in place (anything inserted before then was missed and must be polled for).
    pub async fn listen(
        &self,
        wake: impl Fn(),
        on_listening: impl FnOnce(),
    ) -> Result<(), OutboxError> {
        let (client, mut connection) = self.open().await?;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let driver = tokio::spawn(async move {
            let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(message) = messages.next().await {
                match message {
                    Ok(AsyncMessage::Notification(_)) => {
                        if tx.send(()).is_err() {
                            break;
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::debug!(error = %e, "listen connection ended");
                        break;
                    }
                }
            }
        });
        let channel = self.resolve_channel(&client).await?;
        client
            .batch_execute(&format!("LISTEN {}", quote_ident(&channel)))
            .await
            .map_err(query_err("subscribing to wake-ups"))?;
        on_listening();
        while rx.recv().await.is_some() {
            wake();
        }
        driver.abort();
        Err(OutboxError::Connect {
            target: self.target(),
            reason: "the wake-up connection was closed".to_string(),
        })
    }
}

impl Outbox {
    /// Quarantined rows, oldest first.
    pub async fn quarantine_list(
        &self,
        reason: Option<&str>,
        limit: i64,
    ) -> Result<Vec<QuarantineEntry>, OutboxError> {
        let client = self.raw_connect().await?;
        self.resolve_channel(&client).await?;
        let rows = client
            .query(&self.sql.quarantine_list, &[&reason, &limit])
            .await
            .map_err(query_err("listing quarantined rows"))?;
        Ok(rows
            .iter()
            .map(|r| QuarantineEntry {
                id: r.get(0),
                event_id: r.get(1),
                aggregate_type: r.get(2),
                aggregate_id: r.get(3),
                event_type: r.get(4),
                reason: r.get(5),
                last_error: r.get(6),
                attempts: r.get(7),
                quarantined_at: r.get(8),
                created_at: r.get(9),
            })
            .collect())
    }

    /// Puts quarantined rows back to unsent (attempts reset, same event_id) and wakes the
    /// relays; returns how many rows moved.
    pub async fn quarantine_retry(&self, which: &RetrySelection) -> Result<u64, OutboxError> {
        let mut client = self.raw_connect().await?;
        let channel = self.resolve_channel(&client).await?;
        let (id, event_id, all, reason) = match which {
            RetrySelection::Id(id) => (Some(*id), None, false, None),
            RetrySelection::EventId(e) => (None, Some(e.as_str()), false, None),
            RetrySelection::All { reason } => (None, None, true, reason.as_deref()),
        };
        let tx = client
            .transaction()
            .await
            .map_err(query_err("starting the re-drive"))?;
        let moved = tx
            .execute(&self.sql.quarantine_retry, &[&id, &event_id, &all, &reason])
            .await
            .map_err(query_err("re-driving quarantined rows"))?;
        if moved > 0 {
            // Delivered at commit, like the insert trigger's.
            tx.execute("SELECT pg_notify($1, '')", &[&channel])
                .await
                .map_err(query_err("waking the relays"))?;
        }
        tx.commit()
            .await
            .map_err(query_err("committing the re-drive"))?;
        Ok(moved)
    }
}

/// Which quarantined rows `quarantine retry` moves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RetrySelection {
    Id(i64),
    EventId(String),
    All { reason: Option<String> },
}

/// One quarantined row, as operators see it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct QuarantineEntry {
    pub id: i64,
    pub event_id: String,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub event_type: String,
    pub reason: String,
    pub last_error: String,
    pub attempts: i32,
    pub quarantined_at: String,
    pub created_at: String,
}

/// The claim statement for a mode: the candidates part of the mode, then the shared UPDATE.
fn claim_sql(table: &str, mode: &ClaimMode) -> String {
    // "The row just before c in its group is done": sent (or, with --on-poison skip, also
    // quarantined), or there is none. One step back in the group's order index, so the probe
    // costs the same however many of the group's rows were sent before — a probe for the first
    // unsent row instead walks every dead index entry the group's sent rows left behind. As a
    // correlated scalar subquery it cannot become a hash anti-join over the backlog when
    // statistics are missing; the range comparison keeps the planner on the (key, id) index
    // (see claim_candidates_fair.sql).
    let ordered_filter = match &mode.ordered {
        Some(o) => {
            let (p, c) = (key_sql(&o.key, Some("p")), key_sql(&o.key, Some("c")));
            format!(
                "AND coalesce((SELECT p.sent_at IS NOT NULL{} FROM {table} AS p \
                 WHERE {p} >= {c} AND {p} <= {c} AND p.id < c.id \
                 ORDER BY {p} DESC, p.id DESC LIMIT 1), true)",
                if o.skip_poison {
                    " OR p.quarantined_at IS NOT NULL"
                } else {
                    ""
                },
            )
        }
        None => String::new(),
    };
    let candidates = match (&mode.fair, &mode.ordered) {
        (Some(key), _) => format!(
            "RECURSIVE {}",
            include_str!("../sql/claim_candidates_fair.sql")
                .replace("{key_bare}", &key_sql(key, None))
                .replace("{key_c}", &key_sql(key, Some("c")))
        ),
        (None, Some(_)) => include_str!("../sql/claim_candidates_ordered.sql").to_string(),
        (None, None) => include_str!("../sql/claim_candidates.sql").to_string(),
    };
    format!(
        "WITH {}\n{}",
        candidates.replace("{ordered_filter}", &ordered_filter),
        include_str!("../sql/claim.sql")
    )
    .replace("{table}", table)
}

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

/// Result of `migrate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigrateReport {
    pub from: i32,
    pub to: i32,
}

#[derive(Debug)]
struct Statements {
    claim: Statement,
    /// mark_sent.sql, or delete_sent.sql with --delete-on-ack.
    mark_sent: Statement,
    reschedule: Statement,
    quarantine: Statement,
    stats: Statement,
    probe: Statement,
    delete_expired: Statement,
    /// park_blocked and unpark_blocked, with ordered delivery and poison blocking.
    park: Option<(Statement, Statement)>,
}

/// One connection with the relay's prepared statements.
#[derive(Debug)]
pub struct Session {
    client: Client,
    statements: Statements,
    /// Which statement `mark_sent` is; their parameters differ.
    delete_on_ack: bool,
    /// The ordered claim also takes the floor and the window size; the fair one the floor.
    ordered: bool,
    fair: bool,
}

impl Session {
    pub fn is_closed(&self) -> bool {
        self.client.is_closed()
    }

    /// Claims up to `limit` rows for `owner` for `lease`, in `id` order. Commits before
    /// returning: nothing is sent while a row lock is held.
    pub async fn claim(
        &self,
        owner: &str,
        lease: Duration,
        limit: i64,
        floor: i64,
    ) -> Result<Vec<ClaimedRow>, OutboxError> {
        let lease = lease.as_secs_f64();
        let window = ordered_window(limit);
        let rows = match (self.ordered, self.fair) {
            (true, _) => {
                self.client
                    .query(
                        &self.statements.claim,
                        &[&limit, &owner, &lease, &floor, &window],
                    )
                    .await
            }
            (false, true) => {
                self.client
                    .query(&self.statements.claim, &[&limit, &owner, &lease, &floor])
                    .await
            }
            (false, false) => {
                self.client
                    .query(&self.statements.claim, &[&limit, &owner, &lease])
                    .await
            }
        }
        .map_err(query_err("claiming rows"))?;
        let mut claimed: Vec<ClaimedRow> = rows
            .iter()
            .map(|r| ClaimedRow {
                id: r.get(0),
                event_id: r.get(1),
                aggregate_type: r.get(2),
                aggregate_id: r.get(3),
                event_type: r.get(4),
                payload: r.get(5),
                headers: r.get(6),
                queue_url: r.get(7),
                lease_token: r.get(8),
                attempts: r.get(9),
                created_at_epoch: r.get(10),
                created_at: r.get(11),
            })
            .collect();
        // UPDATE ... RETURNING does not keep the CTE's order.
        claimed.sort_unstable_by_key(|r| r.id);
        Ok(claimed)
    }

    /// Applies a claim's outcomes, fenced by (id, owner, lease_token). The three statements
    /// are pipelined on the connection; each commits on its own, which is safe because each
    /// row appears in exactly one of them.
    pub async fn settle(&self, owner: &str, s: &Settlement) -> Result<Settled, OutboxError> {
        let sent = async {
            if s.sent.is_empty() {
                return Ok(0);
            }
            let ids: Vec<i64> = s.sent.iter().map(|r| r.id).collect();
            let tokens: Vec<i64> = s.sent.iter().map(|r| r.lease_token).collect();
            if self.delete_on_ack {
                return self
                    .client
                    .execute(&self.statements.mark_sent, &[&owner, &ids, &tokens])
                    .await
                    .map_err(query_err("deleting acknowledged rows"));
            }
            let message_ids: Vec<&str> = s.sent.iter().map(|r| r.message_id.as_str()).collect();
            self.client
                .execute(
                    &self.statements.mark_sent,
                    &[&owner, &ids, &tokens, &message_ids],
                )
                .await
                .map_err(query_err("marking rows sent"))
        };
        let rescheduled = async {
            if s.reschedule.is_empty() {
                return Ok(0);
            }
            let r = &s.reschedule;
            let ids: Vec<i64> = r.iter().map(|r| r.id).collect();
            let tokens: Vec<i64> = r.iter().map(|r| r.lease_token).collect();
            let delays: Vec<f64> = r.iter().map(|r| r.delay.as_secs_f64()).collect();
            let errors: Vec<Option<&str>> = r.iter().map(|r| r.error.as_deref()).collect();
            let refunds: Vec<i32> = r.iter().map(|r| i32::from(r.refund)).collect();
            self.client
                .execute(
                    &self.statements.reschedule,
                    &[&owner, &ids, &tokens, &delays, &errors, &refunds],
                )
                .await
                .map_err(query_err("rescheduling rows"))
        };
        let quarantined = async {
            if s.quarantine.is_empty() {
                return Ok(Vec::new());
            }
            let q = &s.quarantine;
            let ids: Vec<i64> = q.iter().map(|r| r.id).collect();
            let tokens: Vec<i64> = q.iter().map(|r| r.lease_token).collect();
            let reasons: Vec<&str> = q.iter().map(|r| r.reason.as_str()).collect();
            let errors: Vec<&str> = q.iter().map(|r| r.error.as_str()).collect();
            // Quarantines are rare; returning their ids tells which reasons really landed.
            let changed = self
                .client
                .query(
                    &self.statements.quarantine,
                    &[&owner, &ids, &tokens, &reasons, &errors],
                )
                .await
                .map_err(query_err("quarantining rows"))?;
            Ok(changed
                .iter()
                .filter_map(|r| {
                    let id: i64 = r.get(0);
                    q.iter().find(|x| x.id == id).map(|x| x.reason)
                })
                .collect())
        };
        let (sent, rescheduled, quarantined_reasons) =
            tokio::try_join!(sent, rescheduled, quarantined)?;
        let expected = (s.sent.len() + s.reschedule.len() + s.quarantine.len()) as u64;
        let applied = sent + rescheduled + quarantined_reasons.len() as u64;
        Ok(Settled {
            sent,
            rescheduled,
            quarantined_reasons,
            lost: expected - applied,
        })
    }

    /// Deletes up to `limit` sent rows older than `retention`; returns how many went.
    pub async fn delete_expired(
        &self,
        retention: Duration,
        limit: i64,
    ) -> Result<u64, OutboxError> {
        self.client
            .execute(
                &self.statements.delete_expired,
                &[&retention.as_secs_f64(), &limit],
            )
            .await
            .map_err(query_err("deleting sent rows past retention"))
    }

    /// Whether a claim now would find a row: a read-only look that takes no lock, for an
    /// idle relay to decide whether to claim.
    pub async fn probe(&self) -> Result<bool, OutboxError> {
        let row = self
            .client
            .query_one(&self.statements.probe, &[])
            .await
            .map_err(query_err("looking for claimable rows"))?;
        Ok(row.get(0))
    }

    /// Gauges for `/metrics`, from partial indexes only.
    pub async fn stats(&self) -> Result<Stats, OutboxError> {
        let row = self
            .client
            .query_one(&self.statements.stats, &[])
            .await
            .map_err(query_err("reading outbox statistics"))?;
        Ok(Stats {
            oldest_unsent_age_seconds: row.get(0),
            unsent: row.get(1),
            quarantined: row.get(2),
            blocked: row.get(3),
            claim_floor: row.get(4),
        })
    }

    /// Ordered delivery with poison blocking: parks rows behind quarantined heads and unparks
    /// those whose head was re-driven. Returns (parked, unparked); (0, 0) in other modes.
    pub async fn maintain_blocked_groups(&self) -> Result<(u64, u64), OutboxError> {
        let Some((park, unpark)) = &self.statements.park else {
            return Ok((0, 0));
        };
        let unparked = self
            .client
            .execute(unpark, &[])
            .await
            .map_err(query_err("unparking rows of re-driven groups"))?;
        let parked = self
            .client
            .execute(park, &[])
            .await
            .map_err(query_err("parking rows behind quarantined heads"))?;
        Ok((parked, unparked))
    }
}

/// A session that reconnects on demand after the connection is lost; shared by the claim loop,
/// the settling tasks and the statistics task.
#[derive(Debug)]
pub struct SharedSession {
    outbox: Arc<Outbox>,
    current: Mutex<Option<Arc<Session>>>,
}

impl SharedSession {
    pub fn new(outbox: Arc<Outbox>, first: Session) -> Self {
        SharedSession {
            outbox,
            current: Mutex::new(Some(Arc::new(first))),
        }
    }

    /// The live session, reconnecting once if the last one is closed. Callers that get an
    /// error back decide how long to wait before asking again.
    pub async fn get(&self) -> Result<Arc<Session>, OutboxError> {
        let mut current = self.current.lock().await;
        if let Some(session) = current.as_ref() {
            if !session.is_closed() {
                return Ok(Arc::clone(session));
            }
        }
        *current = None;
        let session = Arc::new(self.outbox.connect().await?);
        *current = Some(Arc::clone(&session));
        tracing::info!(target = %self.outbox.target(), "database connection established");
        Ok(session)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlstates_are_classified_transient_or_not() {
        for transient in [
            "08006", "08001", "40001", "40P01", "57P01", "57P03", "53300", "57014",
        ] {
            assert!(sqlstate_is_transient(transient), "{transient}");
        }
        for fatal in ["42P01", "42501", "42703", "23505", "22P02", "XX000"] {
            assert!(!sqlstate_is_transient(fatal), "{fatal}");
        }
    }

    #[test]
    fn plain_and_schema_qualified_names() {
        let t: TableName = "outbox".parse().unwrap();
        assert_eq!(t.quoted(), "\"outbox\"");
        let t: TableName = "app.outbox".parse().unwrap();
        assert_eq!(t.schema.as_deref(), Some("app"));
        assert_eq!(t.quoted(), "\"app\".\"outbox\"");
    }

    #[test]
    fn quotes_and_dots_inside_names_stay_inside_one_quoted_identifier() {
        let t: TableName = "we\"ird".parse().unwrap();
        assert_eq!(t.name, "we\"ird");
        assert_eq!(t.quoted(), "\"we\"\"ird\"");
        let t: TableName = "\"my.outbox\"".parse().unwrap();
        assert_eq!(t.schema, None);
        assert_eq!(t.name, "my.outbox");
        assert_eq!(t.quoted(), "\"my.outbox\"");
        let t: TableName = "\"s.1\".\"a\"\"b\"".parse().unwrap();
        assert_eq!(t.schema.as_deref(), Some("s.1"));
        assert_eq!(t.name, "a\"b");
        assert_eq!(t.quoted(), "\"s.1\".\"a\"\"b\"");
        let injection: TableName = "outbox; DROP TABLE users; --".parse().unwrap();
        assert_eq!(injection.quoted(), "\"outbox; DROP TABLE users; --\"");
    }

    #[test]
    fn malformed_names_are_refused_with_the_reason() {
        for (bad, why) in [
            ("", "empty"),
            ("a..b", "empty"),
            ("a.b.c", "schema.table"),
            ("\"open", "unterminated"),
            ("\"a\"b", "expected a dot"),
            (&"x".repeat(64), "63 bytes"),
        ] {
            let err = bad.parse::<TableName>().unwrap_err();
            assert!(err.contains(why), "{bad:?}: {err}");
        }
    }

    #[test]
    fn derived_names_stay_within_the_identifier_limit_and_apart() {
        let short: TableName = "outbox".parse().unwrap();
        assert_eq!(short.derived("unsent_idx"), "outbox_unsent_idx");
        let a: TableName = "a".repeat(60).parse().unwrap();
        let b: TableName = format!("{}b", "a".repeat(59)).parse().unwrap();
        let (da, db) = (a.derived("unsent_idx"), b.derived("unsent_idx"));
        assert!(da.len() <= 63 && db.len() <= 63);
        assert_ne!(da, db);
        assert!(da.ends_with("_unsent_idx"));
    }

    #[test]
    fn statements_quote_the_table_and_keep_values_as_parameters() {
        let t: TableName = "app.\"out\"\"box\"".parse().unwrap();
        let outbox =
            Outbox::new("postgres://u:p@127.0.0.1:5/db", t, Duration::from_secs(1)).unwrap();
        assert!(outbox.sql.claim.contains("FROM \"app\".\"out\"\"box\""));
        assert!(outbox.sql.claim.contains("LIMIT $1"));
        assert!(!outbox.sql.claim.contains("{table}"));
        let migration = outbox.migrate_sql(&[]);
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
