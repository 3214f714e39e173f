//! `run`'s flags (which `check` shares) and their validated form, [`RunConfig`].

use std::net::SocketAddr;
use std::time::Duration;

use clap::builder::BoolishValueParser;
use clap::{Args, ValueEnum};

use super::parse::{check_destination, parse_bytes, parse_retention, parse_route};
use super::{DatabaseArgs, DatabaseConfig};
use crate::batch::{
    is_fifo, is_topic, KeyColumn, MessageFormat, OffloadPlan, PlanConfig, PlanOrdering,
};
use crate::concurrency::RequestConcurrency;
use crate::outbox::{ClaimStrategy, OrderScope, Ordered, Wakeup};

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

/// Rows deleted per retention statement: small enough that each DELETE holds its row locks
/// for milliseconds, large enough that a busy table keeps up.
pub const RETENTION_BATCH: i64 = 1000;

/// The longest `--maintenance-timeout`: a day, well inside PostgreSQL's limit (~24.8 days).
pub const MAX_MAINTENANCE_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

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
