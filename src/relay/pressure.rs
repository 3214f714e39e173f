//! The relay-wide back-off after whole-request failures: how long every sender waits.
//!
//! No clock and no random draw inside: `now` and the pause are parameters (the pause is a
//! decision's, see [`pause_for`]), so the rule is unit-tested without tokio time.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::retry;

/// Relay-wide back-off: after a whole-request failure every sender waits, so an outage or
/// throttling costs one failed request per back-off step instead of one per batch.
#[derive(Debug, Default)]
pub(super) struct Pressure {
    /// Shared by every delivery task of the process.
    state: Mutex<PressureState>,
}

#[derive(Debug, Default)]
struct PressureState {
    /// Pauses since a request last went through: each one is a back-off step longer.
    consecutive_failures: u32,
    /// No request is sent before this.
    paused_until: Option<Instant>,
}

/// The pause the `failures`-th whole-request failure in a row imposes (capped exponential,
/// full jitter; `jitter` is the draw in `[0, 1)`).
pub(super) fn pause_for(failures: u32, base: Duration, cap: Duration, jitter: f64) -> Duration {
    retry::backoff(failures, base, cap, jitter)
}

impl Pressure {
    /// Whole-request failures in a row so far: a decision's next pause is [`pause_for`] one more.
    pub(super) fn failures(&self) -> u32 {
        self.state
            .lock()
            .expect("pressure lock")
            .consecutive_failures
    }

    /// Records a failure that pauses the relay for `delay` from `now`; a pause already running
    /// that ends later is kept.
    pub(super) fn pause(&self, now: Instant, delay: Duration) {
        let mut s = self.state.lock().expect("pressure lock");
        s.consecutive_failures = s.consecutive_failures.saturating_add(1);
        let until = now + delay;
        s.paused_until = Some(s.paused_until.map_or(until, |u| u.max(until)));
    }

    /// A request went through: the path is healthy again.
    pub(super) fn relieve(&self) {
        let mut s = self.state.lock().expect("pressure lock");
        s.consecutive_failures = 0;
        s.paused_until = None;
    }

    /// How long senders still wait at `now`, if at all.
    pub(super) fn remaining(&self, now: Instant) -> Option<Duration> {
        let s = self.state.lock().expect("pressure lock");
        s.paused_until
            .and_then(|until| until.checked_duration_since(now))
            .filter(|d| !d.is_zero())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn a_pause_holds_senders_until_it_ends() {
        let p = Pressure::default();
        let now = Instant::now();
        assert_eq!(p.remaining(now), None);
        p.pause(now, 3 * SECOND);
        assert_eq!(p.failures(), 1);
        assert_eq!(p.remaining(now), Some(3 * SECOND));
        assert_eq!(p.remaining(now + SECOND), Some(2 * SECOND));
        assert_eq!(p.remaining(now + 3 * SECOND), None);
    }

    #[test]
    fn a_shorter_pause_does_not_cut_a_longer_one_short() {
        let p = Pressure::default();
        let now = Instant::now();
        p.pause(now, 10 * SECOND);
        p.pause(now + SECOND, SECOND);
        assert_eq!(p.failures(), 2);
        assert_eq!(p.remaining(now), Some(10 * SECOND));
        p.pause(now + 5 * SECOND, 20 * SECOND);
        assert_eq!(p.remaining(now), Some(25 * SECOND));
    }

    #[test]
    fn a_request_that_goes_through_ends_the_pause_and_the_count() {
        let p = Pressure::default();
        let now = Instant::now();
        p.pause(now, 10 * SECOND);
        p.pause(now, 10 * SECOND);
        p.relieve();
        assert_eq!(p.failures(), 0);
        assert_eq!(p.remaining(now), None);
    }

    #[test]
    fn each_failure_in_a_row_pauses_one_step_longer_up_to_the_cap() {
        let (base, cap) = (SECOND, 8 * SECOND);
        // The jitter's top: the step's ceiling itself.
        let top = 1.0;
        let pauses: Vec<_> = (1..=5).map(|n| pause_for(n, base, cap, top)).collect();
        assert_eq!(
            pauses,
            [SECOND, 2 * SECOND, 4 * SECOND, 8 * SECOND, 8 * SECOND]
        );
        assert_eq!(pause_for(3, base, cap, 0.5), 2 * SECOND);
    }
}
