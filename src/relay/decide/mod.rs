//! What becomes of a request's rows once its outcome is known: pure decisions.
//!
//! Each decision takes the claimed rows, the outcome, the relay's [`Policy`] and the moment
//! (clock, random draws, the relay-wide pause so far) and adds to a [`Decision`]: the rows'
//! part of the settlement, and the [`Effect`]s the loop applies in one place (`Relay::apply`).
//! The feedback into the send gate (pause the relay, park a destination, a destination
//! reached) is among those effects, so nothing here touches shared state, a clock or a network.
//!
//! - `upload`: what becomes of a request whose large bodies could not all be stored in S3.

use std::time::{Duration, Instant};

use crate::batch::{BatchRequest, Rejected};
use crate::destination::{Destination, Park};
use crate::retry::{self, EntryDecision, FailureClass, RequestFailure, RequestReaction};
use crate::row::{
    ClaimedRow, QuarantineReason, QuarantinedRow, RescheduledRow, SentRow, Settlement,
};
use crate::sink::EntryOutcome;

use super::effect::{Count, Effect, Held, Log, Refusal};
use super::pressure::pause_for;

mod upload;

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
    /// no longer backs off; each entry's row is decided by [`Decide::decide_entry`].
    pub(super) fn answered(
        &mut self,
        rows: &[ClaimedRow],
        request: &BatchRequest,
        outcomes: Vec<EntryOutcome>,
    ) {
        self.failures = 0;
        self.effect(Effect::Relieve);
        self.effect(Effect::Reached(request.destination.clone()));
        // Clears a credentials error too: this request was signed and accepted.
        self.effect(Effect::Readiness);
        for (entry, outcome) in request.entries.iter().zip(outcomes) {
            if let EntryOutcome::Failed { code, .. } = &outcome {
                self.span_refused(rows[entry.row].id, Some(code));
            }
            if entry.offload.is_some() && matches!(outcome, EntryOutcome::Sent { .. }) {
                self.effect(Effect::Count(Count::Offloaded));
            }
            self.decide_entry(&rows[entry.row], outcome);
        }
    }

    /// Decides one entry's fate from SQS's per-entry answer.
    pub(super) fn decide_entry(&mut self, row: &ClaimedRow, outcome: EntryOutcome) {
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
                destination: request.destination.clone(),
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
        let service = request.destination.service();
        if reaction == (RequestReaction::PauseAndRelease { not_ready: true }) {
            self.effect(Effect::NotReady(what.clone()));
            self.log(Log::CredentialsRefused {
                service,
                error: what.clone(),
                retry_in: delay,
                queue_url: request.destination.to_string(),
            });
        } else {
            let call = request.destination.batch_call();
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
                        bucket: refusal.destination.to_string(),
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
        queue_url: &Destination,
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
        let (service, noun, fix) = (
            queue_url.service(),
            queue_url.noun(),
            queue_url.address_name(),
        );
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
            self.park_row(&rows[entry.row], &request.destination, park);
        }
        self.log(Log::QueueParked {
            entries: request.entries.len(),
            queue_url: request.destination.to_string(),
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
}

/// The small steps every decision is made of.
impl<J: FnMut() -> f64> Decide<J> {
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
        self.log(match row.unreadable {
            Some(_) => Log::UnreadableQuarantined {
                id: row.id,
                reason,
                error: error.clone(),
            },
            None => Log::Quarantined {
                event_id: row.event_id.clone(),
                id: row.id,
                reason,
                error: error.clone(),
            },
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
    fn park_row(&mut self, row: &ClaimedRow, destination: &Destination, park: &Park) {
        self.out.settlement.quarantine.push(QuarantinedRow {
            id: row.id,
            lease_token: row.lease_token,
            reason: QuarantineReason::Destination,
            error: format!("{} {destination}: {}", destination.noun(), park.error),
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

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::batch::{Entry, Offload};
    use crate::retry::Transport;

    pub(super) const QUEUE: &str = "http://sqs/1/orders";
    pub(super) const TOPIC: &str = "arn:aws:sns:eu-west-1:123456789012:orders";
    pub(super) const BUCKET: &str = "s3://bodies";

    /// The offload bucket the tests' relay is configured with (its text is [`BUCKET`]).
    pub(super) fn bucket() -> Destination {
        Destination::bucket("bodies").expect("a bucket name")
    }
    pub(super) const SECOND: Duration = Duration::from_secs(1);

    pub(super) fn policy() -> Policy {
        Policy {
            max_attempts: 5,
            retry_base: SECOND,
            retry_max: Duration::from_secs(60),
        }
    }

    /// Decisions at a fixed moment with the jitter pinned at its middle, after `failures`
    /// whole-request failures in a row.
    pub(super) fn decide(failures: u32) -> (Decide<impl FnMut() -> f64>, Instant) {
        let now = Instant::now();
        (Decide::new(policy(), now, 1_000.0, failures, || 0.5), now)
    }

    /// Rows 1..=n (at index 0..n), each on its `attempts`-th attempt, written at Unix 990.
    pub(super) fn rows(n: i64, attempts: i32) -> Vec<ClaimedRow> {
        (1..=n)
            .map(|id| ClaimedRow {
                id,
                event_id: format!("e-{id}"),
                aggregate_type: "order".into(),
                aggregate_id: id.to_string(),
                event_type: "created".into(),
                payload: "{}".into(),
                headers: serde_json::json!({}),
                queue_url: None,
                lease_token: 100 + id,
                attempts,
                created_at_epoch: 990.0,
                created_at: "2026-01-01T00:00:00Z".into(),
                unreadable: None,
                dedup_id: None,
            })
            .collect()
    }

    pub(super) fn entry(row: usize, large: bool) -> Entry {
        Entry {
            row,
            id: (row + 1).to_string(),
            body: "{}".into(),
            attributes: Vec::new(),
            group_id: None,
            dedup_id: None,
            size: 2,
            offload: large.then(|| Offload {
                key: format!("k{row}"),
                body: bytes::Bytes::from_static(b"large"),
            }),
        }
    }

    /// A request to `destination` of the rows at `indices`, none of them large.
    pub(super) fn request(destination: &str, indices: &[usize]) -> BatchRequest {
        BatchRequest {
            destination: Destination::of_row(destination),
            entries: indices.iter().map(|&i| entry(i, false)).collect(),
        }
    }

    pub(super) fn failure(code: &str) -> RequestFailure {
        RequestFailure {
            status: Some(400),
            code: Some(code.into()),
            message: "said so".into(),
            transport: Transport::Response,
        }
    }

    pub(super) fn timeout() -> RequestFailure {
        RequestFailure {
            status: None,
            code: None,
            message: "no answer".into(),
            transport: Transport::Timeout,
        }
    }

    pub(super) fn failed(sender_fault: bool, code: &str) -> EntryOutcome {
        EntryOutcome::Failed {
            sender_fault,
            code: code.into(),
            message: "no".into(),
        }
    }

    pub(super) fn sent(id: &str) -> EntryOutcome {
        EntryOutcome::Sent {
            message_id: id.into(),
        }
    }

    pub(super) fn request_failed(
        decide: &mut Decide<impl FnMut() -> f64>,
        rows: &[ClaimedRow],
        request: &BatchRequest,
        f: RequestFailure,
    ) {
        let class = retry::classify(&f);
        let reaction = retry::request_reaction(class, request.entries.len(), false);
        decide.request_failed(rows, request, class, reaction, &f);
    }

    pub(super) fn park(started: bool, configured: bool, now: Instant) -> Park {
        Park {
            until: now + 10 * SECOND,
            error: "QueueDoesNotExist: said so".into(),
            started,
            configured,
        }
    }

    pub(super) fn counts(d: &Decision) -> Vec<Count> {
        d.effects
            .iter()
            .filter_map(|e| match e {
                Effect::Count(c) => Some(*c),
                _ => None,
            })
            .collect()
    }

    pub(super) fn pauses(d: &Decision) -> Vec<Duration> {
        d.effects
            .iter()
            .filter_map(|e| match e {
                Effect::Pause(p) => Some(*p),
                _ => None,
            })
            .collect()
    }

    pub(super) fn logs(d: &Decision) -> Vec<&Log> {
        d.effects
            .iter()
            .filter_map(|e| match e {
                Effect::Log(l) => Some(l),
                _ => None,
            })
            .collect()
    }

    pub(super) fn refusals(d: &Decision) -> Vec<&Refusal> {
        d.effects
            .iter()
            .filter_map(|e| match e {
                Effect::Refused(r) => Some(r),
                _ => None,
            })
            .collect()
    }

    /// (id, refund, delay) of every row given back.
    pub(super) fn rescheduled(d: &Decision) -> Vec<(i64, bool, Duration)> {
        d.settlement
            .reschedule
            .iter()
            .map(|r| (r.id, r.refund, r.delay))
            .collect()
    }

    /// (id, reason, parked for) of every row quarantined or parked.
    pub(super) fn quarantined(d: &Decision) -> Vec<(i64, QuarantineReason, Option<Duration>)> {
        d.settlement
            .quarantine
            .iter()
            .map(|q| (q.id, q.reason, q.retry_in))
            .collect()
    }

    #[test]
    fn a_sent_entry_is_marked_sent_with_its_lag_and_relieves_the_relay() {
        let rows = rows(2, 1);
        let (mut d, _) = decide(3);
        let req = request(QUEUE, &[0, 1]);
        d.answered(&rows, &req, vec![sent("m1"), sent("m2")]);
        let d = d.finish();
        let ids: Vec<_> = d
            .settlement
            .sent
            .iter()
            .map(|s| (s.id, s.lease_token, s.message_id.as_str()))
            .collect();
        assert_eq!(ids, [(1, 101, "m1"), (2, 102, "m2")]);
        assert_eq!(
            d.effects,
            [
                Effect::Relieve,
                Effect::Reached(Destination::of_row(QUEUE)),
                Effect::Readiness,
                Effect::Lag(10.0),
                Effect::Lag(10.0),
            ]
        );
    }

    #[test]
    fn a_sent_entry_whose_body_went_through_s3_is_counted_offloaded() {
        let rows = rows(2, 1);
        let (mut d, _) = decide(0);
        let mut req = request(QUEUE, &[0]);
        req.entries.push(entry(1, true));
        d.answered(&rows, &req, vec![sent("m1"), sent("m2")]);
        assert_eq!(counts(&d.finish()), [Count::Offloaded]);
    }

    #[test]
    fn a_sender_fault_entry_is_quarantined_and_counted_permanent() {
        let rows = rows(1, 1);
        let (mut d, _) = decide(0);
        d.answered(
            &rows,
            &request(QUEUE, &[0]),
            vec![failed(true, "InvalidMessageContents")],
        );
        let d = d.finish();
        assert_eq!(quarantined(&d), [(1, QuarantineReason::SenderFault, None)]);
        assert_eq!(
            d.settlement.quarantine[0].error,
            "InvalidMessageContents: no"
        );
        assert_eq!(
            counts(&d),
            [Count::SendFailures {
                kind: "permanent",
                n: 1
            }]
        );
        assert!(d.effects.contains(&Effect::SpanRefused {
            row_id: 1,
            code: Some("InvalidMessageContents".into())
        }));
        assert_eq!(
            logs(&d),
            [&Log::Quarantined {
                event_id: "e-1".into(),
                id: 1,
                reason: QuarantineReason::SenderFault,
                error: "InvalidMessageContents: no".into(),
            }]
        );
        assert!(pauses(&d).is_empty(), "a bad entry does not slow the relay");
    }

    #[test]
    fn a_retryable_entry_spends_its_attempt_and_waits_its_own_back_off() {
        let rows = rows(1, 3);
        let (mut d, _) = decide(0);
        d.answered(
            &rows,
            &request(QUEUE, &[0]),
            vec![failed(false, "InternalError")],
        );
        let d = d.finish();
        // Attempt 3: a ceiling of 4 s, the jitter's middle.
        assert_eq!(rescheduled(&d), [(1, false, 2 * SECOND)]);
        assert_eq!(
            d.settlement.reschedule[0].error.as_deref(),
            Some("InternalError: no")
        );
        assert_eq!(
            counts(&d),
            [Count::SendFailures {
                kind: "transient",
                n: 1
            }]
        );
        assert!(pauses(&d).is_empty());
    }

    #[test]
    fn a_retryable_entry_out_of_attempts_is_quarantined() {
        let rows = rows(1, 5);
        let (mut d, _) = decide(0);
        d.answered(
            &rows,
            &request(QUEUE, &[0]),
            vec![failed(false, "InternalError")],
        );
        let d = d.finish();
        assert_eq!(quarantined(&d), [(1, QuarantineReason::MaxAttempts, None)]);
        assert_eq!(
            d.settlement.quarantine[0].error,
            "5 attempts; last: InternalError: no"
        );
        assert_eq!(
            counts(&d),
            [Count::SendFailures {
                kind: "transient",
                n: 1
            }]
        );
    }

    #[test]
    fn a_throttled_entry_keeps_its_attempt_and_each_one_pauses_the_relay_a_step_longer() {
        let rows = rows(2, 5);
        let (mut d, _) = decide(7);
        // Even flagged as the sender's fault and out of attempts: a busy queue is no reason to
        // quarantine a good row.
        d.answered(
            &rows,
            &request(QUEUE, &[0, 1]),
            vec![
                failed(true, "ThrottlingException"),
                failed(false, "ThrottlingException"),
            ],
        );
        let d = d.finish();
        // The answer relieved the relay first: the pauses start again at the first step.
        assert_eq!(pauses(&d), [SECOND / 2, SECOND]);
        assert_eq!(rescheduled(&d), [(1, true, SECOND / 2), (2, true, SECOND)]);
        assert_eq!(
            counts(&d),
            [
                Count::SendFailures {
                    kind: "throttled",
                    n: 1
                },
                Count::SendFailures {
                    kind: "throttled",
                    n: 1
                }
            ]
        );
    }

    #[test]
    fn a_failed_request_that_is_not_the_rows_fault_pauses_the_relay_and_releases_them() {
        let rows = rows(2, 2);
        let (mut d, _) = decide(2);
        let mut f = failure("InternalError");
        f.status = Some(500);
        request_failed(&mut d, &rows, &request(QUEUE, &[0, 1]), f);
        let d = d.finish();
        // The third failure in a row: a ceiling of 4 s.
        assert_eq!(pauses(&d), [2 * SECOND]);
        assert_eq!(
            rescheduled(&d),
            [(1, true, 2 * SECOND), (2, true, 2 * SECOND)]
        );
        assert_eq!(
            counts(&d),
            [Count::SendFailures {
                kind: "transient",
                n: 2
            }]
        );
        assert_eq!(
            logs(&d),
            [&Log::RequestFailed {
                call: "SendMessageBatch",
                error: "InternalError: said so".into(),
                kind: "transient",
                retry_in: 2 * SECOND,
            }]
        );
        assert!(!d.effects.iter().any(|e| matches!(e, Effect::NotReady(_))));
    }

    #[test]
    fn a_throttled_publish_is_named_for_sns() {
        let rows = rows(1, 1);
        let (mut d, _) = decide(0);
        request_failed(&mut d, &rows, &request(TOPIC, &[0]), failure("Throttling"));
        let d = d.finish();
        assert_eq!(
            counts(&d),
            [Count::SendFailures {
                kind: "throttled",
                n: 1
            }]
        );
        assert!(matches!(
            logs(&d)[..],
            [Log::RequestFailed {
                call: "PublishBatch",
                kind: "throttled",
                ..
            }]
        ));
    }

    #[test]
    fn refused_credentials_make_the_relay_not_ready_and_keep_the_rows() {
        let rows = rows(1, 1);
        let (mut d, _) = decide(0);
        request_failed(
            &mut d,
            &rows,
            &request(QUEUE, &[0]),
            failure("InvalidClientTokenId"),
        );
        let d = d.finish();
        let what = "InvalidClientTokenId: said so".to_string();
        assert!(d.effects.contains(&Effect::NotReady(what.clone())));
        assert_eq!(rescheduled(&d), [(1, true, SECOND / 2)]);
        assert_eq!(
            counts(&d),
            [Count::SendFailures {
                kind: "config",
                n: 1
            }]
        );
        assert_eq!(
            logs(&d),
            [&Log::CredentialsRefused {
                service: "SQS",
                error: what,
                retry_in: SECOND / 2,
                queue_url: QUEUE.to_string(),
            }]
        );
    }

    #[test]
    fn a_request_of_one_refused_as_bad_input_quarantines_that_row_alone() {
        let rows = rows(1, 1);
        let (mut d, _) = decide(0);
        request_failed(
            &mut d,
            &rows,
            &request(QUEUE, &[0]),
            failure("InvalidParameterValue"),
        );
        let d = d.finish();
        assert_eq!(quarantined(&d), [(1, QuarantineReason::Rejected, None)]);
        assert_eq!(
            counts(&d),
            [Count::SendFailures {
                kind: "permanent",
                n: 1
            }]
        );
        assert!(pauses(&d).is_empty());
    }

    #[test]
    fn a_refusing_queue_asks_for_a_park_and_nothing_else_yet() {
        let rows = rows(2, 1);
        let (mut d, _) = decide(0);
        request_failed(
            &mut d,
            &rows,
            &request(QUEUE, &[0, 1]),
            failure("QueueDoesNotExist"),
        );
        let d = d.finish();
        assert_eq!(
            refusals(&d),
            [&Refusal {
                destination: Destination::of_row(QUEUE),
                error: "QueueDoesNotExist: said so".into(),
                held: Held::Request(vec![0, 1]),
            }]
        );
        assert!(d.settlement.is_empty(), "the rows wait for the park");
        assert!(counts(&d).is_empty() && pauses(&d).is_empty());
    }

    pub(super) fn refusal(destination: &str, held: Held) -> Refusal {
        Refusal {
            destination: Destination::of_row(destination),
            error: "QueueDoesNotExist: said so".into(),
            held,
        }
    }

    #[test]
    fn the_relays_own_queue_refusing_parks_its_rows_and_fails_readiness() {
        let rows = rows(2, 1);
        let (mut d, now) = decide(0);
        d.refused(
            &rows,
            refusal(QUEUE, Held::Request(vec![0, 1])),
            &park(true, true, now),
        );
        let d = d.finish();
        let parked = Some(10 * SECOND);
        assert_eq!(
            quarantined(&d),
            [
                (1, QuarantineReason::Destination, parked),
                (2, QuarantineReason::Destination, parked)
            ]
        );
        assert_eq!(
            d.settlement.quarantine[0].error,
            "queue http://sqs/1/orders: QueueDoesNotExist: said so"
        );
        assert_eq!(d.effects[0], Effect::Readiness);
        assert_eq!(
            counts(&d),
            [Count::SendFailures {
                kind: "config",
                n: 2
            }]
        );
        assert!(
            matches!(logs(&d)[..], [Log::ConfiguredRefused { noun: "queue", fix: "queue URL", retry_in, .. }] if *retry_in == 10 * SECOND)
        );
        assert!(pauses(&d).is_empty(), "other queues keep flowing");
    }

    #[test]
    fn a_rows_own_queue_refusing_parks_its_rows_and_keeps_the_relay_ready() {
        let rows = rows(1, 1);
        let (mut d, now) = decide(0);
        d.refused(
            &rows,
            refusal(QUEUE, Held::Request(vec![0])),
            &park(true, false, now),
        );
        let d = d.finish();
        assert_eq!(
            quarantined(&d),
            [(1, QuarantineReason::Destination, Some(10 * SECOND))]
        );
        assert!(!d.effects.contains(&Effect::Readiness));
        assert_eq!(
            counts(&d),
            [Count::SendFailures {
                kind: "destination",
                n: 1
            }]
        );
        assert!(matches!(
            logs(&d)[..],
            [Log::RowsOwnRefused {
                service: "SQS",
                noun: "queue",
                ..
            }]
        ));
    }

    #[test]
    fn a_refusal_that_joins_a_running_park_is_not_logged_again() {
        let rows = rows(1, 1);
        let (mut d, now) = decide(0);
        d.refused(
            &rows,
            refusal(TOPIC, Held::Request(vec![0])),
            &park(false, true, now),
        );
        let d = d.finish();
        assert!(logs(&d).is_empty());
        assert_eq!(quarantined(&d).len(), 1);
        assert!(d.settlement.quarantine[0]
            .error
            .starts_with("topic arn:aws:sns:"));
    }

    #[test]
    fn a_parked_queue_parks_its_rows_without_a_request() {
        let rows = rows(2, 1);
        let (mut d, now) = decide(0);
        d.parked(&rows, &request(QUEUE, &[1]), &park(false, true, now));
        let d = d.finish();
        assert_eq!(
            quarantined(&d),
            [(2, QuarantineReason::Destination, Some(10 * SECOND))]
        );
        assert!(counts(&d).is_empty(), "no request, no failure");
        assert_eq!(
            logs(&d),
            [&Log::QueueParked {
                entries: 1,
                queue_url: QUEUE.to_string()
            }]
        );
    }

    #[test]
    fn a_request_not_sent_and_the_follow_ups_given_back_keep_their_attempts() {
        let rows = rows(3, 1);
        let (mut d, _) = decide(0);
        d.not_sent(&rows, &request(QUEUE, &[0]), "shutting down");
        d.given_back(&rows, &[request(QUEUE, &[1]), request(QUEUE, &[2])]);
        let d = d.finish();
        assert_eq!(
            rescheduled(&d),
            [
                (1, true, Duration::ZERO),
                (2, true, Duration::ZERO),
                (3, true, Duration::ZERO)
            ]
        );
        assert_eq!(
            logs(&d),
            [&Log::NotSent {
                entries: 1,
                why: "shutting down"
            }]
        );
    }

    #[test]
    fn the_planners_refusals_are_quarantined_and_the_rows_held_back_released() {
        let rows = rows(2, 1);
        let (mut d, _) = decide(0);
        let rejected = vec![Rejected {
            row: 0,
            reason: QuarantineReason::TooLarge,
            error: "too big".into(),
        }];
        d.planned(&rows, rejected, &[1]);
        let d = d.finish();
        assert_eq!(quarantined(&d), [(1, QuarantineReason::TooLarge, None)]);
        assert_eq!(rescheduled(&d), [(2, true, Duration::ZERO)]);
    }
}
