//! What becomes of a request's rows once its outcome is known.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::batch::{BatchRequest, Entry};
use crate::destination::{bucket_key, describe, Park};
use crate::metrics as names;
use crate::otel::ClaimSpans;
use crate::retry::{self, EntryDecision, FailureClass, RequestFailure, RequestReaction};
use crate::row::{
    ClaimedRow, QuarantineReason, QuarantinedRow, RescheduledRow, SentRow, Settlement,
};
use crate::sqs::EntryOutcome;

use super::send::OffloadFailed;
use super::Relay;

impl Relay {
    /// A request's uploads failed, so nothing of it was sent. The failure is S3's, counted in
    /// `outbox_offload_failures_total` only, and it holds only the entries it concerns: a bad
    /// body is quarantined alone (`rejected`); a bucket that refuses us (missing, denied) parks
    /// the large rows on the bucket's own back-off, and readiness fails, as for the relay's own
    /// queue; throttling, outages and credentials pause the relay and release the large rows.
    /// The other entries go on in a request of their own (returned), unless the destination
    /// keeps order: then they are given back unsent, so no group overtakes its held row.
    pub(super) fn offload_failed(
        &self,
        settlement: &mut Settlement,
        rows: &[ClaimedRow],
        request: &BatchRequest,
        failed: OffloadFailed,
        spans: &mut ClaimSpans,
    ) -> Option<BatchRequest> {
        let bucket = match &self.s3 {
            Some(s3) => bucket_key(s3.bucket()),
            None => unreachable!("entries are offloaded only with a bucket"),
        };
        let now = Instant::now();
        let large = |entry: &&Entry| entry.offload.is_some();
        let large_ones = || -> Vec<usize> {
            (0..request.entries.len())
                .filter(|&i| request.entries[i].offload.is_some())
                .collect()
        };
        let held: Vec<usize> = match failed {
            OffloadFailed::NoTime => {
                for entry in request.entries.iter().filter(large) {
                    release(settlement, &rows[entry.row], Duration::ZERO, None);
                }
                tracing::debug!(
                    "lease too short for the uploads; large rows released for a fresh claim"
                );
                large_ones()
            }
            OffloadFailed::Parked(park) => {
                for entry in request.entries.iter().filter(large) {
                    park_row(settlement, &rows[entry.row], &bucket, &park, now);
                }
                tracing::debug!(bucket = %bucket, "bucket parked; large rows parked without an upload");
                large_ones()
            }
            OffloadFailed::Refused { failure, .. } if retry::upload_spends_attempt(&failure) => {
                let error = retry::describe(&failure);
                tracing::warn!(error = %error, bucket = %bucket,
                    "S3 PutObject timed out; the large rows spend an attempt and retry after their own back-off");
                for entry in request.entries.iter().filter(large) {
                    spans.refused(rows[entry.row].id, None);
                    self.spend_attempt(settlement, &rows[entry.row], error.clone());
                }
                large_ones()
            }
            OffloadFailed::Refused { index, failure } => {
                let class = retry::classify(&failure);
                let what = retry::describe(&failure);
                let culprit = &request.entries[index];
                match retry::request_reaction(class, 1, false) {
                    RequestReaction::QuarantineTheEntry => {
                        spans.refused(rows[culprit.row].id, failure.code.as_deref());
                        quarantine(
                            settlement,
                            &rows[culprit.row],
                            QuarantineReason::Rejected,
                            what,
                        );
                        vec![index]
                    }
                    RequestReaction::ParkTheQueue => {
                        let park = self
                            .destinations
                            .refused(&bucket, &what, now, fastrand::f64());
                        self.health
                            .set_config_error(self.destinations.readiness_error());
                        if park.started {
                            tracing::error!(error = %what, bucket = %bucket, retry_in = ?park.remaining(now),
                                "S3 refused the relay's offload bucket; rows too large for their destination are parked (quarantine reason destination) and retried by themselves, the others flow; fix the bucket name, its region or its permissions");
                        }
                        for entry in request.entries.iter().filter(large) {
                            spans.refused(rows[entry.row].id, failure.code.as_deref());
                            park_row(settlement, &rows[entry.row], &bucket, &park, now);
                        }
                        large_ones()
                    }
                    reaction => {
                        let delay = self.pressure.push(&self.config);
                        if reaction == (RequestReaction::PauseAndRelease { not_ready: true }) {
                            self.health.set_config_error(Some(format!("S3: {what}")));
                            tracing::error!(error = %what, retry_in = ?delay, bucket = %bucket,
                                "S3 refused the relay's credentials; large rows stay unsent, fix the credentials, region or clock");
                        } else {
                            tracing::warn!(error = %what, kind = class.metric_kind(), retry_in = ?delay,
                                "S3 PutObject failed; large rows released, relay backing off");
                        }
                        let error = format!("S3 PutObject: {what}");
                        for entry in request.entries.iter().filter(large) {
                            spans.refused(rows[entry.row].id, failure.code.as_deref());
                            release(settlement, &rows[entry.row], delay, Some(error.clone()));
                        }
                        large_ones()
                    }
                }
            }
        };
        let rest = request
            .entries
            .iter()
            .enumerate()
            .filter(|(i, _)| !held.contains(i))
            .map(|(_, e)| e.clone());
        if self.keeps_order(&request.queue_url) {
            for entry in rest {
                release(settlement, &rows[entry.row], Duration::ZERO, None);
            }
            return None;
        }
        let entries: Vec<Entry> = rest.collect();
        (!entries.is_empty()).then(|| BatchRequest {
            queue_url: request.queue_url.clone(),
            entries,
        })
    }

    /// A failure that counts against the row: retried after the row's own back-off with the
    /// attempt kept, or quarantined (`max_attempts`) once `--max-attempts` are spent.
    pub(super) fn spend_attempt(
        &self,
        settlement: &mut Settlement,
        row: &ClaimedRow,
        error: String,
    ) {
        let attempts = row.attempts as u32;
        match retry::entry_decision(false, "", attempts, self.config.max_attempts) {
            EntryDecision::OutOfAttempts => {
                let error = format!("{attempts} attempts; last: {error}");
                quarantine(settlement, row, QuarantineReason::MaxAttempts, error);
            }
            _ => settlement.reschedule.push(RescheduledRow {
                id: row.id,
                lease_token: row.lease_token,
                delay: self.backoff(attempts),
                error: Some(error),
                refund: false,
            }),
        }
    }

    /// Decides one entry's fate from SQS's per-entry answer.
    pub(super) fn settle_entry(
        &self,
        settlement: &mut Settlement,
        row: &ClaimedRow,
        outcome: EntryOutcome,
    ) {
        match outcome {
            EntryOutcome::Sent { message_id } => {
                let lag = unix_now() - row.created_at_epoch;
                metrics::histogram!(names::DELIVERY_LAG).record(lag.max(0.0));
                settlement.sent.push(SentRow {
                    id: row.id,
                    lease_token: row.lease_token,
                    message_id,
                });
            }
            EntryOutcome::Failed {
                sender_fault,
                code,
                message,
            } => {
                let error = format!("{code}: {message}");
                let attempts = row.attempts as u32;
                let decision =
                    retry::entry_decision(sender_fault, &code, attempts, self.config.max_attempts);
                metrics::counter!(names::SEND_FAILURES, "kind" => decision.metric_kind())
                    .increment(1);
                match decision {
                    EntryDecision::Throttled => {
                        // Pressure on the queue, not the row's fault: slow the relay, keep the
                        // attempt.
                        let delay = self.pressure.push(&self.config);
                        release(settlement, row, delay, Some(error));
                    }
                    EntryDecision::SenderFault => {
                        quarantine(settlement, row, QuarantineReason::SenderFault, error);
                    }
                    EntryDecision::OutOfAttempts => {
                        let error = format!("{attempts} attempts; last: {error}");
                        quarantine(settlement, row, QuarantineReason::MaxAttempts, error);
                    }
                    EntryDecision::Retry => settlement.reschedule.push(RescheduledRow {
                        id: row.id,
                        lease_token: row.lease_token,
                        delay: self.backoff(attempts),
                        error: Some(error),
                        refund: false,
                    }),
                }
            }
        }
    }

    /// The whole request failed. Bad input that a single entry caused is quarantined; a queue
    /// that refuses us parks its own rows; anything else is not the rows' fault: they go back
    /// with their attempts and the relay backs off.
    pub(super) fn request_failed(
        &self,
        settlement: &mut Settlement,
        rows: &[ClaimedRow],
        request: &BatchRequest,
        class: FailureClass,
        reaction: RequestReaction,
        failure: &RequestFailure,
    ) {
        let entries = request.entries.len() as u64;
        let what = retry::describe(failure);
        if reaction == RequestReaction::ParkTheQueue {
            self.destination_refused(settlement, rows, request, &what);
            return;
        }
        metrics::counter!(names::SEND_FAILURES, "kind" => class.metric_kind()).increment(entries);
        if reaction == RequestReaction::QuarantineTheEntry {
            let row = &rows[request.entries[0].row];
            quarantine(settlement, row, QuarantineReason::Rejected, what);
            return;
        }
        // Splitting is the caller's; whatever else is left pauses the relay and releases the rows.
        let delay = self.pressure.push(&self.config);
        let (service, _) = describe(&request.queue_url);
        if reaction == (RequestReaction::PauseAndRelease { not_ready: true }) {
            self.health.set_config_error(Some(what.clone()));
            tracing::error!(error = %what, retry_in = ?delay, queue_url = %request.queue_url,
                "{service} refused the relay's credentials; rows stay unsent, fix the credentials, region or clock");
        } else {
            let call = if service == "SNS" {
                "PublishBatch"
            } else {
                "SendMessageBatch"
            };
            tracing::warn!(error = %what, kind = class.metric_kind(), retry_in = ?delay,
                "{call} failed; rows released, relay backing off");
        }
        for entry in &request.entries {
            release(settlement, &rows[entry.row], delay, Some(what.clone()));
        }
    }

    /// One queue refused the request: park its rows until the queue's own back-off ends. Other
    /// queues and the relay-wide pause are untouched; readiness fails only for the relay's own
    /// queues (`--queue-url`, `--route`), whose refusal is a configuration error.
    pub(super) fn destination_refused(
        &self,
        settlement: &mut Settlement,
        rows: &[ClaimedRow],
        request: &BatchRequest,
        what: &str,
    ) {
        let now = Instant::now();
        let park = self
            .destinations
            .refused(&request.queue_url, what, now, fastrand::f64());
        let kind = if park.configured {
            self.health
                .set_config_error(self.destinations.readiness_error());
            FailureClass::Config.metric_kind()
        } else {
            FailureClass::Destination.metric_kind()
        };
        metrics::counter!(names::SEND_FAILURES, "kind" => kind)
            .increment(request.entries.len() as u64);
        let retry_in = park.remaining(now);
        // "SQS refused the relay's configured queue", or "SNS ... topic" for a topic ARN.
        let (service, noun) = describe(&request.queue_url);
        let fix = if noun == "topic" {
            "topic ARN"
        } else {
            "queue URL"
        };
        if park.started && park.configured {
            tracing::error!(error = %what, queue_url = %request.queue_url, retry_in = ?retry_in,
                "{service} refused the relay's configured {noun}; its rows are parked (quarantine reason destination) and retried by themselves, fix the {fix} or its permissions");
        } else if park.started {
            tracing::warn!(error = %what, queue_url = %request.queue_url, retry_in = ?retry_in,
                "{service} refused a row's own {noun}; its rows are parked (quarantine reason destination) and retried by themselves, other {noun}s are unaffected");
        }
        for entry in &request.entries {
            park_row(settlement, &rows[entry.row], &request.queue_url, &park, now);
        }
    }
}

pub(super) fn quarantine(
    settlement: &mut Settlement,
    row: &ClaimedRow,
    reason: QuarantineReason,
    error: String,
) {
    tracing::warn!(event_id = %row.event_id, id = row.id, reason = reason.as_str(), error = %error, "row quarantined");
    settlement.quarantine.push(QuarantinedRow {
        id: row.id,
        lease_token: row.lease_token,
        reason,
        error,
        retry_in: None,
    });
}

/// Parks a row whose queue refuses us: quarantined with reason `destination` until the
/// queue's park ends, then unsent again by itself with its attempt refunded. Logged once per
/// park by the caller, not per row.
/// How logs and `last_error` name a destination: `queue` or `topic`.
pub(super) fn park_row(
    settlement: &mut Settlement,
    row: &ClaimedRow,
    queue_url: &str,
    park: &Park,
    now: Instant,
) {
    settlement.quarantine.push(QuarantinedRow {
        id: row.id,
        lease_token: row.lease_token,
        reason: QuarantineReason::Destination,
        error: format!("{} {queue_url}: {}", describe(queue_url).1, park.error),
        retry_in: Some(park.remaining(now)),
    });
}

/// Gives a row back without counting the claim against it.
pub(super) fn release(
    settlement: &mut Settlement,
    row: &ClaimedRow,
    delay: Duration,
    error: Option<String>,
) {
    settlement.reschedule.push(RescheduledRow {
        id: row.id,
        lease_token: row.lease_token,
        delay,
        error,
        refund: true,
    });
}

pub(super) fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}
