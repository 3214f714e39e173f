//! The loop: wait -> claim -> plan -> send -> settle -> record.
//!
//! It sees neither driver: rows come from `outbox`, requests go through `sqs`, and every rule
//! (batching, backoff, classification) is a pure function elsewhere. One task claims; each
//! claim is delivered by its own task, so the next claim runs while earlier batches are in
//! flight. Two semaphores bound the work: requests in flight, and rows being delivered (so
//! rows are not leased long before a request slot is free for them). Below the first, each
//! destination has its own adaptive limit (`concurrency`), fed with every send's outcome.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::batch::{self, BatchRequest, Entry, PlanConfig};
use crate::concurrency::{self, Limiter, Outcome};
use crate::config::{Retention, RunConfig, RETENTION_BATCH};
use crate::destination::{bucket_key, describe, Destinations, Park};
use crate::idle;
use crate::metrics::{self as names, Health};
use crate::otel::{ClaimSpans, Tracing};
use crate::outbox::{
    ClaimLimits, ClaimRequest, Outbox, OutboxError, Session, SharedSession, Upkeep, Wakeup,
};
use crate::retry::{self, EntryDecision, FailureClass, RequestFailure, RequestReaction, Transport};
use crate::row::{
    Claimed, ClaimedRow, QuarantineReason, QuarantinedRow, RescheduledRow, SentRow, Settlement,
};
use crate::s3::S3;
use crate::sns::Sns;
use crate::sqs::{EntryOutcome, Sqs};

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error(transparent)]
    Startup(#[from] OutboxError),
}

/// The relay's shared state, one per process.
struct Relay {
    config: RunConfig,
    plan_config: PlanConfig,
    outbox: Arc<Outbox>,
    session: SharedSession,
    /// Statistics and maintenance, on a connection of their own so they never delay claims
    /// and settlements.
    upkeep: Upkeep,
    sqs: Sqs,
    /// For destinations that are SNS topic ARNs; the planner and settlement treat them alike.
    sns: Sns,
    /// Where large message bodies go first (`--offload-bucket`), when set.
    s3: Option<S3>,
    health: Arc<Health>,
    /// Woken by settlements, and by the NOTIFY trigger or the logical doorbell in those
    /// modes; a stored permit coalesces bursts.
    wake: Notify,
    /// Relay-wide back-off after whole-request failures (throttling, outage, credentials).
    pressure: Pressure,
    /// Queues that refused us (missing, access denied): only their rows wait, each queue on its
    /// own back-off.
    destinations: Destinations,
    /// Bounds SendMessageBatch calls in flight.
    request_permits: Arc<Semaphore>,
    /// Each destination's share of those, adapted to how it answers (taken before a permit).
    concurrency: Limiter,
    /// No unsent row has a smaller id (as of the last statistics refresh): claims start
    /// there instead of walking the index entries of rows sent since the last VACUUM. A row
    /// that becomes unsent below it (a late commit, a re-drive) waits at most one refresh.
    claim_floor: AtomicI64,
    /// Each destination queue's `MaximumMessageSize`, learnt on first use.
    queue_limits: Mutex<HashMap<String, (usize, Instant)>>,
    /// OpenTelemetry, when an OTLP endpoint is configured: a span per event.
    tracing: Option<Arc<Tracing>>,
}

/// Queues whose size limit is remembered at most (rows may carry their own queue URLs).
const MAX_KNOWN_QUEUES: usize = 1024;

/// A relay that has reached its database and found its table, ready to [`run`].
pub struct Connected {
    config: RunConfig,
    outbox: Arc<Outbox>,
    first: Session,
}

/// The outbox as `run` uses it: table (or adopted view), settlement and claim mode.
pub fn outbox_for(config: &RunConfig) -> Result<Outbox, OutboxError> {
    Outbox::new(
        &config.database.url.0,
        config.database.table.clone(),
        config.database.connect_timeout,
    )?
    .adopted_from(
        config
            .database
            .adopted
            .as_ref()
            .map(|(base, _)| base.clone()),
    )
    .password_source(config.database.password.clone())
    .pooler(config.database.pooler)
    .delete_on_ack(config.retention.deletes_on_ack())
    .round_trip_deadline(config.db_timeout)
    .claim_limits(ClaimLimits {
        max_payload_bytes: i64::try_from(config.max_payload_bytes).unwrap_or(i64::MAX),
        max_attempts: i32::try_from(config.max_attempts).unwrap_or(i32::MAX),
    })
    .claim_strategy(config.claim.clone())
}

/// Connects and checks the table and the wake-up mode, so that start-up problems (database
/// unreachable, table missing, `--wakeup` not set up) end the process with one clear line
/// before anything else is started.
pub async fn connect(config: RunConfig) -> Result<Connected, RelayError> {
    let outbox = Arc::new(outbox_for(&config)?);
    // As for every later connection (SharedSession::get): the handshake has its own bound, the
    // statements prepared after it one round-trip deadline more.
    let limit = config.database.connect_timeout + config.db_timeout;
    let first = tokio::time::timeout(limit, outbox.connect())
        .await
        .map_err(|_| OutboxError::Unanswered {
            what: "setting up the first connection",
            after: limit,
        })??;
    let installed = outbox.installed_wakeup().await?;
    match (config.wakeup, installed.judge(config.wakeup)) {
        (_, Ok(())) => {}
        // Polling works with the trigger still there; it only costs the application.
        (Wakeup::Poll, Err(harm)) => tracing::warn!("{harm}"),
        (_, Err(fix)) => return Err(OutboxError::Wakeup(fix).into()),
    }
    if config.wakeup == Wakeup::Logical {
        outbox.check_logical().await?;
    }
    Ok(Connected {
        config,
        outbox,
        first,
    })
}

/// Relays until `shutdown` fires and in-flight work has drained. After start-up every failure
/// is retried with back-off and never ends the loop. With `tracing`, every delivery attempt of
/// an event is a span; flushing them is the caller's, once this returns.
pub async fn run(
    connected: Connected,
    health: Arc<Health>,
    tracing: Option<Arc<Tracing>>,
    shutdown: CancellationToken,
) {
    let Connected {
        config,
        outbox,
        first,
    } = connected;
    health.set_database_ok(true);
    health.tick();
    let sqs = Sqs::new(config.sqs_endpoint.as_deref(), config.send_timeout).await;
    let sns = Sns::new(config.sns_endpoint.as_deref(), config.send_timeout).await;
    let s3 = match &config.plan.offload {
        Some(offload) => Some(
            S3::new(
                &offload.bucket,
                config.s3_endpoint.as_deref(),
                config.send_timeout,
            )
            .await,
        ),
        None => None,
    };
    let mut configured_queues = vec![config.plan.default_queue_url.clone()];
    for (_, url) in &config.plan.routes {
        if !configured_queues.contains(url) {
            configured_queues.push(url.clone());
        }
    }
    // The bucket is the relay's own configuration too: while it refuses us, large rows wait and
    // the relay is not ready.
    if let Some(offload) = &config.plan.offload {
        configured_queues.push(bucket_key(&offload.bucket));
    }
    let concurrency = Limiter::new(
        config.request_concurrency,
        config.max_in_flight,
        configured_queues.clone(),
    );
    let relay = Arc::new(Relay {
        destinations: Destinations::new(configured_queues, config.retry_base, config.retry_max),
        plan_config: config.plan.clone(),
        session: SharedSession::new(Arc::clone(&outbox), first),
        upkeep: Upkeep::new(Arc::clone(&outbox), config.maintenance_timeout),
        outbox,
        sqs,
        sns,
        s3,
        health,
        wake: Notify::new(),
        pressure: Pressure::default(),
        request_permits: Arc::new(Semaphore::new(config.max_in_flight)),
        concurrency,
        claim_floor: AtomicI64::new(0),
        queue_limits: Mutex::new(HashMap::new()),
        tracing,
        config,
    });
    tracing::info!(
        relay_id = %relay.config.relay_id,
        table = %relay.config.database.table,
        queue_url = %relay.config.queue_url,
        wakeup = %relay.config.wakeup,
        batch_size = relay.config.batch_size,
        max_in_flight = relay.config.max_in_flight,
        lease = %humantime::format_duration(relay.config.lease),
        "relay started"
    );
    let background = CancellationToken::new();
    let listener = tokio::spawn(Arc::clone(&relay).listen_for_wakeups(background.clone()));
    let stats = tokio::spawn(Arc::clone(&relay).refresh_stats(background.clone()));
    let retention = tokio::spawn(Arc::clone(&relay).expire_sent(background.clone()));
    relay.claim_loop(&shutdown).await;
    background.cancel();
    let _ = tokio::join!(listener, stats, retention);
    tracing::info!("relay stopped");
}

impl Relay {
    async fn claim_loop(self: &Arc<Self>, shutdown: &CancellationToken) {
        let c = &self.config;
        // Rows in delivery, not claims, are bounded: enough to fill every request slot plus one
        // claim being prepared. Counting claims instead starved the request slots when claims
        // are small (a steady stream claims a few rows at a time): five claims of four rows
        // kept five requests in flight of 32.
        let rows_in_delivery =
            (c.max_in_flight * batch::MAX_ENTRIES).max(c.batch_size) + c.batch_size;
        let row_permits = Arc::new(Semaphore::new(rows_in_delivery));
        // Payload bytes in delivery are bounded too, so memory is: rows of 1 MiB would
        // otherwise fill the row bound with hundreds of MiB (each byte is held about three
        // times: the row, the message body, the request). A claim asks for at most what is
        // free; it waits until a large message's worth is free, or the whole budget if smaller.
        let byte_budget = c.max_bytes_in_flight.min(u32::MAX as usize) as u32;
        let byte_permits = Arc::new(Semaphore::new(byte_budget as usize));
        let claim_threshold = byte_budget.min(c.max_request_bytes as u32);
        let mut cursor: Option<String> = None;
        let mut deliveries = JoinSet::new();
        let mut db_failures = 0u32;
        let mut idle = idle::Schedule::new(Instant::now());
        while !shutdown.is_cancelled() {
            self.health.tick();
            reap(&mut deliveries);
            if let Some(pause) = self.pressure.remaining() {
                self.sleep_or_shutdown(pause.min(c.poll_interval), shutdown)
                    .await;
                continue;
            }
            // A whole batch is reserved for the claim; what it does not fill goes back at once.
            let mut permit = tokio::select! {
                permit = Arc::clone(&row_permits).acquire_many_owned(c.batch_size as u32) => permit.expect("never closed"),
                _ = tokio::time::sleep(c.poll_interval) => continue,
                _ = shutdown.cancelled() => break,
            };
            // The same for bytes: take what is free (at least a large message's worth), and
            // give back what the claim did not use.
            let mut bytes = tokio::select! {
                bytes = Arc::clone(&byte_permits).acquire_many_owned(claim_threshold) => bytes.expect("never closed"),
                _ = tokio::time::sleep(c.poll_interval) => continue,
                _ = shutdown.cancelled() => break,
            };
            if let Ok(more) = Arc::clone(&byte_permits)
                .try_acquire_many_owned(byte_permits.available_permits() as u32)
            {
                bytes.merge(more);
            }
            let claimed_at = Instant::now();
            let request = ClaimRequest {
                limit: c.batch_size as i64,
                owner: c.relay_id.clone(),
                lease: c.lease,
                budget_bytes: i64::from(bytes.num_permits() as u32),
                floor: self.claim_floor.load(Ordering::Relaxed),
                cursor: cursor.clone(),
            };
            let request = &request;
            let claim = async {
                let started = Instant::now();
                let claimed = self
                    .session
                    .run("claiming rows", |s| async move { s.claim(request).await })
                    .await;
                metrics::histogram!(names::CLAIM_DURATION).record(started.elapsed().as_secs_f64());
                claimed
            };
            match claim.await {
                Ok(mut claimed) => {
                    db_failures = 0;
                    self.health.set_database_ok(true);
                    cursor = claimed.cursor.take();
                    record_quarantined_at_claim(&claimed);
                    let full = claimed.len() == c.batch_size;
                    let rows_claimed = !claimed.is_empty();
                    if rows_claimed {
                        drop(permit.split(c.batch_size - claimed.len()));
                        // The first row is claimed whatever its size; it may hold more than was
                        // free, never more than the whole budget (which would wait for ever).
                        let held: usize = claimed.rows.iter().map(|r| r.payload.len()).sum();
                        let held = held.min(bytes.num_permits());
                        drop(bytes.split(bytes.num_permits() - held));
                        let lease_deadline = claimed_at + c.lease;
                        let relay = Arc::clone(self);
                        let shutdown = shutdown.clone();
                        deliveries.spawn(async move {
                            relay
                                .deliver(claimed, lease_deadline, (permit, bytes), shutdown)
                                .await
                        });
                    }
                    if full {
                        continue;
                    }
                    if rows_claimed && c.wakeup == Wakeup::Poll {
                        // More is likely on its way: claim again after a moment, which lets
                        // the next claim gather several rows (each claim and settlement is
                        // a transaction in the application's database) for little latency.
                        idle.worked(Instant::now());
                        self.sleep_or_shutdown(idle::FAST, shutdown).await;
                        continue;
                    }
                    self.wait_for_work(&mut idle, shutdown).await;
                }
                Err(e) => {
                    db_failures += 1;
                    self.health.set_database_ok(false);
                    let replaced = crate::outbox::replacement(&e).is_some();
                    let delay = self.db_backoff(db_failures, replaced);
                    if replaced {
                        // The session logged what happened when it dropped the connection.
                        tracing::debug!(error = %e, retry_in = ?delay, "claim failed on a replaced connection");
                    } else if e.is_transient() {
                        tracing::warn!(error = %e, retry_in = ?delay, "claim failed; backing off");
                    } else {
                        tracing::error!(error = %e, retry_in = ?delay,
                            "claim failed and will keep failing until the database or its permissions are fixed; backing off");
                    }
                    self.sleep_or_shutdown(delay, shutdown).await;
                }
            }
        }
        tracing::info!(
            deliveries = deliveries.len(),
            "shutting down: no new claims; finishing in-flight sends"
        );
        let drain = async { while deliveries.join_next().await.is_some() {} };
        if tokio::time::timeout(c.drain_timeout, drain).await.is_err() {
            tracing::warn!(
                "drain timeout reached; unsettled rows stay leased until their lease expires, then another replica sends them"
            );
            deliveries.abort_all();
        }
    }

    /// Sends one claim's rows and settles every row exactly once.
    async fn deliver(
        self: Arc<Self>,
        claimed: Claimed,
        lease_deadline: Instant,
        _permits: (OwnedSemaphorePermit, OwnedSemaphorePermit),
        shutdown: CancellationToken,
    ) {
        let Claimed { mut rows, .. } = claimed;
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
    fn keeps_order(&self, queue_url: &str) -> bool {
        self.plan_config
            .ordering
            .is_some_and(|o| o.every_destination || batch::is_fifo(queue_url))
    }

    /// The message size limit of each ordered queue the rows go to, read from its
    /// `MaximumMessageSize` and read again every `--stats-interval` (an operator may raise it,
    /// then re-drive what it refused). A queue that cannot be read now is tried again with the
    /// next claim; meanwhile `--max-request-bytes` applies. Only ordered queues need it: there a
    /// refused entry after accepted entries of its group would break the group's order, while
    /// elsewhere SQS's own per-entry refusal quarantines the row just as well.
    async fn queue_limits(&self, rows: &[ClaimedRow]) -> HashMap<String, usize> {
        let mut unknown: Vec<String> = Vec::new();
        {
            let known = self.queue_limits.lock().expect("queue limits lock");
            for row in rows {
                let queue = self.plan_config.queue_for(row);
                // A topic has no MaximumMessageSize to read: SNS's fixed limit applies.
                if !self.keeps_order(queue) || batch::is_topic(queue) {
                    continue;
                }
                let fresh = known
                    .get(queue)
                    .is_some_and(|(_, read)| read.elapsed() < self.config.stats_interval);
                if !fresh && !unknown.iter().any(|q| q == queue) {
                    unknown.push(queue.to_string());
                }
            }
        }
        for queue in unknown {
            let read =
                tokio::time::timeout(self.config.send_timeout, self.sqs.queue_attributes(&queue))
                    .await;
            if let Ok(Ok(info)) = read {
                let limit = info
                    .maximum_message_size
                    .unwrap_or(self.config.max_request_bytes);
                let mut known = self.queue_limits.lock().expect("queue limits lock");
                // Rows may name any number of queues of their own; keep the memory bounded.
                if known.len() >= MAX_KNOWN_QUEUES {
                    known.clear();
                }
                known.insert(queue, (limit, Instant::now()));
            }
        }
        let known = self.queue_limits.lock().expect("queue limits lock");
        known
            .iter()
            .map(|(queue, (limit, _))| (queue.clone(), *limit))
            .collect()
    }

    /// One SendMessageBatch call, once a request slot is free and the relay is not backing off.
    async fn send(
        &self,
        request: BatchRequest,
        lease_deadline: Instant,
        shutdown: &CancellationToken,
    ) -> (BatchRequest, Result<Vec<EntryOutcome>, Unsent>) {
        let c = &self.config;
        // A queue that refused us lately is not asked again before its time: its rows wait in
        // the table, and need no request slot for that.
        if let Some(park) = self.destinations.parked(&request.queue_url, Instant::now()) {
            return (request, Err(Unsent::Parked(park)));
        }
        // The destination's own slot first: a request waiting for a slow queue must not hold one
        // of the permits every destination shares. The bucket's next, for the uploads.
        let slot = tokio::select! {
            slot = self.concurrency.acquire(&request.queue_url) => slot,
            _ = shutdown.cancelled() => return (request, Err(Unsent::NotSent("shutting down"))),
        };
        let bucket = self
            .s3
            .as_ref()
            .filter(|_| request.entries.iter().any(|e| e.offload.is_some()))
            .map(|s3| bucket_key(s3.bucket()));
        let upload_slot = match &bucket {
            Some(bucket) => tokio::select! {
                slot = self.concurrency.acquire(bucket) => Some(slot),
                _ = shutdown.cancelled() => return (request, Err(Unsent::NotSent("shutting down"))),
            },
            None => None,
        };
        let _permit = tokio::select! {
            permit = self.request_permits.acquire() => permit.expect("never closed"),
            _ = shutdown.cancelled() => return (request, Err(Unsent::NotSent("shutting down"))),
        };
        while let Some(pause) = self.pressure.remaining() {
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = shutdown.cancelled() => return (request, Err(Unsent::NotSent("shutting down"))),
            }
        }
        // Another request may have found the queue refusing while this one waited.
        if let Some(park) = self.destinations.parked(&request.queue_url, Instant::now()) {
            return (request, Err(Unsent::Parked(park)));
        }
        // Sending now could outlive the lease: another replica might take the rows over while
        // SQS's answer is still on its way. Give them back instead.
        if Instant::now() + c.send_timeout + c.settle_margin > lease_deadline {
            return (
                request,
                Err(Unsent::NotSent("lease too short for another send")),
            );
        }
        // The SDK enforces the send timeout; this guard only covers a stuck future.
        let hard_limit = c.send_timeout + Duration::from_secs(1);
        if let Some(upload_slot) = upload_slot {
            let started = Instant::now();
            let uploaded = self.offload(&request, lease_deadline).await;
            upload_slot.finish(upload_outcome(&uploaded, started.elapsed()));
            if let Err(failed) = uploaded {
                return (request, Err(Unsent::Offload(failed)));
            }
            if Instant::now() + c.send_timeout + c.settle_margin > lease_deadline {
                return (
                    request,
                    Err(Unsent::NotSent(
                        "lease too short for the send after the upload",
                    )),
                );
            }
        }
        let started = Instant::now();
        let sent = async {
            if batch::is_topic(&request.queue_url) {
                self.sns.publish(&request).await
            } else {
                self.sqs.send(&request).await
            }
        };
        let result = match tokio::time::timeout(hard_limit, sent).await {
            Ok(result) => result.map_err(Unsent::Failed),
            Err(_) => Err(Unsent::Failed(RequestFailure {
                status: None,
                code: None,
                message: format!(
                    "no answer within {}",
                    humantime::format_duration(hard_limit)
                ),
                transport: Transport::Timeout,
            })),
        };
        metrics::histogram!(names::SEND_DURATION).record(started.elapsed().as_secs_f64());
        slot.finish(send_outcome(&result, started.elapsed()));
        (request, result)
    }

    /// Stores the request's large bodies in S3 before their pointers are sent; if an upload
    /// fails, nothing is sent and the first failed entry decides (see
    /// [`Relay::offload_failed`]); a bucket that refused us lately is not asked again before its
    /// park ends. The uploads of a request go at once, each in its own round trip: their bodies
    /// are in memory already (the byte budget bounds them), and one after the other a request
    /// of ten would wait ten round trips. An object stored for a request that then fails stays,
    /// and a resend overwrites it (a replica that took the row over writes the same bytes under
    /// the same key). Each upload's deadline grows with its body, within what the lease leaves
    /// for the send after it (`s3::upload_deadline`): an upload that outlived the lease could
    /// never be followed by its send, and would be given back for ever. No upload starts unless
    /// every large body of the request has its time.
    async fn offload(
        &self,
        request: &BatchRequest,
        lease_deadline: Instant,
    ) -> Result<(), OffloadFailed> {
        let Some(s3) = &self.s3 else { return Ok(()) };
        let c = &self.config;
        let after = c.send_timeout + c.settle_margin;
        let lease_left = lease_deadline.saturating_duration_since(Instant::now() + after);
        let lease_window = c.lease.saturating_sub(after);
        let bucket = bucket_key(s3.bucket());
        if let Some(park) = self.destinations.parked(&bucket, Instant::now()) {
            return Err(OffloadFailed::Parked(park));
        }
        let mut deadlines = Vec::with_capacity(request.entries.len());
        for entry in &request.entries {
            let deadline = match &entry.offload {
                Some(offload) => {
                    let bytes = offload.body.len();
                    match crate::s3::upload_deadline(
                        bytes,
                        c.send_timeout,
                        lease_left,
                        lease_window,
                    ) {
                        Some(deadline) => Some(deadline),
                        None => return Err(OffloadFailed::NoTime),
                    }
                }
                None => None,
            };
            deadlines.push(deadline);
        }
        let uploads = request
            .entries
            .iter()
            .zip(deadlines)
            .enumerate()
            .filter_map(|(index, (entry, deadline))| {
                let offload = entry.offload.as_ref()?;
                let deadline = deadline?;
                // The SDK enforces the deadline; this guard only covers a stuck future.
                let limit = deadline + Duration::from_secs(1);
                Some(async move {
                    let result = match tokio::time::timeout(limit, s3.put(offload, deadline)).await
                    {
                        Ok(result) => result,
                        Err(_) => Err(RequestFailure {
                            status: None,
                            code: None,
                            message: format!(
                                "S3 PutObject: no answer within {}",
                                humantime::format_duration(limit)
                            ),
                            transport: Transport::Timeout,
                        }),
                    };
                    let result = result.map_err(|mut failure| {
                        if failure.transport == Transport::Timeout {
                            failure.message = format!(
                                "{} (a {}-byte body gets {}: --send-timeout and 1 s per MiB, within the lease)",
                                failure.message,
                                offload.body.len(),
                                humantime::format_duration(deadline)
                            );
                        }
                        failure
                    });
                    (index, result)
                })
            });
        let mut first_failed = None;
        for (index, result) in futures_util::future::join_all(uploads).await {
            match result {
                Ok(()) => {
                    self.destinations.reached(&bucket);
                }
                Err(failure) => {
                    let kind = retry::classify(&failure).metric_kind();
                    metrics::counter!(names::OFFLOAD_FAILURES, "kind" => kind).increment(1);
                    // join_all keeps the entries' order: the first failure is the first entry's.
                    if first_failed.is_none() {
                        first_failed = Some(OffloadFailed::Refused { index, failure });
                    }
                }
            }
        }
        first_failed.map_or(Ok(()), Err)
    }

    /// A request's uploads failed, so nothing of it was sent. The failure is S3's, counted in
    /// `outbox_offload_failures_total` only, and it holds only the entries it concerns: a bad
    /// body is quarantined alone (`rejected`); a bucket that refuses us (missing, denied) parks
    /// the large rows on the bucket's own back-off, and readiness fails, as for the relay's own
    /// queue; throttling, outages and credentials pause the relay and release the large rows.
    /// The other entries go on in a request of their own (returned), unless the destination
    /// keeps order: then they are given back unsent, so no group overtakes its held row.
    fn offload_failed(
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
    fn spend_attempt(&self, settlement: &mut Settlement, row: &ClaimedRow, error: String) {
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
    fn settle_entry(&self, settlement: &mut Settlement, row: &ClaimedRow, outcome: EntryOutcome) {
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
    fn request_failed(
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
    fn destination_refused(
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

    /// Writes a claim's outcomes, retrying while the lease still protects the rows. If the
    /// database stays away past the lease, the rows are simply claimed and sent again later,
    /// with the same event_id.
    async fn settle(&self, settlement: Settlement, lease_deadline: Instant) {
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

    /// With `--wakeup notify` keeps a LISTEN connection open, with `logical` the doorbell's
    /// replication connection; each (re)connection also wakes the loop once, since what
    /// committed while it was down rang no bell.
    async fn listen_for_wakeups(self: Arc<Self>, stop: CancellationToken) {
        if self.config.wakeup == Wakeup::Poll {
            return;
        }
        let mut failures = 0u32;
        loop {
            let connected = std::sync::atomic::AtomicBool::new(false);
            let wake = || self.wake.notify_one();
            let ready = || {
                tracing::debug!(wakeup = %self.config.wakeup, "wake-ups connected");
                connected.store(true, std::sync::atomic::Ordering::Relaxed);
                self.wake.notify_one();
            };
            let listening = async {
                match self.config.wakeup {
                    Wakeup::Logical => self.outbox.doorbell(wake, ready).await,
                    _ => self.outbox.listen(wake, ready).await,
                }
            };
            let result = tokio::select! {
                result = listening => result,
                _ = stop.cancelled() => return,
            };
            if let Err(e) = result {
                // A connection that worked and then dropped starts the backoff afresh.
                failures = if connected.load(std::sync::atomic::Ordering::Relaxed) {
                    1
                } else {
                    failures + 1
                };
                let delay = self.db_backoff(failures, false);
                tracing::warn!(error = %e, retry_in = ?delay, "wake-up connection lost; polling until it is back");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = stop.cancelled() => return,
                }
            }
        }
    }

    /// Refreshes the table gauges with one index-backed query every `--stats-interval`.
    async fn refresh_stats(self: Arc<Self>, stop: CancellationToken) {
        let mut tick = tokio::time::interval(self.config.stats_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.cancelled() => return,
            }
            // First, so that rows parked behind a head that comes back now are released in the
            // same pass.
            self.unpark_destinations().await;
            self.maintain_blocked_groups().await;
            match self.upkeep.stats().await {
                Ok(s) => {
                    self.health.set_database_ok(true);
                    metrics::gauge!(names::OLDEST_UNSENT_AGE).set(s.oldest_unsent_age_seconds);
                    metrics::gauge!(names::UNSENT_ROWS).set(s.unsent as f64);
                    metrics::gauge!(names::QUARANTINED_ROWS).set(s.quarantined as f64);
                    metrics::gauge!(names::BLOCKED_ROWS).set(s.blocked as f64);
                    metrics::gauge!(names::OLDEST_QUARANTINED_AGE)
                        .set(s.oldest_quarantined_age_seconds);
                    // With nothing unsent the floor stays: a row committing late below the
                    // last unsent id must still be found.
                    if s.claim_floor > 0 {
                        self.claim_floor.store(s.claim_floor, Ordering::Relaxed);
                    }
                }
                // A slow count is not a database that is down: readiness stays as claims find it.
                Err(e) if e.timed_out() => tracing::warn!(
                    error = %e,
                    "reading outbox statistics took longer than --maintenance-timeout; the gauges keep their last values"
                ),
                Err(e) => {
                    self.health.set_database_ok(false);
                    tracing::warn!(error = %e, "could not read outbox statistics");
                }
            }
        }
    }

    /// Deletes sent rows past `--retention`, in short batches, every `--retention-interval`.
    /// Every replica may run it: SKIP LOCKED keeps them from waiting on each other.
    async fn expire_sent(self: Arc<Self>, stop: CancellationToken) {
        let Retention::For(retention) = self.config.retention else {
            return;
        };
        let mut tick = tokio::time::interval(self.config.retention_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.cancelled() => return,
            }
            let mut deleted = 0u64;
            loop {
                match self.upkeep.delete_expired(retention, RETENTION_BATCH).await {
                    Ok(n) => {
                        deleted += n;
                        if n < RETENTION_BATCH as u64 || stop.is_cancelled() {
                            break;
                        }
                        // Leave room for claims and settlements between batches.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "retention pass failed; next pass retries");
                        break;
                    }
                }
            }
            if deleted > 0 {
                tracing::debug!(rows = deleted, "deleted sent rows past retention");
            }
        }
    }

    /// Rows parked for their destination whose time has come become unsent again, and the
    /// claim loop is woken to send them.
    async fn unpark_destinations(&self) {
        match self.upkeep.unpark_destinations().await {
            Ok(0) => {}
            Ok(rows) => {
                tracing::info!(rows, "rows parked for their queue are tried again");
                self.wake.notify_one();
            }
            Err(e) => tracing::warn!(error = %e, "could not unpark rows parked for their queue"),
        }
    }

    /// Ordered delivery with poison blocking: park rows behind quarantined heads (so claims
    /// stop walking them and operators see them) and release groups whose head was re-driven.
    /// Runs with the gauges; every replica may run it, the statements are idempotent.
    async fn maintain_blocked_groups(&self) {
        match self.upkeep.maintain_blocked_groups().await {
            Ok((parked, unparked)) => {
                if parked > 0 {
                    metrics::counter!(names::EVENTS_QUARANTINED, "reason" => "blocked")
                        .increment(parked);
                    tracing::warn!(
                        rows = parked,
                        "rows parked behind a quarantined event of their group"
                    );
                }
                if unparked > 0 {
                    tracing::info!(
                        rows = unparked,
                        "rows released: the quarantined event of their group was re-driven"
                    );
                }
            }
            Err(e) => tracing::warn!(error = %e, "could not maintain blocked groups"),
        }
    }

    /// Returns when a claim is worth trying: woken (settlement, NOTIFY, doorbell), or, when
    /// polling, once the probe finds a claimable row.
    ///
    /// With `notify` and `logical` the bell rings for new rows; the probe every
    /// `--poll-interval` finds what it cannot announce (retries falling due, leases expiring,
    /// rows committed while its connection was down).
    async fn wait_for_work(&self, idle: &mut idle::Schedule, shutdown: &CancellationToken) {
        loop {
            let wait = match self.config.wakeup {
                Wakeup::Poll => idle.next(Instant::now(), self.config.poll_interval),
                Wakeup::Notify | Wakeup::Logical => self.config.poll_interval,
            };
            tokio::select! {
                _ = self.wake.notified() => return,
                _ = tokio::time::sleep(wait) => {}
                _ = shutdown.cancelled() => return,
            }
            self.health.tick();
            let probe =
                self.session.run(
                    "looking for claimable rows",
                    |s| async move { s.probe().await },
                );
            match probe.await {
                Ok(false) => {}
                // Found work, or the database failed: the claim finds the rows, or meets the
                // failure and backs off.
                Ok(true) | Err(_) => return,
            }
        }
    }

    /// Waits `delay` or until shutdown, ticking health meanwhile: a loop that waits on purpose
    /// (a back-off up to `--retry-max` through a database outage) is alive, and `/healthz`
    /// must not get it restarted. Each tick comes from this task, so a loop that really stops
    /// still fails liveness.
    async fn sleep_or_shutdown(&self, delay: Duration, shutdown: &CancellationToken) {
        let until = tokio::time::Instant::now() + delay;
        loop {
            self.health.tick();
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(left.min(self.health.tick_every())) => {}
                _ = shutdown.cancelled() => return,
            }
        }
    }

    /// The wait before a database retry: capped by `--db-retry-max`, at once after the
    /// session replaced a dark or read-only connection.
    fn db_backoff(&self, failures: u32, replaced: bool) -> Duration {
        crate::outbox::reconnect_delay(
            failures,
            replaced,
            self.config.retry_base,
            self.config.db_retry_max,
            fastrand::f64(),
        )
    }

    fn backoff(&self, attempt: u32) -> Duration {
        retry::backoff(
            attempt,
            self.config.retry_base,
            self.config.retry_max,
            fastrand::f64(),
        )
    }
}

/// Why a request produced no per-entry answers.
enum Unsent {
    /// SQS (or the path to it) failed the whole request.
    Failed(RequestFailure),
    /// We chose not to send it (shutdown, or the lease would not outlast the call).
    NotSent(&'static str),
    /// Its queue refused us lately and is not asked again before the park ends.
    Parked(Park),
    /// A large body could not be stored in S3, so nothing was sent.
    Offload(OffloadFailed),
}

/// Why a request's large bodies are not all in S3.
enum OffloadFailed {
    /// The bucket refused us lately and is not asked again before its park ends.
    Parked(Park),
    /// What the lease has left is too short for an upload a fresh claim would have time for.
    NoTime,
    /// S3 refused the upload of the entry at `index`, the first of the request that failed.
    Refused {
        index: usize,
        failure: RequestFailure,
    },
}

fn quarantine(
    settlement: &mut Settlement,
    row: &ClaimedRow,
    reason: QuarantineReason,
    error: String,
) {
    if row.unreadable.is_some() {
        tracing::warn!(id = row.id, reason = reason.as_str(), error = %error, "unreadable row quarantined");
    } else {
        tracing::warn!(event_id = %row.event_id, id = row.id, reason = reason.as_str(), error = %error, "row quarantined");
    }
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
fn park_row(
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
fn release(settlement: &mut Settlement, row: &ClaimedRow, delay: Duration, error: Option<String>) {
    settlement.reschedule.push(RescheduledRow {
        id: row.id,
        lease_token: row.lease_token,
        delay,
        error,
        refund: true,
    });
}

/// The claim quarantined these rows itself (too large to hold, or out of attempts after
/// relays died holding them): nothing to send or settle, only to count and say.
fn record_quarantined_at_claim(claimed: &Claimed) {
    for row in &claimed.quarantined {
        metrics::counter!(names::EVENTS_QUARANTINED, "reason" => row.reason.as_str()).increment(1);
        tracing::warn!(event_id = row.event_id.as_deref().unwrap_or(""), id = row.id,
            reason = row.reason.as_str(), error = %row.error, "row quarantined at claim");
    }
}

/// What a send tells its destination's concurrency limit (the rule: `concurrency`).
fn send_outcome(result: &Result<Vec<EntryOutcome>, Unsent>, rtt: Duration) -> Outcome {
    match result {
        Ok(outcomes) => concurrency::answer_outcome(
            rtt,
            outcomes.iter().filter_map(|o| match o {
                EntryOutcome::Failed { code, .. } => Some(code.as_str()),
                EntryOutcome::Sent { .. } => None,
            }),
        ),
        Err(Unsent::Failed(failure)) => concurrency::failure_outcome(retry::classify(failure)),
        Err(_) => Outcome::Unmeasured,
    }
}

/// The same for a request's uploads to the offload bucket (S3 `SlowDown` is its throttling).
fn upload_outcome(result: &Result<(), OffloadFailed>, rtt: Duration) -> Outcome {
    match result {
        Ok(()) => Outcome::Answered(rtt),
        Err(OffloadFailed::Refused { failure, .. }) => {
            concurrency::failure_outcome(retry::classify(failure))
        }
        Err(OffloadFailed::Parked(_) | OffloadFailed::NoTime) => Outcome::Unmeasured,
    }
}

fn reap(deliveries: &mut JoinSet<()>) {
    while let Some(done) = deliveries.try_join_next() {
        if let Err(e) = done {
            if e.is_panic() {
                tracing::error!(error = %e, "a delivery task panicked; its rows are retried after their lease");
            }
        }
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Relay-wide back-off: after a whole-request failure every sender waits, so an outage or
/// throttling costs one failed request per back-off step instead of one per batch.
#[derive(Debug, Default)]
struct Pressure {
    state: Mutex<PressureState>,
}

#[derive(Debug, Default)]
struct PressureState {
    consecutive_failures: u32,
    paused_until: Option<Instant>,
}

impl Pressure {
    /// Records a failure; returns the pause it imposes (capped, full jitter).
    fn push(&self, config: &RunConfig) -> Duration {
        let mut s = self.state.lock().expect("pressure lock");
        s.consecutive_failures = s.consecutive_failures.saturating_add(1);
        let delay = retry::backoff(
            s.consecutive_failures,
            config.retry_base,
            config.retry_max,
            fastrand::f64(),
        );
        let until = Instant::now() + delay;
        s.paused_until = Some(s.paused_until.map_or(until, |u| u.max(until)));
        delay
    }

    /// A request went through: the path is healthy again.
    fn relieve(&self) {
        let mut s = self.state.lock().expect("pressure lock");
        s.consecutive_failures = 0;
        s.paused_until = None;
    }

    fn remaining(&self) -> Option<Duration> {
        let s = self.state.lock().expect("pressure lock");
        s.paused_until
            .and_then(|until| until.checked_duration_since(Instant::now()))
            .filter(|d| !d.is_zero())
    }
}
