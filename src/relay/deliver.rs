//! Delivering one claim: plan -> send -> decide -> apply -> settle.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;

use crate::batch;
use crate::destination::Destination;
use crate::metrics as names;
use crate::otel::ClaimSpans;
use crate::retry::{self, RequestReaction};
use crate::row::{Claimed, ClaimedRow, QuarantineReason, Settled, Settlement};
use crate::sink::EntryOutcome;

use super::carry::Carried;
use super::decide::{Decide, Decision, Policy};
use super::effect::{Count, Effect};
use super::follow_ups::{FollowUps, Next};
use super::send::NoAnswer;
use super::{Relay, LOG_TARGET};

impl Relay {
    /// Sends one claim's rows and settles every row exactly once.
    pub(super) async fn deliver(
        self: Arc<Self>,
        claimed: Claimed,
        lease_deadline: Instant,
        _permits: (OwnedSemaphorePermit, OwnedSemaphorePermit),
        shutdown: CancellationToken,
    ) {
        let Claimed {
            mut rows, server, ..
        } = claimed;
        let holds_back = rows.iter().any(|r| self.plan_config.keeps_order_of(r));
        // Before planning: a row's `traceparent` becomes its span's, and the planner sizes the
        // message with the value that is sent.
        let mut spans = ClaimSpans::begin(self.shared.tracing.as_deref(), &mut rows, |row| {
            self.plan_config.queue_for(row).clone()
        });
        let mut limits = self.size_limits(&rows).await;
        let mut plan = batch::plan_within(&rows, &self.plan_config, &limits);
        // A row refused for a destination's own limit is checked against that destination
        // once more before it is quarantined: an operator who raised the limit (a queue's or a
        // topic's MaximumMessageSize) and re-drove it must not meet the limit remembered from
        // before.
        let max_request_bytes = self.config.send.max_request_bytes;
        let stale: Vec<Destination> = plan
            .rejected
            .iter()
            .filter(|r| r.reason == QuarantineReason::TooLarge)
            .map(|r| self.plan_config.queue_for(&rows[r.row]).clone())
            .filter(|d| {
                d.limits(max_request_bytes, limits.get(d).copied()).bytes < max_request_bytes
            })
            .collect();
        if !stale.is_empty() {
            self.ask_again(&stale);
            limits = self.size_limits(&rows).await;
            plan = batch::plan_within(&rows, &self.plan_config, &limits);
        }
        let mut settlement = Settlement {
            server,
            lease: self.config.claim.lease,
            ..Settlement::default()
        };
        let mut planned = self.decide(Instant::now());
        planned.planned(&rows, plan.rejected, &plan.released);
        self.apply(planned.finish(), &rows, &mut settlement, &mut spans);
        let mut sends: FuturesUnordered<_> = plan
            .requests
            .into_iter()
            .map(|request| self.send(request, lease_deadline, &shutdown))
            .collect();
        let mut follow_ups = FollowUps::new(plan.follow_ups);
        while let Some((request, result)) = sends.next().await {
            let first = request.entries[0].id.clone();
            let mut all_sent = false;
            let mut decide = self.decide(Instant::now());
            match result {
                Ok(outcomes) => {
                    all_sent = outcomes
                        .iter()
                        .all(|o| matches!(o, EntryOutcome::Sent { .. }));
                    decide.answered(&rows, &request, outcomes);
                }
                Err(NoAnswer::Failed(failure)) => {
                    let class = retry::classify(&failure);
                    let reaction = retry::request_reaction(
                        class,
                        request.entries.len(),
                        self.keeps_order(&request.destination),
                    );
                    if let RequestReaction::Split {
                        one_after_the_other,
                    } = reaction
                    {
                        let (left, right) = request.split();
                        if one_after_the_other {
                            follow_ups.split_in_order(&left, right);
                        } else {
                            sends.push(self.send(right, lease_deadline, &shutdown));
                        }
                        sends.push(self.send(left, lease_deadline, &shutdown));
                        continue;
                    }
                    decide.request_failed(&rows, &request, class, reaction, &failure);
                }
                Err(NoAnswer::Parked(park)) => decide.parked(&rows, &request, &park),
                Err(NoAnswer::Offload(failed)) => {
                    let bucket = match self.shared.sinks.offload() {
                        Some(s3) => s3.bucket().clone(),
                        None => unreachable!("entries are offloaded only with a bucket"),
                    };
                    let ordered = self.keeps_order(&request.destination);
                    if let Some(rest) =
                        decide.offload_failed(&rows, &request, failed, &bucket, ordered)
                    {
                        sends.push(self.send(rest, lease_deadline, &shutdown));
                    }
                }
                Err(NoAnswer::NotSent(why)) => decide.not_sent(&rows, &request, why),
            }
            match follow_ups.answered(&first, all_sent) {
                Next::Nothing => {}
                Next::Send(next) => sends.push(self.send(next, lease_deadline, &shutdown)),
                Next::GiveBack(requests) => decide.given_back(&rows, &requests),
            }
            self.apply(decide.finish(), &rows, &mut settlement, &mut spans);
        }
        drop(sends);
        spans.finish(&settlement);
        self.settle_soon(settlement, lease_deadline).await;
        // Rows of ordered groups held their group-mates back from other claims: settled, they
        // unblock them, which waited for them already. Claim again rather than wait for the
        // poll interval or the latency budget (no NOTIFY fires for a DELETE or an UPDATE).
        // Any other settlement makes nothing claimable, and waking would only split the
        // stream into more claims.
        if holds_back {
            self.wake.notify_one();
        }
    }

    /// Decisions taken at `now`, with the relay's rules and the relay-wide pause as it stands.
    fn decide(&self, now: Instant) -> Decide<fn() -> f64> {
        let policy = Policy {
            max_attempts: self.config.claim.max_attempts,
            retry_base: self.config.retry.retry_base,
            retry_max: self.config.retry.retry_max,
        };
        Decide::new(
            policy,
            now,
            crate::metrics::unix_seconds(SystemTime::now()),
            self.shared.pressure.failures(),
            fastrand::f64,
        )
    }

    /// The one place where decisions reach the rest of the relay: the settlement of the claim,
    /// the send gate (pause, parks), readiness, metrics, spans and log lines.
    fn apply(
        &self,
        decision: Decision,
        rows: &[ClaimedRow],
        settlement: &mut Settlement,
        spans: &mut ClaimSpans,
    ) {
        let Decision {
            settlement: part,
            effects,
        } = decision;
        settlement.sent.extend(part.sent);
        settlement.reschedule.extend(part.reschedule);
        settlement.quarantine.extend(part.quarantine);
        for effect in effects {
            match effect {
                Effect::Pause(delay) => self.shared.pressure.pause(Instant::now(), delay),
                Effect::Relieve => self.shared.pressure.relieve(),
                Effect::Reached(destination) => {
                    self.shared.destinations.reached(&destination);
                }
                Effect::Refused(refusal) => {
                    let now = Instant::now();
                    let park = self.shared.destinations.refused(
                        &refusal.destination,
                        &refusal.error,
                        now,
                        fastrand::f64(),
                    );
                    let mut decide = self.decide(now);
                    decide.refused(rows, refusal, &park);
                    self.apply(decide.finish(), rows, settlement, spans);
                }
                Effect::Readiness => self
                    .shared
                    .health
                    .set_config_error(self.shared.destinations.readiness_error()),
                Effect::NotReady(why) => self.shared.health.set_config_error(Some(why)),
                Effect::Count(Count::SendFailures { kind, n }) => {
                    metrics::counter!(names::SEND_FAILURES, "kind" => kind).increment(n)
                }
                Effect::Count(Count::Offloaded) => metrics::counter!(names::OFFLOADED).increment(1),
                Effect::Lag(lag) => metrics::histogram!(names::DELIVERY_LAG).record(lag),
                Effect::SpanRefused { row_id, code } => spans.refused(row_id, code.as_deref()),
                Effect::Log(line) => line.emit(),
            }
        }
    }

    /// Whether requests to this queue carry ordered groups.
    pub(super) fn keeps_order(&self, queue_url: &Destination) -> bool {
        self.plan_config.keeps_order(queue_url)
    }

    /// A settlement left `rows` acknowledged rows unsent while its claim held them: they would
    /// be claimed and sent again, and so would every row after them, for ever. Claims stop for
    /// good, with one line naming what on the table can do that; the rows stay unsent, each sent
    /// once more than it should have been at most by each relay.
    /// The server refused one of the relay's statements on the table because a rule rewrites
    /// it ([`OutboxError::rewritten_by_rule`]): a settlement, a claim that quarantines, the
    /// parking, a renewal. No retry changes that, and each of them stops claims the same way,
    /// as settlements that change nothing.
    pub(super) async fn refused_by_rule(&self, e: &crate::outbox::OutboxError) {
        debug_assert!(e.rewritten_by_rule());
        self.settlements_undone(Undone::Refused(e.to_string()))
            .await
    }

    pub(super) async fn settlements_undone(&self, undone: Undone) {
        // Said once: the first statement that found it names it, later ones add nothing.
        if self.admission.blocked_for_good() {
            return;
        }
        // Claims stop at once: the rows are free again since the settlement removed their
        // claim, and a claim now would send them again. The reason is named below.
        let statement = match undone {
            Undone::NotParked(_) | Undone::NotQuarantined(_) => {
                "UPDATE (parking, quarantines and, with --retention, settlements)"
            }
            _ => "DELETE (or, with --retention, UPDATE)",
        };
        let what = match undone {
            Undone::Unchanged(rows) => format!(
                "settlements on {} change nothing: {rows} row(s) SQS acknowledged are still unsent after the relay settled them under its claim",
                self.outbox.table()
            ),
            Undone::Refused(error) => format!(
                "settlements on {} change nothing: the server refuses the relay's own statements on it ({error})",
                self.outbox.table()
            ),
            Undone::NotParked(rows) => format!(
                "updates on {} change nothing: {rows} row(s) behind a quarantined event of their group are still unparked after the relay parked them",
                self.outbox.table()
            ),
            Undone::NotQuarantined(rows) => format!(
                "updates on {} change nothing: {rows} row(s) a claim refused (too large, or out of attempts) are still unquarantined after the relay quarantined them",
                self.outbox.table()
            ),
        };
        self.admission.block(what.clone());
        metrics::gauge!(names::TABLE_BLOCKED, "table" => self.outbox.table().label()).set(1.0);
        let causes = self
            .settlements
            .run("naming what undoes the settlements", |s| async move {
                s.settlement_blockers().await
            })
            .await;
        let causes = match causes {
            Ok(c) if c.is_empty() => {
                "no trigger, rule or row-level security policy was found that explains it"
                    .to_string()
            }
            Ok(c) => c.join("; "),
            Err(e) => format!("could not read the table's triggers, rules and policies: {e}"),
        };
        let why = format!(
            "{what} ({causes}); claims stopped so that the same events are not sent again and again: make the relay's {statement} take effect, then restart the relay"
        );
        // Not ready from the line on, not from the claim loop's next turn; a relay serving
        // several tables skips this one and stays ready for the others.
        if matches!(self.gauges, super::Gauges::Own(_)) {
            self.shared.health.set_not_claiming(Some(why.clone()));
        }
        tracing::error!(target: LOG_TARGET, "{why}");
        self.admission.explain(why);
    }

    /// A settlement changed fewer of its acknowledged rows (`ids`) than it meant to: looks
    /// whether they are still unsent, with sends stopped meanwhile, and stops claims for good
    /// if they are. Tried until the lease ends, like the settlement; after that a claim may
    /// take them and send them once more, and its own settlement looks again.
    async fn confirm_settled(&self, ids: &[i64], lease_deadline: Instant) {
        let _confirming = self.admission.confirming();
        let mut attempt = 0u32;
        loop {
            let result = self
                .settlements
                .run(
                    "looking for acknowledged rows the settlement left unsent",
                    |s| async move { s.unsettled(ids).await },
                )
                .await;
            match result {
                Ok(0) => return,
                Ok(unchanged) => {
                    return self.settlements_undone(Undone::Unchanged(unchanged)).await
                }
                Err(e) => {
                    attempt += 1;
                    let delay = self.db_backoff(attempt, crate::outbox::replacement(&e).is_some());
                    if Instant::now() + delay >= lease_deadline {
                        tracing::warn!(target: LOG_TARGET, error = %e, rows = ids.len(),
                            "could not look whether a settlement that changed fewer rows than it meant to took effect; sending again");
                        return;
                    }
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    /// Writes a claim's outcomes: carried by the claim loop's next claim when one comes
    /// within the latency budget ([`super::carry`]), else on the settlements' connection.
    async fn settle_soon(&self, settlement: Settlement, lease_deadline: Instant) {
        let patience = self.config.claim.max_delay;
        if settlement.is_empty() || patience.is_zero() {
            return self.settle(settlement, lease_deadline, false).await;
        }
        let ticket = match self.carry.hand(settlement) {
            Ok(ticket) => ticket,
            Err(settlement) => return self.settle(settlement, lease_deadline, false).await,
        };
        match self.carry.outcome(ticket, patience).await {
            Carried::Settled(settled) => self.settled(settled, lease_deadline).await,
            Carried::Back { settlement, tried } => {
                self.settle(settlement, lease_deadline, tried).await
            }
        }
    }

    /// Writes a claim's outcomes, retrying while the lease still protects the rows. If the
    /// database stays away past the lease, the rows are simply claimed and sent again later,
    /// with the same event_id. `tried`: a claim that carried it failed, and may have applied
    /// it unseen.
    pub(super) async fn settle(
        &self,
        settlement: Settlement,
        lease_deadline: Instant,
        tried: bool,
    ) {
        if settlement.is_empty() {
            return;
        }
        let mut attempt = 0u32;
        loop {
            let (owner, settlement) = (&self.config.claim.relay_id, &settlement);
            let retry = tried || attempt > 0;
            metrics::counter!(names::SETTLEMENTS, "written" => "alone").increment(1);
            let result = self
                .settlements
                .run("recording outcomes", |s| async move {
                    s.write_settlement(owner, settlement, retry).await
                })
                .await;
            match result {
                Ok(settled) => {
                    self.shared.health.set_database_ok(true);
                    return self.settled(settled, lease_deadline).await;
                }
                Err(e) if e.rewritten_by_rule() => {
                    // The rows stay unsent and their claim ends with its lease: each is sent
                    // once more at most, by the relay that claims it next, which stops too.
                    self.refused_by_rule(&e).await;
                    return;
                }
                Err(e) => {
                    self.shared.health.set_database_ok(false);
                    attempt += 1;
                    let delay = self.db_backoff(attempt, crate::outbox::replacement(&e).is_some());
                    if Instant::now() + delay >= lease_deadline {
                        tracing::error!(target: LOG_TARGET, error = %e, rows = settlement.sent.len() + settlement.reschedule.len() + settlement.quarantine.len(),
                            "could not record outcomes before the lease ends; the rows will be sent again with the same event_id");
                        return;
                    }
                    tracing::warn!(target: LOG_TARGET, error = %e, retry_in = ?delay, "settlement failed; retrying");
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    /// What a settlement did, however it was written: counted, and looked into when it
    /// changed fewer rows than it meant to or found its claim gone.
    async fn settled(&self, settled: Settled, lease_deadline: Instant) {
        metrics::counter!(names::EVENTS_SENT).increment(settled.sent);
        for reason in &settled.quarantined_reasons {
            metrics::counter!(names::EVENTS_QUARANTINED, "reason" => reason.as_str()).increment(1);
        }
        if !settled.suspect.is_empty() {
            self.confirm_settled(&settled.suspect, lease_deadline).await;
        }
        if settled.lost > 0 {
            metrics::counter!(names::LEASE_LOST).increment(settled.lost);
            tracing::warn!(target: LOG_TARGET,
                rows = settled.lost,
                "lease lost: another replica owns these rows now; our outcome was not recorded"
            );
        }
    }
}

/// How the relay found that its settlements cannot take effect.
pub(super) enum Undone {
    /// A settlement changed fewer rows than it meant to while its claim held them (a row
    /// trigger that skips them, a policy, a privilege).
    Unchanged(u64),
    /// The server refused the settling statement itself (a rule that rewrites it).
    Refused(String),
    /// The parking left rows unparked that it meant to park (sql/park_blocked.sql): the same
    /// row trigger or policy skips every UPDATE of the relay's.
    NotParked(u64),
    /// The quarantine after a claim left rows it refused unquarantined (sql/refuse.sql): the
    /// same.
    NotQuarantined(u64),
}
