//! The relay under test as a process: the arguments and wake-up mode each run gives it,
//! migrating, starting, counting and checking it.

use std::time::Duration;

use crate::help::help_value;
use crate::settings::Settings;
use crate::sink::Sink;
use crate::support::{self, RelayProcess, TestDb};
use crate::traces::EXPORTER_LOG_TARGET;

/// `run` arguments of a relay sending to `queue_url` at `endpoint`: no retention, a lease no
/// run outlasts, the run's batch and `--max-in-flight`, then `OUTBOX_BENCH_RELAY_ARGS`.
pub fn relay_args(
    settings: &Settings,
    db_url: &str,
    queue_url: &str,
    endpoint: &str,
    relay_id: &str,
    max_in_flight: usize,
) -> Vec<String> {
    // A lease long enough that none runs out during a run: a takeover would be a different
    // benchmark.
    let fixed = ["--retention", "off", "--lease", "5m"];
    let target = (db_url, queue_url, endpoint);
    args_with(settings, target, relay_id, max_in_flight, &fixed)
}

/// [`relay_args`] without `--retention off` and the long lease: the relay's own defaults for
/// those, as production runs it.
pub fn relay_args_with_defaults(
    settings: &Settings,
    db_url: &str,
    queue_url: &str,
    endpoint: &str,
    relay_id: &str,
    max_in_flight: usize,
) -> Vec<String> {
    let target = (db_url, queue_url, endpoint);
    args_with(settings, target, relay_id, max_in_flight, &[])
}

fn args_with(
    settings: &Settings,
    (db_url, queue_url, endpoint): (&str, &str, &str),
    relay_id: &str,
    max_in_flight: usize,
    fixed: &[&str],
) -> Vec<String> {
    let db_url = settings.relay_url(db_url);
    let mut args: Vec<String> = [
        "run",
        "--database-url",
        &db_url,
        "--queue-url",
        queue_url,
        "--sqs-endpoint-url",
        endpoint,
        "--relay-id",
        relay_id,
        "--metrics-addr",
        "127.0.0.1:0",
    ]
    .iter()
    .chain(fixed)
    .map(|s| s.to_string())
    .collect();
    args.extend([
        "--batch-size".to_string(),
        settings.batch.to_string(),
        "--max-in-flight".to_string(),
        max_in_flight.to_string(),
    ]);
    args.extend(settings.relay_args.iter().cloned());
    args
}

/// Sum of `outbox_events_sent_total` over the replicas.
pub async fn sent_total(relays: &[RelayProcess]) -> u64 {
    let mut sum = 0.0;
    for relay in relays {
        sum += relay
            .metric("outbox_events_sent_total")
            .await
            .unwrap_or(0.0);
    }
    sum as u64
}

/// SIGTERM to every relay at once, then each gets 30 s to exit before SIGKILL.
pub async fn stop(relays: &[RelayProcess]) {
    for relay in relays {
        relay.sigterm();
    }
    for relay in relays {
        if relay.wait_exit(Duration::from_secs(30)).await.is_none() {
            relay.kill9();
        }
    }
}

/// Panics on a relay's first error line.
pub fn check_alive(relays: &[RelayProcess]) {
    check_alive_traced(relays, false);
}

/// [`check_alive`]; with `traced`, the trace exporter's own error lines (a collector that is
/// down) are expected: the run counts them instead.
pub fn check_alive_traced(relays: &[RelayProcess], traced: bool) {
    for relay in relays {
        if let Some(line) = relay.output().lines().find(|l| {
            (l.contains("ERROR") || l.starts_with("error:"))
                && !(traced && l.contains(EXPORTER_LOG_TARGET))
        }) {
            panic!(
                "{} reported an error: {line}\n{}",
                relay.name(),
                relay.output()
            );
        }
    }
}

/// How an idle relay learns of new rows: a `--wakeup` mode, or the NOTIFY trigger of builds
/// that have no such flag.
#[derive(Clone, Debug, PartialEq)]
pub struct Wakeup {
    /// The `--wakeup` value; `None` for a build without the flag.
    pub mode: Option<String>,
}

impl Wakeup {
    /// The build's modes, its default first; builds without `--wakeup` have one.
    pub fn modes(relay_help: &str) -> Vec<Wakeup> {
        if !relay_help.contains("--wakeup") {
            return vec![Wakeup { mode: None }];
        }
        let default = help_value(relay_help, "--wakeup").unwrap_or_else(|| "poll".into());
        let mut modes = vec![default.clone()];
        for m in ["poll", "notify", "logical"] {
            if m != default {
                modes.push(m.to_string());
            }
        }
        modes
            .into_iter()
            .map(|m| Wakeup { mode: Some(m) })
            .collect()
    }

    pub fn label(&self) -> String {
        match &self.mode {
            Some(m) => format!("--wakeup {m}"),
            None => "NOTIFY trigger (build without --wakeup)".to_string(),
        }
    }

    pub fn needs_logical_wal(&self) -> bool {
        self.mode.as_deref() == Some("logical")
    }

    pub fn cluster_label(&self) -> &'static str {
        if self.needs_logical_wal() {
            "durable, wal_level=logical"
        } else {
            "durable"
        }
    }

    /// For `migrate` and `run` alike.
    fn flags(&self) -> Vec<String> {
        match &self.mode {
            Some(m) => vec!["--wakeup".to_string(), m.clone()],
            None => Vec::new(),
        }
    }
}

/// `outbox-relay migrate` on `db` for `wakeup`, as an operator would run it.
pub async fn migrate(db: &TestDb, wakeup: &Wakeup) {
    let flags = wakeup.flags();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    support::scenario::migrate_with(db, &flags).await;
}

/// One relay with the build's defaults (plus `OUTBOX_BENCH_RELAY_ARGS` and `extra`), sending
/// to `sink`; returns once it serves /metrics and has had a second to set up its wake-up.
pub async fn start_relay(
    settings: &Settings,
    db: &TestDb,
    wakeup: &Wakeup,
    sink: &Sink,
    id: &str,
    extra: &[String],
) -> RelayProcess {
    start_relay_at(
        settings,
        db,
        wakeup,
        (&sink.queue_url("bench"), &sink.endpoint),
        id,
        extra,
    )
    .await
}

/// [`start_relay`] sending to `(queue URL, endpoint)`, e.g. a fauxqs queue.
pub async fn start_relay_at(
    settings: &Settings,
    db: &TestDb,
    wakeup: &Wakeup,
    (queue_url, endpoint): (&str, &str),
    id: &str,
    extra: &[String],
) -> RelayProcess {
    let url = settings.relay_url(&db.url);
    let mut args: Vec<String> = [
        "run",
        "--database-url",
        &url,
        "--queue-url",
        queue_url,
        "--sqs-endpoint-url",
        endpoint,
        "--relay-id",
        id,
        "--metrics-addr",
        "127.0.0.1:0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(wakeup.flags());
    args.extend(settings.relay_args.iter().cloned());
    args.extend(extra.iter().cloned());
    let relay = RelayProcess::spawn_named(id, &args, &[]);
    relay.metric("outbox_events_sent_total").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    check_alive(std::slice::from_ref(&relay));
    relay
}
