//! A steady run second by second, to tell why a relay falls behind: the backlog (committed but
//! not yet at the sink), what finding the next claimable rows costs right now (the claim's
//! candidate scan under EXPLAIN ANALYZE: time and index/heap buffers it touched), the dead
//! rows VACUUM has not removed yet and when autovacuum ran, and who used the CPU.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::task::JoinHandle;

use crate::procstat::{self, Snapshot};
use crate::sink::Sink;
use crate::support::TestDb;

/// The claim's candidate scan (sql/claim_candidates.sql) without its row locks.
const PROBE: &str = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) \
    SELECT id FROM outbox \
    WHERE sent_at IS NULL AND quarantined_at IS NULL AND available_at <= now() \
      AND (lease_until IS NULL OR lease_until < now()) \
    ORDER BY id LIMIT 100";

#[derive(Debug, Clone, Copy)]
pub struct Second {
    /// Since the run started.
    pub seconds: f64,
    /// Events committed by then.
    pub committed: u64,
    /// Events the sink had received by then: `committed - arrived` is the backlog.
    pub arrived: u64,
    /// Time of the claim's candidate scan ([`PROBE`]) at that second.
    pub probe_ms: f64,
    /// Index and heap buffers that scan touched.
    pub probe_buffers: i64,
    /// n_dead_tup of the outbox table: what VACUUM has not removed yet.
    pub dead_rows: i64,
    /// autovacuum_count of the table: when autovacuum ran.
    pub autovacuums: i64,
    /// Cores the machine kept busy over the second.
    pub busy_cores: f64,
    /// Of those, PostgreSQL's.
    pub postgres_cores: f64,
    /// Of those, the relay's.
    pub relay_cores: f64,
}

impl Second {
    pub fn backlog(&self) -> i64 {
        self.committed as i64 - self.arrived as i64
    }

    pub fn to_json(self) -> Value {
        json!({
            "seconds": self.seconds,
            "committed": self.committed,
            "arrived": self.arrived,
            "backlog": self.backlog(),
            "candidate_scan_ms": self.probe_ms,
            "candidate_scan_buffers": self.probe_buffers,
            "dead_rows": self.dead_rows,
            "autovacuums_so_far": self.autovacuums,
            "machine_busy_cores": self.busy_cores,
            "postgres_cores": self.postgres_cores,
            "relay_cores": self.relay_cores,
        })
    }
}

pub struct Timeline {
    /// Set by [`Timeline::finish`]; the sampling task ends at its next tick.
    stop: Arc<AtomicBool>,
    /// The sampling task; it returns the seconds.
    task: JoinHandle<Vec<Second>>,
}

impl Timeline {
    pub async fn start(
        db: &TestDb,
        sink: Arc<Sink>,
        committed: Arc<AtomicU64>,
        relay_pid: u32,
    ) -> Timeline {
        let client = db.client().await;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let task = tokio::spawn(async move {
            let start = Instant::now();
            let mut seconds = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut last = (
                Instant::now(),
                Snapshot::take(),
                procstat::cpu_seconds(relay_pid).unwrap_or(0.0),
            );
            while !stopped.load(Ordering::Relaxed) {
                tick.tick().await;
                let Ok(plan) = client.query_one(PROBE, &[]).await else {
                    break;
                };
                let plan: Value = plan.get(0);
                let top = &plan[0];
                let node = &top["Plan"];
                let buffers = node["Shared Hit Blocks"].as_i64().unwrap_or(0)
                    + node["Shared Read Blocks"].as_i64().unwrap_or(0);
                let Ok(stats) = client
                    .query_one(
                        "SELECT coalesce(n_dead_tup, 0), autovacuum_count \
                         FROM pg_stat_user_tables WHERE relid = 'outbox'::regclass",
                        &[],
                    )
                    .await
                else {
                    break;
                };
                let now = (
                    Instant::now(),
                    Snapshot::take(),
                    procstat::cpu_seconds(relay_pid).unwrap_or(0.0),
                );
                let wall = (now.0 - last.0).as_secs_f64().max(1e-6);
                let cpu = now.1.since(&last.1);
                seconds.push(Second {
                    seconds: start.elapsed().as_secs_f64(),
                    committed: committed.load(Ordering::Relaxed),
                    arrived: sink.arrivals_len() as u64,
                    probe_ms: top["Execution Time"].as_f64().unwrap_or(f64::NAN),
                    probe_buffers: buffers,
                    dead_rows: stats.get(0),
                    autovacuums: stats.get(1),
                    busy_cores: cpu.machine_busy / wall,
                    postgres_cores: cpu.postgres / wall,
                    relay_cores: (now.2 - last.2) / wall,
                });
                last = now;
            }
            seconds
        });
        Timeline { stop, task }
    }

    pub async fn finish(self) -> Vec<Second> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap_or_default()
    }
}

/// One line: the largest backlog and when, the candidate scan at the start and at its worst,
/// dead rows at their most, autovacuum runs, and the busiest second.
pub fn summary(seconds: &[Second]) -> String {
    let Some(first) = seconds.first() else {
        return "no samples".to_string();
    };
    let worst_backlog = seconds
        .iter()
        .max_by_key(|s| s.backlog())
        .expect("non-empty");
    let worst_probe = seconds
        .iter()
        .max_by(|a, b| a.probe_ms.total_cmp(&b.probe_ms))
        .expect("non-empty");
    let busiest = seconds
        .iter()
        .max_by(|a, b| a.busy_cores.total_cmp(&b.busy_cores))
        .expect("non-empty");
    let last = seconds.last().expect("non-empty");
    format!(
        "backlog max {} at {:.0} s; candidate scan {:.2} ms / {} buffers at start, worst {:.2} ms / {} buffers at {:.0} s; dead rows max {}; autovacuums {}; busiest second {:.2} cores (postgres {:.2}, relay {:.2})",
        worst_backlog.backlog(),
        worst_backlog.seconds,
        first.probe_ms,
        first.probe_buffers,
        worst_probe.probe_ms,
        worst_probe.probe_buffers,
        worst_probe.seconds,
        seconds.iter().map(|s| s.dead_rows).max().unwrap_or(0),
        last.autovacuums - first.autovacuums,
        busiest.busy_cores,
        busiest.postgres_cores,
        busiest.relay_cores,
    )
}
