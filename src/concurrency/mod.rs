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

/// `--request-concurrency`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum RequestConcurrency {
    /// Each destination's limit follows its answers, up to `--max-in-flight`.
    #[default]
    Adaptive,
    /// Every destination may have `--max-in-flight` requests in flight, whatever it does.
    Fixed,
}
