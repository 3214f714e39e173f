//! Adaptive request concurrency: how many requests each destination gets at once.
//!
//! `--max-in-flight` is the ceiling; below it each destination (queue URL, topic ARN, offload
//! bucket) has a limit of its own that falls when its answers slow down, time out or throttle,
//! and rises while they stay healthy. A slow destination so gets fewer requests instead of
//! timeouts, copies and a relay-wide back-off, and the others keep theirs.
//!
//! - [`controller`]: pure: the rule, from outcomes and times to a limit.
//! - [`limiter`]: the slots a request waits for, and the gauge.

pub mod controller;
pub mod limiter;

pub use controller::Outcome;
pub use limiter::{Limiter, Slot};

use std::time::Duration;

use crate::retry::{self, FailureClass};

/// What an answer tells its destination's limit: its round trip, or back-pressure when the
/// destination throttled any entry (`failed_codes`: the codes of the entries it refused).
pub fn answer_outcome<'a>(
    rtt: Duration,
    mut failed_codes: impl Iterator<Item = &'a str>,
) -> Outcome {
    if failed_codes.any(retry::is_throttle_code) {
        Outcome::BackPressure
    } else {
        Outcome::Answered(rtt)
    }
}

/// What a request that failed as a whole tells its destination's limit: throttling and the
/// transient failures (no answer in time, a 5xx, a dropped connection) are back-pressure; a
/// refusal of the relay's configuration or of the request's input says nothing of load.
pub fn failure_outcome(class: FailureClass) -> Outcome {
    match class {
        FailureClass::Throttled | FailureClass::Transient => Outcome::BackPressure,
        FailureClass::Config | FailureClass::Destination | FailureClass::BadRequest => {
            Outcome::Unmeasured
        }
    }
}

/// `--request-concurrency`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum RequestConcurrency {
    /// Each destination's limit follows its answers, up to `--max-in-flight`.
    #[default]
    Adaptive,
    /// Every destination may have `--max-in-flight` requests in flight, whatever it does.
    Fixed,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttling_timeouts_and_server_errors_are_back_pressure_refusals_are_not() {
        let rtt = Duration::from_millis(20);
        assert_eq!(answer_outcome(rtt, [].into_iter()), Outcome::Answered(rtt));
        assert_eq!(
            answer_outcome(rtt, ["InvalidParameterValue"].into_iter()),
            Outcome::Answered(rtt),
            "an entry's bad input is its own"
        );
        assert_eq!(
            answer_outcome(rtt, ["AWS.SimpleQueueService.RequestThrottled"].into_iter()),
            Outcome::BackPressure
        );
        assert_eq!(
            failure_outcome(FailureClass::Throttled),
            Outcome::BackPressure
        );
        assert_eq!(
            failure_outcome(FailureClass::Transient),
            Outcome::BackPressure
        );
        for class in [
            FailureClass::Config,
            FailureClass::Destination,
            FailureClass::BadRequest,
        ] {
            assert_eq!(failure_outcome(class), Outcome::Unmeasured, "{class:?}");
        }
    }
}
