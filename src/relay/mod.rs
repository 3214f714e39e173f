//! The loop: wait -> claim -> plan -> send -> decide -> apply -> settle -> record.
//!
//! - `mod.rs` (here): start-up ([`connect`]), [`run`], the claim loop and the drain at shutdown.
//! - `deliver`: one claim's rows: plan -> send -> decide -> apply (the one place where
//!   decisions reach the send gate, health, metrics and logs) -> settle.
//! - `send`: the send gate (destination parks, relay-wide pause, lease deadline), S3 uploads,
//!   the queue-limit cache.
//! - `decide`: pure: an outcome (answered, failed, refused, upload failed) -> the rows'
//!   settlement and the effects to apply (`effect`); `pressure` and `follow_ups` are the pure
//!   state they feed (the relay-wide pause, which request waits for which).
//! - `maintenance`: wake-ups, gauges and statistics, retention, unparking.
//! - `reads`: what the relay last read of a table, exported as times (`time() - x` in rules).
//! - `admission`: whether the relay may claim now (the schema's verdict, a recent renewal).
//! - `claim_size`, `gather`: pure: how many rows the next claim asks for, and when it runs.
//! - `given_up`: claims whose answer did not come back in time, released once they committed.
//! - `carry`: settlements handed to the next claim, which applies them in its own transaction.
//! - `many`: one relay serving several tables (the look, turns, tables in trouble); `board`:
//!   its table gauges, the worst tables' as series of their own.
//!
//! It sees neither driver: rows come from `outbox`, requests go through `sink`, and every rule
//! (batching, backoff, classification) is a pure function elsewhere. One task claims; each
//! claim is delivered by its own task, so the next claim runs while earlier batches are in
//! flight. Two semaphores bound the work: requests in flight, and rows being delivered (so
//! rows are not leased long before a request slot is free for them). Below the first, each
//! destination has its own adaptive limit (`concurrency`), fed with every send's outcome.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::batch::{self, PlanConfig};
use crate::concurrency::Limiter;
use crate::config::RunConfig;
use crate::destination::{Destination, Destinations};
use crate::metrics::{self as names, Health};
use crate::otel::Tracing;
use crate::outbox::{
    ClaimRequest, LiveSession, Maintenance, Outbox, OutboxError, Registration, Session, Wakeup,
};
use crate::poll;
use crate::row::{Claimed, Kept};

use crate::sink::Sinks;
use deliver::Undone;

mod admission;
pub(crate) mod board;
mod carry;
mod claim_size;
mod decide;
mod deliver;
mod effect;
mod follow_ups;
mod gather;
mod given_up;
mod maintenance;
pub mod many;
mod pressure;
pub mod reads;
mod send;

use pressure::Pressure;
use send::SizeLimit;

/// Why the relay could not start; after start-up every failure is retried instead.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error(transparent)]
    Startup(#[from] OutboxError),
}

/// Every log line of the relay carries this target, whichever of its files writes it.
const LOG_TARGET: &str = "outbox_relay::relay";

/// The relay's shared state, one per process.
struct Relay {
    /// The `run` command's settings, as validated at start-up.
    config: RunConfig,
    /// What the planner needs of them (destinations, routes, ordering, offload), kept whole so
    /// each claim does not rebuild it.
    plan_config: PlanConfig,
    /// The table: connections, the wake-up listeners, the maintenance statements.
    outbox: Arc<Outbox>,
    /// The connection claims and settlements share, replaced when it goes dark.
    session: LiveSession,
    /// Settlements' own connection, for those no claim carries ([`carry`]): a second backend,
    /// so that with the database's cores saturated by the application the relay's claims and
    /// settlements each get a share.
    settlements: LiveSession,
    /// Settlements waiting for the next claim, which applies them in its own transaction.
    carry: carry::Carry,
    /// Statistics and maintenance, on a connection of their own so they never delay claims
    /// and settlements.
    maintenance: Maintenance,
    /// What every table of the relay shares: the destinations' clients and back-offs, the
    /// request, row and byte budgets, health and tracing.
    shared: Shared,
    /// Rung by the NOTIFY trigger or the logical wake-up in those modes: rows committed, and
    /// more may follow (the claim gathers them, `gather`); a stored permit coalesces bursts.
    bell: Notify,
    /// Woken when rows are claimable now and waited long enough already: a settlement that
    /// unblocked the next rows of their groups (ordered delivery), rows unparked, wake-ups
    /// reconnected (what committed meanwhile rang no bell).
    wake: Notify,
    /// Whether the schema lets this relay claim, and when its registration was last renewed.
    admission: admission::Admission,
    /// This relay's registration as the next renewal writes it (its last claim, whether it
    /// claims): kept here, written to the database only by the renewal, never per claim.
    registration: Mutex<Registration>,
    /// When the gauges, retention and the registration last ran: a relay serving several
    /// tables runs them during a table's turns only, each at its own interval across turns.
    last_stats: Mutex<Option<Instant>>,
    /// When the next sweep below the floor is due (src/outbox/floors.rs); `None`: at the next
    /// statistics pass.
    next_sweep: Mutex<Option<Instant>>,
    last_retention: Mutex<Option<Instant>>,
    /// The claims whose rows are in delivery, and whether a claim was given up on since the
    /// last release of such claims ([`given_up`]).
    given_up: Arc<given_up::GivenUp>,
    /// Where this table's gauges go: straight to the series without a `table` label (one
    /// table), or to the board that publishes the worst tables' (several).
    gauges: Gauges,
}

/// Where a table's gauges and reads go.
pub(crate) enum Gauges {
    /// The one table of a single-table relay: the recorder's series without a `table` label,
    /// and its reads rendered beside them.
    Own(Arc<reads::Reads>),
    /// A table of several: the board, which shows the worst tables' with a `table` label.
    Board(Arc<board::Board>),
}

/// What every table of a relay shares: the destinations' clients and back-offs, the request,
/// row and byte budgets, health and tracing. One per process.
#[derive(Clone)]
pub(crate) struct Shared {
    /// The queues' and topics' clients, and the offload bucket's (`--offload-bucket`) when set.
    sinks: Sinks,
    /// What `/healthz` and `/readyz` report: liveness ticks, the database, configuration errors.
    health: Arc<Health>,
    /// OpenTelemetry, when an OTLP endpoint is configured: a span per event.
    tracing: Option<Arc<Tracing>>,
    /// Relay-wide back-off after whole-request failures (throttling, outage, credentials).
    pressure: Arc<Pressure>,
    /// Queues that refused us (missing, access denied): only their rows wait, each queue on its
    /// own back-off.
    destinations: Arc<Destinations>,
    /// Bounds SendMessageBatch calls in flight.
    request_permits: Arc<Semaphore>,
    /// Each destination's share of those, adapted to how it answers (taken before a permit).
    concurrency: Arc<Limiter>,
    /// Each topic's and ordered queue's `MaximumMessageSize`, learnt on first use.
    size_limits: Arc<Mutex<HashMap<Destination, SizeLimit>>>,
    /// Rows and payload bytes in delivery, bounded for the whole process (every table's
    /// claims take from the same budgets).
    row_permits: Arc<Semaphore>,
    byte_permits: Arc<Semaphore>,
}

impl Shared {
    pub(crate) async fn new(
        config: &RunConfig,
        health: Arc<Health>,
        tracing: Option<Arc<Tracing>>,
    ) -> Shared {
        let sinks = Sinks::new(config.endpoints(), config.send.send_timeout).await;
        let mut configured_queues = vec![config.destination.queue_url.clone()];
        for (_, url) in &config.order.routes {
            if !configured_queues.contains(url) {
                configured_queues.push(url.clone());
            }
        }
        // The bucket is the relay's own configuration too: while it refuses us, large rows wait
        // and the relay is not ready.
        if let Some(offload) = &config.offload.plan {
            configured_queues.push(offload.bucket.clone());
        }
        let concurrency = Limiter::new(
            config.claim.request_concurrency,
            config.claim.max_in_flight,
            configured_queues.clone(),
        );
        let c = config;
        // Rows in delivery, not claims, are bounded: enough to fill every request slot plus one
        // claim being prepared. Counting claims instead starved the request slots when claims
        // are small (a steady stream claims a few rows at a time): five claims of four rows
        // kept five requests in flight of 32.
        // A relay behind claims up to claim_size::CATCH_UP batches at once.
        let most = c.claim.batch_size * claim_size::CATCH_UP;
        let rows_in_delivery = (c.claim.max_in_flight * batch::MAX_ENTRIES).max(most) + most;
        // Payload bytes in delivery are bounded too, so memory is: rows of 1 MiB would
        // otherwise fill the row bound with hundreds of MiB (each byte is held about three
        // times: the row, the message body, the request).
        let byte_budget = c.send.max_bytes_in_flight.min(u32::MAX as usize);
        Shared {
            destinations: Arc::new(Destinations::new(
                configured_queues,
                config.retry.retry_base,
                config.retry.retry_max,
            )),
            sinks,
            health,
            tracing,
            pressure: Arc::new(Pressure::default()),
            request_permits: Arc::new(Semaphore::new(config.claim.max_in_flight)),
            concurrency: Arc::new(concurrency),
            size_limits: Arc::new(Mutex::new(HashMap::new())),
            row_permits: Arc::new(Semaphore::new(rows_in_delivery)),
            byte_permits: Arc::new(Semaphore::new(byte_budget)),
        }
    }
}

/// A relay that has reached its database and found its table, ready to [`run`].
pub struct Connected {
    /// The settings `run` goes on with.
    config: RunConfig,
    /// The table, found and checked.
    outbox: Arc<Outbox>,
    /// The connection opened to check it, kept as the first claim session.
    first: Session,
    /// The registration, and when its first renewal began and what it saw, where it could be
    /// made at once (not on a standby first in the URL, say: the renewals go on trying).
    registration: Registration,
    renewed: Option<(Instant, crate::outbox::Renewed)>,
}

/// `outbox` is built from `config` ([`Outbox::from_config`]) by the caller, which reads the
/// files its settings name once, at start-up.
pub async fn connect(config: RunConfig, outbox: Outbox) -> Result<Connected, RelayError> {
    let outbox = Arc::new(outbox);
    // As for every later connection (LiveSession::get): the handshake has its own bound, the
    // statements prepared after it one round-trip deadline more.
    let limit = config.database.connect_timeout + config.retry.db_timeout;
    let first = tokio::time::timeout(limit, outbox.connect())
        .await
        .map_err(|_| OutboxError::Unanswered {
            what: "setting up the first connection",
            after: limit,
        })??;
    outbox.connector().pooler_allows(config.claim.wakeup)?;
    // Later round trips each have --db-timeout (LiveSession); the start's have this bound
    // together, then the start is tried again on new connections. Without it a link gone dark
    // after the first connection was made held the relay at its start, silently, for as long
    // as TCP takes to give up (simulation seed 13374753696320402105).
    let start = async {
        let installed = outbox.installed_wakeup().await?;
        match (config.claim.wakeup, installed.judge(config.claim.wakeup)) {
            (_, Ok(())) => {}
            // Polling works with the trigger still there; it only costs the application.
            (Wakeup::Poll, Err(harm)) => tracing::warn!("{harm}"),
            (_, Err(fix)) => return Err(OutboxError::Wakeup(fix)),
        }
        if config.claim.wakeup == Wakeup::Logical {
            outbox.check_logical().await?;
        }
        // The contract was read with the first connection: a schema that no longer admits
        // this relay is refused here, at start, rather than after the relay reported ready.
        if let Some((verdict, _)) = outbox.verdict().filter(|(v, _)| !v.claims()) {
            return Err(OutboxError::Refused(outbox.refusal(verdict)));
        }
        // Registered before the first claim, so the fleet (and `migrate --contract`) sees
        // every relay that claims; a role that may not write the registry stops the start
        // here. A server that takes no writes (a standby first in the URL) or a failure worth
        // retrying does not: claims wait for the first renewal that succeeds (`admission`).
        let registration = Registration::starting(&config.claim.relay_id, config.claim.lease);
        let began = Instant::now();
        let renewed = match outbox.renew(&first, &registration).await {
            Ok(renewed) => Some((began, renewed)),
            Err(e) if e.is_transient() || crate::outbox::replacement(&e).is_some() => {
                tracing::debug!(error = %e, "first registration failed; claims wait for a renewal that succeeds");
                None
            }
            Err(e) => return Err(e),
        };
        Ok((registration, renewed))
    };
    let (registration, renewed) =
        within(config.retry.db_timeout, "starting the relay", start).await?;
    Ok(Connected {
        config,
        outbox,
        first,
        registration,
        renewed,
    })
}

/// `work` (statements on one connection, each under the server's `--db-timeout`) within a
/// bound of the relay's own: a connection gone dark would otherwise hold the start, or a
/// table's turn, until TCP gives up. Each statement has `--db-timeout`; the whole gets ten,
/// then fails as unanswered, which is retried like a connection lost.
async fn within<T>(
    db_timeout: std::time::Duration,
    what: &'static str,
    work: impl std::future::Future<Output = Result<T, OutboxError>>,
) -> Result<T, OutboxError> {
    let after = db_timeout * 10;
    tokio::time::timeout(after, work)
        .await
        .unwrap_or(Err(OutboxError::Unanswered { what, after }))
}

/// Relays until `shutdown` fires and in-flight work has drained. After start-up every failure
/// is retried with back-off and never ends the loop. With `tracing`, every delivery attempt of
/// an event is a span; flushing them is the caller's, once this returns.
pub async fn run(
    connected: Connected,
    health: Arc<Health>,
    reads: Arc<reads::Reads>,
    tracing: Option<Arc<Tracing>>,
    shutdown: CancellationToken,
) {
    let Connected {
        config,
        outbox,
        first,
        registration,
        renewed,
    } = connected;
    health.set_database_ok(true);
    health.tick();
    let shared = Shared::new(&config, health, tracing).await;
    let relay = Arc::new(Relay::new(
        config,
        Arc::clone(&outbox),
        Sessions {
            claims: LiveSession::new(Arc::clone(&outbox), first),
            settlements: LiveSession::lazy(Arc::clone(&outbox)),
        },
        &shared,
        registration,
        Gauges::Own(reads),
        None,
    ));
    let mut fleet = maintenance::RelaysShown::default();
    if let Some((began, renewed)) = &renewed {
        relay.admission.renewed(*began);
        let me = relay
            .registration
            .lock()
            .expect("registration lock")
            .clone();
        fleet = maintenance::show_registry(renewed, &me, fleet);
    }
    tracing::info!(
        relay_id = %relay.config.claim.relay_id,
        table = %relay.config.database.table,
        queue_url = %relay.config.destination.queue_url,
        wakeup = %relay.config.claim.wakeup,
        batch_size = relay.config.claim.batch_size,
        max_in_flight = relay.config.claim.max_in_flight,
        lease = %humantime::format_duration(relay.config.claim.lease),
        "relay started"
    );
    // The series exists from the start, 0, so that dashboards and the alert see the table
    // before anything goes wrong (with several tables only blocked ones get one).
    metrics::gauge!(names::TABLE_BLOCKED, "table" => relay.outbox.table().label()).set(0.0);
    let background = CancellationToken::new();
    let listener = tokio::spawn(Arc::clone(&relay).listen_for_wakeups(background.clone()));
    let stats = tokio::spawn(Arc::clone(&relay).refresh_stats(background.clone()));
    let retention = tokio::spawn(Arc::clone(&relay).expire_sent(background.clone()));
    let renewals = tokio::spawn(Arc::clone(&relay).keep_registered(fleet, background.clone()));
    relay.claim_loop(&shutdown, None).await;
    background.cancel();
    let _ = tokio::join!(listener, stats, retention, renewals);
    relay.deregister().await;
    tracing::info!("relay stopped");
}

/// A table's connections: its own (one table), or shared with the other tables'.
pub(crate) struct Sessions {
    pub(crate) claims: LiveSession,
    pub(crate) settlements: LiveSession,
}

impl Relay {
    fn new(
        config: RunConfig,
        outbox: Arc<Outbox>,
        sessions: Sessions,
        shared: &Shared,
        registration: Registration,
        gauges: Gauges,
        shared_maintenance: Option<&Maintenance>,
    ) -> Relay {
        let maintenance = match shared_maintenance {
            Some(maintenance) => maintenance.for_table(Arc::clone(&outbox)),
            None => Maintenance::new(Arc::clone(&outbox), config.maintenance.maintenance_timeout),
        };
        Relay {
            plan_config: config.plan(),
            session: sessions.claims,
            settlements: sessions.settlements,
            carry: carry::Carry::default(),
            maintenance,
            shared: shared.clone(),
            outbox,
            bell: Notify::new(),
            wake: Notify::new(),
            admission: admission::Admission::default(),
            registration: Mutex::new(registration),
            last_stats: Mutex::new(None),
            next_sweep: Mutex::new(None),
            last_retention: Mutex::new(None),
            given_up: Arc::default(),
            gauges,
            config,
        }
    }

    /// Claims until shutdown; with a `turn` (a relay serving several tables), until the
    /// table has nothing claimable, or its turn is over and another table waits, or a claim
    /// fails or may not run; what ended it is returned. In-flight deliveries are drained
    /// before it returns, either way.
    async fn claim_loop(
        self: &Arc<Self>,
        shutdown: &CancellationToken,
        turn: Option<&Turn>,
    ) -> TurnEnd {
        let mut end = TurnEnd::Shutdown;
        let c = &self.config;
        let mut limit = c.claim.batch_size;
        let row_permits = Arc::clone(&self.shared.row_permits);
        // A claim asks for at most the bytes that are free; it waits until a large message's
        // worth is free, or the whole budget if smaller (`Shared::new`).
        let byte_budget = c.send.max_bytes_in_flight.min(u32::MAX as usize) as u32;
        let byte_permits = Arc::clone(&self.shared.byte_permits);
        let claim_threshold = byte_budget.min(c.send.max_request_bytes as u32);
        let mut cursor: Option<String> = None;
        let mut deliveries = JoinSet::new();
        let mut db_failures = 0u32;
        let mut idle = poll::Schedule::new(Instant::now(), c.claim.max_delay);
        let mut gather = gather::Gather::new(c.claim.max_delay, c.claim.batch_size);
        // Cancelled when claims stop before shutdown (a schema that no longer admits this
        // relay): deliveries finish the requests in flight and give back the rows not sent yet,
        // as at shutdown. Each spell of claiming has its own.
        let mut sending = shutdown.child_token();
        // Why claims stopped, as logged once and reported by /readyz.
        let mut stopped: Option<String> = None;
        while !shutdown.is_cancelled() {
            self.shared.health.tick();
            reap(&mut deliveries);
            let gate = self.gate();
            if gate != admission::Gate::Claim {
                let why = self.why_not_claiming(&gate);
                if turn.is_some() {
                    end = TurnEnd::NotClaiming(why);
                    break;
                }
                if stopped.as_ref() != Some(&why) {
                    if stopped.is_none() {
                        sending.cancel();
                        sending = shutdown.child_token();
                    }
                    self.claims_stopped(&gate, &why, deliveries.len());
                    stopped = Some(why);
                }
                self.carry.idle();
                tokio::select! {
                    _ = self.admission.changed.notified() => {}
                    _ = self.sleep_or_shutdown(c.claim.poll_interval, shutdown) => {}
                }
                continue;
            }
            if stopped.take().is_some() {
                self.claims_resumed();
            }
            if let Some(pause) = self.shared.pressure.remaining(Instant::now()) {
                self.sleep_or_shutdown(pause.min(c.claim.poll_interval), shutdown)
                    .await;
                continue;
            }
            // A whole batch is reserved for the claim; what it does not fill goes back at once.
            let mut permit = tokio::select! {
                permit = Arc::clone(&row_permits).acquire_many_owned(limit as u32) => permit.expect("never closed"),
                _ = tokio::time::sleep(c.claim.poll_interval) => continue,
                _ = shutdown.cancelled() => break,
            };
            // The same for bytes: take what is free (at least a large message's worth), and
            // give back what the claim did not use.
            let mut bytes = tokio::select! {
                bytes = Arc::clone(&byte_permits).acquire_many_owned(claim_threshold) => bytes.expect("never closed"),
                _ = tokio::time::sleep(c.claim.poll_interval) => continue,
                _ = shutdown.cancelled() => break,
            };
            if let Ok(more) = Arc::clone(&byte_permits)
                .try_acquire_many_owned(byte_permits.available_permits() as u32)
            {
                bytes.merge(more);
            }
            if let Some(held) = self.given_up.due() {
                self.release_given_up(&held).await;
            }
            let claimed_at = Instant::now();
            let request = ClaimRequest {
                limit: limit as i64,
                owner: c.claim.relay_id.clone(),
                lease: c.claim.lease,
                budget_bytes: i64::from(bytes.num_permits() as u32),
                cursor: cursor.clone(),
                catching_up: limit > c.claim.batch_size,
            };
            let request = &request;
            // What deliveries finished since the last claim: this claim applies it first.
            let carried = self.carry.take(self.outbox.floors().server());
            let claim = async {
                let started = Instant::now();
                let (owner, settlements) = (&c.claim.relay_id, &carried.settlements());
                let leased = self
                    .session
                    .run("claiming rows", |s| async move {
                        s.lease_settling(request, owner, settlements).await
                    })
                    .await;
                metrics::histogram!(names::CLAIM_DURATION).record(started.elapsed().as_secs_f64());
                let (mut claimed, after, settled) = leased?;
                metrics::counter!(names::SETTLEMENTS, "written" => "with_claim")
                    .increment(settled.len() as u64);
                carried.settled(settled);
                // Under a deadline of its own: the claim committed, and a connection lost now
                // must not cost its leased rows.
                if !after.is_empty() {
                    match self
                        .session
                        .run("after a claim", |s| async move {
                            Ok(s.after_claim(after).await)
                        })
                        .await
                    {
                        Ok(done) => done.apply_to(&mut claimed),
                        Err(e) => {
                            tracing::warn!(error = %e, "the claim's refusals and takeovers did not finish; the next claim does them")
                        }
                    }
                }
                Ok::<_, crate::outbox::OutboxError>(claimed)
            };
            match claim.await {
                Ok(mut claimed) => {
                    db_failures = 0;
                    self.registration
                        .lock()
                        .expect("registration lock")
                        .last_claim = Some(std::time::SystemTime::now());
                    self.shared.health.set_database_ok(true);
                    cursor = claimed.cursor.take();
                    record_quarantined_at_claim(&claimed);
                    match std::mem::take(&mut claimed.kept) {
                        Kept::Nothing => {}
                        Kept::Rows(ids) => {
                            let looking =
                                "looking for refused rows the quarantine left unquarantined";
                            self.confirm_changed(&ids, looking, Undone::NotQuarantined)
                                .await
                        }
                        Kept::ByRule(error) => {
                            self.settlements_undone(Undone::Refused(error)).await
                        }
                    }
                    gather.claimed(claimed_at, claimed.len());
                    // Rows a takeover freed after the claim are claimable now, like the rest
                    // of a full claim's backlog.
                    let full = claimed.len() == limit || claimed.freed > 0;
                    // Settlements ride in claims only while the relay keeps up. Behind (full
                    // claims back to back), they stay on their own connection: a second
                    // backend, so that on a database the application saturates the relay's
                    // claims and settlements each get a share of its cores (docs/benchmarks.md,
                    // "Keeping up").
                    match full {
                        true => self.carry.idle(),
                        false => self.carry.claiming(),
                    }
                    limit = claim_size::next(c.claim.batch_size, limit, claimed.len());
                    let rows_claimed = !claimed.is_empty();
                    if rows_claimed {
                        drop(permit.split(permit.num_permits() - claimed.len()));
                        // The first row is claimed whatever its size; it may hold more than was
                        // free, never more than the whole budget (which would wait for ever).
                        let held: usize = claimed.rows.iter().map(|r| r.payload.len()).sum();
                        let held = held.min(bytes.num_permits());
                        drop(bytes.split(bytes.num_permits() - held));
                        let lease_deadline = claimed_at + c.claim.lease;
                        let relay = Arc::clone(self);
                        let shutdown = sending.clone();
                        let held = self
                            .given_up
                            .hold(claimed.rows.iter().map(|r| r.lease_token));
                        deliveries.spawn(async move {
                            relay
                                .deliver(claimed, lease_deadline, (permit, bytes), shutdown)
                                .await;
                            drop(held);
                        });
                    }
                    if let Some(turn) = turn {
                        if turn.over(Instant::now()) {
                            end = TurnEnd::Yielded;
                            break;
                        }
                        if !full {
                            reap(&mut deliveries);
                            if deliveries.is_empty() {
                                end = TurnEnd::Drained;
                                break;
                            }
                            // Settlements in flight may make more rows claimable (the next
                            // rows of their groups, under ordered delivery): the turn claims
                            // again when one is done, rather than ending and waiting for the
                            // next look.
                            self.carry.idle();
                            tokio::select! {
                                done = deliveries.join_next() => {
                                    if let Some(Err(e)) = done {
                                        if e.is_panic() {
                                            tracing::error!(error = %e, "a delivery task panicked; its rows are retried after their lease");
                                        }
                                    }
                                }
                                _ = self.wake.notified() => {}
                                _ = shutdown.cancelled() => {}
                            }
                            continue;
                        }
                    }
                    if full {
                        continue;
                    }
                    if rows_claimed {
                        idle.worked(Instant::now());
                        if c.claim.wakeup == Wakeup::Poll {
                            // More is likely on its way: the next claim gathers what the
                            // stream writes within the latency budget (`gather`).
                            let wait = gather.wait(claimed_at, Instant::now());
                            self.gather_or_wake(wait, shutdown).await;
                            continue;
                        }
                    }
                    self.carry.idle();
                    if let Woken::Bell(rang) =
                        self.wait_for_work(&mut idle, claimed_at, shutdown).await
                    {
                        let wait = gather.wait(rang, Instant::now());
                        self.gather_or_wake(wait, shutdown).await;
                    }
                }
                Err(e) if e.rewritten_by_rule() => {
                    // A claim that quarantines rows updates them: a rule made while the relay
                    // runs refuses that as it refuses settlements. Claims stop at the gate.
                    self.refused_by_rule(&e).await;
                }
                Err(e) if turn.is_some() => {
                    if e.outcome_unknown() {
                        self.given_up.claim_given_up();
                    }
                    // The scheduler backs this table off; the other tables go on.
                    end = TurnEnd::Failed(e);
                    break;
                }
                Err(e) => {
                    // A claim that may have committed unseen is released before the next
                    // claim. Not one that failed otherwise: a claim whose rows cannot be read
                    // must keep counting attempts until they are quarantined.
                    if e.outcome_unknown() {
                        self.given_up.claim_given_up();
                    }
                    db_failures += 1;
                    self.shared.health.set_database_ok(false);
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
                    self.carry.idle();
                    self.sleep_or_shutdown(delay, shutdown).await;
                }
            }
        }
        // Deliveries still running settle on their own from now on.
        self.carry.idle();
        if turn.is_none() || shutdown.is_cancelled() {
            tracing::info!(
                deliveries = deliveries.len(),
                "shutting down: no new claims; finishing in-flight sends"
            );
        }
        let drain = async { while deliveries.join_next().await.is_some() {} };
        if tokio::time::timeout(c.send.drain_timeout, drain)
            .await
            .is_err()
        {
            tracing::warn!(
                "drain timeout reached; unsettled rows stay leased until their lease expires, then another replica sends them"
            );
            deliveries.abort_all();
        }
        end
    }

    /// One turn of a table served with others: claims until the turn ends, and beside them
    /// the maintenance that is due (the gauges, retention, the registration, each at its own
    /// interval across turns; unparking at once when the look found parked rows due).
    pub(crate) async fn turn(
        self: &Arc<Self>,
        turn: Turn,
        look: Option<crate::outbox::Look>,
        shutdown: &CancellationToken,
    ) -> TurnEnd {
        // Claims first: the maintenance that is due runs beside them (below), on the maintenance
        // connection every table shares, where another table's statistics or retention may be
        // running. Only a registration too old to claim on is renewed before.
        if self.gate() != admission::Gate::Claim {
            if let (_, Err(e)) = self.renew(maintenance::RelaysShown::default()).await {
                return TurnEnd::Failed(e);
            }
            // Rows hidden by row-level security: the statistics pass looks again, and lets
            // the turn claim if that passed.
            if self.admission.blocked().is_some() && !self.admission.blocked_for_good() {
                self.stats_pass().await;
            }
        }
        if look.is_some_and(|l| l.parked_due) {
            // The statistics pass unparks (after its read): run it now.
            *self.last_stats.lock().expect("stats lock") = None;
        }
        let background = CancellationToken::new();
        let stats = tokio::spawn(Arc::clone(self).refresh_stats(background.clone()));
        let retention = tokio::spawn(Arc::clone(self).expire_sent(background.clone()));
        let renewals = tokio::spawn(
            Arc::clone(self)
                .keep_registered(maintenance::RelaysShown::default(), background.clone()),
        );
        let end = self.claim_loop(shutdown, Some(&turn)).await;
        background.cancel();
        let _ = tokio::join!(stats, retention, renewals);
        end
    }

    /// Removes this relay's claims that it gave up on (all but `held`, the ones in delivery)
    /// so that their rows are free now, not after their lease, and their attempt is not
    /// counted; tried again before the next claim if it fails.
    async fn release_given_up(&self, held: &[i64]) {
        match self
            .maintenance
            .release_orphans(
                &self.config.claim.relay_id,
                held,
                self.config.retry.db_timeout,
            )
            .await
        {
            Ok(released) => {
                self.given_up.released();
                if released > 0 {
                    tracing::info!(
                        claims = released,
                        "released the claims given up on that had committed: their rows are free again, their attempt not counted"
                    );
                }
            }
            Err(e) => tracing::debug!(error = %e, "could not release the claims given up on yet"),
        }
    }

    /// Whether the relay may claim now ([`admission::gate`]).
    fn gate(&self) -> admission::Gate {
        admission::gate(
            self.admission.blocked(),
            self.outbox.verdict().map(|(v, _)| v),
            self.admission.last_renewal(),
            Instant::now(),
            crate::version::claims_allowed_for(self.config.claim.lease),
        )
    }

    /// Whether the look's finding needs a turn of this table now.
    pub(crate) fn needs_turn(&self, look: &crate::outbox::Look) -> bool {
        look.claimable || look.parked_due || (look.expired && self.retention_due())
    }
}

/// A table's turn, for a relay serving several tables.
pub(crate) struct Turn {
    /// From then on the turn gives way as soon as another table waits.
    pub(crate) until: Instant,
    /// How many tables wait for a turn now.
    pub(crate) waiting: Arc<std::sync::atomic::AtomicUsize>,
}

impl Turn {
    fn over(&self, now: Instant) -> bool {
        now >= self.until && self.waiting.load(Ordering::Relaxed) > 0
    }
}

/// What ended a table's turn.
#[derive(Debug)]
pub(crate) enum TurnEnd {
    /// A claim found less than a full batch: nothing more is claimable now.
    Drained,
    /// The turn's time was up and another table waited; more may be claimable.
    Yielded,
    /// A claim (or the registration) failed: the table is backed off.
    Failed(OutboxError),
    /// The schema does not admit this relay, or its registration is not current.
    NotClaiming(String),
    /// The relay is shutting down.
    Shutdown,
}

impl Relay {
    /// Waits `delay` or until shutdown, ticking health meanwhile: a loop that waits on purpose
    /// (a back-off up to `--retry-max` through a database outage) is alive, and `/healthz`
    /// must not get it restarted. Each tick comes from this task, so a loop that really stops
    /// still fails liveness.
    async fn sleep_or_shutdown(&self, delay: Duration, shutdown: &CancellationToken) {
        let until = tokio::time::Instant::now() + delay;
        loop {
            self.shared.health.tick();
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(left.min(self.shared.health.tick_every())) => {}
                _ = shutdown.cancelled() => return,
            }
        }
    }

    /// Waits `delay` for a stream's rows to gather, or until rows are claimable that waited
    /// long enough already (`wake`), or shutdown.
    async fn gather_or_wake(&self, delay: Duration, shutdown: &CancellationToken) {
        if delay.is_zero() {
            return;
        }
        tokio::select! {
            _ = self.sleep_or_shutdown(delay, shutdown) => {}
            _ = self.wake.notified() => {}
        }
    }

    /// The wait before a database retry: capped by `--db-retry-max`, at once after the
    /// session replaced a dark or read-only connection.
    fn db_backoff(&self, failures: u32, replaced: bool) -> Duration {
        crate::outbox::reconnect_delay(
            failures,
            replaced,
            self.config.retry.retry_base,
            self.config.retry.db_retry_max,
            fastrand::f64(),
        )
    }
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

/// What ended a wait for work.
enum Woken {
    /// A wake-up rang: rows committed at this moment at the earliest; more may follow.
    Bell(Instant),
    /// Claim now: a look found rows, rows were unblocked, the database failed, or shutdown.
    Now,
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
