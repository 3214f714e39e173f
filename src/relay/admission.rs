//! Whether the relay may claim now: the schema's verdict on its version (the latest contract
//! read, at a new connection or a renewal) and a registration renewed recently enough that
//! `migrate --contract`, and any other relay, still sees it alive.
//!
//! A relay whose renewals fail stops claiming before its registration lapses: otherwise a
//! migration that waited for it to drop off the registry could change the schema under a
//! relay that still claims. [`gate`] is the rule, pure; the loop applies it before each claim.

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
}

/// The rule: the verdict first (no verdict yet counts as admitted: start-up refused any
/// other), then the registration's age against `allowed_for`
/// ([`crate::version::claims_allowed_for`]).
pub(super) fn gate(
    verdict: Option<Verdict>,
    renewed: Option<Instant>,
    now: Instant,
    allowed_for: Duration,
) -> Gate {
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
    pub(super) changed: Notify,
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
}

#[cfg(test)]
mod tests {
    use super::*;

    const HALF_LEASE: Duration = Duration::from_secs(15);

    #[test]
    fn a_relay_claims_while_admitted_and_renewed_within_half_a_lease() {
        let t0 = Instant::now();
        assert_eq!(
            gate(Some(Verdict::Claim), Some(t0), t0 + HALF_LEASE, HALF_LEASE),
            Gate::Claim
        );
        assert_eq!(gate(None, Some(t0), t0, HALF_LEASE), Gate::Claim);
    }

    #[test]
    fn a_refusal_stops_claims_whatever_the_renewal() {
        let t0 = Instant::now();
        let refused = Verdict::Refused {
            schema: 5,
            requirement: ">=0.3.0".into(),
        };
        assert_eq!(
            gate(Some(refused.clone()), Some(t0), t0, HALF_LEASE),
            Gate::Refused(refused)
        );
        let old = Verdict::Migrate { found: 3 };
        assert_eq!(
            gate(Some(old.clone()), Some(t0), t0, HALF_LEASE),
            Gate::Refused(old)
        );
    }

    #[test]
    fn renewals_that_stopped_succeeding_stop_claims_before_the_registration_lapses() {
        let t0 = Instant::now();
        let late = t0 + HALF_LEASE + Duration::from_millis(1);
        assert_eq!(
            gate(Some(Verdict::Claim), Some(t0), late, HALF_LEASE),
            Gate::Unrenewed(HALF_LEASE + Duration::from_millis(1))
        );
        assert_eq!(
            gate(Some(Verdict::Claim), None, t0, HALF_LEASE),
            Gate::Unrenewed(Duration::MAX)
        );
    }
}
