//! Group `large-events`: payloads near SQS's size limit under byte budgets, inline and through
//! S3.

use std::time::Duration;

use crate::drain::{drain, say_drain, spec, Destination, DrainRun, SHORT_DRAIN_POLL};
use crate::help::{help_value, relay_run_help};
use crate::progress::say;
use crate::settings::{Settings, SQS_LATENCY};
use crate::workload::{self, Backlog, Payload};

/// Large events: this many, each with a payload of about [`LARGE_EVENT_BYTES`] (SQS takes
/// up to 1 MiB of body and attributes together).
const LARGE_EVENTS: u64 = 300;
const LARGE_EVENT_BYTES: usize = 900_000;
/// The offloaded large-events run sends every body above this many bytes through S3: all of
/// them.
const OFFLOAD_ABOVE: usize = 65_536;
/// A budget that bounds nothing here: the relay as it was before the byte budget (rows only).
const UNBOUNDED_BUDGET: &str = "1GiB";
/// The unbounded large-event run is skipped when its relay could come near this.
const UNBOUNDED_RSS_LIMIT: u64 = 1536 * 1024 * 1024;

/// `MemAvailable` of /proc/meminfo in bytes (0 when unknown, which skips what needs memory).
fn mem_available() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemAvailable:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

/// Every drain of the group, in the order run.
pub async fn run(settings: &Settings) -> Vec<DrainRun> {
    let mut runs = Vec::new();
    // Payloads near SQS's limit: what the relay holds with the default byte budget, a
    // smaller one, and one that bounds nothing (rows only, as before the budget); and with
    // the default budget, every body through S3 first (the sink's PutObject), against the
    // same events sent inline.
    let help = relay_run_help();
    let default_budget = help_value(&help, "--max-bytes-in-flight");
    let mut budgets: Vec<(Option<&str>, bool, Duration)> = vec![(None, false, Duration::ZERO)];
    if help.contains("--offload-bucket") {
        budgets.push((None, true, Duration::ZERO));
    }
    if default_budget.is_some() {
        budgets.extend([
            (Some("8MiB"), false, Duration::ZERO),
            (Some(UNBOUNDED_BUDGET), false, Duration::ZERO),
        ]);
    }
    // With a round trip per call, as in a region: S3 takes each body in its own call.
    budgets.push((None, false, SQS_LATENCY));
    if help.contains("--offload-bucket") {
        budgets.push((None, true, SQS_LATENCY));
    }
    for (budget, offload, delay) in budgets {
        let backlog = Backlog {
            rows: LARGE_EVENTS,
            groups: workload::GROUPS,
            payload: Payload::Blob(LARGE_EVENT_BYTES),
        };
        // Each payload byte is held about three times while in flight; unbounded, the whole
        // backlog can be.
        let worst = LARGE_EVENTS * LARGE_EVENT_BYTES as u64 * 3;
        if budget == Some(UNBOUNDED_BUDGET)
            && (worst > UNBOUNDED_RSS_LIMIT || worst > mem_available() / 2)
        {
            say(&format!(
                "large events, --max-bytes-in-flight {UNBOUNDED_BUDGET}: skipped, the relay could hold ~{} MiB ({} MiB available)",
                worst >> 20,
                mem_available() >> 20
            ));
            continue;
        }
        let mut label = match (budget, &default_budget) {
            (Some(b), _) => format!("--max-bytes-in-flight {b}"),
            (None, Some(d)) => format!("--max-bytes-in-flight {d} (default)"),
            (None, None) => "no byte budget in this build".to_string(),
        };
        if offload {
            label.push_str(&format!(
                ", bodies through S3 (--offload-threshold {OFFLOAD_ABOVE})"
            ));
        }
        let mut s = spec(
            settings,
            &format!("large events, sink {} ms, {label}", delay.as_millis()),
            Destination::Sink(delay),
            1,
            settings.in_flight,
        );
        s.backlog = backlog;
        s.poll = SHORT_DRAIN_POLL;
        if let Some(b) = budget {
            s.flags = vec!["--max-bytes-in-flight".to_string(), b.to_string()];
        }
        s.offload_above = offload.then_some(OFFLOAD_ABOVE);
        let run = drain(settings, s).await;
        say_drain(&run);
        runs.push(run);
    }
    runs
}
