//! The claim, send and retry groups of `run`'s flags: how many rows are worked on at once, how
//! long each step may take, and how failures wait. The lease ties them together: it must
//! outlast a send, its settlement and every database round trip.

use std::time::Duration;

use clap::Args;

use super::parse::parse_bytes;
use crate::concurrency::RequestConcurrency;
use crate::outbox::{Pooler, Wakeup};

/// SQS's own ceiling for one message and one batch (1 MiB).
pub const SQS_MAX_REQUEST_BYTES: usize = 1024 * 1024;

/// `--max-delay` unless set (or --poll-interval if shorter): within the tens of milliseconds an
/// event's delivery takes anyway (a SendMessageBatch in-region is ~15 ms), and long enough that
/// at 200 events/s a claim carries six of them (docs/benchmarks.md, "Rates").
pub const DEFAULT_MAX_DELAY: Duration = Duration::from_millis(30);

/// How rows are claimed and worked on: lease, batch, requests in flight, wake-ups, attempts.
#[derive(Debug, Clone, Args)]
pub struct ClaimArgs {
    /// How long a claim holds its rows; must outlast --send-timeout + --settle-margin.
    #[arg(long, env = "OUTBOX_LEASE", default_value = "30s", value_parser = humantime::parse_duration)]
    pub lease: Duration,

    /// Rows per claim; a relay that falls behind (its claims come back full) claims up to four
    /// times this at once until it has caught up.
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

    /// The latency budget: how long the oldest new row may wait for its claim while events
    /// flow. After a claim that found rows but did not fill --batch-size the relay waits for
    /// more, up to this (counted from that claim's start), less when the stream writes a quarter
    /// batch sooner; with `notify`/`logical`, counted from the wake-up. Every claim and
    /// settlement is a transaction in the application's database: a longer budget carries more
    /// rows per claim for less database CPU per event. 0 claims again at once. Default: 30ms,
    /// or --poll-interval if shorter. (Was `--linger`.)
    #[arg(long, env = "OUTBOX_MAX_DELAY", alias = "linger", value_parser = humantime::parse_duration)]
    pub max_delay: Option<Duration>,

    /// Quarantine a row after this many failed attempts.
    #[arg(long, env = "OUTBOX_MAX_ATTEMPTS", default_value_t = 10)]
    pub max_attempts: u32,

    /// Lease owner name; default host name and process ID.
    #[arg(long, env = "OUTBOX_RELAY_ID")]
    pub relay_id: Option<String>,
}

/// How long one send may take, how much is sent at once, and how large a payload may be.
#[derive(Debug, Clone, Args)]
pub struct SendArgs {
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
}

/// How failures wait, and how long a database round trip may take.
#[derive(Debug, Clone, Args)]
pub struct RetryArgs {
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
}

/// The claim group, validated.
#[derive(Debug, Clone)]
pub struct ClaimConfig {
    /// How long a claim holds its rows before another replica may take them over.
    pub lease: Duration,
    /// Rows per claim.
    pub batch_size: usize,
    /// Requests in flight at once, all destinations together; each destination's ceiling.
    pub max_in_flight: usize,
    /// Whether each destination's share of the requests adapts to its answers.
    pub request_concurrency: RequestConcurrency,
    /// How an idle relay learns of new rows.
    pub wakeup: Wakeup,
    /// The longest an idle relay waits before looking for work.
    pub poll_interval: Duration,
    /// The latency budget of the oldest new row while events flow (`relay::gather`).
    pub max_delay: Duration,
    /// Failed attempts after which a row is quarantined.
    pub max_attempts: u32,
    /// The lease owner written on each claim's row in the lease table (and the relay's name in
    /// the fleet registry), so an operator sees who holds which rows.
    pub relay_id: String,
}

/// The send group, validated.
#[derive(Debug, Clone)]
pub struct SendConfig {
    /// The longest one SQS or SNS call may take.
    pub send_timeout: Duration,
    /// The part of the lease kept after a send to record its outcome.
    pub settle_margin: Duration,
    /// On SIGTERM, how long in-flight sends may finish.
    pub drain_timeout: Duration,
    /// The largest message and batch request, in bytes.
    pub max_request_bytes: usize,
    /// Payload bytes being delivered at once: what bounds the relay's memory.
    pub max_bytes_in_flight: usize,
    /// Payloads above it are quarantined by the claim, unread.
    pub max_payload_bytes: usize,
}

/// The retry group, validated.
#[derive(Debug, Clone)]
pub struct RetryConfig {
    /// The first retry delay of a row; doubles per attempt.
    pub retry_base: Duration,
    /// The longest retry delay, for rows and for the relay's own back-off.
    pub retry_max: Duration,
    /// The client-side deadline of every database round trip of `run` (`--db-timeout`).
    pub db_timeout: Duration,
    /// The cap of the database reconnect back-off (`--db-retry-max`).
    pub db_retry_max: Duration,
}

impl ClaimArgs {
    /// Ranges and the wake-up mode; `pooler`, because a pooler in between cannot carry every
    /// wake-up mode.
    pub fn validate(&self, pooler: Pooler) -> Result<ClaimConfig, String> {
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
        above_zero(&[("--poll-interval", self.poll_interval)])?;
        let max_delay = self
            .max_delay
            .unwrap_or(DEFAULT_MAX_DELAY.min(self.poll_interval));
        if max_delay > self.poll_interval {
            return Err(format!(
                "--max-delay {} is longer than --poll-interval {}: a stream would wait longer than an idle relay; lower --max-delay",
                humantime::format_duration(max_delay),
                humantime::format_duration(self.poll_interval)
            ));
        }
        pooler.allows(self.wakeup)?;
        let relay_id = match self.relay_id.as_deref().map(str::trim) {
            Some("") => return Err("--relay-id must not be empty".to_string()),
            Some(id) => id.to_string(),
            None => default_relay_id(),
        };
        Ok(ClaimConfig {
            lease: self.lease,
            batch_size: self.batch_size,
            max_in_flight: self.max_in_flight,
            request_concurrency: self.request_concurrency,
            wakeup: self.wakeup,
            poll_interval: self.poll_interval,
            max_delay,
            max_attempts: self.max_attempts,
            relay_id,
        })
    }
}

impl SendArgs {
    /// Timeouts within the `lease`, and sizes: a request within SQS's limit, the bytes in
    /// flight holding at least one request, a payload within the bytes in flight.
    pub fn validate(&self, lease: Duration) -> Result<SendConfig, String> {
        above_zero(&[("--send-timeout", self.send_timeout)])?;
        check_lease(lease, self.send_timeout, self.settle_margin)?;
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
        Ok(SendConfig {
            send_timeout: self.send_timeout,
            settle_margin: self.settle_margin,
            drain_timeout: self.drain_timeout,
            max_request_bytes: self.max_request_bytes,
            max_bytes_in_flight: self.max_bytes_in_flight,
            max_payload_bytes,
        })
    }
}

impl RetryArgs {
    /// Back-off bounds, and the database deadline within the `lease` (by default the send
    /// group's settle margin).
    pub fn validate(&self, send: &SendConfig, lease: Duration) -> Result<RetryConfig, String> {
        above_zero(&[("--retry-base", self.retry_base)])?;
        if self.retry_max < self.retry_base {
            return Err(format!(
                "--retry-max ({}) must not be below --retry-base ({})",
                humantime::format_duration(self.retry_max),
                humantime::format_duration(self.retry_base)
            ));
        }
        // A settlement slower than the margin kept for it could not protect its lease anyway.
        let db_timeout = self.db_timeout.unwrap_or(send.settle_margin);
        check_db_timeouts(db_timeout, self.db_retry_max, lease)?;
        Ok(RetryConfig {
            retry_base: self.retry_base,
            retry_max: self.retry_max,
            db_timeout,
            db_retry_max: self.db_retry_max,
        })
    }
}

/// A zero interval, timeout or delay would spin or never wait.
pub(super) fn above_zero(durations: &[(&str, Duration)]) -> Result<(), String> {
    for (name, value) in durations {
        if value.is_zero() {
            return Err(format!("{name} must be above zero"));
        }
    }
    Ok(())
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
