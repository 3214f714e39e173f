//! What becomes of a request's rows once its outcome is known: pure decisions.
//!
//! Each decision takes the claimed rows, the outcome, the relay's [`Policy`] and the moment
//! (clock, random draws, the relay-wide pause so far) and adds to a [`Decision`]: the rows'
//! part of the settlement, and the [`Effect`]s the loop applies in one place (`Relay::apply`).
//! The feedback into the send gate (pause the relay, park a destination, a destination
//! reached) is among those effects, so nothing here touches shared state, a clock or a network.

use std::time::{Duration, Instant};

use crate::batch::{BatchRequest, Entry, Rejected};
use crate::destination::{describe, Park};
use crate::retry::{self, EntryDecision, FailureClass, RequestFailure, RequestReaction};
use crate::row::{
    ClaimedRow, QuarantineReason, QuarantinedRow, RescheduledRow, SentRow, Settlement,
};
use crate::sqs::EntryOutcome;

use super::effect::{Count, Effect, Held, Log, Refusal};
use super::pressure::pause_for;
use super::send::OffloadFailed;

/// The relay's rules a decision applies (from `--max-attempts`, `--retry-base`, `--retry-max`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Policy {
    /// Retryable failures past this many attempts quarantine the row (`max_attempts`).
    pub(super) max_attempts: u32,
    /// The first step of a row's back-off and of the relay-wide pause.
    pub(super) retry_base: Duration,
    /// Where both back-offs stop growing.
    pub(super) retry_max: Duration,
}

/// What the decisions about one outcome came to.
#[derive(Debug, Default)]
pub(super) struct Decision {
    /// The rows' part of their claim's settlement.
    pub(super) settlement: Settlement,
    /// What the loop must do besides, in order.
    pub(super) effects: Vec<Effect>,
}

/// Takes decisions at one moment and collects them into a [`Decision`].
pub(super) struct Decide<J> {
    /// The rules.
    policy: Policy,
    /// When the decision is taken: how long parks still run.
    now: Instant,
    /// The wall clock as Unix seconds: a sent row's delivery lag.
    unix_now: f64,
    /// Whole-request failures in a row as the relay-wide pause counted them, plus the pauses
    /// asked for here: the next pause is one back-off step longer.
    failures: u32,
    /// A random draw in `[0, 1)` for each back-off (full jitter).
    jitter: J,
    /// What was decided so far.
    out: Decision,
}

impl<J: FnMut() -> f64> Decide<J> {
    pub(super) fn new(
        policy: Policy,
        now: Instant,
        unix_now: f64,
        failures: u32,
        jitter: J,
    ) -> Self {
        Decide {
            policy,
            now,
            unix_now,
            failures,
            jitter,
            out: Decision::default(),
        }
    }

    pub(super) fn finish(self) -> Decision {
        self.out
    }

    /// What the planner refused (quarantined for good) and held back (behind a refused row of
    /// their group: given back without counting an attempt).
    pub(super) fn planned(&mut self, rows: &[ClaimedRow], rejected: Vec<Rejected>, held: &[usize]) {
        for rejected in rejected {
            self.quarantine(&rows[rejected.row], rejected.reason, rejected.error);
        }
        for &index in held {
            self.release(&rows[index], Duration::ZERO, None);
        }
    }

    /// SQS or SNS answered the request entry by entry: the destination is reached and the relay
    /// no longer backs off; each entry's row is decided by [`Decide::settle_entry`].
    pub(super) fn answered(
        &mut self,
        rows: &[ClaimedRow],
        request: &BatchRequest,
        outcomes: Vec<EntryOutcome>,
    ) {
        self.failures = 0;
        self.effect(Effect::Relieve);
        self.effect(Effect::Reached(request.queue_url.clone()));
        // Clears a credentials error too: this request was signed and accepted.
        self.effect(Effect::Readiness);
        for (entry, outcome) in request.entries.iter().zip(outcomes) {
            if let EntryOutcome::Failed { code, .. } = &outcome {
                self.span_refused(rows[entry.row].id, Some(code));
            }
            if entry.offload.is_some() && matches!(outcome, EntryOutcome::Sent { .. }) {
                self.effect(Effect::Count(Count::Offloaded));
            }
            self.settle_entry(&rows[entry.row], outcome);
        }
    }

    /// Decides one entry's fate from SQS's per-entry answer.
    pub(super) fn settle_entry(&mut self, row: &ClaimedRow, outcome: EntryOutcome) {
        match outcome {
            EntryOutcome::Sent { message_id } => {
                let lag = self.unix_now - row.created_at_epoch;
                self.effect(Effect::Lag(lag.max(0.0)));
                self.out.settlement.sent.push(SentRow {
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
                    retry::entry_decision(sender_fault, &code, attempts, self.policy.max_attempts);
                self.send_failures(decision.metric_kind(), 1);
                match decision {
                    EntryDecision::Throttled => {
                        // Pressure on the queue, not the row's fault: slow the relay, keep the
                        // attempt.
                        let delay = self.pause();
                        self.release(row, delay, Some(error));
                    }
                    EntryDecision::SenderFault => {
                        self.quarantine(row, QuarantineReason::SenderFault, error);
                    }
                    EntryDecision::OutOfAttempts => {
                        let error = format!("{attempts} attempts; last: {error}");
                        self.quarantine(row, QuarantineReason::MaxAttempts, error);
                    }
                    EntryDecision::Retry => self.retry(row, attempts, error),
                }
            }
        }
    }

    /// The whole request failed, and splitting was not the answer (that is the caller's). Bad
    /// input that a single entry caused is quarantined; a queue that refuses us parks its own
    /// rows (an [`Effect::Refused`]); anything else is not the rows' fault: they go back with
    /// their attempts and the relay backs off.
    pub(super) fn request_failed(
        &mut self,
        rows: &[ClaimedRow],
        request: &BatchRequest,
        class: FailureClass,
        reaction: RequestReaction,
        failure: &RequestFailure,
    ) {
        for entry in &request.entries {
            self.span_refused(rows[entry.row].id, failure.code.as_deref());
        }
        let entries = request.entries.len() as u64;
        let what = retry::describe(failure);
        if reaction == RequestReaction::ParkTheQueue {
            self.effect(Effect::Refused(Refusal {
                destination: request.queue_url.clone(),
                error: what,
                held: Held::Request(request.entries.iter().map(|e| e.row).collect()),
            }));
            return;
        }
        self.send_failures(class.metric_kind(), entries);
        if reaction == RequestReaction::QuarantineTheEntry {
            let row = &rows[request.entries[0].row];
            self.quarantine(row, QuarantineReason::Rejected, what);
            return;
        }
        // Whatever else is left pauses the relay and releases the rows.
        let delay = self.pause();
        let (service, _) = describe(&request.queue_url);
        if reaction == (RequestReaction::PauseAndRelease { not_ready: true }) {
            self.effect(Effect::NotReady(what.clone()));
            self.log(Log::CredentialsRefused {
                service,
                error: what.clone(),
                retry_in: delay,
                queue_url: request.queue_url.clone(),
            });
        } else {
            let call = if service == "SNS" {
                "PublishBatch"
            } else {
                "SendMessageBatch"
            };
            self.log(Log::RequestFailed {
                call,
                error: what.clone(),
                kind: class.metric_kind(),
                retry_in: delay,
            });
        }
        for entry in &request.entries {
            self.release(&rows[entry.row], delay, Some(what.clone()));
        }
    }

    /// The rows a [`Refusal`] held, now that the loop parked its destination (`park`).
    pub(super) fn refused(&mut self, rows: &[ClaimedRow], refusal: Refusal, park: &Park) {
        match refusal.held {
            Held::Request(held) => {
                self.destination_refused(rows, &held, &refusal.destination, &refusal.error, park)
            }
            Held::Uploads { rows: held, code } => {
                // The bucket is the relay's own configuration: readiness follows it.
                self.effect(Effect::Readiness);
                if park.started {
                    self.log(Log::BucketRefused {
                        error: refusal.error,
                        bucket: refusal.destination.clone(),
                        retry_in: park.remaining(self.now),
                    });
                }
                for index in held {
                    self.span_refused(rows[index].id, code.as_deref());
                    self.park_row(&rows[index], &refusal.destination, park);
                }
            }
        }
    }

    /// One queue refused the request: park its rows until the queue's own back-off ends. Other
    /// queues and the relay-wide pause are untouched; readiness fails only for the relay's own
    /// queues (`--queue-url`, `--route`), whose refusal is a configuration error.
    fn destination_refused(
        &mut self,
        rows: &[ClaimedRow],
        held: &[usize],
        queue_url: &str,
        what: &str,
        park: &Park,
    ) {
        let kind = if park.configured {
            self.effect(Effect::Readiness);
            FailureClass::Config.metric_kind()
        } else {
            FailureClass::Destination.metric_kind()
        };
        self.send_failures(kind, held.len() as u64);
        let retry_in = park.remaining(self.now);
        // "SQS refused the relay's configured queue", or "SNS ... topic" for a topic ARN.
        let (service, noun) = describe(queue_url);
        let fix = if noun == "topic" {
            "topic ARN"
        } else {
            "queue URL"
        };
        if park.started && park.configured {
            self.log(Log::ConfiguredRefused {
                service,
                noun,
                fix,
                error: what.to_string(),
                queue_url: queue_url.to_string(),
                retry_in,
            });
        } else if park.started {
            self.log(Log::RowsOwnRefused {
                service,
                noun,
                error: what.to_string(),
                queue_url: queue_url.to_string(),
                retry_in,
            });
        }
        for &index in held {
            self.park_row(&rows[index], queue_url, park);
        }
    }

    /// The request's queue is parked (it refused us lately): its rows park without a request.
    pub(super) fn parked(&mut self, rows: &[ClaimedRow], request: &BatchRequest, park: &Park) {
        for entry in &request.entries {
            self.park_row(&rows[entry.row], &request.queue_url, park);
        }
        self.log(Log::QueueParked {
            entries: request.entries.len(),
            queue_url: request.queue_url.clone(),
        });
    }

    /// The relay chose not to send the request (`why`): its rows go back as they were.
    pub(super) fn not_sent(
        &mut self,
        rows: &[ClaimedRow],
        request: &BatchRequest,
        why: &'static str,
    ) {
        for entry in &request.entries {
            self.release(&rows[entry.row], Duration::ZERO, None);
        }
        self.log(Log::NotSent {
            entries: request.entries.len(),
            why,
        });
    }

    /// Requests that were to follow one that was not accepted entry by entry: sending them
    /// now could overtake what failed, so their rows go back as they were.
    pub(super) fn given_back(&mut self, rows: &[ClaimedRow], requests: &[BatchRequest]) {
        for request in requests {
            for entry in &request.entries {
                self.release(&rows[entry.row], Duration::ZERO, None);
            }
        }
    }

    /// A request's uploads failed, so nothing of it was sent. The failure is S3's, counted in
    /// `outbox_offload_failures_total` only, and it holds only the entries it concerns: a bad
    /// body is quarantined alone (`rejected`); a bucket that refuses us (missing, denied) parks
    /// the large rows on the bucket's own back-off (an [`Effect::Refused`]), and readiness
    /// fails, as for the relay's own queue; throttling, outages and credentials pause the
    /// relay and release the large rows. The other entries go on in a request of their own
    /// (returned), unless the destination keeps order (`ordered`): then they are given back
    /// unsent, so no group overtakes its held row. `bucket` is the bucket's park key.
    pub(super) fn offload_failed(
        &mut self,
        rows: &[ClaimedRow],
        request: &BatchRequest,
        failed: OffloadFailed,
        bucket: &str,
        ordered: bool,
    ) -> Option<BatchRequest> {
        let large: Vec<usize> = (0..request.entries.len())
            .filter(|&i| request.entries[i].offload.is_some())
            .collect();
        let large_rows =
            || -> Vec<usize> { large.iter().map(|&i| request.entries[i].row).collect() };
        let held: Vec<usize> = match failed {
            OffloadFailed::NoTime => {
                for row in large_rows() {
                    self.release(&rows[row], Duration::ZERO, None);
                }
                self.log(Log::NoTimeForUploads);
                large.clone()
            }
            OffloadFailed::Parked(park) => {
                for row in large_rows() {
                    self.park_row(&rows[row], bucket, &park);
                }
                self.log(Log::BucketParked {
                    bucket: bucket.to_string(),
                });
                large.clone()
            }
            OffloadFailed::Refused { failure, .. } if retry::upload_spends_attempt(&failure) => {
                let error = retry::describe(&failure);
                self.log(Log::UploadTimedOut {
                    error: error.clone(),
                    bucket: bucket.to_string(),
                });
                for row in large_rows() {
                    self.span_refused(rows[row].id, None);
                    self.spend_attempt(&rows[row], error.clone());
                }
                large.clone()
            }
            OffloadFailed::Refused { index, failure } => {
                let class = retry::classify(&failure);
                let what = retry::describe(&failure);
                let culprit = &request.entries[index];
                match retry::request_reaction(class, 1, false) {
                    RequestReaction::QuarantineTheEntry => {
                        self.span_refused(rows[culprit.row].id, failure.code.as_deref());
                        self.quarantine(&rows[culprit.row], QuarantineReason::Rejected, what);
                        vec![index]
                    }
                    RequestReaction::ParkTheQueue => {
                        self.effect(Effect::Refused(Refusal {
                            destination: bucket.to_string(),
                            error: what,
                            held: Held::Uploads {
                                rows: large_rows(),
                                code: failure.code.clone(),
                            },
                        }));
                        large.clone()
                    }
                    reaction => {
                        let delay = self.pause();
                        if reaction == (RequestReaction::PauseAndRelease { not_ready: true }) {
                            self.effect(Effect::NotReady(format!("S3: {what}")));
                            self.log(Log::S3CredentialsRefused {
                                error: what.clone(),
                                retry_in: delay,
                                bucket: bucket.to_string(),
                            });
                        } else {
                            self.log(Log::UploadFailed {
                                error: what.clone(),
                                kind: class.metric_kind(),
                                retry_in: delay,
                            });
                        }
                        let error = format!("S3 PutObject: {what}");
                        for row in large_rows() {
                            self.span_refused(rows[row].id, failure.code.as_deref());
                            self.release(&rows[row], delay, Some(error.clone()));
                        }
                        large.clone()
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
        if ordered {
            for entry in rest {
                self.release(&rows[entry.row], Duration::ZERO, None);
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
    pub(super) fn spend_attempt(&mut self, row: &ClaimedRow, error: String) {
        let attempts = row.attempts as u32;
        match retry::entry_decision(false, "", attempts, self.policy.max_attempts) {
            EntryDecision::OutOfAttempts => {
                let error = format!("{attempts} attempts; last: {error}");
                self.quarantine(row, QuarantineReason::MaxAttempts, error);
            }
            _ => self.retry(row, attempts, error),
        }
    }

    fn effect(&mut self, effect: Effect) {
        self.out.effects.push(effect);
    }

    fn log(&mut self, line: Log) {
        self.effect(Effect::Log(line));
    }

    fn send_failures(&mut self, kind: &'static str, n: u64) {
        self.effect(Effect::Count(Count::SendFailures { kind, n }));
    }

    fn span_refused(&mut self, row_id: i64, code: Option<&str>) {
        self.effect(Effect::SpanRefused {
            row_id,
            code: code.map(str::to_string),
        });
    }

    /// Pauses the relay one back-off step longer than the last pause; returns the pause.
    fn pause(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let jitter = (self.jitter)();
        let delay = pause_for(
            self.failures,
            self.policy.retry_base,
            self.policy.retry_max,
            jitter,
        );
        self.effect(Effect::Pause(delay));
        delay
    }

    /// Tries the row again after its own back-off; the attempt counts.
    fn retry(&mut self, row: &ClaimedRow, attempts: u32, error: String) {
        let jitter = (self.jitter)();
        let delay = retry::backoff(
            attempts,
            self.policy.retry_base,
            self.policy.retry_max,
            jitter,
        );
        self.out.settlement.reschedule.push(RescheduledRow {
            id: row.id,
            lease_token: row.lease_token,
            delay,
            error: Some(error),
            refund: false,
        });
    }

    /// Quarantines the row until an operator acts.
    fn quarantine(&mut self, row: &ClaimedRow, reason: QuarantineReason, error: String) {
        self.log(Log::Quarantined {
            event_id: row.event_id.clone(),
            id: row.id,
            reason,
            error: error.clone(),
        });
        self.out.settlement.quarantine.push(QuarantinedRow {
            id: row.id,
            lease_token: row.lease_token,
            reason,
            error,
            retry_in: None,
        });
    }

    /// Parks a row whose destination refuses us: quarantined with reason `destination` until
    /// the destination's park ends, then unsent again by itself with its attempt refunded.
    /// Logged once per park, not per row. `last_error` names the destination (`queue`,
    /// `topic` or `bucket`).
    fn park_row(&mut self, row: &ClaimedRow, destination: &str, park: &Park) {
        self.out.settlement.quarantine.push(QuarantinedRow {
            id: row.id,
            lease_token: row.lease_token,
            reason: QuarantineReason::Destination,
            error: format!("{} {destination}: {}", describe(destination).1, park.error),
            retry_in: Some(park.remaining(self.now)),
        });
    }

    /// Gives a row back without counting the claim against it.
    fn release(&mut self, row: &ClaimedRow, delay: Duration, error: Option<String>) {
        self.out.settlement.reschedule.push(RescheduledRow {
            id: row.id,
            lease_token: row.lease_token,
            delay,
            error,
            refund: true,
        });
    }
}
