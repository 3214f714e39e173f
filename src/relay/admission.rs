//! Whether the relay may claim now: the schema's verdict on its version (the latest contract
//! read, at a new connection or a renewal) and a registration renewed recently enough that
//! `migrate --contract`, and any other relay, still sees it alive.
//!
//! A relay whose renewals fail stops claiming before its registration lapses: otherwise a
//! migration that waited for it to drop off the registry could change the schema under a
//! relay that still claims. [`gate`] is the rule, pure; the loop applies it before each claim.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::version::Verdict;

/// What the claim loop does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Gate {
    Claim,
    /// The schema does not admit this relay (or is older than it needs).
    Refused(Verdict),
    /// No renewal succeeded for this long: the registration may lapse before a claim ends.
    Unrenewed(Duration),
    /// The relay's settlements of the table change nothing (a trigger, a rule, row-level
    /// security undid them): claiming again would send the same rows again and again. Why, as
    /// one line; it stays until the relay restarts.
    Blocked(String),
}

/// The rule: settlements that change nothing first (`blocked`), then the verdict (no verdict
/// yet counts as admitted: start-up refused any other), then the registration's age against
/// `allowed_for` ([`crate::version::claims_allowed_for`]).
pub(super) fn gate(
    blocked: Option<String>,
    verdict: Option<Verdict>,
    renewed: Option<Instant>,
    now: Instant,
    allowed_for: Duration,
) -> Gate {
    if let Some(why) = blocked {
        return Gate::Blocked(why);
    }
    if let Some(v) = verdict.filter(|v| !v.claims()) {
        return Gate::Refused(v);
    }
    let age = renewed.map_or(Duration::MAX, |at| now.saturating_duration_since(at));
    match age <= allowed_for {
        true => Gate::Claim,
        false => Gate::Unrenewed(age),
    }
}

/// The renewal's side of the gate: when the last renewal that succeeded began, and a bell
/// for the claim loop waiting for a verdict to change.
#[derive(Debug, Default)]
pub(super) struct Admission {
    renewed: Mutex<Option<Instant>>,
    /// Why claims stopped for good: the relay's settlements change nothing ([`Gate::Blocked`]).
    blocked: Mutex<Option<String>>,
    /// Why claims stopped until it passes: row-level security hides rows from the relay's
    /// role or keeps it from settling them, seen by a statistics pass ([`Gate::Blocked`]).
    hidden: Mutex<Option<String>>,
    /// Settlements that changed fewer rows than they meant to, whose effect is being looked
    /// at: no request is sent meanwhile ([`Admission::sends_stopped`]).
    confirming: AtomicUsize,
    pub(super) changed: Notify,
}

/// Sends stay stopped while this lives ([`Admission::confirming`]).
pub(super) struct Confirming<'a>(&'a Admission);

impl Drop for Confirming<'_> {
    fn drop(&mut self) {
        self.0.confirming.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Admission {
    /// A renewal that began at `at` succeeded.
    pub(super) fn renewed(&self, at: Instant) {
        *self.renewed.lock().expect("admission lock") = Some(at);
        self.changed.notify_waiters();
    }

    pub(super) fn last_renewal(&self) -> Option<Instant> {
        *self.renewed.lock().expect("admission lock")
    }

    /// Claims stop for good, for `why`; the first reason stays.
    pub(super) fn block(&self, why: String) {
        self.blocked
            .lock()
            .expect("admission lock")
            .get_or_insert(why);
        self.changed.notify_waiters();
    }

    /// The reason claims stopped for good, completed once it is known.
    pub(super) fn explain(&self, why: String) {
        *self.blocked.lock().expect("admission lock") = Some(why);
        self.changed.notify_waiters();
    }

    /// Why claims stop now, if they do for the table itself: settlements undone (for good)
    /// first, then rows hidden from the relay (until that passes).
    pub(super) fn blocked(&self) -> Option<String> {
        let blocked = self.blocked.lock().expect("admission lock").clone();
        blocked.or_else(|| self.hidden.lock().expect("admission lock").clone())
    }

    /// Row-level security hides rows from the relay (`Some(why)`) or no longer does (`None`);
    /// returns whether that changed.
    pub(super) fn hidden(&self, why: Option<String>) -> bool {
        let mut hidden = self.hidden.lock().expect("admission lock");
        if *hidden == why {
            return false;
        }
        *hidden = why;
        drop(hidden);
        self.changed.notify_waiters();
        true
    }

    /// Whether claims stopped for good (settlements undone), which no later pass clears.
    pub(super) fn blocked_for_good(&self) -> bool {
        self.blocked.lock().expect("admission lock").is_some()
    }

    /// A settlement changed fewer rows than it meant to: until the look at those rows ends
    /// (the guard is dropped, after [`Admission::block`] if they are still unsent), no request
    /// is sent. A claim of this relay may already have taken the rows the settlement freed;
    /// sent during that look, they would be one copy more than the bound of
    /// docs/operations.md ("Triggers and rules"). Claims go on: a false alarm (another
    /// statement deleted some of the rows) costs a round trip's worth of rows given back.
    pub(super) fn confirming(&self) -> Confirming<'_> {
        self.confirming.fetch_add(1, Ordering::AcqRel);
        Confirming(self)
    }

    /// Whether a request about to be sent must be given back instead: settlements on the
    /// table change nothing, or may, and that is being looked at.
    pub(super) fn sends_stopped(&self) -> bool {
        self.confirming.load(Ordering::Acquire) > 0 || self.blocked_for_good()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HALF_LEASE: Duration = Duration::from_secs(15);

    #[test]
    fn a_relay_claims_while_admitted_and_renewed_within_half_a_lease() {
        let t0 = Instant::now();
        assert_eq!(
            gate(
                None,
                Some(Verdict::Claim),
                Some(t0),
                t0 + HALF_LEASE,
                HALF_LEASE
            ),
            Gate::Claim
        );
        assert_eq!(gate(None, None, Some(t0), t0, HALF_LEASE), Gate::Claim);
    }

    #[test]
    fn a_refusal_stops_claims_whatever_the_renewal() {
        let t0 = Instant::now();
        let refused = Verdict::Refused {
            schema: 5,
            requirement: ">=0.3.0".into(),
        };
        assert_eq!(
            gate(None, Some(refused.clone()), Some(t0), t0, HALF_LEASE),
            Gate::Refused(refused)
        );
        let old = Verdict::Migrate { found: 3 };
        assert_eq!(
            gate(None, Some(old.clone()), Some(t0), t0, HALF_LEASE),
            Gate::Refused(old)
        );
    }

    #[test]
    fn settlements_that_change_nothing_stop_claims_whatever_else_holds() {
        let t0 = Instant::now();
        assert_eq!(
            gate(
                Some("trigger keep".into()),
                Some(Verdict::Claim),
                Some(t0),
                t0,
                HALF_LEASE
            ),
            Gate::Blocked("trigger keep".into())
        );
    }

    #[test]
    fn sends_stop_while_a_settlement_is_looked_at_and_for_good_once_it_was_undone() {
        let admission = Admission::default();
        assert!(!admission.sends_stopped());
        let first = admission.confirming();
        let second = admission.confirming();
        assert!(admission.sends_stopped());
        drop(first);
        assert!(admission.sends_stopped(), "one look still runs");
        drop(second);
        assert!(!admission.sends_stopped(), "a false alarm lifts the stop");
        let look = admission.confirming();
        admission.block("trigger keep".into());
        drop(look);
        assert!(admission.sends_stopped());
        assert!(admission.blocked_for_good());
    }

    #[test]
    fn renewals_that_stopped_succeeding_stop_claims_before_the_registration_lapses() {
        let t0 = Instant::now();
        let late = t0 + HALF_LEASE + Duration::from_millis(1);
        assert_eq!(
            gate(None, Some(Verdict::Claim), Some(t0), late, HALF_LEASE),
            Gate::Unrenewed(HALF_LEASE + Duration::from_millis(1))
        );
        assert_eq!(
            gate(None, Some(Verdict::Claim), None, t0, HALF_LEASE),
            Gate::Unrenewed(Duration::MAX)
        );
    }
}
