//! Big backlogs (`big-backlog`): what a relay catching up on a large backlog costs the
//! application, and how its drain holds up as the backlog shrinks.
//!
//! On the durable cluster (`fsync=on`, `synchronous_commit=on`): a backlog of
//! `OUTBOX_BENCH_BACKLOG_ROWS` order events (default 1,000,000; the target is
//! 10,000,000, about 25 minutes of this machine), then the application's steady 500 commits/s
//! for `OUTBOX_BENCH_BACKLOG_BASELINE_SECONDS` without a relay, then the same 500/s while one
//! relay (the build's defaults, delete on acknowledgement) drains the backlog into the
//! benchmark's 0 ms sink, until it has caught up. Reported: the application's commit latency
//! p50/p99 without and with the relay, and for each tenth of the backlog the relay's drain rate
//! and its mean claim time (`outbox_claim_duration_seconds`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::cluster::Clusters;
use crate::procstat;
use crate::progress::say;
use crate::relays::{self, check_alive, relay_args};
use crate::settings::{Settings, PRODUCER_CONNECTIONS};
use crate::sink::Sink;
use crate::stats::quantile;
use crate::support::{metric_value, RelayProcess};
use crate::workload::{self, Backlog, Database, Produced};

/// The application's commits per second meanwhile, as the issue asks.
pub const RATE: u64 = 500;
/// Producer windows: each a fresh `workload::produce`, until the relay has caught up.
const WINDOW: Duration = Duration::from_secs(10);
/// How often the relay's counters are read.
const POLL: Duration = Duration::from_millis(200);

/// One tenth of the backlog, as the relay drained it.
pub struct Tenth {
    /// How long the relay took over this tenth.
    pub seconds: f64,
    /// Rows it sent per second over this tenth.
    pub rows_per_second: f64,
    /// Mean of the claims made in this tenth; `None` for a build without the histogram.
    pub claim_ms: Option<f64>,
}

pub struct BacklogRun {
    /// Rows of the backlog written before the relay started.
    pub rows: u64,
    /// The application's commits/s meanwhile ([`RATE`]).
    pub rate: u64,
    /// How long writing the backlog took.
    pub fill_seconds: f64,
    /// The application's commit latency in ms, sorted: without the relay, and while it caught
    /// up (events due before it had).
    pub without_ms: Vec<f64>,
    /// See `without_ms`.
    pub with_ms: Vec<f64>,
    /// From the relay's start until it had sent the backlog and everything written meanwhile.
    pub catch_up_seconds: f64,
    /// The drain tenth by tenth of the backlog: does it slow as the table empties?
    pub tenths: Vec<Tenth>,
    /// CPU seconds of the relay over the catch-up.
    pub relay_cpu_seconds: f64,
    /// The outbox table's size with the backlog, before the relay.
    pub table_mib_before: f64,
    /// Its size once the relay had caught up (delete on acknowledgement).
    pub table_mib_after: f64,
}

impl BacklogRun {
    pub fn p(&self, with: bool, q: f64) -> f64 {
        quantile(
            if with {
                &self.with_ms
            } else {
                &self.without_ms
            },
            q,
        )
    }

    /// Backlog rows per second over the whole catch-up.
    pub fn rows_per_second(&self) -> f64 {
        self.rows as f64 / self.tenths.iter().map(|t| t.seconds).sum::<f64>()
    }

    pub fn summary(&self) -> String {
        let tenths: Vec<String> = self
            .tenths
            .iter()
            .map(|t| match t.claim_ms {
                Some(ms) => format!("{:.0}/s {ms:.2} ms", t.rows_per_second),
                None => format!("{:.0}/s", t.rows_per_second),
            })
            .collect();
        format!(
            "big backlog, {} rows (filled in {:.0} s), {} commits/s durable: commit p50 {:.2} -> {:.2} ms, p99 {:.2} -> {:.2} ms (without -> while the relay catches up); caught up in {:.0} s, {:.0} backlog rows/s; by tenth (rows/s, mean claim): {}; relay {:.0} CPU s; table {:.0} -> {:.0} MiB",
            self.rows,
            self.fill_seconds,
            self.rate,
            self.p(false, 0.5),
            self.p(true, 0.5),
            self.p(false, 0.99),
            self.p(true, 0.99),
            self.catch_up_seconds,
            self.rows_per_second(),
            tenths.join(", "),
            self.relay_cpu_seconds,
            self.table_mib_before,
            self.table_mib_after,
        )
    }

    pub fn to_json(&self) -> Value {
        json!({
            "rows": self.rows,
            "commits_per_second": self.rate,
            "fill_seconds": self.fill_seconds,
            "commit_ms_without_relay": {"p50": self.p(false, 0.5), "p99": self.p(false, 0.99), "n": self.without_ms.len()},
            "commit_ms_while_catching_up": {"p50": self.p(true, 0.5), "p99": self.p(true, 0.99), "n": self.with_ms.len()},
            "catch_up_seconds": self.catch_up_seconds,
            "backlog_rows_per_second": self.rows_per_second(),
            "by_tenth": self.tenths.iter().map(|t| json!({
                "seconds": t.seconds,
                "rows_per_second": t.rows_per_second,
                "claim_ms": t.claim_ms,
            })).collect::<Vec<_>>(),
            "relay_cpu_seconds": self.relay_cpu_seconds,
            "table_mib_before": self.table_mib_before,
            "table_mib_after": self.table_mib_after,
        })
    }
}

/// The relay's counters at one moment.
struct Mark {
    /// Since the relay started.
    seconds: f64,
    /// `outbox_events_sent_total` at that moment.
    sent: f64,
    /// `outbox_claim_duration_seconds` sum and count; `None` where the build lacks it.
    claim_sum: Option<f64>,
    /// See `claim_sum`.
    claim_count: Option<f64>,
}

/// Commit latency of the events that were due before `until` (all of them without a bound).
fn latencies(runs: &[Produced], until: Option<Instant>) -> Vec<f64> {
    let mut all: Vec<f64> = runs
        .iter()
        .flat_map(|p| {
            p.commits.iter().enumerate().filter_map(move |(i, at)| {
                let due = p.start + Duration::from_secs_f64(i as f64 / p.rate as f64);
                if until.is_some_and(|u| due >= u) {
                    return None;
                }
                Some(at.as_ref()?.saturating_duration_since(due).as_secs_f64() * 1000.0)
            })
        })
        .collect();
    all.sort_by(f64::total_cmp);
    all
}

/// `rate` commits/s in windows of [`WINDOW`] until `stop`.
async fn produce_until(
    database: &Database,
    prefix: &str,
    stop: &AtomicBool,
    committed: &Arc<AtomicU64>,
) -> Vec<Produced> {
    let mut runs = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let prefix = format!("{prefix}-{}", runs.len());
        runs.push(
            workload::produce(
                &database.db,
                &prefix,
                RATE,
                WINDOW,
                PRODUCER_CONNECTIONS,
                Arc::clone(committed),
            )
            .await,
        );
    }
    runs
}

/// The tenths of the backlog from the marks: where `sent` crossed each tenth of `rows`.
fn tenths(marks: &[Mark], rows: u64) -> Vec<Tenth> {
    let mut out = Vec::new();
    let mut from = &marks[0];
    for k in 1..=10 {
        let goal = (rows * k / 10) as f64;
        let Some(to) = marks.iter().find(|m| m.sent >= goal) else {
            break;
        };
        let seconds = to.seconds - from.seconds;
        let claim_ms = match (
            to.claim_sum,
            from.claim_sum,
            to.claim_count,
            from.claim_count,
        ) {
            (Some(s1), Some(s0), Some(c1), Some(c0)) if c1 > c0 => {
                Some((s1 - s0) / (c1 - c0) * 1000.0)
            }
            _ => None,
        };
        out.push(Tenth {
            seconds,
            rows_per_second: (to.sent - from.sent) / seconds.max(1e-9),
            claim_ms,
        });
        from = to;
    }
    out
}

pub async fn big_backlog(settings: &Settings, clusters: &mut Clusters) -> BacklogRun {
    let rows = settings.backlog_rows;
    let database = Database::create_in(clusters.durable().await).await;
    let filling = Instant::now();
    database.fill(&Backlog::orders(rows)).await;
    let fill_seconds = filling.elapsed().as_secs_f64();
    let table_mib_before = database.size_mib().await;

    let committed = Arc::new(AtomicU64::new(0));
    let stop = AtomicBool::new(false);
    let without = {
        let produce = produce_until(&database, "without", &stop, &committed);
        let timer = async {
            tokio::time::sleep(settings.backlog_baseline).await;
            stop.store(true, Ordering::Relaxed);
        };
        tokio::join!(produce, timer).0
    };

    let sink = Sink::start(Duration::ZERO, false).await;
    let mut args = relay_args(
        settings,
        &database.db.url,
        &sink.queue_url("bench"),
        &sink.endpoint,
        "bench-backlog",
        settings.in_flight,
    );
    // The drains keep sent rows (`--retention off`) to compare table sizes; a backlog after an
    // outage meets the default, delete on acknowledgement.
    if let Some(at) = args.iter().position(|a| a == "--retention") {
        args.drain(at..at + 2);
    }
    stop.store(false, Ordering::Relaxed);
    let started = Instant::now();
    let relay = RelayProcess::spawn_named("bench-backlog", &args, &[]);
    let limit = Duration::from_secs(300 + rows / 1_000);
    let mut marks = vec![Mark {
        seconds: 0.0,
        sent: 0.0,
        claim_sum: Some(0.0),
        claim_count: Some(0.0),
    }];
    let mut caught_up = None;
    let with = {
        let produce = produce_until(&database, "with", &stop, &committed);
        let watch = async {
            loop {
                tokio::time::sleep(POLL).await;
                let scrape = relay.scrape().await;
                let sent = metric_value(&scrape, "outbox_events_sent_total").unwrap_or(0.0);
                marks.push(Mark {
                    seconds: started.elapsed().as_secs_f64(),
                    sent,
                    claim_sum: metric_value(&scrape, "outbox_claim_duration_seconds_sum"),
                    claim_count: metric_value(&scrape, "outbox_claim_duration_seconds_count"),
                });
                // The rows written without the relay wait behind the backlog too.
                let written = rows + committed.load(Ordering::Relaxed);
                if sent >= written as f64 {
                    caught_up = Some(Instant::now());
                    break;
                }
                check_alive(std::slice::from_ref(&relay));
                assert!(
                    started.elapsed() < limit,
                    "big backlog: {sent} of {written} sent after {limit:?}\n{}",
                    relay.output()
                );
            }
            stop.store(true, Ordering::Relaxed);
        };
        tokio::join!(produce, watch).0
    };
    let catch_up_seconds = caught_up.map_or(0.0, |at| (at - started).as_secs_f64());
    let relay_cpu_seconds = procstat::cpu_seconds(relay.pid()).unwrap_or(0.0);
    relays::stop(std::slice::from_ref(&relay)).await;
    let table_mib_after = database.size_mib().await;
    drop(sink);
    database.drop_now().await;
    BacklogRun {
        rows,
        rate: RATE,
        fill_seconds,
        without_ms: latencies(&without, None),
        with_ms: latencies(&with, caught_up),
        catch_up_seconds,
        tenths: tenths(&marks, rows),
        relay_cpu_seconds,
        table_mib_before,
        table_mib_after,
    }
}

/// The group's one run, and its progress line.
pub async fn run(settings: &Settings, clusters: &mut Clusters) -> BacklogRun {
    let run = big_backlog(settings, clusters).await;
    say(&run.summary());
    run
}
