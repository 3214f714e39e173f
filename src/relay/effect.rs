//! What a decision asks of the loop besides its settlement: the feedback (pause, park, reach a
//! destination, readiness), the counters and the log lines, as data applied in one place
//! (`Relay::apply`).

use std::time::Duration;

use crate::destination::Destination;
use crate::row::QuarantineReason;

use super::LOG_TARGET;

/// One thing the loop does for a decision, in the order the decision asked.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Effect {
    /// Every sender waits this long from now: one more whole-request failure in a row.
    Pause(Duration),
    /// A request went through: the relay-wide pause ends and its back-off starts afresh.
    Relieve,
    /// A request reached this destination: its park, if any, ends.
    Reached(Destination),
    /// This destination refused us: park it (or join its park already running), then decide
    /// its rows with that park (`Decide::refused`).
    Refused(Refusal),
    /// Readiness follows the relay's own destinations again: one was reached or refused.
    Readiness,
    /// The relay is not ready, for this reason, until a request goes through again.
    NotReady(String),
    /// A counter goes up.
    Count(Count),
    /// A sent row's delivery lag, in seconds (`outbox_delivery_lag_seconds`).
    Lag(f64),
    /// The span of the row with this id ends refused, with this error code (if any).
    SpanRefused {
        /// The row's `id`: its span's key.
        row_id: i64,
        /// SQS's, SNS's or S3's error code, for the span's `error.type`.
        code: Option<String>,
    },
    /// A log line.
    Log(Log),
}

/// A destination that refused a request, and the rows it holds: they park once the loop knows
/// the park (its end, and whether this refusal started it).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Refusal {
    /// The queue URL or topic ARN, or the offload bucket's key, that refused.
    pub(super) destination: Destination,
    /// What it said: the park's error, and part of the rows' `last_error`.
    pub(super) error: String,
    /// Which rows wait for it, and why.
    pub(super) held: Held,
}

/// The rows a [`Refusal`] holds (indices into the claimed rows).
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Held {
    /// A request's every row: its queue or topic refused it.
    Request(Vec<usize>),
    /// The rows of a request's large bodies: the offload bucket refused an upload with `code`.
    Uploads {
        /// Indices of the rows whose bodies were to go to the bucket.
        rows: Vec<usize>,
        /// S3's error code, for their spans.
        code: Option<String>,
    },
}

/// The counters a decision moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Count {
    /// `outbox_send_failures_total{kind}`, by `n` entries.
    SendFailures {
        /// The `kind` label: `throttled`, `permanent`, `transient`, `config`, `destination`.
        kind: &'static str,
        /// How many entries failed so.
        n: u64,
    },
    /// `outbox_offloaded_total`: a message whose body went through S3 was sent.
    Offloaded,
}

/// Every log line a decision writes; [`Log::emit`] holds their text, fields and levels. A
/// variant's fields are the line's fields, under the same names.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Log {
    /// A row quarantined for good (until an operator acts).
    Quarantined {
        event_id: String,
        id: i64,
        reason: QuarantineReason,
        error: String,
    },
    /// A row the relay could not read, quarantined in its place in its group: it has no event
    /// id to name.
    UnreadableQuarantined {
        id: i64,
        reason: QuarantineReason,
        error: String,
    },
    /// A request's queue or topic is parked: its rows parked without a request.
    QueueParked { entries: usize, queue_url: String },
    /// A request was not sent (shutdown, lease): its rows released.
    NotSent { entries: usize, why: &'static str },
    /// The lease left too little for the uploads.
    NoTimeForUploads,
    /// The offload bucket is parked: large rows parked without an upload.
    BucketParked { bucket: String },
    /// An upload timed out: the large rows spend an attempt.
    UploadTimedOut { error: String, bucket: String },
    /// The offload bucket refused us and a park started.
    BucketRefused {
        error: String,
        bucket: String,
        retry_in: Duration,
    },
    /// S3 refused the relay's credentials.
    S3CredentialsRefused {
        error: String,
        retry_in: Duration,
        bucket: String,
    },
    /// An upload failed for a reason that pauses the relay.
    UploadFailed {
        error: String,
        kind: &'static str,
        retry_in: Duration,
    },
    /// SQS or SNS refused the relay's credentials.
    CredentialsRefused {
        service: &'static str,
        error: String,
        retry_in: Duration,
        queue_url: String,
    },
    /// A whole request failed for a reason that pauses the relay.
    RequestFailed {
        call: &'static str,
        error: String,
        kind: &'static str,
        retry_in: Duration,
    },
    /// One of the relay's own queues or topics refused us and a park started.
    ConfiguredRefused {
        service: &'static str,
        noun: &'static str,
        fix: &'static str,
        error: String,
        queue_url: String,
        retry_in: Duration,
    },
    /// A row's own queue or topic refused us and a park started.
    RowsOwnRefused {
        service: &'static str,
        noun: &'static str,
        error: String,
        queue_url: String,
        retry_in: Duration,
    },
}

impl Log {
    /// Writes the line, as the relay always has (target `outbox_relay::relay`).
    pub(super) fn emit(&self) {
        match self {
            Log::Quarantined {
                event_id,
                id,
                reason,
                error,
            } => {
                tracing::warn!(target: LOG_TARGET, event_id = %event_id, id = id, reason = reason.as_str(), error = %error, "row quarantined")
            }
            Log::UnreadableQuarantined { id, reason, error } => {
                tracing::warn!(target: LOG_TARGET, id = id, reason = reason.as_str(), error = %error, "unreadable row quarantined")
            }
            Log::QueueParked { entries, queue_url } => tracing::debug!(
                target: LOG_TARGET,
                entries = entries,
                queue_url = %queue_url,
                "queue parked; rows parked without a request"
            ),
            Log::NotSent { entries, why } => tracing::debug!(
                target: LOG_TARGET,
                entries = entries,
                why,
                "batch not sent; rows released"
            ),
            Log::NoTimeForUploads => tracing::debug!(
                target: LOG_TARGET,
                "lease too short for the uploads; large rows released for a fresh claim"
            ),
            Log::BucketParked { bucket } => {
                tracing::debug!(target: LOG_TARGET, bucket = %bucket, "bucket parked; large rows parked without an upload")
            }
            Log::UploadTimedOut { error, bucket } => {
                tracing::warn!(target: LOG_TARGET, error = %error, bucket = %bucket,
                    "S3 PutObject timed out; the large rows spend an attempt and retry after their own back-off")
            }
            Log::BucketRefused {
                error,
                bucket,
                retry_in,
            } => {
                tracing::error!(target: LOG_TARGET, error = %error, bucket = %bucket, retry_in = ?retry_in,
                    "S3 refused the relay's offload bucket; rows too large for their destination are parked (quarantine reason destination) and retried by themselves, the others flow; fix the bucket name, its region or its permissions")
            }
            Log::S3CredentialsRefused {
                error,
                retry_in,
                bucket,
            } => {
                tracing::error!(target: LOG_TARGET, error = %error, retry_in = ?retry_in, bucket = %bucket,
                    "S3 refused the relay's credentials; large rows stay unsent, fix the credentials, region or clock")
            }
            Log::UploadFailed {
                error,
                kind,
                retry_in,
            } => {
                tracing::warn!(target: LOG_TARGET, error = %error, kind = kind, retry_in = ?retry_in,
                    "S3 PutObject failed; large rows released, relay backing off")
            }
            Log::CredentialsRefused {
                service,
                error,
                retry_in,
                queue_url,
            } => {
                tracing::error!(target: LOG_TARGET, error = %error, retry_in = ?retry_in, queue_url = %queue_url,
                    "{service} refused the relay's credentials; rows stay unsent, fix the credentials, region or clock")
            }
            Log::RequestFailed {
                call,
                error,
                kind,
                retry_in,
            } => {
                tracing::warn!(target: LOG_TARGET, error = %error, kind = kind, retry_in = ?retry_in,
                    "{call} failed; rows released, relay backing off")
            }
            Log::ConfiguredRefused {
                service,
                noun,
                fix,
                error,
                queue_url,
                retry_in,
            } => {
                tracing::error!(target: LOG_TARGET, error = %error, queue_url = %queue_url, retry_in = ?retry_in,
                    "{service} refused the relay's configured {noun}; its rows are parked (quarantine reason destination) and retried by themselves, fix the {fix} or its permissions")
            }
            Log::RowsOwnRefused {
                service,
                noun,
                error,
                queue_url,
                retry_in,
            } => {
                tracing::warn!(target: LOG_TARGET, error = %error, queue_url = %queue_url, retry_in = ?retry_in,
                    "{service} refused a row's own {noun}; its rows are parked (quarantine reason destination) and retried by themselves, other {noun}s are unaffected")
            }
        }
    }
}
