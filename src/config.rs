//! Command line and environment -> validated configuration.
//!
//! Parsing is clap's; the rules live in pure `validate` functions that unit tests call without
//! I/O. Every error is one line that says what to change.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use clap::builder::BoolishValueParser;
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::batch::{
    is_fifo, is_topic, KeyColumn, MessageFormat, OffloadPlan, PlanConfig, PlanOrdering,
};
use crate::concurrency::RequestConcurrency;
use crate::dbauth::PasswordSource;
use crate::outbox::{
    ClaimStrategy, ColumnMap, KeyIndex, OrderScope, Ordered, Pooler, TableName, Wakeup,
};

#[derive(Debug, Parser)]
#[command(
    name = "outbox-relay",
    version,
    about = "Relays a PostgreSQL transactional outbox to Amazon SQS, at least once, with leases"
)]
pub struct Cli {
    /// Log line format.
    #[arg(long, env = "OUTBOX_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create or upgrade the outbox table and its indexes, and set up the chosen --wakeup
    /// (idempotent).
    Migrate(MigrateArgs),
    /// Run the relay until SIGTERM/SIGINT.
    Run(Box<RunArgs>),
    /// Unsent, leased and quarantined rows, oldest unsent age, rows sent in the last minute.
    Status(StatusArgs),
    /// Check what `run` with the same flags needs: configuration, database, table shape,
    /// privileges and queues. Exits 0 only when every check passes.
    Check(Box<RunArgs>),
    /// Inspect and re-drive quarantined rows.
    #[command(subcommand)]
    Quarantine(QuarantineCommand),
}

#[derive(Debug, Subcommand)]
pub enum QuarantineCommand {
    /// List quarantined rows, oldest first, with reason, last error and attempts.
    List(QuarantineListArgs),
    /// Put quarantined rows back to unsent (attempts reset, same event_id); prints how many.
    Retry(QuarantineRetryArgs),
}

#[derive(Debug, Clone, Args)]
pub struct QuarantineListArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,

    /// Print JSON (one array) instead of a table.
    #[arg(long)]
    pub json: bool,

    /// Only rows quarantined for this reason (too_large, invalid, sender_fault, rejected, max_attempts, blocked, destination).
    #[arg(long)]
    pub reason: Option<String>,

    /// At most this many rows.
    #[arg(long, default_value_t = 100)]
    pub limit: i64,
}

#[derive(Debug, Clone, Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["id", "event_id", "all"])))]
pub struct QuarantineRetryArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,

    /// The row with this id.
    #[arg(long)]
    pub id: Option<i64>,

    /// The row with this event_id.
    #[arg(long)]
    pub event_id: Option<String>,

    /// Every quarantined row (narrow with --reason).
    #[arg(long)]
    pub all: bool,

    /// With --all: only rows quarantined for this reason.
    #[arg(long, requires = "all")]
    pub reason: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct DatabaseArgs {
    /// PostgreSQL connection: a libpq URL or key=value string.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,

    /// Outbox table, optionally schema-qualified (`app.outbox`); quote a part containing a dot.
    #[arg(long, env = "OUTBOX_TABLE", default_value = "outbox")]
    pub table: String,

    /// Give up on one connection attempt after this long.
    #[arg(long, env = "OUTBOX_CONNECT_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub connect_timeout: Duration,

    /// A connection pooler between the relay and PostgreSQL: `none` (the relay's own
    /// connections: session settings, prepared statements), `session` or `transaction`
    /// (PgBouncer's pool modes; RDS Proxy is `transaction`): nothing is left on a server
    /// connection, statements are unnamed and settings per transaction.
    #[arg(long, env = "OUTBOX_POOLER", default_value = "none")]
    pub pooler: Pooler,

    /// An adopted table's column for a standard name: NAME=COLUMN, repeatable (env:
    /// comma-separated), e.g. event_id=id aggregate_type=aggregatetype. With any of these the
    /// relay reads the table through the view `migrate --adopt` created.
    #[arg(long = "column", env = "OUTBOX_COLUMNS", value_delimiter = ',', value_parser = parse_column)]
    pub columns: Vec<(String, String)>,

    /// PEM file of the CA certificate(s) the database server's certificate must chain to
    /// (libpq's sslrootcert; wins over one in --database-url). Used by sslmode verify-ca,
    /// verify-full and require.
    #[arg(long, env = "OUTBOX_DB_CA_CERT")]
    pub db_ca_cert: Option<std::path::PathBuf>,

    /// A file holding the database password (a mounted secret), read again for every new
    /// connection so a rotated password is used without a restart; trailing newline ignored.
    /// The URL must not carry a password then.
    #[arg(long, env = "OUTBOX_DATABASE_PASSWORD_FILE")]
    pub database_password_file: Option<std::path::PathBuf>,

    /// Log in with a fresh RDS IAM auth token per connection, signed with the relay's AWS
    /// credentials (the chain SQS uses) for the URL's host, port and user; needs TLS and a
    /// URL without a password.
    // Boolean variables also take 1/0, yes/no, on/off: manifests write those as often.
    #[arg(long, env = "OUTBOX_DATABASE_IAM_AUTH", value_parser = BoolishValueParser::new())]
    pub database_iam_auth: bool,

    /// PEM file of the client certificate (or a chain starting with it) to present to the
    /// database server (libpq's sslcert; wins over one in --database-url). Needs
    /// --db-client-key; read again at each new connection.
    #[arg(long, env = "OUTBOX_DB_CLIENT_CERT")]
    pub db_client_cert: Option<std::path::PathBuf>,

    /// PEM file of the client certificate's private key, unencrypted, readable by the relay's
    /// user only (libpq's sslkey; wins over one in --database-url).
    #[arg(long, env = "OUTBOX_DB_CLIENT_KEY")]
    pub db_client_key: Option<std::path::PathBuf>,
}

#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,

    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

fn parse_column(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((name, column)) if !name.is_empty() => Ok((name.to_string(), column.to_string())),
        _ => Err(format!(
            "{s:?}: use NAME=COLUMN, e.g. aggregate_type=aggregatetype"
        )),
    }
}

#[derive(Debug, Clone, Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,

    /// Also create the group index for this --group-by key (aggregate_id always has one).
    #[arg(long, env = "OUTBOX_GROUP_BY")]
    pub group_by: Option<KeyColumn>,

    /// Also create the index that --fair-by with this key needs.
    #[arg(long, env = "OUTBOX_FAIR_BY")]
    pub fair_by: Option<KeyColumn>,

    /// Adopt an existing outbox table (e.g. Debezium's): add only the relay's columns, indexes
    /// and a view; the application's columns are named with --column.
    #[arg(long)]
    pub adopt: bool,

    /// The wake-up the relays will use: `notify` installs the NOTIFY trigger, `logical` the
    /// publication; anything the chosen mode does not use is removed.
    #[arg(long, env = "OUTBOX_WAKEUP", default_value = "poll")]
    pub wakeup: Wakeup,

    /// Print the statements a run would execute and change nothing (no database needed, except
    /// that --adopt reads the table's columns when --database-url is given).
    #[arg(long)]
    pub print_sql: bool,

    /// How long a step may wait for a lock that blocks the application's writes (the
    /// application's inserts queue behind it meanwhile) before it tries again later.
    #[arg(long, env = "OUTBOX_LOCK_TIMEOUT", default_value = "100ms", value_parser = humantime::parse_duration)]
    pub lock_timeout: Duration,

    /// Tries per step before migrate gives up with an error (capped backoff with jitter between).
    #[arg(long, env = "OUTBOX_LOCK_ATTEMPTS", default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..))]
    pub lock_attempts: u32,
}

impl MigrateArgs {
    /// How migrate takes the locks that block writes.
    pub fn lock_policy(&self) -> Result<crate::outbox::LockPolicy, String> {
        if self.lock_timeout.is_zero() {
            return Err("--lock-timeout must be above zero: without it a waiting step blocks the application's writes for as long as it waits".into());
        }
        Ok(crate::outbox::LockPolicy {
            timeout: self.lock_timeout,
            attempts: self.lock_attempts,
        })
    }

    /// The keys whose (key, id) index `migrate` creates besides the default one.
    pub fn keys(&self) -> Vec<(KeyColumn, KeyIndex)> {
        // Ordered claims need both of the group key's indexes (see KeyIndex).
        let order = self
            .group_by
            .iter()
            .flat_map(|k| [(k.clone(), KeyIndex::Order), (k.clone(), KeyIndex::Fair)]);
        let fair = self.fair_by.iter().map(|k| (k.clone(), KeyIndex::Fair));
        order.chain(fair).collect()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Switch {
    /// On when a destination queue is FIFO (`.fifo`), off otherwise.
    Auto,
    On,
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnPoison {
    /// A quarantined row holds back the rest of its group until it is re-driven.
    Block,
    /// A quarantined row is passed over; the rest of its group flows.
    Skip,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// The payload JSON as the body.
    Raw,
    /// A CloudEvents 1.0 structured JSON envelope around the payload.
    Cloudevents,
}

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,

    /// Default destination: an SQS queue URL or an SNS topic ARN (arn:aws:sns:...); one ending
    /// in `.fifo` turns on FIFO fields.
    #[arg(long, env = "OUTBOX_QUEUE_URL")]
    pub queue_url: Option<String>,

    /// SQS endpoint override (local emulators). AWS_ENDPOINT_URL is honoured by the SDK too.
    #[arg(long, env = "AWS_ENDPOINT_URL_SQS")]
    pub sqs_endpoint_url: Option<String>,

    /// SNS endpoint override (local emulators), for topic destinations. AWS_ENDPOINT_URL is
    /// honoured by the SDK too.
    #[arg(long, env = "AWS_ENDPOINT_URL_SNS")]
    pub sns_endpoint_url: Option<String>,

    /// Where /metrics, /healthz and /readyz listen.
    #[arg(long, env = "OUTBOX_METRICS_ADDR", default_value = "0.0.0.0:9898")]
    pub metrics_addr: String,

    /// How long a claim holds its rows; must outlast --send-timeout + --settle-margin.
    #[arg(long, env = "OUTBOX_LEASE", default_value = "30s", value_parser = humantime::parse_duration)]
    pub lease: Duration,

    /// Rows per claim.
    #[arg(long, env = "OUTBOX_BATCH_SIZE", default_value_t = 100)]
    pub batch_size: usize,

    /// SendMessageBatch requests in flight at once, at most: all destinations together, and the
    /// ceiling of each destination's adaptive limit (--request-concurrency). SQS answers in
    /// ~15 ms in-region, so the throughput ceiling of sending is about this × 10 entries / 15 ms.
    #[arg(long, env = "OUTBOX_MAX_IN_FLIGHT", default_value_t = 32)]
    pub max_in_flight: usize,

    /// How many requests each destination gets: `adaptive` (a limit per destination, up to
    /// --max-in-flight, lowered when its answers slow down, time out or throttle, raised while
    /// they are healthy) or `fixed` (--max-in-flight, whatever the destination does).
    #[arg(long, env = "OUTBOX_REQUEST_CONCURRENCY", default_value = "adaptive")]
    pub request_concurrency: RequestConcurrency,

    /// How an idle relay learns of new rows: `poll` (adaptive polling with a cheap probe;
    /// costs the application's commits nothing), `logical` (a temporary logical replication
    /// slot; needs wal_level=logical and a REPLICATION role), `notify` (a trigger; serializes
    /// the application's commits, for low-write databases only). `migrate` with the same
    /// flag sets it up.
    #[arg(long, env = "OUTBOX_WAKEUP", default_value = "poll")]
    pub wakeup: Wakeup,

    /// The longest an idle relay waits before looking for work: polling stretches to it after
    /// sustained idleness; with `notify` and `logical` it is the fallback.
    #[arg(long, env = "OUTBOX_POLL_INTERVAL", default_value = "100ms", value_parser = humantime::parse_duration)]
    pub poll_interval: Duration,

    /// Quarantine a row after this many failed attempts.
    #[arg(long, env = "OUTBOX_MAX_ATTEMPTS", default_value_t = 10)]
    pub max_attempts: u32,

    /// Lease owner name; default host name and process ID.
    #[arg(long, env = "OUTBOX_RELAY_ID")]
    pub relay_id: Option<String>,

    /// Give up on one SQS call after this long.
    #[arg(long, env = "OUTBOX_SEND_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub send_timeout: Duration,

    /// Time reserved after a send to record its outcome before the lease ends.
    #[arg(long, env = "OUTBOX_SETTLE_MARGIN", default_value = "5s", value_parser = humantime::parse_duration)]
    pub settle_margin: Duration,

    /// On SIGTERM, how long to finish in-flight sends before giving up.
    #[arg(long, env = "OUTBOX_DRAIN_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub drain_timeout: Duration,

    /// SQS's limit for one message and for one batch request, in bytes.
    #[arg(long, env = "OUTBOX_MAX_REQUEST_BYTES", default_value_t = 1024 * 1024)]
    pub max_request_bytes: usize,

    /// Payload bytes being delivered at once, at most (claims stop at it): what bounds the
    /// relay's memory with large events, at about five bytes of memory per budget byte; the
    /// default keeps a relay under 256 MiB with events of any size (docs/benchmarks.md).
    /// Bytes, or with a KiB/MiB/GiB suffix.
    #[arg(long, env = "OUTBOX_MAX_BYTES_IN_FLIGHT", default_value = "32MiB", value_parser = parse_bytes)]
    pub max_bytes_in_flight: usize,

    /// The largest payload (its JSON text) the relay reads: a larger one is quarantined as
    /// `too_large` by the claim, from its size measured in the database, without being read, so
    /// a row bigger than the relay's memory cannot crash-loop it. Default: --max-bytes-in-flight,
    /// which it must not exceed. Bytes, or with a KiB/MiB/GiB suffix.
    #[arg(long, env = "OUTBOX_MAX_PAYLOAD_BYTES", value_parser = parse_bytes)]
    pub max_payload_bytes: Option<usize>,

    /// First retry delay; doubles per attempt, with full jitter.
    #[arg(long, env = "OUTBOX_RETRY_BASE", default_value = "1s", value_parser = humantime::parse_duration)]
    pub retry_base: Duration,

    /// Longest retry delay, for rows and for the relay's own back-off.
    #[arg(long, env = "OUTBOX_RETRY_MAX", default_value = "60s", value_parser = humantime::parse_duration)]
    pub retry_max: Duration,

    /// Give up on one database round trip after this long: the connection is dropped and a new
    /// one replaces it (a connection gone dark answers nothing, ever). Also the TCP keepalive
    /// idle time and `tcp_user_timeout` of the relay's sockets, where the URL sets none.
    /// Default: --settle-margin, the time a settlement has anyway.
    #[arg(long, env = "OUTBOX_DB_TIMEOUT", value_parser = humantime::parse_duration)]
    pub db_timeout: Option<Duration>,

    /// Longest wait between database reconnects and retried settlements (full jitter from
    /// --retry-base), kept well below --retry-max so the relay is back soon after the database.
    #[arg(long, env = "OUTBOX_DB_RETRY_MAX", default_value = "2s", value_parser = humantime::parse_duration)]
    pub db_retry_max: Duration,

    /// How often the table gauges (oldest unsent age, counts) are refreshed.
    #[arg(long, env = "OUTBOX_STATS_INTERVAL", default_value = "5s", value_parser = humantime::parse_duration)]
    pub stats_interval: Duration,

    /// Longest a statistics or maintenance statement (gauges, retention deletes, unparking) may
    /// run: each runs on a connection of its own under this `statement_timeout`, so a large
    /// backlog never delays claims and settlements.
    #[arg(long, env = "OUTBOX_MAINTENANCE_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub maintenance_timeout: Duration,

    /// How long sent rows stay in the table: `0` deletes each row when SQS acknowledged it
    /// (nothing accumulates in the application's database), a duration keeps them that long
    /// (an audit trail, deleted in small batches), `off` keeps them forever.
    #[arg(long, env = "OUTBOX_RETENTION", default_value = "0", value_parser = parse_retention)]
    pub retention: Retention,

    /// How often the retention pass runs.
    #[arg(long, env = "OUTBOX_RETENTION_INTERVAL", default_value = "1m", value_parser = humantime::parse_duration)]
    pub retention_interval: Duration,

    /// The same as `--retention 0` (the default): delete rows as soon as SQS acknowledged them.
    // Boolean variables also take 1/0, yes/no, on/off: manifests write those as often.
    #[arg(long, env = "OUTBOX_DELETE_ON_ACK", value_parser = BoolishValueParser::new())]
    pub delete_on_ack: bool,

    /// Per-group ordered delivery: a group's next event is sent only after the previous one was
    /// acknowledged, across all replicas.
    #[arg(long, env = "OUTBOX_ORDERED", value_enum, default_value_t = Switch::Auto)]
    pub ordered: Switch,

    /// The group key: FIFO MessageGroupId and the unit of ordering (aggregate_id, aggregate_type,
    /// event_type or header:NAME).
    #[arg(long, env = "OUTBOX_GROUP_BY", default_value = "aggregate_id")]
    pub group_by: KeyColumn,

    /// With ordering, what a quarantined row does to the rest of its group.
    #[arg(long, env = "OUTBOX_ON_POISON", value_enum, default_value_t = OnPoison::Block)]
    pub on_poison: OnPoison,

    /// Claim round-robin across the values of this key (e.g. aggregate_type, header:tenant), so a
    /// burst under one value cannot starve the others.
    #[arg(long, env = "OUTBOX_FAIR_BY")]
    pub fair_by: Option<KeyColumn>,

    /// On standard queues, send the --fair-by key as MessageGroupId (SQS fair queues).
    #[arg(long, env = "OUTBOX_FAIR_GROUP_ID", value_parser = BoolishValueParser::new())]
    pub fair_group_id: bool,

    /// Route rows by key value to a queue or topic: KEY=QUEUE_URL or KEY=TOPIC_ARN, repeatable
    /// (env: comma-separated). A row's own queue_url wins; unrouted rows go to --queue-url.
    #[arg(long = "route", env = "OUTBOX_ROUTES", value_delimiter = ',', value_parser = parse_route)]
    pub routes: Vec<(String, String)>,

    /// The key --route matches on.
    #[arg(long, env = "OUTBOX_ROUTE_BY", default_value = "aggregate_type")]
    pub route_by: KeyColumn,

    /// Message body format.
    #[arg(long, env = "OUTBOX_MESSAGE_FORMAT", value_enum, default_value_t = Format::Raw)]
    pub message_format: Format,

    /// Large events through S3: message bodies above --offload-threshold are stored in this
    /// bucket and sent as a pointer in the SQS Extended Client format (docs/large-events.md).
    #[arg(long, env = "OUTBOX_OFFLOAD_BUCKET")]
    pub offload_bucket: Option<String>,

    /// Put in front of every object key in --offload-bucket, e.g. `outbox/`.
    #[arg(long, env = "OUTBOX_OFFLOAD_PREFIX")]
    pub offload_prefix: Option<String>,

    /// Messages larger than this (body and attributes) go through S3; default: those that do
    /// not fit their destination (256 KiB for an SNS topic, which also caps a larger value).
    /// Bytes, or with a KiB/MiB suffix.
    #[arg(long, env = "OUTBOX_OFFLOAD_THRESHOLD", value_parser = parse_bytes)]
    pub offload_threshold: Option<usize>,

    /// S3 endpoint override (local servers, S3-compatible stores); addressed path-style.
    #[arg(long, env = "AWS_ENDPOINT_URL_S3")]
    pub s3_endpoint_url: Option<String>,

    /// CloudEvents `source` attribute (a URI reference naming the producer).
    #[arg(
        long,
        env = "OUTBOX_CLOUDEVENTS_SOURCE",
        default_value = "/outbox-relay"
    )]
    pub cloudevents_source: String,
}

/// A byte size: digits, optionally followed by KiB, MiB or GiB (or K, M, G: the same, binary).
fn parse_bytes(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let unit_bytes: usize = match unit.trim() {
        "" | "B" => 1,
        "K" | "KiB" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        other => {
            return Err(format!(
                "{other:?} is not a unit: use bytes, KiB, MiB or GiB (e.g. 32MiB)"
            ))
        }
    };
    digits
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(unit_bytes))
        .ok_or_else(|| format!("{s:?} is not a size: use bytes, KiB, MiB or GiB (e.g. 32MiB)"))
}

fn parse_route(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((key, url)) if !key.is_empty() && check_destination(url).is_ok() => {
            Ok((key.to_string(), url.to_string()))
        }
        Some((key, url)) if !key.is_empty() && is_topic(url) => Err(format!(
            "{s:?}: {}",
            check_destination(url).expect_err("not ok")
        )),
        _ => Err(format!("{s:?}: use KEY=QUEUE_URL or KEY=TOPIC_ARN, e.g. order=https://sqs.eu-west-1.amazonaws.com/123456789012/orders or order=arn:aws:sns:eu-west-1:123456789012:orders")),
    }
}

/// A destination is an SQS queue URL or an SNS topic ARN
/// (`arn:<partition>:sns:<region>:<account>:<name>`, every part present).
fn check_destination(destination: &str) -> Result<(), String> {
    if is_topic(destination) {
        let parts: Vec<&str> = destination.split(':').collect();
        if parts.len() == 6 && parts.iter().all(|p| !p.is_empty()) {
            return Ok(());
        }
        return Err(format!(
            "{destination:?} is not a topic ARN: expected arn:aws:sns:<region>:<account>:<name>"
        ));
    }
    if destination.starts_with("https://") || destination.starts_with("http://") {
        return Ok(());
    }
    Err(format!(
        "{destination:?} is neither a queue URL (https://sqs.<region>.amazonaws.com/<account>/<name>) nor a topic ARN (arn:aws:sns:<region>:<account>:<name>)"
    ))
}

/// How long sent rows are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retention {
    /// Deleted by the settlement itself, when SQS acknowledged them.
    OnAck,
    /// Marked sent, then deleted by the retention pass this long after sending.
    For(Duration),
    /// Marked sent and kept.
    Off,
}

impl Retention {
    /// Sent rows are deleted at settlement instead of being marked.
    pub fn deletes_on_ack(self) -> bool {
        self == Retention::OnAck
    }
}

fn parse_retention(s: &str) -> Result<Retention, String> {
    if s.eq_ignore_ascii_case("off") {
        return Ok(Retention::Off);
    }
    match humantime::parse_duration(s) {
        Ok(d) if d.is_zero() => Ok(Retention::OnAck),
        Ok(d) => Ok(Retention::For(d)),
        // humantime wants a unit even for zero; a bare 0 is what people write.
        Err(_) if s.trim() == "0" => Ok(Retention::OnAck),
        Err(e) => Err(format!(
            "{e}: use 0 (delete when sent), a duration such as 1h or 7d, or `off`"
        )),
    }
}

/// Rows deleted per retention statement: small enough that each DELETE holds its row locks
/// for milliseconds, large enough that a busy table keeps up.
pub const RETENTION_BATCH: i64 = 1000;

/// The longest `--maintenance-timeout`: a day, well inside PostgreSQL's limit (~24.8 days).
pub const MAX_MAINTENANCE_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// A value that must never be printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Where the database is and which table to use.
#[derive(Debug, Clone)]
pub struct DatabaseConfig {
    pub url: Secret,
    /// What the relay reads and updates: the table, or an adopted table's view.
    pub table: TableName,
    pub connect_timeout: Duration,
    /// With --column: the application's own table and where its columns are.
    pub adopted: Option<(TableName, ColumnMap)>,
    /// Where each new connection's password comes from.
    pub password: PasswordSource,
    /// Whether a pooler shares the server connections with other clients.
    pub pooler: Pooler,
}

/// Everything `run` needs, validated.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub database: DatabaseConfig,
    pub queue_url: String,
    pub sqs_endpoint: Option<String>,
    /// For topic destinations (SNS); `None`: the SDK's own resolution.
    pub sns_endpoint: Option<String>,
    /// Where S3 is reached when large bodies are offloaded; `None`: AWS's own endpoint.
    pub s3_endpoint: Option<String>,
    pub metrics_addr: SocketAddr,
    pub relay_id: String,
    pub lease: Duration,
    pub batch_size: usize,
    pub max_in_flight: usize,
    pub request_concurrency: RequestConcurrency,
    pub wakeup: Wakeup,
    pub poll_interval: Duration,
    pub max_attempts: u32,
    pub send_timeout: Duration,
    pub settle_margin: Duration,
    pub drain_timeout: Duration,
    pub max_request_bytes: usize,
    pub max_bytes_in_flight: usize,
    /// Payloads above it are quarantined by the claim, unread.
    pub max_payload_bytes: usize,
    pub retry_base: Duration,
    pub retry_max: Duration,
    /// The client-side deadline of every database round trip of `run` (`--db-timeout`).
    pub db_timeout: Duration,
    /// The cap of the database reconnect back-off (`--db-retry-max`).
    pub db_retry_max: Duration,
    pub stats_interval: Duration,
    /// `statement_timeout` of each statistics and maintenance statement.
    pub maintenance_timeout: Duration,
    pub retention: Retention,
    pub retention_interval: Duration,
    /// How claims choose rows.
    pub claim: ClaimStrategy,
    /// How rows become messages, and where they go.
    pub plan: PlanConfig,
}

/// SQS's own ceiling for one message and one batch (1 MiB).
pub const SQS_MAX_REQUEST_BYTES: usize = 1024 * 1024;

impl DatabaseArgs {
    pub fn validate(&self) -> Result<DatabaseConfig, String> {
        let url = match self.database_url.as_deref().map(str::trim) {
            Some(url) if !url.is_empty() => url.to_string(),
            _ => {
                return Err(
                    "--database-url (or DATABASE_URL) is required: the PostgreSQL database holding the outbox table"
                        .to_string(),
                )
            }
        };
        let table = self.table.parse::<TableName>()?;
        if self.connect_timeout.is_zero() {
            return Err("--connect-timeout must be above zero".to_string());
        }
        let url = match &self.db_ca_cert {
            Some(path) => crate::tls::with_root_cert(&url, path)?,
            None => url,
        };
        let url = match &self.db_client_cert {
            Some(path) => crate::tls::with_client_cert(&url, path)?,
            None => url,
        };
        let url = match &self.db_client_key {
            Some(path) => crate::tls::with_client_key(&url, path)?,
            None => url,
        };
        // sslmode and its certificate are checked now, before anything is touched.
        let (rest, tls) = crate::tls::split(&url).map_err(|e| {
            format!("--database-url is not a valid PostgreSQL URL or key=value string: {e}")
        })?;
        let ssl = tls.effective_mode()?;
        let password = match tokio_postgres::Config::from_str(&rest) {
            Ok(pg) => crate::dbauth::choose(
                &pg,
                ssl,
                self.database_password_file.as_deref(),
                self.database_iam_auth,
            )?,
            // Outbox::new says what is wrong with the string, in the words every command uses.
            Err(_) => PasswordSource::Url,
        };
        // The one look outside this process here: a missing secret is a configuration
        // mistake, to be reported as one before anything starts. Later reads happen at each
        // connection, where a failure is retried.
        if let PasswordSource::File(path) = &password {
            crate::dbauth::read_password_file(path)
                .map_err(|e| format!("--database-password-file: {e}"))?;
        }
        let (table, adopted) = if self.columns.is_empty() {
            (table, None)
        } else {
            let map = ColumnMap::from_pairs(&self.columns)?;
            (table.relay_view(), Some((table, map)))
        };
        Ok(DatabaseConfig {
            url: Secret(url),
            table,
            connect_timeout: self.connect_timeout,
            adopted,
            password,
            pooler: self.pooler,
        })
    }
}

impl RunArgs {
    /// Checks every rule that needs no I/O.
    pub fn validate(&self) -> Result<RunConfig, String> {
        let database = self.database.validate()?;
        let queue_url =
            match self.queue_url.as_deref().map(str::trim) {
                Some(url) if !url.is_empty() => url.to_string(),
                _ => return Err(
                    "--queue-url (or OUTBOX_QUEUE_URL) is required: the SQS queue URL to send to"
                        .to_string(),
                ),
            };
        check_destination(&queue_url).map_err(|e| format!("--queue-url {e}"))?;
        for (flag, endpoint) in [
            ("--sqs-endpoint-url", &self.sqs_endpoint_url),
            ("--sns-endpoint-url", &self.sns_endpoint_url),
        ] {
            if let Some(endpoint) = endpoint {
                if !(endpoint.starts_with("https://") || endpoint.starts_with("http://")) {
                    return Err(format!(
                        "{flag} {endpoint:?} must start with http:// or https://"
                    ));
                }
            }
        }
        let metrics_addr: SocketAddr = self.metrics_addr.parse().map_err(|_| {
            format!(
                "--metrics-addr {:?} is not an address: use host:port, e.g. 0.0.0.0:9898",
                self.metrics_addr
            )
        })?;
        if self.batch_size == 0 || self.batch_size > 10_000 {
            return Err(format!(
                "--batch-size {} is out of range: use 1 to 10000 rows per claim",
                self.batch_size
            ));
        }
        if self.max_in_flight == 0 || self.max_in_flight > 256 {
            return Err(format!(
                "--max-in-flight {} is out of range: use 1 to 256",
                self.max_in_flight
            ));
        }
        if self.max_attempts == 0 {
            return Err("--max-attempts must be at least 1".to_string());
        }
        for (name, value) in [
            ("--poll-interval", self.poll_interval),
            ("--send-timeout", self.send_timeout),
            ("--stats-interval", self.stats_interval),
            ("--retry-base", self.retry_base),
            ("--retention-interval", self.retention_interval),
            ("--maintenance-timeout", self.maintenance_timeout),
        ] {
            if value.is_zero() {
                return Err(format!("{name} must be above zero"));
            }
        }
        // PostgreSQL's statement_timeout is a 32-bit count of milliseconds.
        if self.maintenance_timeout > MAX_MAINTENANCE_TIMEOUT {
            return Err(format!(
                "--maintenance-timeout {} is too long: use at most {}",
                humantime::format_duration(self.maintenance_timeout),
                humantime::format_duration(MAX_MAINTENANCE_TIMEOUT)
            ));
        }
        if self.retry_max < self.retry_base {
            return Err(format!(
                "--retry-max ({}) must not be below --retry-base ({})",
                humantime::format_duration(self.retry_max),
                humantime::format_duration(self.retry_base)
            ));
        }
        check_lease(self.lease, self.send_timeout, self.settle_margin)?;
        // A settlement slower than the margin kept for it could not protect its lease anyway.
        let db_timeout = self.db_timeout.unwrap_or(self.settle_margin);
        check_db_timeouts(db_timeout, self.db_retry_max, self.lease)?;
        database.pooler.allows(self.wakeup)?;
        let retention = match (self.delete_on_ack, self.retention) {
            (false, retention) | (true, retention @ Retention::OnAck) => retention,
            (true, _) => {
                return Err("--delete-on-ack deletes rows when sent; it contradicts --retention: set one of them (--retention 0 is the same as --delete-on-ack)".to_string())
            }
        };
        if self.max_request_bytes < 1024 || self.max_request_bytes > SQS_MAX_REQUEST_BYTES {
            return Err(format!(
                "--max-request-bytes {} is out of range: use 1024 to {SQS_MAX_REQUEST_BYTES} (SQS's limit)",
                self.max_request_bytes
            ));
        }
        if self.max_bytes_in_flight < self.max_request_bytes {
            return Err(format!(
                "--max-bytes-in-flight {} is below --max-request-bytes {}: it must hold at least one request",
                self.max_bytes_in_flight, self.max_request_bytes
            ));
        }
        let max_payload_bytes = self.max_payload_bytes.unwrap_or(self.max_bytes_in_flight);
        if max_payload_bytes == 0 || max_payload_bytes > self.max_bytes_in_flight {
            return Err(format!(
                "--max-payload-bytes {max_payload_bytes} is out of range: use 1 to --max-bytes-in-flight ({}), the most the relay holds at once",
                self.max_bytes_in_flight
            ));
        }
        // Ordering is decided per destination queue: with `auto` and a standard default queue,
        // the rows whose own queue_url or route is a FIFO queue are ordered, the others not.
        let scope = match self.ordered {
            Switch::On => Some(OrderScope::Every),
            Switch::Off => None,
            Switch::Auto if is_fifo(&queue_url) => Some(OrderScope::Every),
            Switch::Auto => Some(OrderScope::FifoDestinations {
                route_by: self.route_by.clone(),
                fifo_routes: self
                    .routes
                    .iter()
                    .filter(|(_, url)| is_fifo(url))
                    .map(|(key, _)| key.clone())
                    .collect(),
            }),
        };
        if self.fair_group_id && self.fair_by.is_none() {
            return Err(
                "--fair-group-id sends the --fair-by key as MessageGroupId: set --fair-by too"
                    .to_string(),
            );
        }
        if self.fair_group_id {
            let standard_topic = std::iter::once(&queue_url)
                .chain(self.routes.iter().map(|(_, d)| d))
                .find(|d| is_topic(d) && !is_fifo(d));
            if let Some(topic) = standard_topic {
                return Err(format!("--fair-group-id is for SQS fair queues; the standard topic {topic} takes no MessageGroupId: route it without --fair-group-id, or use a FIFO topic"));
            }
        }
        let format = match self.message_format {
            Format::Raw => MessageFormat::Raw,
            Format::Cloudevents if self.cloudevents_source.trim().is_empty() => {
                return Err("--message-format cloudevents needs --cloudevents-source (a URI reference such as /shop/orders)".to_string())
            }
            Format::Cloudevents => MessageFormat::CloudEvents {
                source: self.cloudevents_source.clone(),
            },
        };
        let offload = self.offload()?;
        let ordered = scope.map(|scope| Ordered {
            key: self.group_by.clone(),
            routing: crate::group::Routing::new(&queue_url, &self.routes, &self.route_by),
            skip_poison: self.on_poison == OnPoison::Skip,
            scope,
        });
        let plan_ordering = ordered.as_ref().map(|o| PlanOrdering {
            every_destination: o.scope == OrderScope::Every,
            skip_poison: o.skip_poison,
        });
        let claim = ClaimStrategy::new(ordered, self.fair_by.clone());
        let plan = PlanConfig {
            default_queue_url: queue_url.clone(),
            routes: self.routes.clone(),
            route_by: self.route_by.clone(),
            group_by: self.group_by.clone(),
            fair_group: self.fair_by.clone().filter(|_| self.fair_group_id),
            format,
            max_request_bytes: self.max_request_bytes,
            ordering: plan_ordering,
            offload,
        };
        let relay_id = match self.relay_id.as_deref().map(str::trim) {
            Some("") => return Err("--relay-id must not be empty".to_string()),
            Some(id) => id.to_string(),
            None => default_relay_id(),
        };
        Ok(RunConfig {
            database,
            queue_url,
            sqs_endpoint: self.sqs_endpoint_url.clone(),
            sns_endpoint: self.sns_endpoint_url.clone(),
            s3_endpoint: self.s3_endpoint_url.clone(),
            metrics_addr,
            relay_id,
            lease: self.lease,
            batch_size: self.batch_size,
            max_in_flight: self.max_in_flight,
            request_concurrency: self.request_concurrency,
            wakeup: self.wakeup,
            poll_interval: self.poll_interval,
            max_attempts: self.max_attempts,
            send_timeout: self.send_timeout,
            settle_margin: self.settle_margin,
            drain_timeout: self.drain_timeout,
            max_request_bytes: self.max_request_bytes,
            max_bytes_in_flight: self.max_bytes_in_flight,
            max_payload_bytes,
            retry_base: self.retry_base,
            retry_max: self.retry_max,
            db_timeout,
            db_retry_max: self.db_retry_max,
            stats_interval: self.stats_interval,
            maintenance_timeout: self.maintenance_timeout,
            retention,
            retention_interval: self.retention_interval,
            claim,
            plan,
        })
    }
}

impl RunArgs {
    /// `--offload-*`: where large bodies go. The object key is the prefix and a 64-character
    /// digest, within S3's 1024 bytes.
    fn offload(&self) -> Result<Option<OffloadPlan>, String> {
        let prefix = self.offload_prefix.clone().unwrap_or_default();
        let bucket = match self.offload_bucket.as_deref().map(str::trim) {
            Some(bucket) if !bucket.is_empty() => bucket.to_string(),
            _ if self.offload_threshold.is_some() || !prefix.is_empty() => {
                return Err(
                    "--offload-threshold and --offload-prefix need --offload-bucket (the S3 bucket large bodies go to)"
                        .to_string(),
                )
            }
            _ => return Ok(None),
        };
        if bucket.contains('/') {
            return Err(format!(
                "--offload-bucket {bucket:?} is a bucket name, not a URL or path: put key prefixes in --offload-prefix"
            ));
        }
        if prefix.len() > 1024 - 64 {
            return Err(format!(
                "--offload-prefix is {} bytes; S3 keys hold 1024 and the relay adds 64",
                prefix.len()
            ));
        }
        if let Some(threshold) = self.offload_threshold {
            if threshold == 0 || threshold > self.max_request_bytes {
                return Err(format!(
                    "--offload-threshold {threshold} is out of range: use 1 to --max-request-bytes ({})",
                    self.max_request_bytes
                ));
            }
        }
        if let Some(endpoint) = &self.s3_endpoint_url {
            if !(endpoint.starts_with("https://") || endpoint.starts_with("http://")) {
                return Err(format!(
                    "--s3-endpoint-url {endpoint:?} must start with http:// or https://"
                ));
            }
        }
        Ok(Some(OffloadPlan {
            bucket,
            prefix,
            threshold: self.offload_threshold,
        }))
    }
}

/// The lease must outlast a send and the settlement after it; otherwise another replica could
/// take the rows over while this one still holds SQS's answer, and every slow send would
/// become a duplicate.
pub fn check_lease(
    lease: Duration,
    send_timeout: Duration,
    settle_margin: Duration,
) -> Result<(), String> {
    if send_timeout + settle_margin >= lease {
        return Err(format!(
            "--lease ({}) must be longer than --send-timeout ({}) + --settle-margin ({}), so a row's lease outlasts its send",
            humantime::format_duration(lease),
            humantime::format_duration(send_timeout),
            humantime::format_duration(settle_margin)
        ));
    }
    Ok(())
}

/// A round trip allowed to outlast the lease could never protect what it settles; a zero
/// deadline or back-off cap would spin.
pub fn check_db_timeouts(
    db_timeout: Duration,
    db_retry_max: Duration,
    lease: Duration,
) -> Result<(), String> {
    if db_timeout.is_zero() || db_retry_max.is_zero() {
        return Err(
            "--db-timeout (default: --settle-margin) and --db-retry-max must be above zero"
                .to_string(),
        );
    }
    if db_timeout >= lease {
        return Err(format!(
            "--db-timeout ({}) must be shorter than --lease ({}): a settlement must be able to finish while the lease holds",
            humantime::format_duration(db_timeout),
            humantime::format_duration(lease)
        ));
    }
    Ok(())
}

fn default_relay_id() -> String {
    let host = gethostname::gethostname().to_string_lossy().into_owned();
    format!("{host}-{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_maintenance_timeout_is_above_zero_and_within_postgresqls_limit() {
        assert_eq!(
            run_args(&[]).unwrap().maintenance_timeout,
            Duration::from_secs(10)
        );
        assert_eq!(
            run_args(&["--maintenance-timeout", "0s"]).unwrap_err(),
            "--maintenance-timeout must be above zero"
        );
        let err = run_args(&["--maintenance-timeout", "30days"]).unwrap_err();
        assert!(
            err.starts_with("--maintenance-timeout 30days is too long: use at most 1day"),
            "{err}"
        );
        assert_eq!(
            run_args(&["--maintenance-timeout", "500ms"])
                .unwrap()
                .maintenance_timeout,
            Duration::from_millis(500)
        );
    }

    fn run_args(extra: &[&str]) -> Result<RunConfig, String> {
        run_args_to("http://127.0.0.1:4566/000000000000/q", extra)
    }

    fn run_args_to(queue_url: &str, extra: &[&str]) -> Result<RunConfig, String> {
        let mut argv = vec![
            "outbox-relay",
            "run",
            "--database-url",
            "postgres://relay:pw@127.0.0.1:5432/app",
            "--queue-url",
            queue_url,
        ];
        argv.extend_from_slice(extra);
        let cli = Cli::try_parse_from(argv).map_err(|e| e.to_string())?;
        match cli.command {
            Command::Run(args) => args.validate(),
            other => panic!("parsed {other:?}"),
        }
    }

    #[test]
    fn the_largest_payload_read_defaults_to_the_bytes_in_flight_and_cannot_exceed_them() {
        let c = run_args(&[]).unwrap();
        assert_eq!(c.max_payload_bytes, c.max_bytes_in_flight);
        let c = run_args(&["--max-bytes-in-flight", "8MiB"]).unwrap();
        assert_eq!(c.max_payload_bytes, 8 * 1024 * 1024);
        let c = run_args(&["--max-payload-bytes", "256KiB"]).unwrap();
        assert_eq!(c.max_payload_bytes, 256 * 1024);
        for bad in ["0", "64MiB"] {
            let err = run_args(&["--max-payload-bytes", bad]).unwrap_err();
            assert!(
                err.starts_with("--max-payload-bytes") && err.contains("--max-bytes-in-flight"),
                "{err}"
            );
            assert!(!err.contains('\n'), "one line: {err}");
        }
    }

    #[test]
    fn offload_is_off_by_default_and_its_flags_need_a_bucket() {
        assert_eq!(run_args(&[]).unwrap().plan.offload, None);
        let c = run_args(&[
            "--offload-bucket",
            "events",
            "--offload-prefix",
            "outbox/",
            "--offload-threshold",
            "256KiB",
        ])
        .unwrap();
        assert_eq!(
            c.plan.offload,
            Some(OffloadPlan {
                bucket: "events".into(),
                prefix: "outbox/".into(),
                threshold: Some(256 * 1024),
            })
        );
        let err = run_args(&["--offload-threshold", "1KiB"]).unwrap_err();
        assert!(err.contains("need --offload-bucket"), "{err}");
        let err = run_args(&["--offload-bucket", "s3://events/x"]).unwrap_err();
        assert!(err.contains("--offload-prefix"), "{err}");
        let err = run_args(&["--offload-bucket", "e", "--offload-threshold", "2MiB"]).unwrap_err();
        assert!(err.contains("out of range"), "{err}");
    }

    #[test]
    fn defaults_are_valid_and_keep_the_lease_relation() {
        let c = run_args(&[]).unwrap();
        assert_eq!(c.batch_size, 100);
        assert_eq!(c.lease, Duration::from_secs(30));
        assert!(c.send_timeout + c.settle_margin < c.lease);
        assert_eq!(c.database.table.quoted(), "\"outbox\"");
        assert!(!c.relay_id.is_empty());
    }

    #[test]
    fn the_lease_must_outlast_send_timeout_plus_settle_margin() {
        let s = Duration::from_secs;
        assert!(check_lease(s(30), s(10), s(5)).is_ok());
        assert!(check_lease(s(16), s(10), s(5)).is_ok());
        let err = check_lease(s(15), s(10), s(5)).unwrap_err();
        assert!(err.contains(
            "--lease (15s) must be longer than --send-timeout (10s) + --settle-margin (5s)"
        ));
        assert!(check_lease(s(5), s(10), s(1)).is_err());
        let err = run_args(&["--lease", "5s"]).unwrap_err();
        assert!(err.contains("--lease"), "{err}");
    }

    #[test]
    fn missing_queue_url_says_what_to_set() {
        let cli =
            Cli::try_parse_from(["outbox-relay", "run", "--database-url", "postgres://x@h/db"])
                .unwrap();
        let Command::Run(mut args) = cli.command else {
            panic!()
        };
        args.queue_url = None;
        let err = args.validate().unwrap_err();
        assert!(err.starts_with("--queue-url (or OUTBOX_QUEUE_URL) is required"));
        assert!(!err.contains('\n'));
    }

    #[test]
    fn ranges_and_shapes_are_checked() {
        for (flags, needle) in [
            (vec!["--batch-size", "0"], "--batch-size 0"),
            (vec!["--max-in-flight", "0"], "--max-in-flight 0"),
            (vec!["--max-attempts", "0"], "--max-attempts"),
            (vec!["--metrics-addr", "nope"], "--metrics-addr"),
            (
                vec!["--max-request-bytes", "2000000"],
                "--max-request-bytes",
            ),
            (
                vec!["--retry-base", "10s", "--retry-max", "1s"],
                "--retry-max",
            ),
            (vec!["--table", "a.b.c"], "--table"),
            (vec!["--db-timeout", "0s"], "--db-timeout"),
            (vec!["--db-retry-max", "0s"], "--db-retry-max"),
            (
                vec!["--db-timeout", "30s", "--lease", "30s"],
                "--db-timeout (30s)",
            ),
            (
                vec!["--settle-margin", "0s"],
                "--db-timeout (default: --settle-margin)",
            ),
            (
                vec!["--sqs-endpoint-url", "localhost:4566"],
                "--sqs-endpoint-url",
            ),
        ] {
            let err = run_args(&flags).unwrap_err();
            assert!(err.contains(needle), "{flags:?}: {err}");
            assert!(!err.contains('\n'), "one line: {err}");
        }
    }

    #[test]
    fn the_database_deadline_defaults_to_the_settle_margin() {
        let c = run_args(&["--settle-margin", "3s"]).unwrap();
        assert_eq!(c.db_timeout, Duration::from_secs(3));
        assert_eq!(c.db_retry_max, Duration::from_secs(2));
        let c = run_args(&["--db-timeout", "7s"]).unwrap();
        assert_eq!(c.db_timeout, Duration::from_secs(7));
    }

    #[test]
    fn retention_takes_zero_a_duration_or_off() {
        assert_eq!(run_args(&[]).unwrap().retention, Retention::OnAck);
        for zero in ["0", "0s"] {
            assert_eq!(
                run_args(&["--retention", zero]).unwrap().retention,
                Retention::OnAck
            );
        }
        assert_eq!(
            run_args(&["--delete-on-ack"]).unwrap().retention,
            Retention::OnAck
        );
        let err = run_args(&["--delete-on-ack", "--retention", "1h"]).unwrap_err();
        assert!(err.contains("contradicts --retention"), "{err}");
        assert_eq!(
            run_args(&["--retention", "off"]).unwrap().retention,
            Retention::Off
        );
        assert_eq!(
            run_args(&["--retention", "90s"]).unwrap().retention,
            Retention::For(Duration::from_secs(90))
        );
        assert!(run_args(&["--retention", "soon"])
            .unwrap_err()
            .contains("or `off`"));
    }

    #[test]
    fn pooler_defaults_to_direct_connections_and_refuses_what_cannot_cross_it() {
        assert_eq!(run_args(&[]).unwrap().database.pooler, Pooler::None);
        let pooled = run_args(&["--pooler", "transaction"]).unwrap();
        assert_eq!(pooled.database.pooler, Pooler::Transaction);
        for wakeup in ["notify", "logical"] {
            let err = run_args(&["--pooler", "transaction", "--wakeup", wakeup]).unwrap_err();
            assert!(err.contains(&format!("--wakeup {wakeup}")), "{err}");
            assert!(!err.contains('\n'), "{err}");
        }
        assert!(run_args(&["--pooler", "session", "--wakeup", "notify"]).is_ok());
        assert!(run_args(&["--pooler", "session", "--wakeup", "logical"]).is_err());
        assert!(run_args(&["--pooler", "statement"]).is_err());
    }

    #[test]
    fn wakeup_defaults_to_polling_and_names_each_mode() {
        assert_eq!(run_args(&[]).unwrap().wakeup, Wakeup::Poll);
        for (flag, mode) in [
            ("poll", Wakeup::Poll),
            ("logical", Wakeup::Logical),
            ("notify", Wakeup::Notify),
        ] {
            assert_eq!(run_args(&["--wakeup", flag]).unwrap().wakeup, mode);
        }
        let err = run_args(&["--wakeup", "listen"]).unwrap_err();
        assert!(err.contains("poll, logical or notify"), "{err}");
    }

    #[test]
    fn quarantine_retry_needs_exactly_one_selection() {
        let parse = |extra: &[&str]| {
            let mut argv = vec![
                "outbox-relay",
                "quarantine",
                "retry",
                "--database-url",
                "postgres://h/db",
            ];
            argv.extend_from_slice(extra);
            Cli::try_parse_from(argv)
        };
        assert!(parse(&[]).is_err());
        assert!(parse(&["--id", "3", "--all"]).is_err());
        assert!(
            parse(&["--reason", "invalid"]).is_err(),
            "--reason only narrows --all"
        );
        assert!(parse(&["--all", "--reason", "invalid"]).is_ok());
        assert!(parse(&["--event-id", "order-1:paid"]).is_ok());
    }

    #[test]
    fn ordering_is_decided_per_destination_queue() {
        let fifo = "http://127.0.0.1:4566/000000000000/orders.fifo";
        let c = run_args_to(fifo, &[]).unwrap();
        let ordered = c.claim.ordered().expect("ordered on a FIFO queue").clone();
        assert_eq!(ordered.key, KeyColumn::AggregateId);
        assert!(!ordered.skip_poison);
        assert_eq!(ordered.scope, OrderScope::Every);
        // A standard default queue: only rows bound for a FIFO queue (their own queue_url, a
        // FIFO route) are ordered.
        let c = run_args(&[]).unwrap();
        assert!(matches!(
            c.claim.ordered().unwrap().scope,
            OrderScope::FifoDestinations { ref fifo_routes, .. } if fifo_routes.is_empty()
        ));
        assert_eq!(
            c.plan.ordering,
            Some(PlanOrdering {
                every_destination: false,
                skip_poison: false
            })
        );
        let c = run_args(&[
            "--ordered",
            "on",
            "--group-by",
            "header:tenant",
            "--on-poison",
            "skip",
        ])
        .unwrap();
        let ordered = c.claim.ordered().unwrap();
        assert_eq!(ordered.key, KeyColumn::Header("tenant".into()));
        assert!(ordered.skip_poison);
        assert_eq!(ordered.scope, OrderScope::Every);
        let off = run_args_to(fifo, &["--ordered", "off"]).unwrap();
        assert_eq!(off.claim, ClaimStrategy::Plain);
        assert_eq!(off.plan.ordering, None);
        let routed = run_args(&[
            "--route",
            "order=http://q/1/orders.fifo",
            "--route",
            "invoice=http://q/1/invoices",
        ])
        .unwrap();
        assert!(matches!(
            &routed.claim.ordered().unwrap().scope,
            OrderScope::FifoDestinations { fifo_routes, .. } if fifo_routes == &["order".to_string()]
        ));
        let fair = run_args_to(fifo, &["--fair-by", "aggregate_type"]).unwrap();
        assert!(matches!(fair.claim, ClaimStrategy::OrderedFair { .. }));
    }

    #[test]
    fn topic_arns_are_destinations_and_what_topics_cannot_do_is_refused() {
        let topic = "arn:aws:sns:eu-west-1:123456789012:orders";
        let fifo_topic = "arn:aws:sns:eu-west-1:123456789012:orders.fifo";
        let c = run_args_to(topic, &["--route", &format!("pay={fifo_topic}")]).unwrap();
        assert_eq!(c.queue_url, topic);
        assert_eq!(c.plan.routes[0].1, fifo_topic);
        // A FIFO topic route orders its rows like a FIFO queue route does.
        assert!(matches!(
            &c.claim.ordered().unwrap().scope,
            OrderScope::FifoDestinations { fifo_routes, .. } if fifo_routes == &["pay".to_string()]
        ));
        let c = run_args_to(fifo_topic, &["--sns-endpoint-url", "http://127.0.0.1:1"]).unwrap();
        assert_eq!(c.claim.ordered().unwrap().scope, OrderScope::Every);
        assert_eq!(c.sns_endpoint.as_deref(), Some("http://127.0.0.1:1"));
        let err = run_args_to("arn:aws:sns:eu-west-1:orders", &[]).unwrap_err();
        assert!(
            err.starts_with("--queue-url") && err.contains("not a topic ARN"),
            "{err}"
        );
        let err = run_args(&["--route", "x=arn:aws:sns::1:t"]).unwrap_err();
        assert!(err.contains("not a topic ARN"), "{err}");
        let err =
            run_args_to(topic, &["--fair-by", "aggregate_type", "--fair-group-id"]).unwrap_err();
        assert!(err.contains("takes no MessageGroupId"), "{err}");
        assert!(run_args_to(
            fifo_topic,
            &["--fair-by", "aggregate_type", "--fair-group-id"]
        )
        .is_ok());
        assert!(run_args_to(topic, &["--sns-endpoint-url", "localhost:1"])
            .unwrap_err()
            .starts_with("--sns-endpoint-url"));
    }

    #[test]
    fn routes_fairness_and_formats_are_validated() {
        let c = run_args(&[
            "--route",
            "order=http://q/o",
            "--route",
            "invoice=http://q/i",
            "--route-by",
            "event_type",
        ])
        .unwrap();
        assert_eq!(c.plan.routes.len(), 2);
        assert_eq!(c.plan.route_by, KeyColumn::EventType);
        assert!(run_args(&["--route", "nourl"])
            .unwrap_err()
            .contains("KEY=QUEUE_URL"));
        assert!(run_args(&["--fair-group-id"])
            .unwrap_err()
            .contains("set --fair-by"));
        let c = run_args(&["--fair-by", "aggregate_type", "--fair-group-id"]).unwrap();
        assert_eq!(c.claim.fair(), Some(&KeyColumn::AggregateType));
        assert_eq!(c.plan.fair_group, Some(KeyColumn::AggregateType));
        assert!(run_args(&["--group-by", "payload"])
            .unwrap_err()
            .contains("not a key"));
        let c = run_args(&[
            "--message-format",
            "cloudevents",
            "--cloudevents-source",
            "/shop",
        ])
        .unwrap();
        assert_eq!(
            c.plan.format,
            MessageFormat::CloudEvents {
                source: "/shop".into()
            }
        );
        assert!(run_args(&[
            "--message-format",
            "cloudevents",
            "--cloudevents-source",
            " "
        ])
        .is_err());
    }

    #[test]
    fn column_mapping_reads_an_adopted_table_through_its_view() {
        let c = run_args(&[
            "--table",
            "app.outboxevent",
            "--column",
            "event_id=id",
            "--column",
            "aggregate_type=aggregatetype",
            "--column",
            "headers=",
        ])
        .unwrap();
        assert_eq!(c.database.table.quoted(), "\"app\".\"outboxevent_relay\"");
        let (base, map) = c.database.adopted.unwrap();
        assert_eq!(base.quoted(), "\"app\".\"outboxevent\"");
        assert_eq!(map.event_id, "id");
        assert_eq!(map.aggregate_type, "aggregatetype");
        assert_eq!(map.headers, None);
        assert_eq!(map.id, "outbox_seq");
        assert!(run_args(&["--column", "payload="])
            .unwrap_err()
            .contains("needs a column"));
        assert!(run_args(&["--column", "nope=x"])
            .unwrap_err()
            .contains("unknown name"));
        assert!(run_args(&["--column", "x"]).is_err());
    }

    fn database(url: &str, extra: &[&str]) -> Result<DatabaseConfig, String> {
        let mut argv = vec!["outbox-relay", "status", "--database-url", url];
        argv.extend_from_slice(extra);
        let cli = Cli::try_parse_from(argv).map_err(|e| e.to_string())?;
        match cli.command {
            Command::Status(args) => args.database.validate(),
            other => panic!("parsed {other:?}"),
        }
    }

    #[test]
    fn the_password_source_follows_the_flags_and_a_missing_file_is_a_configuration_error() {
        let bare = "postgres://relay@db.internal:5432/app";
        assert_eq!(database(bare, &[]).unwrap().password, PasswordSource::Url);
        assert_eq!(
            database(bare, &["--database-iam-auth"]).unwrap().password,
            PasswordSource::Iam
        );
        let err = run_args(&["--database-iam-auth"]).unwrap_err();
        assert!(
            err.contains("remove the password from --database-url"),
            "{err}"
        );
        let err =
            database(&format!("{bare}?sslmode=disable"), &["--database-iam-auth"]).unwrap_err();
        assert!(err.contains("sslmode=disable"), "{err}");

        let path = std::env::temp_dir().join(format!("config-pw-{}", std::process::id()));
        let file = path.to_str().unwrap();
        let err = database(bare, &["--database-password-file", file]).unwrap_err();
        assert!(
            err.starts_with("--database-password-file: cannot read the password file"),
            "{err}"
        );
        assert!(err.contains(file) && !err.contains('\n'), "{err}");
        std::fs::write(&path, "rotated-secret\n").unwrap();
        let config = database(bare, &["--database-password-file", file]).unwrap();
        assert_eq!(config.password, PasswordSource::File(path.clone()));
        let err = run_args(&["--database-password-file", file]).unwrap_err();
        assert!(err.contains("remove the password from the URL"), "{err}");
        let err = database(
            bare,
            &["--database-password-file", file, "--database-iam-auth"],
        )
        .unwrap_err();
        assert!(err.contains("choose one"), "{err}");
        assert!(!format!("{config:?}").contains("rotated-secret"));
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn the_database_url_is_redacted_in_debug_output() {
        let c = run_args(&[]).unwrap();
        let shown = format!("{c:?}");
        assert!(!shown.contains("relay:pw"), "{shown}");
        assert!(shown.contains("<redacted>"));
    }

    /// Every boolean flag that reads an environment variable: (subcommand path, arg id, env).
    fn boolean_env_flags() -> Vec<(Vec<String>, String, String)> {
        fn walk(
            cmd: &clap::Command,
            path: &[String],
            out: &mut Vec<(Vec<String>, String, String)>,
        ) {
            for arg in cmd.get_arguments() {
                if let (Some(env), clap::ArgAction::SetTrue) = (arg.get_env(), arg.get_action()) {
                    let env = env.to_string_lossy().into_owned();
                    out.push((path.to_vec(), arg.get_id().to_string(), env));
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &[path, &[sub.get_name().to_string()]].concat(), out);
            }
        }
        let mut out = Vec::new();
        walk(&<Cli as clap::CommandFactory>::command(), &[], &mut out);
        out
    }

    /// `cmd` with the flag `id` (under the subcommands `path`) taking a value.
    fn taking_a_value(cmd: clap::Command, path: &[String], id: &str) -> clap::Command {
        match path.split_first() {
            None => cmd.mut_arg(id, |a| a.action(clap::ArgAction::Set)),
            Some((name, rest)) => cmd.mut_subcommand(name, |sub| taking_a_value(sub, rest, id)),
        }
    }

    /// Manifests and shells write 1/0, yes/no, on/off as often as true/false. clap reads the
    /// variable through the flag's value parser. Tests share the process environment, so
    /// instead each flag is made to take a value and given the same text on the command line,
    /// where that same parser reads it.
    #[test]
    fn boolean_environment_variables_accept_the_usual_spellings() {
        let flags = boolean_env_flags();
        let envs: Vec<&str> = flags.iter().map(|(_, _, env)| env.as_str()).collect();
        for expected in ["OUTBOX_DELETE_ON_ACK", "OUTBOX_FAIR_GROUP_ID"] {
            assert!(envs.contains(&expected), "{expected} in {envs:?}");
        }
        for (path, id, env) in &flags {
            // Other required arguments (quarantine retry's selection) are not this test's
            // concern.
            let cmd = taking_a_value(<Cli as clap::CommandFactory>::command(), path, id)
                .ignore_errors(true);
            let long = format!("--{}", id.replace('_', "-"));
            for (text, want) in [
                ("1", true),
                ("0", false),
                ("yes", true),
                ("no", false),
                ("on", true),
                ("off", false),
                ("true", true),
                ("false", false),
            ] {
                let argv = ["outbox-relay"]
                    .into_iter()
                    .chain(path.iter().map(String::as_str))
                    .chain([long.as_str(), text]);
                let matches = cmd
                    .clone()
                    .try_get_matches_from(argv)
                    .unwrap_or_else(|e| panic!("{env}={text}: {e}"));
                let matches = path.iter().fold(&matches, |m, name| {
                    m.subcommand_matches(name).expect("subcommand")
                });
                assert_eq!(matches.get_one::<bool>(id), Some(&want), "{env}={text}");
            }
        }
    }

    #[test]
    fn boolean_flags_still_work_without_a_value() {
        let c = run_args(&["--fair-by", "aggregate_type", "--fair-group-id"]).unwrap();
        assert!(c.plan.fair_group.is_some());
        assert!(run_args(&[]).unwrap().plan.fair_group.is_none());
        assert_eq!(
            run_args(&["--delete-on-ack"]).unwrap().retention,
            Retention::OnAck
        );
    }
}
