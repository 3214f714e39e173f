//! Group `idle`: what relays with nothing to send cost, on the durable clusters.

use std::collections::BTreeMap;
use std::time::Instant;

use serde_json::{json, Value};

use crate::cluster::{drop_db, Clusters};
use crate::procstat;
use crate::progress::say;
use crate::relays::{check_alive, migrate, start_relay, stop, Wakeup};
use crate::settings::{Settings, SQS_LATENCY};
use crate::sink::Sink;
use crate::support::pg::PrivatePg;
use crate::support::{RelayProcess, TestDb};

/// Idle relays of one mode: what they cost while there is nothing to send.
pub struct IdleRun {
    /// The relays' wake-up mode.
    pub wakeup: Wakeup,
    /// Idle relays in the set.
    pub relays: usize,
    /// Length of the measured window.
    pub seconds: f64,
    /// Transactions the relays' database saw (pg_stat_database xact_commit + xact_rollback).
    pub transactions: i64,
    /// CPU of the relays' own backends (walsenders included), and of the relay processes.
    pub backend_cpu: f64,
    /// See `backend_cpu`.
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
    /// Which durable cluster: plain or `wal_level=logical`.
    pub cluster: &'static str,
    /// Length of the measured window.
    pub seconds: f64,
    /// CPU seconds of the cluster's whole process tree over the window.
    pub cpu: f64,
}

struct IdleSetup {
    /// The set's wake-up mode.
    wakeup: Wakeup,
    /// The set's own database: its transactions and backends are the set's.
    db: TestDb,
    /// The set's relays, running.
    relays: Vec<RelayProcess>,
    /// Whether the set runs on the `wal_level=logical` cluster.
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
    let pids = |logical: bool| -> Option<u32> { clusters.running(logical)?.pid() };
    let cluster_cpu_before: Vec<(bool, f64)> = [false, true]
        .into_iter()
        .filter_map(|l| Some((l, procstat::tree_cpu_seconds(pids(l)?))))
        .collect();
    let mut before = Vec::new();
    for s in &setups {
        let cluster = clusters
            .running(s.cluster_logical)
            .expect("cluster running");
        before.push(idle_sample(cluster, s).await);
    }
    let started = Instant::now();
    tokio::time::sleep(settings.idle_window).await;
    let mut runs = Vec::new();
    for (s, b) in setups.iter().zip(&before) {
        let cluster = clusters
            .running(s.cluster_logical)
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
        check_alive(&s.relays);
        stop(&s.relays).await;
    }
    for s in &setups {
        let cluster = clusters
            .running(s.cluster_logical)
            .expect("cluster running");
        drop_db(cluster, &s.db).await;
    }
    (runs, cluster_cpu)
}

struct IdleSample {
    /// xact_commit + xact_rollback of the set's database.
    transactions: i64,
    /// pid -> CPU seconds of each backend connected to the set's database.
    backends: BTreeMap<u32, f64>,
    /// CPU seconds of the set's relay processes.
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

/// 1 and 4 idle relays of every mode, a progress line for each set and cluster.
pub async fn run(
    settings: &Settings,
    clusters: &mut Clusters,
    modes: &[Wakeup],
) -> (Vec<IdleRun>, Vec<IdleClusterCpu>) {
    let (runs, cluster_cpu) = idle(settings, clusters, modes).await;
    for r in &runs {
        say(&format!(
            "idle, {}, {} relay(s): {:.2} transactions/s, their backends {:.2}% of a core, relays {:.2}%",
            r.wakeup.label(),
            r.relays,
            r.per_second(r.transactions as f64),
            r.per_second(r.backend_cpu) * 100.0,
            r.per_second(r.relay_cpu) * 100.0,
        ));
    }
    for c in &cluster_cpu {
        say(&format!(
            "idle, whole {} cluster (every set above on it at once): {:.2}% of a core",
            c.cluster,
            c.cpu / c.seconds * 100.0
        ));
    }
    (runs, cluster_cpu)
}
