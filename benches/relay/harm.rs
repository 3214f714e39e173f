//! What the relay costs the application's database: commit rate with and without the relay on
//! durable commits (`harm`), and what relays with nothing to send cost (`idle`).
//!
//! Both run on clusters of the benchmark's own with `fsync=on` and `synchronous_commit=on`, as
//! in production: with `fsync=off` a commit never waits for its WAL flush, so whatever
//! serializes commits (NOTIFY's database-wide lock, MEASURED.md trap 4) costs next to nothing.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::task::JoinHandle;

use crate::procstat::{self, Snapshot};
use crate::report::quantile;
use crate::sink::Sink;
use crate::support::pg::PrivatePg;
use crate::support::{self, RelayProcess, TestDb};
use crate::workload::{self, WRITER_APP};
use crate::{Settings, SQS_LATENCY};

/// Durable commits, as in production.
pub const DURABLE: &[&str] = &["fsync=on", "synchronous_commit=on"];
/// The same, with the WAL a logical-decoding wake-up needs.
pub const DURABLE_LOGICAL: &[&str] = &["fsync=on", "synchronous_commit=on", "wal_level=logical"];

/// How an idle relay learns of new rows: a `--wakeup` mode, or the NOTIFY trigger of builds
/// that have no such flag.
#[derive(Clone, Debug, PartialEq)]
pub struct Wakeup {
    pub mode: Option<String>,
}

impl Wakeup {
    /// The build's modes, its default first; builds without `--wakeup` have one.
    pub fn modes(relay_help: &str) -> Vec<Wakeup> {
        if !relay_help.contains("--wakeup") {
            return vec![Wakeup { mode: None }];
        }
        let default = crate::help_value(relay_help, "--wakeup").unwrap_or_else(|| "poll".into());
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

/// The durable clusters, started when first needed and stopped when a group is done.
#[derive(Default)]
pub struct Clusters {
    durable: Option<PrivatePg>,
    logical: Option<PrivatePg>,
}

impl Clusters {
    pub async fn for_mode(&mut self, wakeup: &Wakeup) -> &PrivatePg {
        if wakeup.needs_logical_wal() {
            self.logical().await
        } else {
            self.durable().await
        }
    }

    pub async fn durable(&mut self) -> &PrivatePg {
        if self.durable.is_none() {
            self.durable = Some(PrivatePg::start_with(DURABLE).await);
        }
        self.durable.as_ref().expect("started")
    }

    pub async fn logical(&mut self) -> &PrivatePg {
        if self.logical.is_none() {
            self.logical = Some(PrivatePg::start_with(DURABLE_LOGICAL).await);
        }
        self.logical.as_ref().expect("started")
    }

    /// Stops both, so that their background processes do not run beside the next group.
    pub fn stop(&mut self) {
        self.durable = None;
        self.logical = None;
    }
}

/// `outbox-relay migrate` on `db` for `wakeup`, as an operator would run it.
pub async fn migrate(db: &TestDb, wakeup: &Wakeup) {
    let mut args = vec![
        "migrate".to_string(),
        "--database-url".to_string(),
        db.url.clone(),
    ];
    args.extend(wakeup.flags());
    let (status, output) = support::run_to_end(&args, &[], Duration::from_secs(120)).await;
    assert!(status.success(), "outbox-relay {args:?} failed:\n{output}");
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
    let url = settings.relay_url(&db.url);
    let mut args: Vec<String> = [
        "run",
        "--database-url",
        &url,
        "--queue-url",
        &sink.queue_url("bench"),
        "--sqs-endpoint-url",
        &sink.endpoint,
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
    crate::check_alive(std::slice::from_ref(&relay));
    relay
}

/// What the writers' backends waited on, sampled every 100 ms: `CPU` (running, or waiting
/// for a core), `idle` (the benchmark has the next INSERT on its way), or the wait event
/// (`IO:WALSync` is the commit's flush; `Lock:object` on NOTIFY's queue lock, `LWLock:…`).
pub struct WaitSampler {
    stop: Arc<AtomicBool>,
    task: JoinHandle<BTreeMap<String, u64>>,
}

impl WaitSampler {
    pub async fn start(db: &TestDb) -> WaitSampler {
        let client = db.client().await;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let task = tokio::spawn(async move {
            let mut waits = BTreeMap::new();
            let statement = client
                .prepare(
                    "SELECT state, coalesce(wait_event_type || ':' || wait_event, '') \
                     FROM pg_stat_activity \
                     WHERE datname = current_database() AND application_name = $1",
                )
                .await
                .expect("prepare the wait sample");
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            while !stopped.load(Ordering::Relaxed) {
                tick.tick().await;
                let Ok(rows) = client.query(&statement, &[&WRITER_APP]).await else {
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

/// `share%` of each key, largest first, the small ones left out.
pub fn shares(map: &BTreeMap<String, u64>) -> String {
    let total: u64 = map.values().sum();
    let mut v: Vec<(&String, &u64)> = map.iter().collect();
    v.sort_by(|a, b| b.1.cmp(a.1));
    v.iter()
        .filter(|(_, n)| **n * 100 >= total.max(1))
        .map(|(k, n)| format!("{k} {:.0}%", **n as f64 * 100.0 / total.max(1) as f64))
        .collect::<Vec<_>>()
        .join(", ")
}

/// One measurement: `writers` closed-loop writers for a while, with or without the relay.
pub struct HarmCell {
    pub writers: usize,
    pub round: usize,
    pub with_relay: bool,
    pub commits_per_second: f64,
    pub seconds: f64,
    /// Commit-to-sent of every event (with the relay only), sorted; and how many never
    /// arrived within the wait.
    pub latencies_ms: Vec<f64>,
    pub missing: usize,
    pub writer_waits: BTreeMap<String, u64>,
    pub cpu: Snapshot,
    pub relay_cpu: f64,
}

/// Every cell of one wake-up mode, on one cluster.
pub struct HarmRun {
    pub wakeup: Wakeup,
    pub cells: Vec<HarmCell>,
}

/// Medians of one (mode, writers) pair.
pub struct HarmSummary {
    pub writers: usize,
    pub without: Vec<f64>,
    pub with: Vec<f64>,
    /// Commit-to-sent over every with-relay cell, sorted.
    pub latencies_ms: Vec<f64>,
    pub missing: usize,
}

impl HarmSummary {
    pub fn ratio(&self) -> f64 {
        median(&self.with) / median(&self.without)
    }
}

pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
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
                crate::say(&format!(
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

async fn harm_cell(
    settings: &Settings,
    db: &TestDb,
    wakeup: &Wakeup,
    writers: usize,
    round: usize,
    with_relay: bool,
) -> HarmCell {
    // Every cell starts from an empty table just after a checkpoint: the same full-page
    // writes, no backlog left by a cell without the relay for the next one to drain, and
    // "without" means without the trigger too.
    let admin = db.client().await;
    admin
        .batch_execute(&format!(
            "TRUNCATE outbox; ALTER TABLE outbox {} TRIGGER USER; CHECKPOINT",
            if with_relay { "ENABLE" } else { "DISABLE" }
        ))
        .await
        .expect("reset the outbox for a harm cell");
    drop(admin);
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
    let (mut latencies_ms, mut missing) = (Vec::new(), 0);
    if let Some(relay) = relay {
        let deadline = Instant::now() + Duration::from_secs(60);
        while sink.arrivals_len() < written.commits.len() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        crate::check_alive(std::slice::from_ref(&relay));
        relay.sigterm();
        if relay.wait_exit(Duration::from_secs(30)).await.is_none() {
            relay.kill9();
        }
        let mut arrived: BTreeMap<u64, Instant> = BTreeMap::new();
        for (n, at) in sink.arrivals() {
            let slot = arrived.entry(n).or_insert(at);
            *slot = (*slot).min(at);
        }
        for (n, commit) in &written.commits {
            match arrived.get(n) {
                Some(at) => latencies_ms.push(signed_ms(*commit, *at)),
                None => missing += 1,
            }
        }
        latencies_ms.sort_by(f64::total_cmp);
    }
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

/// `arrival - commit` in milliseconds; negative when the event reached the sink before the
/// INSERT's reply reached the writer.
pub fn signed_ms(commit: Instant, arrival: Instant) -> f64 {
    if arrival >= commit {
        (arrival - commit).as_secs_f64() * 1000.0
    } else {
        -((commit - arrival).as_secs_f64() * 1000.0)
    }
}

pub async fn drop_db(cluster: &PrivatePg, db: &TestDb) {
    let (client, connection) = tokio_postgres::connect(&cluster.admin_url(), tokio_postgres::NoTls)
        .await
        .expect("connect as admin");
    let driver = tokio::spawn(connection);
    client
        .batch_execute(&format!("DROP DATABASE {} WITH (FORCE)", db.name))
        .await
        .expect("drop a benchmark database");
    drop(client);
    let _ = driver.await;
}

/// Idle relays of one mode: what they cost while there is nothing to send.
pub struct IdleRun {
    pub wakeup: Wakeup,
    pub relays: usize,
    pub seconds: f64,
    /// Transactions the relays' database saw (pg_stat_database xact_commit + xact_rollback).
    pub transactions: i64,
    /// CPU of the relays' own backends (walsenders included), and of the relay processes.
    pub backend_cpu: f64,
    pub relay_cpu: f64,
}

impl IdleRun {
    pub fn per_second(&self, v: f64) -> f64 {
        v / self.seconds
    }

    pub fn to_json(&self) -> Value {
        json!({
            "wakeup": self.wakeup.label(),
            "cluster": self.wakeup.cluster_label(),
            "relays": self.relays,
            "seconds": self.seconds,
            "transactions": self.transactions,
            "transactions_per_second": self.per_second(self.transactions as f64),
            "postgres_backends_cpu_seconds": self.backend_cpu,
            "postgres_backends_percent_of_a_core": self.per_second(self.backend_cpu) * 100.0,
            "relay_cpu_seconds": self.relay_cpu,
            "relay_percent_of_a_core": self.per_second(self.relay_cpu) * 100.0,
        })
    }
}

/// What one idle window measured on each cluster as a whole (postmaster and every process).
pub struct IdleClusterCpu {
    pub cluster: &'static str,
    pub seconds: f64,
    pub cpu: f64,
}

struct IdleSetup {
    wakeup: Wakeup,
    db: TestDb,
    relays: Vec<RelayProcess>,
    cluster_logical: bool,
}

/// 1 and 4 idle relays of every mode, all at once, each set in a database of its own, so one
/// window measures them all; the database of each set tells its transactions and backends
/// apart. Relays settle for `settings.idle_settle` first, so an adaptive wait has stretched.
pub async fn idle(
    settings: &Settings,
    clusters: &mut Clusters,
    modes: &[Wakeup],
) -> (Vec<IdleRun>, Vec<IdleClusterCpu>) {
    let sink = Sink::start(SQS_LATENCY, false).await;
    let mut setups = Vec::new();
    for wakeup in modes {
        for relays in [1usize, 4] {
            let cluster = clusters.for_mode(wakeup).await;
            let db = cluster.create_db().await;
            migrate(&db, wakeup).await;
            let ids: Vec<String> = (0..relays)
                .map(|i| {
                    format!(
                        "bench-idle-{}-{relays}-{i}",
                        wakeup.mode.as_deref().unwrap_or("trigger")
                    )
                })
                .collect();
            let started = futures_util::future::join_all(
                ids.iter()
                    .map(|id| start_relay(settings, &db, wakeup, &sink, id, &[])),
            )
            .await;
            setups.push(IdleSetup {
                wakeup: wakeup.clone(),
                db,
                relays: started,
                cluster_logical: wakeup.needs_logical_wal(),
            });
        }
    }
    tokio::time::sleep(settings.idle_settle).await;
    let pids = |logical: bool| -> Option<u32> {
        if logical {
            clusters.logical.as_ref()?.pid()
        } else {
            clusters.durable.as_ref()?.pid()
        }
    };
    let cluster_cpu_before: Vec<(bool, f64)> = [false, true]
        .into_iter()
        .filter_map(|l| Some((l, procstat::tree_cpu_seconds(pids(l)?))))
        .collect();
    let mut before = Vec::new();
    for s in &setups {
        let cluster = if s.cluster_logical {
            clusters.logical.as_ref()
        } else {
            clusters.durable.as_ref()
        }
        .expect("cluster running");
        before.push(idle_sample(cluster, s).await);
    }
    let started = Instant::now();
    tokio::time::sleep(settings.idle_window).await;
    let mut runs = Vec::new();
    for (s, b) in setups.iter().zip(&before) {
        let cluster = if s.cluster_logical {
            clusters.logical.as_ref()
        } else {
            clusters.durable.as_ref()
        }
        .expect("cluster running");
        let a = idle_sample(cluster, s).await;
        // Backends present at both ends; one that reconnected in between is left out.
        let backend_cpu: f64 = a
            .backends
            .iter()
            .filter_map(|(pid, cpu)| Some(cpu - b.backends.get(pid)?))
            .sum();
        runs.push(IdleRun {
            wakeup: s.wakeup.clone(),
            relays: s.relays.len(),
            seconds: started.elapsed().as_secs_f64(),
            transactions: a.transactions - b.transactions,
            backend_cpu,
            relay_cpu: a.relay_cpu - b.relay_cpu,
        });
    }
    let seconds = started.elapsed().as_secs_f64();
    let cluster_cpu = cluster_cpu_before
        .into_iter()
        .filter_map(|(l, cpu)| {
            Some(IdleClusterCpu {
                cluster: if l {
                    "durable, wal_level=logical"
                } else {
                    "durable"
                },
                seconds,
                cpu: procstat::tree_cpu_seconds(pids(l)?) - cpu,
            })
        })
        .collect();
    for s in &setups {
        crate::check_alive(&s.relays);
        for relay in &s.relays {
            relay.sigterm();
        }
        for relay in &s.relays {
            if relay.wait_exit(Duration::from_secs(30)).await.is_none() {
                relay.kill9();
            }
        }
    }
    for s in &setups {
        let cluster = if s.cluster_logical {
            clusters.logical.as_ref()
        } else {
            clusters.durable.as_ref()
        }
        .expect("cluster running");
        drop_db(cluster, &s.db).await;
    }
    (runs, cluster_cpu)
}

struct IdleSample {
    transactions: i64,
    /// pid -> CPU seconds of each backend connected to the set's database.
    backends: BTreeMap<u32, f64>,
    relay_cpu: f64,
}

/// Read from the cluster's `postgres` database, so the sample itself adds nothing to the
/// set's database.
async fn idle_sample(cluster: &PrivatePg, setup: &IdleSetup) -> IdleSample {
    let (client, connection) = tokio_postgres::connect(&cluster.admin_url(), tokio_postgres::NoTls)
        .await
        .expect("connect as admin");
    let driver = tokio::spawn(connection);
    let transactions: i64 = client
        .query_one(
            "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database WHERE datname = $1",
            &[&setup.db.name],
        )
        .await
        .expect("pg_stat_database")
        .get(0);
    let pids: Vec<i32> = client
        .query(
            "SELECT pid FROM pg_stat_activity WHERE datname = $1",
            &[&setup.db.name],
        )
        .await
        .expect("pg_stat_activity")
        .iter()
        .map(|r| r.get(0))
        .collect();
    drop(client);
    let _ = driver.await;
    IdleSample {
        transactions,
        backends: pids
            .into_iter()
            .filter_map(|pid| Some((pid as u32, procstat::cpu_seconds(pid as u32)?)))
            .collect(),
        relay_cpu: setup
            .relays
            .iter()
            .filter_map(|r| procstat::cpu_seconds(r.pid()))
            .sum(),
    }
}
