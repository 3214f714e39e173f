//! Group `harm`: what the relay costs the application's database, its commit rate with and
//! without the relay on durable commits.
//!
//! It runs on clusters of the benchmark's own with `fsync=on` and `synchronous_commit=on`, as
//! in production: with `fsync=off` a commit never waits for its WAL flush, so whatever
//! serializes commits (NOTIFY's database-wide lock, MEASURED.md trap 4) costs next to nothing.
//!
//! Here the relay process shares the machine's cores with PostgreSQL; own_core.rs measures the
//! same with the database on a core of its own, as production has it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::task::JoinHandle;

use crate::cluster::{drop_db, Clusters};
use crate::procstat::{self, Snapshot};
use crate::progress::say;
use crate::relays::{check_alive, migrate, start_relay, stop, Wakeup};
use crate::settings::{Settings, SQS_LATENCY};
use crate::sink::Sink;
use crate::stats::{median, quantile, shares, signed_ms};
use crate::support::pg::PrivatePg;
use crate::support::{RelayProcess, TestDb};
use crate::workload::{self, Written, WRITER_APP};

/// What the writers' backends waited on, sampled every 100 ms: `CPU` (running, or waiting
/// for a core), `idle` (the benchmark has the next INSERT on its way), or the wait event
/// (`IO:WALSync` is the commit's flush; `Lock:object` on NOTIFY's queue lock, `LWLock:…`).
pub struct WaitSampler {
    /// Set by [`WaitSampler::finish`]; the sampling task ends at its next tick.
    stop: Arc<AtomicBool>,
    /// The sampling task; it returns the samples counted by wait.
    task: JoinHandle<BTreeMap<String, u64>>,
}

impl WaitSampler {
    /// Samples the writers' backends.
    pub async fn start(db: &TestDb) -> WaitSampler {
        WaitSampler::start_for(db, WRITER_APP).await
    }

    /// Samples the backends whose `application_name` is like `pattern` (the relay's:
    /// `outbox-relay%`).
    pub async fn start_for(db: &TestDb, pattern: &'static str) -> WaitSampler {
        let client = db.client().await;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let task = tokio::spawn(async move {
            let mut waits = BTreeMap::new();
            let statement = client
                .prepare(
                    "SELECT state, coalesce(wait_event_type || ':' || wait_event, '') \
                     FROM pg_stat_activity \
                     WHERE datname = current_database() AND application_name LIKE $1",
                )
                .await
                .expect("prepare the wait sample");
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            while !stopped.load(Ordering::Relaxed) {
                tick.tick().await;
                let Ok(rows) = client.query(&statement, &[&pattern]).await else {
                    break;
                };
                for row in rows {
                    let state: Option<String> = row.get(0);
                    let wait: String = row.get(1);
                    let key = match state.as_deref() {
                        Some("active") if wait.is_empty() || wait.starts_with("Client") => {
                            "CPU".to_string()
                        }
                        Some("active") => wait,
                        _ => "idle".to_string(),
                    };
                    *waits.entry(key).or_insert(0) += 1;
                }
            }
            waits
        });
        WaitSampler { stop, task }
    }

    pub async fn finish(self) -> BTreeMap<String, u64> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap_or_default()
    }
}

/// One measurement: `writers` closed-loop writers for a while, with or without the relay.
pub struct HarmCell {
    /// Closed-loop writers of the cell.
    pub writers: usize,
    /// 0-based alternation the cell belongs to.
    pub round: usize,
    /// Whether a relay (and the outbox trigger) ran during the cell.
    pub with_relay: bool,
    /// What the writers reached: the figure compared with and without.
    pub commits_per_second: f64,
    /// Writer time of the cell.
    pub seconds: f64,
    /// Commit-to-sent of every event (with the relay only), sorted; and how many never
    /// arrived within the wait.
    pub latencies_ms: Vec<f64>,
    /// See `latencies_ms`.
    pub missing: usize,
    /// What the writers' backends waited on, sampled (see [`WaitSampler`]).
    pub writer_waits: BTreeMap<String, u64>,
    /// CPU of every process on the machine during the cell.
    pub cpu: Snapshot,
    /// CPU seconds of the relay during the cell (0 without).
    pub relay_cpu: f64,
}

/// Every cell of one wake-up mode, on one cluster.
pub struct HarmRun {
    /// The wake-up mode every cell's relay ran with.
    pub wakeup: Wakeup,
    /// Every cell, in the order run.
    pub cells: Vec<HarmCell>,
}

/// Medians of one (mode, writers) pair.
pub struct HarmSummary {
    /// The writer count summarised.
    pub writers: usize,
    /// Commits/s of each cell without the relay.
    pub without: Vec<f64>,
    /// Commits/s of each cell with the relay.
    pub with: Vec<f64>,
    /// Commit-to-sent over every with-relay cell, sorted.
    pub latencies_ms: Vec<f64>,
    /// Events that never arrived, over every with-relay cell.
    pub missing: usize,
}

impl HarmSummary {
    pub fn ratio(&self) -> f64 {
        median(&self.with) / median(&self.without)
    }
}

impl HarmRun {
    pub fn summaries(&self) -> Vec<HarmSummary> {
        let mut writers: Vec<usize> = self.cells.iter().map(|c| c.writers).collect();
        writers.dedup();
        writers.sort_unstable();
        writers.dedup();
        writers
            .into_iter()
            .map(|w| {
                let cells = || self.cells.iter().filter(move |c| c.writers == w);
                let mut latencies_ms: Vec<f64> = cells()
                    .flat_map(|c| c.latencies_ms.iter().copied())
                    .collect();
                latencies_ms.sort_by(f64::total_cmp);
                HarmSummary {
                    writers: w,
                    without: cells()
                        .filter(|c| !c.with_relay)
                        .map(|c| c.commits_per_second)
                        .collect(),
                    with: cells()
                        .filter(|c| c.with_relay)
                        .map(|c| c.commits_per_second)
                        .collect(),
                    latencies_ms,
                    missing: cells().map(|c| c.missing).sum(),
                }
            })
            .collect()
    }

    pub fn to_json(&self) -> Value {
        json!({
            "wakeup": self.wakeup.label(),
            "cluster": self.wakeup.cluster_label(),
            "summary": self.summaries().iter().map(|s| json!({
                "writers": s.writers,
                "commits_per_second_without_relay": s.without,
                "commits_per_second_with_relay": s.with,
                "median_without": median(&s.without),
                "median_with": median(&s.with),
                "with_over_without": s.ratio(),
                "commit_to_sent_p50_ms": quantile(&s.latencies_ms, 0.5),
                "commit_to_sent_p99_ms": quantile(&s.latencies_ms, 0.99),
                "commit_to_sent_p999_ms": quantile(&s.latencies_ms, 0.999),
                "commit_to_sent_max_ms": s.latencies_ms.last(),
                "events_never_arrived": s.missing,
            })).collect::<Vec<_>>(),
            "cells": self.cells.iter().map(|c| json!({
                "writers": c.writers,
                "round": c.round,
                "with_relay": c.with_relay,
                "commits_per_second": c.commits_per_second,
                "seconds": c.seconds,
                "commit_to_sent_p50_ms": (!c.latencies_ms.is_empty()).then(|| quantile(&c.latencies_ms, 0.5)),
                "commit_to_sent_p99_ms": (!c.latencies_ms.is_empty()).then(|| quantile(&c.latencies_ms, 0.99)),
                "writer_backend_samples": c.writer_waits,
                "postgres_cpu_seconds": c.cpu.postgres,
                "relay_cpu_seconds": c.relay_cpu,
                "bench_process_cpu_seconds": c.cpu.bench,
                "other_processes_cpu_seconds": c.cpu.others(c.relay_cpu),
                "machine_busy_cores": c.cpu.busy_cores(c.seconds),
            })).collect::<Vec<_>>(),
        })
    }
}

/// Alternates without / with the relay `settings.harm_rounds` times for each writer count
/// (the order flips every round, so a drift of the machine favours neither side).
pub async fn harm(
    settings: &Settings,
    cluster: &PrivatePg,
    wakeup: &Wakeup,
    writer_counts: &[usize],
) -> HarmRun {
    let db = cluster.create_db().await;
    migrate(&db, wakeup).await;
    let mut cells = Vec::new();
    for round in 0..settings.harm_rounds {
        for &writers in writer_counts {
            let order = if round % 2 == 0 {
                [false, true]
            } else {
                [true, false]
            };
            for with_relay in order {
                let cell = harm_cell(settings, &db, wakeup, writers, round, with_relay).await;
                say(&format!(
                    "  harm, {}, {writers} writer(s), round {}, {}: {:.0} commits/s{}; writers: {}",
                    wakeup.label(),
                    round + 1,
                    if with_relay { "with relay" } else { "without" },
                    cell.commits_per_second,
                    if with_relay {
                        format!(
                            ", commit-to-sent p50 {:.1} ms p99 {:.1} ms",
                            quantile(&cell.latencies_ms, 0.5),
                            quantile(&cell.latencies_ms, 0.99)
                        )
                    } else {
                        String::new()
                    },
                    shares(&cell.writer_waits),
                ));
                cells.push(cell);
            }
        }
    }
    drop_db(cluster, &db).await;
    HarmRun {
        wakeup: wakeup.clone(),
        cells,
    }
}

/// Every cell starts from an empty table just after a checkpoint: the same full-page writes,
/// no backlog left by a cell without the relay for the next one to drain; `trigger` off means
/// without the relay's trigger too.
pub async fn reset_outbox(db: &TestDb, trigger: bool) {
    let admin = db.client().await;
    admin
        .batch_execute(&format!(
            "TRUNCATE outbox CASCADE; ALTER TABLE outbox {} TRIGGER USER; CHECKPOINT",
            if trigger { "ENABLE" } else { "DISABLE" }
        ))
        .await
        .expect("reset the outbox for a harm cell");
}

/// Waits (up to 60 s) until `sink` has every event `written` committed, stops `relay`, and
/// returns each event's commit-to-sent, sorted, and how many never arrived.
pub async fn commit_to_sent(
    sink: &Sink,
    relay: RelayProcess,
    written: &Written,
) -> (Vec<f64>, usize) {
    let (each, missing) = each_commit_to_sent(sink, relay, &written.commits).await;
    let mut latencies_ms: Vec<f64> = each.into_iter().map(|(_, ms)| ms).collect();
    latencies_ms.sort_by(f64::total_cmp);
    (latencies_ms, missing)
}

/// [`commit_to_sent`] event by event: (when it committed, its commit-to-sent in ms), in the
/// order of `commits`, and how many never arrived.
pub async fn each_commit_to_sent(
    sink: &Sink,
    relay: RelayProcess,
    commits: &[(u64, Instant)],
) -> (Vec<(Instant, f64)>, usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while sink.arrivals_len() < commits.len() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    check_alive(std::slice::from_ref(&relay));
    stop(std::slice::from_ref(&relay)).await;
    let mut arrived: BTreeMap<u64, Instant> = BTreeMap::new();
    for (n, at) in sink.arrivals() {
        let slot = arrived.entry(n).or_insert(at);
        *slot = (*slot).min(at);
    }
    let (mut each, mut missing) = (Vec::new(), 0);
    for (n, commit) in commits {
        match arrived.get(n) {
            Some(at) => each.push((*commit, signed_ms(*commit, *at))),
            None => missing += 1,
        }
    }
    (each, missing)
}

async fn harm_cell(
    settings: &Settings,
    db: &TestDb,
    wakeup: &Wakeup,
    writers: usize,
    round: usize,
    with_relay: bool,
) -> HarmCell {
    reset_outbox(db, with_relay).await;
    let tag = format!("h{writers}r{round}{}", if with_relay { "w" } else { "o" });
    let mut relay = None;
    let sink = Sink::start(SQS_LATENCY, with_relay).await;
    if with_relay {
        let id = format!("bench-harm-{tag}");
        relay = Some(start_relay(settings, db, wakeup, &sink, &id, &[]).await);
    }
    let relay_cpu_before = relay
        .as_ref()
        .and_then(|r| procstat::cpu_seconds(r.pid()))
        .unwrap_or(0.0);
    let before = Snapshot::take();
    let waits = WaitSampler::start(db).await;
    let written = workload::closed_loop(db, &tag, writers, settings.harm_seconds).await;
    let writer_waits = waits.finish().await;
    let cpu = Snapshot::take().since(&before);
    let relay_cpu = relay
        .as_ref()
        .and_then(|r| procstat::cpu_seconds(r.pid()))
        .unwrap_or(0.0)
        - relay_cpu_before;
    let (latencies_ms, missing) = match relay {
        Some(relay) => commit_to_sent(&sink, relay, &written).await,
        None => (Vec::new(), 0),
    };
    HarmCell {
        writers,
        round,
        with_relay,
        commits_per_second: written.commits_per_second(),
        seconds: written.seconds,
        latencies_ms,
        missing,
        writer_waits,
        cpu,
        relay_cpu,
    }
}

/// Every writer count for the build's default wake-up, the other modes at 16 writers.
pub async fn run(settings: &Settings, clusters: &mut Clusters, modes: &[Wakeup]) -> Vec<HarmRun> {
    let mut runs = Vec::new();
    // Every writer count for the default mode; the others at 16 writers, enough to show
    // what each costs where commits group.
    for (i, wakeup) in modes.iter().enumerate() {
        let writers: &[usize] = if i == 0 { &[1, 16, 64] } else { &[16] };
        let run = harm(settings, clusters.for_mode(wakeup).await, wakeup, writers).await;
        for s in run.summaries() {
            say(&format!(
                "harm, {}, {} writer(s): {:.0} commits/s with the relay, {:.0} without: {:.2}; commit-to-sent p50 {:.1} ms, p99 {:.1} ms, p99.9 {:.1} ms",
                wakeup.label(),
                s.writers,
                median(&s.with),
                median(&s.without),
                s.ratio(),
                quantile(&s.latencies_ms, 0.5),
                quantile(&s.latencies_ms, 0.99),
                quantile(&s.latencies_ms, 0.999),
            ));
        }
        runs.push(run);
    }
    clusters.stop();
    runs
}
