//! Delivering one claim: plan -> send -> decide -> apply -> settle.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;

use crate::batch::{self, BatchRequest};
use crate::metrics as names;
use crate::otel::ClaimSpans;
use crate::retry::{self, RequestReaction};
use crate::row::{Claimed, QuarantineReason, Settlement};
use crate::sqs::EntryOutcome;

use super::decide::{park_row, quarantine, release};
use super::send::Unsent;
use super::Relay;

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
            mut rows,
            unreadable,
            ..
        } = claimed;
        // Before planning: a row's `traceparent` becomes its span's, and the planner sizes the
        // message with the value that is sent.
        let mut spans = ClaimSpans::begin(self.tracing.as_deref(), &mut rows, |row| {
            self.plan_config.queue_for(row).to_string()
        });
        let mut limits = self.queue_limits(&rows).await;
        let mut plan = batch::plan_within(&rows, &self.plan_config, &limits);
        // A row refused for a queue's own limit is checked against that queue once more before
        // it is quarantined: an operator who raised the limit and re-drove it must not meet the
        // limit remembered from before.
        let stale: Vec<String> = plan
            .rejected
            .iter()
            .filter(|r| r.reason == QuarantineReason::TooLarge)
            .map(|r| self.plan_config.queue_for(&rows[r.row]).to_string())
            .filter(|q| {
                limits
                    .get(q)
                    .is_some_and(|&l| l < self.config.max_request_bytes)
            })
            .collect();
        if !stale.is_empty() {
            {
                let mut known = self.queue_limits.lock().expect("queue limits lock");
                for queue in &stale {
                    known.remove(queue);
                }
            }
            limits = self.queue_limits(&rows).await;
            plan = batch::plan_within(&rows, &self.plan_config, &limits);
        }
        let mut settlement = Settlement::default();
        for row in unreadable {
            tracing::warn!(id = row.id, reason = "invalid", error = %row.error, "unreadable row quarantined");
            settlement.quarantine.push(row.quarantined());
        }
        for rejected in plan.rejected {
            let row = &rows[rejected.row];
            quarantine(&mut settlement, row, rejected.reason, rejected.error);
        }
        for index in plan.released {
            release(&mut settlement, &rows[index], Duration::ZERO, None);
        }
        let mut sends: FuturesUnordered<_> = plan
            .requests
            .into_iter()
            .map(|request| self.send(request, lease_deadline, &shutdown))
            .collect();
        // Requests that must follow another go only once it was accepted entry by entry (keyed
        // by its first entry): the rest of a group too long for one request, and the halves of
        // an ordered request SQS refused as a whole. Otherwise they go back unsent, so a group
        // keeps its order.
        let mut after: HashMap<String, BatchRequest> = plan.sequels.into_iter().collect();
        while let Some((request, result)) = sends.next().await {
            let first = request.entries[0].id.clone();
            let mut all_sent = false;
            match result {
                Ok(outcomes) => {
                    all_sent = outcomes
                        .iter()
                        .all(|o| matches!(o, EntryOutcome::Sent { .. }));
                    self.pressure.relieve();
                    self.destinations.reached(&request.queue_url);
                    // Clears a credentials error too: this request was signed and accepted.
                    self.health
                        .set_config_error(self.destinations.readiness_error());
                    for (entry, outcome) in request.entries.iter().zip(outcomes) {
                        if let EntryOutcome::Failed { code, .. } = &outcome {
                            spans.refused(rows[entry.row].id, Some(code));
                        }
                        if entry.offload.is_some() && matches!(outcome, EntryOutcome::Sent { .. }) {
                            metrics::counter!(names::OFFLOADED).increment(1);
                        }
                        self.settle_entry(&mut settlement, &rows[entry.row], outcome);
                    }
                }
                Err(Unsent::Failed(failure)) => {
                    let class = retry::classify(&failure);
                    let reaction = retry::request_reaction(
                        class,
                        request.entries.len(),
                        self.keeps_order(&request.queue_url),
                    );
                    if let RequestReaction::Split {
                        one_after_the_other,
                    } = reaction
                    {
                        let (left, right) = request.split();
                        if one_after_the_other {
                            if let Some(next) = after.remove(&first) {
                                after.insert(right.entries[0].id.clone(), next);
                            }
                            after.insert(first, right);
                        } else {
                            sends.push(self.send(right, lease_deadline, &shutdown));
                        }
                        sends.push(self.send(left, lease_deadline, &shutdown));
                        continue;
                    }
                    for entry in &request.entries {
                        spans.refused(rows[entry.row].id, failure.code.as_deref());
                    }
                    self.request_failed(
                        &mut settlement,
                        &rows,
                        &request,
                        class,
                        reaction,
                        &failure,
                    );
                }
                Err(Unsent::Parked(park)) => {
                    let now = Instant::now();
                    for entry in &request.entries {
                        park_row(
                            &mut settlement,
                            &rows[entry.row],
                            &request.queue_url,
                            &park,
                            now,
                        );
                    }
                    tracing::debug!(
                        entries = request.entries.len(),
                        queue_url = %request.queue_url,
                        "queue parked; rows parked without a request"
                    );
                }
                Err(Unsent::Offload(failed)) => {
                    if let Some(rest) =
                        self.offload_failed(&mut settlement, &rows, &request, failed, &mut spans)
                    {
                        sends.push(self.send(rest, lease_deadline, &shutdown));
                    }
                }
                Err(Unsent::NotSent(why)) => {
                    for entry in &request.entries {
                        release(&mut settlement, &rows[entry.row], Duration::ZERO, None);
                    }
                    tracing::debug!(
                        entries = request.entries.len(),
                        why,
                        "batch not sent; rows released"
                    );
                }
            }
            if let Some(next) = after.remove(&first) {
                if all_sent {
                    sends.push(self.send(next, lease_deadline, &shutdown));
                } else {
                    // Sending the rest now could overtake what failed: give it back.
                    let mut next = Some(next);
                    while let Some(request) = next {
                        for entry in &request.entries {
                            release(&mut settlement, &rows[entry.row], Duration::ZERO, None);
                        }
                        next = after.remove(&request.entries[0].id);
                    }
                }
            }
        }
        drop(sends);
        spans.finish(&settlement);
        self.settle(settlement, lease_deadline).await;
        // Settled rows may unblock others: the next row of each group under ordered delivery,
        // retries due now. Claim again rather than wait for the poll interval; no NOTIFY
        // fires for an UPDATE.
        self.wake.notify_one();
    }

    /// Whether requests to this queue carry ordered groups.
    pub(super) fn keeps_order(&self, queue_url: &str) -> bool {
        self.plan_config
            .ordering
            .is_some_and(|o| o.every_destination || batch::is_fifo(queue_url))
    }

    /// Writes a claim's outcomes, retrying while the lease still protects the rows. If the
    /// database stays away past the lease, the rows are simply claimed and sent again later,
    /// with the same event_id.
    pub(super) async fn settle(&self, settlement: Settlement, lease_deadline: Instant) {
        if settlement.is_empty() {
            return;
        }
        let mut attempt = 0u32;
        loop {
            let (owner, settlement) = (&self.config.relay_id, &settlement);
            let result = self
                .session
                .run("recording outcomes", |s| async move {
                    s.settle(owner, settlement).await
                })
                .await;
            match result {
                Ok(settled) => {
                    self.health.set_database_ok(true);
                    metrics::counter!(names::EVENTS_SENT).increment(settled.sent);
                    for reason in &settled.quarantined_reasons {
                        metrics::counter!(names::EVENTS_QUARANTINED, "reason" => reason.as_str())
                            .increment(1);
                    }
                    if settled.lost > 0 {
                        metrics::counter!(names::LEASE_LOST).increment(settled.lost);
                        tracing::warn!(
                            rows = settled.lost,
                            "lease lost: another replica owns these rows now; our outcome was not recorded"
                        );
                    }
                    return;
                }
                Err(e) => {
                    self.health.set_database_ok(false);
                    attempt += 1;
                    let delay = self.db_backoff(attempt, crate::outbox::replacement(&e).is_some());
                    if Instant::now() + delay >= lease_deadline {
                        tracing::error!(error = %e, rows = settlement.sent.len() + settlement.reschedule.len() + settlement.quarantine.len(),
                            "could not record outcomes before the lease ends; the rows will be sent again with the same event_id");
                        return;
                    }
                    tracing::warn!(error = %e, retry_in = ?delay, "settlement failed; retrying");
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }
}
