//! Background work beside the claim loop: wake-ups, gauges and statistics, retention, unparking.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio_util::sync::CancellationToken;

use crate::config::{Retention, RETENTION_BATCH};
use crate::metrics as names;
use crate::outbox::Wakeup;
use crate::outbox::{BlockedGroups, Renewed};
use crate::poll;
use crate::version;

use super::admission::Gate;
use super::deliver::Undone;
use super::reads::Read;
use super::{Gauges, Relay, Woken, LOG_TARGET};

impl Relay {
    /// With `--wakeup notify` keeps a LISTEN connection open, with `logical` the
    /// replication connection; each (re)connection also wakes the loop once, since what
    /// committed while it was down rang no bell.
    pub(super) async fn listen_for_wakeups(self: Arc<Self>, stop: CancellationToken) {
        if self.config.claim.wakeup == Wakeup::Poll {
            return;
        }
        let mut failures = 0u32;
        loop {
            let connected = std::sync::atomic::AtomicBool::new(false);
            let wake = || self.bell.notify_one();
            let ready = || {
                tracing::debug!(target: LOG_TARGET, wakeup = %self.config.claim.wakeup, "wake-ups connected");
                connected.store(true, std::sync::atomic::Ordering::Relaxed);
                self.wake.notify_one();
            };
            let listening = async {
                match self.config.claim.wakeup {
                    Wakeup::Logical => self.outbox.logical_wakeup(wake, ready).await,
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
                tracing::warn!(target: LOG_TARGET, error = %e, retry_in = ?delay, "wake-up connection lost; polling until it is back");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = stop.cancelled() => return,
                }
            }
        }
    }

    /// Refreshes the table gauges with one index-backed query every `--stats-interval`
    /// (counted from the last refresh, which for a table served in turns may be a turn ago).
    pub(super) async fn refresh_stats(self: Arc<Self>, stop: CancellationToken) {
        let every = self.config.maintenance.stats_interval;
        loop {
            let wait = due_in(*self.last_stats.lock().expect("stats lock"), every);
            // A pass due now runs even if the turn that started this task ended meanwhile.
            tokio::select! {
                biased;
                _ = tokio::time::sleep(wait) => {}
                _ = stop.cancelled() => return,
            }
            self.stats_pass().await;
        }
    }

    /// One refresh: the gauges first, then unparking.
    pub(super) async fn stats_pass(&self) {
        *self.last_stats.lock().expect("stats lock") = Some(Instant::now());
        // Row-level security turned on since the relay connected: its counts would leave out
        // the rows the policies hide (an age of 0 while they wait), and its settlements might
        // not apply. Nothing more is read or claimed until it passes. A failed look is left
        // to the statements below, which fail the same way and say so.
        match self.maintenance.row_security().await {
            Ok(Some(refusal)) => {
                self.rows_hidden(Some(refusal.to_string()));
                self.read(None);
                return;
            }
            Ok(None) => self.rows_hidden(None),
            Err(_) => {}
        }
        self.sweep_if_due().await;
        let began = SystemTime::now();
        let stats = self.maintenance.stats().await;
        self.read(
            stats
                .as_ref()
                .ok()
                .map(|s| Read::new(began, s.oldest_unsent_age_seconds)),
        );
        // After the read: rows parked for a queue that is still missing are unparked here and
        // parked again by the claim that follows within milliseconds, so a read just after the
        // unparking is the one moment their quarantine looks empty, and every --retry-max it
        // reset OutboxQuarantineNotEmpty's `for:` (it never fired for a destination park).
        // Destinations first, so that rows parked behind a head that comes back now are
        // released in the same pass.
        self.unpark_destinations().await;
        self.maintain_blocked_groups().await;
        match stats {
            Ok(s) => {
                self.shared.health.set_database_ok(true);
                match &self.gauges {
                    Gauges::Board(board) => board.stats(&self.outbox.table().label(), &s),
                    Gauges::Own(_) => {
                        metrics::gauge!(names::OLDEST_UNSENT_AGE).set(s.oldest_unsent_age_seconds);
                        metrics::gauge!(names::UNSENT_ROWS).set(s.unsent as f64);
                        metrics::gauge!(names::QUARANTINED_ROWS).set(s.quarantined as f64);
                        metrics::gauge!(names::BLOCKED_ROWS).set(s.blocked as f64);
                        metrics::gauge!(names::OLDEST_QUARANTINED_AGE)
                            .set(s.oldest_quarantined_age_seconds);
                        metrics::gauge!(names::WATERMARK_AGE).set(s.oldest_held_back_age_seconds);
                        metrics::gauge!(names::WATERMARK_HELD_ROWS).set(s.held_back as f64);
                    }
                }
            }
            // A slow count is not a database that is down: readiness stays as claims find it.
            Err(e) if e.timed_out() => tracing::warn!(target: LOG_TARGET,
                table = %self.outbox.table(),
                error = %e,
                "reading outbox statistics took longer than --maintenance-timeout; the gauges keep their last values"
            ),
            Err(e) => {
                self.shared.health.set_database_ok(false);
                tracing::warn!(target: LOG_TARGET, table = %self.outbox.table(), error = %e, "could not read outbox statistics");
            }
        }
    }

    /// A read of the table's oldest unsent row (`None`: it failed, or row-level security hid
    /// rows from it), for the times behind the gauges ([`reads`](super::reads)).
    pub(super) fn read(&self, read: Option<Read>) {
        match (&self.gauges, read) {
            (Gauges::Own(reads), Some(read)) => reads.read(read),
            (Gauges::Own(reads), None) => reads.failed(),
            (Gauges::Board(board), read) => board.read(&self.outbox.table().label(), read),
        }
    }

    /// Row-level security hides rows from the relay's role (`Some(why)`), or no longer does:
    /// claims stop and resume with it, the table's `outbox_table_blocked` says so, and the
    /// change is logged once.
    fn rows_hidden(&self, why: Option<String>) {
        if !self.admission.hidden(why.clone()) {
            return;
        }
        let table = self.outbox.table().label();
        match why {
            Some(why) => {
                metrics::gauge!(names::TABLE_BLOCKED, "table" => table).set(1.0);
                let why = format!("{why}; claims on it stopped, and its gauges keep their last values, until the role can see and settle every row");
                // Not ready from the line on, not from the claim loop's next turn; a relay
                // serving several tables skips this one and stays ready for the others.
                if matches!(self.gauges, Gauges::Own(_)) {
                    self.shared.health.set_not_claiming(Some(why.clone()));
                }
                tracing::error!(target: LOG_TARGET, "{why}");
            }
            None => {
                if !self.admission.blocked_for_good() {
                    metrics::gauge!(names::TABLE_BLOCKED, "table" => table).set(0.0);
                }
                tracing::info!(target: LOG_TARGET, table = %self.outbox.table(),
                    "row-level security no longer hides rows from the relay's role: claiming again");
            }
        }
    }

    /// The floors' safety net (src/outbox/floors.rs): every `--sweep-interval`, or less often
    /// when a sweep takes long (a held vacuum horizon keeps what it reads), so that sweeping
    /// takes at most 1 % of the time ([`sweep_gap`]). A failed sweep is tried at the next pass.
    pub(super) async fn sweep_if_due(&self) {
        if !self.sweep_due() {
            return;
        }
        let started = Instant::now();
        match self.maintenance.sweep().await {
            Ok(swept) => {
                if let Some(id) = swept.found {
                    tracing::debug!(target: LOG_TARGET, table = %self.outbox.table(), id, "a row committed below the claims' floor; claims start from it again");
                }
                // The server's time, not the round trip's: on a slow link the round trip is
                // the network's, and a hundred of it would hold late rows back for minutes.
                let gap = sweep_gap(self.config.maintenance.sweep_interval, swept.took);
                *self.next_sweep.lock().expect("sweep lock") = Some(started + gap);
            }
            Err(e) => {
                tracing::warn!(target: LOG_TARGET, table = %self.outbox.table(), error = %e, "could not look below the claims' floor; trying again at the next statistics pass")
            }
        }
    }

    /// Whether the next sweep is due now.
    pub(super) fn sweep_due(&self) -> bool {
        self.next_sweep
            .lock()
            .expect("sweep lock")
            .is_none_or(|at| Instant::now() >= at)
    }

    /// Renews the relay's registration and reads the contract every few seconds
    /// ([`version::check_every`]); the claim loop stops claiming on what it reads (`admission`),
    /// and the `outbox_relays` gauge shows the fleet it saw.
    /// `shown`: the `outbox_relays` series set at start-up. The renewal runs on the claims'
    /// connection (`Outbox::renew`): a server that takes no writes is left for the next host
    /// as for a claim. After a failure, or before the first success, it tries again sooner.
    pub(super) async fn keep_registered(
        self: Arc<Self>,
        shown: RelaysShown,
        stop: CancellationToken,
    ) {
        let every = version::check_every(self.config.claim.lease);
        let mut shown = shown;
        let mut failing = self.admission.last_renewal().is_none();
        loop {
            let wait = match failing {
                true => every.min(self.config.retry.retry_base),
                false => due_in(self.admission.last_renewal(), every),
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.cancelled() => return,
            }
            let (now_shown, renewed) = self.renew(shown).await;
            shown = now_shown;
            match renewed {
                Ok(()) => {
                    if std::mem::take(&mut failing) {
                        tracing::debug!(target: LOG_TARGET, "registration renewed");
                    }
                }
                Err(e) => {
                    if !std::mem::replace(&mut failing, true) {
                        tracing::warn!(target: LOG_TARGET, table = %self.outbox.table(), error = %e,
                            "could not renew the relay's registration; claims stop if it keeps failing for half a lease");
                    }
                }
            }
        }
    }

    /// One renewal: the registration written, the contract read (`admission`), the fleet shown
    /// (one table: `outbox_relays`; several: the gauge would mix tables, so not).
    pub(super) async fn renew(
        &self,
        shown: RelaysShown,
    ) -> (RelaysShown, Result<(), crate::outbox::OutboxError>) {
        let me = self.registration.lock().expect("registration lock").clone();
        let began = Instant::now();
        let outbox = Arc::clone(&self.outbox);
        let renewal = self.session.run("renewing the relay's registration", |s| {
            let me = me.clone();
            async move { outbox.renew(&s, &me).await }
        });
        match renewal.await {
            Ok(renewed) => {
                self.admission.renewed(began);
                let shown = match self.gauges {
                    Gauges::Own(_) => show_registry(&renewed, &me, shown),
                    Gauges::Board(_) => shown,
                };
                (shown, Ok(()))
            }
            Err(e) => {
                if e.rewritten_by_rule() {
                    // A rule made while the relay's connection was being replaced (a lock
                    // queue behind the CREATE RULE timed its statements out): the new
                    // connection cannot prepare the settlements, and claims wait for a renewal
                    // that never comes, so no settlement would ever meet the rule and name it.
                    self.refused_by_rule(&e).await;
                }
                self.admission.changed.notify_waiters();
                (shown, Err(e))
            }
        }
    }

    /// Removes the registration of a relay that stopped (best effort: otherwise it lapses
    /// after its lease).
    pub(super) async fn deregister(&self) {
        let id = self.config.claim.relay_id.clone();
        let outbox = Arc::clone(&self.outbox);
        let gone = self
            .session
            .run("removing the relay's registration", |s| async move {
                outbox.deregister(&s, &id).await
            })
            .await;
        if let Err(e) = gone {
            tracing::debug!(target: LOG_TARGET, error = %e, "could not remove the registration; it lapses after its lease");
        }
    }

    /// The one line that says why the relay does not claim (logs, `/readyz`).
    pub(super) fn why_not_claiming(&self, gate: &Gate) -> String {
        match gate {
            Gate::Claim => String::new(),
            Gate::Blocked(why) => why.clone(),
            Gate::Refused(verdict) => self.outbox.refusal(verdict.clone()).to_string(),
            Gate::Unrenewed(_) if self.admission.last_renewal().is_none() => {
                "the relay is not registered yet (its first registration has not succeeded): claims wait for it".to_string()
            }
            Gate::Unrenewed(_) => format!(
                "the relay's registration was not renewed for half its lease ({}): claims wait until the database answers",
                humantime::format_duration(version::claims_allowed_for(self.config.claim.lease))
            ),
        }
    }

    /// Claims stopped (or stopped for another reason): say why once, report not ready, and
    /// register as not claiming at the next renewal.
    pub(super) fn claims_stopped(&self, gate: &Gate, why: &str, in_flight: usize) {
        self.registration
            .lock()
            .expect("registration lock")
            .claiming = false;
        self.shared.health.set_not_claiming(Some(why.to_string()));
        match gate {
            Gate::Refused(_) => {
                tracing::error!(target: LOG_TARGET, deliveries = in_flight, "{why}")
            }
            // Said once, with its cause, where it was found (`Relay::settlements_undone`).
            Gate::Blocked(_) => {}
            _ => tracing::warn!(target: LOG_TARGET, deliveries = in_flight, "{why}"),
        }
    }

    pub(super) fn claims_resumed(&self) {
        self.registration
            .lock()
            .expect("registration lock")
            .claiming = true;
        self.shared.health.set_not_claiming(None);
        tracing::info!(target: LOG_TARGET, version = %version::this_relay(), "claiming again: nothing stops this relay's claims any more");
    }

    /// Deletes sent rows past `--retention`, in short batches, every `--retention-interval`.
    /// Every replica may run it: SKIP LOCKED keeps them from waiting on each other.
    pub(super) async fn expire_sent(self: Arc<Self>, stop: CancellationToken) {
        if !matches!(self.config.maintenance.retention, Retention::For(_)) {
            return;
        }
        loop {
            let wait = due_in(
                *self.last_retention.lock().expect("retention lock"),
                self.config.maintenance.retention_interval,
            );
            tokio::select! {
                biased;
                _ = tokio::time::sleep(wait) => {}
                _ = stop.cancelled() => return,
            }
            self.retention_pass(&stop).await;
        }
    }

    /// Whether a retention pass is due (never without retention).
    pub(super) fn retention_due(&self) -> bool {
        matches!(self.config.maintenance.retention, Retention::For(_))
            && due_in(
                *self.last_retention.lock().expect("retention lock"),
                self.config.maintenance.retention_interval,
            )
            .is_zero()
    }

    /// One pass: batches until fewer than a batch are past retention, or `stop`.
    pub(super) async fn retention_pass(&self, stop: &CancellationToken) {
        let Retention::For(retention) = self.config.maintenance.retention else {
            return;
        };
        *self.last_retention.lock().expect("retention lock") = Some(Instant::now());
        let mut deleted = 0u64;
        // Each batch starts where the one before got to (src/outbox/floors.rs).
        let mut from = self.outbox.floors().retention_start();
        loop {
            match self
                .maintenance
                .delete_expired(retention, RETENTION_BATCH, from)
                .await
            {
                Ok((n, newest)) => {
                    deleted += n;
                    from = newest.or(from);
                    if n < RETENTION_BATCH as u64 || stop.is_cancelled() {
                        break;
                    }
                    // Leave room for claims and settlements between batches.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err(e) => {
                    tracing::warn!(target: LOG_TARGET, table = %self.outbox.table(), error = %e, "retention pass failed; next pass retries");
                    break;
                }
            }
        }
        if deleted > 0 {
            tracing::debug!(target: LOG_TARGET, table = %self.outbox.table(), rows = deleted, "deleted sent rows past retention");
        }
    }

    /// Rows parked for their destination whose time has come become unsent again, and the
    /// claim loop is woken to send them.
    pub(super) async fn unpark_destinations(&self) {
        match self.maintenance.unpark_destinations().await {
            Ok(0) => {}
            Ok(rows) => {
                tracing::info!(target: LOG_TARGET, rows, "rows parked for their queue are tried again");
                self.wake.notify_one();
            }
            Err(e) if e.rewritten_by_rule() => self.refused_by_rule(&e).await,
            Err(e) => {
                tracing::warn!(target: LOG_TARGET, error = %e, "could not unpark rows parked for their queue")
            }
        }
    }

    /// Ordered delivery with poison blocking: park rows behind quarantined heads (so claims
    /// stop walking them and operators see them) and release groups whose head was re-driven.
    /// Runs with the gauges; every replica may run it, the statements are idempotent.
    pub(super) async fn maintain_blocked_groups(&self) {
        match self.maintenance.maintain_blocked_groups().await {
            Ok(BlockedGroups {
                parked,
                unparked,
                not_parked,
            }) => {
                if !not_parked.is_empty() {
                    let looking = "looking for rows the parking left unparked";
                    self.confirm_changed(&not_parked, looking, Undone::NotParked)
                        .await;
                }
                if parked > 0 {
                    metrics::counter!(names::EVENTS_QUARANTINED, "reason" => "blocked")
                        .increment(parked);
                    tracing::warn!(target: LOG_TARGET,
                        rows = parked,
                        "rows parked behind a quarantined event of their group"
                    );
                }
                if unparked > 0 {
                    tracing::info!(target: LOG_TARGET,
                        rows = unparked,
                        "rows released: the quarantined event of their group was re-driven"
                    );
                }
            }
            Err(e) if e.rewritten_by_rule() => self.refused_by_rule(&e).await,
            Err(e) => {
                tracing::warn!(target: LOG_TARGET, error = %e, "could not maintain blocked groups")
            }
        }
    }

    /// One of the relay's UPDATEs (the parking, the quarantine after a claim) left `ids` out
    /// of the rows it meant to change: those still unsent and unquarantined now were kept by
    /// something on the table, which would undo the relay's settlements as well. Claims stop
    /// as for settlements that change nothing (`undone` says which statement found it), and
    /// the cause is named. A look that fails is left to the next pass or claim, which changes
    /// them or looks again.
    pub(super) async fn confirm_changed(
        &self,
        ids: &[i64],
        looking: &'static str,
        undone: fn(u64) -> Undone,
    ) {
        let unchanged = self
            .settlements
            .run(looking, |s| async move { s.unsettled(ids).await })
            .await;
        match unchanged {
            Ok(0) => {}
            Ok(rows) => self.settlements_undone(undone(rows)).await,
            Err(e) => tracing::warn!(target: LOG_TARGET, error = %e, "could not finish {looking}"),
        }
    }

    /// Returns when a claim is worth trying: woken (settlement, NOTIFY, logical wake-up), or, when
    /// polling, once the probe finds a claimable row.
    ///
    /// With `notify` and `logical` the bell rings for new rows; the probe every
    /// `--poll-interval` finds what it cannot announce (retries falling due, leases expiring,
    /// rows committed while its connection was down).
    /// Waits for rows to claim after a claim that started at `last_claim`: polls with the idle
    /// schedule, or waits for a logical wake-up with `--poll-interval` as the fallback.
    pub(super) async fn wait_for_work(
        &self,
        idle: &mut poll::Schedule,
        last_claim: Instant,
        shutdown: &CancellationToken,
    ) -> Woken {
        let entered = Instant::now();
        loop {
            let wait = match self.config.claim.wakeup {
                Wakeup::Poll => idle.next(Instant::now(), self.config.claim.poll_interval),
                Wakeup::Notify | Wakeup::Logical => self.config.claim.poll_interval,
            };
            let until = tokio::time::Instant::now() + wait;
            loop {
                tokio::select! {
                    _ = self.bell.notified() => {
                        // A permit stored before the wait began is a bell that rang during the
                        // claim or its delivery: its rows committed after the claim started.
                        let now = Instant::now();
                        let rang = if now.duration_since(entered) < poll::FAST { last_claim } else { now };
                        return Woken::Bell(rang);
                    }
                    _ = self.wake.notified() => return Woken::Now,
                    // A renewal read the contract: an idle relay the schema no longer admits
                    // (or whose registration lapses) stops claiming and says so now, not when
                    // rows next come.
                    _ = self.admission.changed.notified() => {
                        if self.gate() != Gate::Claim {
                            return Woken::Now;
                        }
                    }
                    _ = tokio::time::sleep_until(until) => break,
                    _ = shutdown.cancelled() => return Woken::Now,
                }
            }
            self.shared.health.tick();
            let probe =
                self.session.run(
                    "looking for claimable rows",
                    |s| async move { s.probe().await },
                );
            match probe.await {
                Ok(false) => {}
                // Found work, or the database failed: the claim finds the rows, or meets the
                // failure and backs off. A row a look finds waited one look's interval at most,
                // within the budget: claim at once.
                Ok(true) | Err(_) => return Woken::Now,
            }
        }
    }
}

/// How long until something done every `every`, last at `last`, is due again: at once if never.
pub(super) fn due_in(last: Option<Instant>, every: Duration) -> Duration {
    last.map_or(Duration::ZERO, |at| every.saturating_sub(at.elapsed()))
}

/// The `outbox_relays` series (version, state) set by the last renewal.
pub(super) type RelaysShown = std::collections::HashSet<(String, &'static str)>;

/// Sets `outbox_relays{version,state}` to the fleet a renewal saw, with this relay as it is now
/// (the renewal read the fleet before its own write), and zeroes the series of versions and
/// states gone since the last renewal; returns the series set.
pub(super) fn show_registry(
    renewed: &Renewed,
    me: &crate::outbox::Registration,
    shown: RelaysShown,
) -> RelaysShown {
    let state = |claiming: bool| if claiming { "claiming" } else { "refused" };
    let mut counts: std::collections::HashMap<(String, &'static str), u32> =
        std::collections::HashMap::new();
    let others = renewed
        .fleet
        .iter()
        .filter(|(id, _, _)| *id != me.relay_id)
        .map(|(_, v, c)| (v.clone(), state(*c)));
    let mine = (version::this_relay().to_string(), state(me.claiming));
    for key in others.chain(std::iter::once(mine)) {
        *counts.entry(key).or_default() += 1;
    }
    for gone in shown.iter().filter(|k| !counts.contains_key(*k)) {
        metrics::gauge!(names::RELAYS, "version" => gone.0.clone(), "state" => gone.1).set(0.0);
    }
    for ((v, s), n) in &counts {
        metrics::gauge!(names::RELAYS, "version" => v.clone(), "state" => *s).set(f64::from(*n));
    }
    counts.into_keys().collect()
}

/// The time from one sweep's start to the next: `every`, or a hundred times what the last one
/// cost the server when that is longer.
pub(super) fn sweep_gap(every: Duration, took: Duration) -> Duration {
    every.max(took * 100)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_sweep_runs_less_often() {
        let every = Duration::from_secs(10);
        assert_eq!(sweep_gap(every, Duration::from_millis(5)), every);
        assert_eq!(
            sweep_gap(every, Duration::from_millis(300)),
            Duration::from_secs(30)
        );
    }
}
