//! The relay-wide back-off after whole-request failures.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::config::RunConfig;
use crate::retry;

/// Relay-wide back-off: after a whole-request failure every sender waits, so an outage or
/// throttling costs one failed request per back-off step instead of one per batch.
#[derive(Debug, Default)]
pub(super) struct Pressure {
    state: Mutex<PressureState>,
}

#[derive(Debug, Default)]
pub(super) struct PressureState {
    consecutive_failures: u32,
    paused_until: Option<Instant>,
}

impl Pressure {
    /// Records a failure; returns the pause it imposes (capped, full jitter).
    pub(super) fn push(&self, config: &RunConfig) -> Duration {
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
    pub(super) fn relieve(&self) {
        let mut s = self.state.lock().expect("pressure lock");
        s.consecutive_failures = 0;
        s.paused_until = None;
    }

    pub(super) fn remaining(&self) -> Option<Duration> {
        let s = self.state.lock().expect("pressure lock");
        s.paused_until
            .and_then(|until| until.checked_duration_since(Instant::now()))
            .filter(|d| !d.is_zero())
    }
}
