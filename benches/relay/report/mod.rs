//! Results: the table printed at the end, results.json, and the data files the plots read.
//!
//! One file a part: [`tables`] the tables of delivery and ceilings, [`drain_tables`] those of
//! the long-group, large-event and tracing drains, [`cost_tables`] those of what the relay
//! costs the application, [`verdict`] the ratios and targets, [`files`] what is written to
//! disk; this file the results themselves and the runs the others look up.

mod cost_tables;
mod drain_tables;
mod files;
mod tables;
mod verdict;

use std::time::Duration;

use serde_json::{json, Value};

use crate::backlog::BacklogRun;
use crate::ceiling::CeilingRun;
use crate::drain::{Destination, DrainRun};
use crate::harm::HarmRun;
use crate::idle::{IdleClusterCpu, IdleRun};
use crate::settings::Settings;
use crate::steady::SteadyRun;
use crate::storage::StorageRun;
use crate::support;
use crate::tracing_group::TracingDrain;

/// Entries per SendMessageBatch request (SQS's limit, and what the relay packs).
const ENTRIES_PER_REQUEST: f64 = 10.0;

pub struct Report {
    meta: Value,
    pub payload_bytes: f64,
    pub ceilings: Vec<CeilingRun>,
    pub drains: Vec<DrainRun>,
    /// Ordered FIFO drains of one backlog over many groups and over one (`long-group`).
    pub long_group: Vec<DrainRun>,
    /// Drains of events near SQS's size limit under byte budgets (`large-events`).
    pub large_events: Vec<DrainRun>,
    /// The same drain with tracing off and on, rounds in rotated order (`tracing`).
    pub tracing: Vec<TracingDrain>,
    pub steady: Vec<SteadyRun>,
    pub harm: Vec<HarmRun>,
    pub idle: Vec<IdleRun>,
    pub idle_clusters: Vec<IdleClusterCpu>,
    pub storage: Vec<StorageRun>,
    /// A large backlog drained while the application commits at a steady rate (`big-backlog`).
    pub big_backlog: Vec<BacklogRun>,
    pub seconds: f64,
    ordered_flag: bool,
    batch: usize,
    in_flight: usize,
}

struct Target {
    what: String,
    goal: String,
    value: Option<f64>,
    met: Option<bool>,
    note: String,
}

impl Report {
    pub async fn new(settings: &Settings, ordered_flag: bool) -> Report {
        let (admin, connection) =
            tokio_postgres::connect(&support::pg().admin_url(), tokio_postgres::NoTls)
                .await
                .expect("connect to the benchmark PostgreSQL");
        tokio::spawn(connection);
        let pg_version: String = admin
            .query_one("SHOW server_version", &[])
            .await
            .expect("server version")
            .get(0);
        let command = |program: &str, args: &[&str]| {
            std::process::Command::new(program)
                .args(args)
                .current_dir(support::repo_root())
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        };
        let dirty = command("git", &["status", "--porcelain", "--", "src", "sql"])
            .is_some_and(|s| !s.is_empty());
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cores = cpuinfo
            .lines()
            .filter(|l| l.starts_with("processor"))
            .count();
        let model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string());
        Report {
            meta: json!({
                "date": command("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]),
                "commit": command("git", &["rev-parse", "--short", "HEAD"]),
                "src_modified_since_commit": dirty,
                "postgres": pg_version,
                "cores": cores,
                "cpu": model,
                "quick": settings.quick,
                "rows": settings.rows,
                "batch_size": settings.batch,
                "max_in_flight_default": settings.in_flight,
                "window_seconds": settings.window.as_secs(),
                "steady_seconds": settings.steady.as_secs(),
                "extra_relay_args": settings.relay_args,
                "relay_pg_options": settings.relay_pg_options,
                "relay_has_ordered_flag": ordered_flag,
            }),
            payload_bytes: 0.0,
            ceilings: Vec::new(),
            drains: Vec::new(),
            long_group: Vec::new(),
            large_events: Vec::new(),
            tracing: Vec::new(),
            steady: Vec::new(),
            harm: Vec::new(),
            idle: Vec::new(),
            idle_clusters: Vec::new(),
            storage: Vec::new(),
            big_backlog: Vec::new(),
            seconds: 0.0,
            ordered_flag,
            batch: settings.batch,
            in_flight: settings.in_flight,
        }
    }

    fn ceiling(&self, workers: usize) -> Option<f64> {
        self.ceiling_of(false, workers)
    }

    fn ceiling_of(&self, ordered: bool, workers: usize) -> Option<f64> {
        self.ceilings
            .iter()
            .find(|c| {
                !c.ceiling.minimal
                    && c.ceiling.ordered == ordered
                    && c.ceiling.workers == workers
                    && c.ceiling.batch == self.batch as i64
            })
            .map(|c| c.ceiling.rows_per_second())
    }

    /// The minimal claim + mark (1 connection, this run's batch).
    fn minimal_ceiling(&self) -> Option<f64> {
        self.ceilings
            .iter()
            .find(|c| c.ceiling.minimal)
            .map(|c| c.ceiling.rows_per_second())
    }

    fn base(&self) -> Option<&DrainRun> {
        self.drains.iter().find(|d| d.is_base(self.in_flight))
    }

    fn replicas(&self, n: usize) -> Option<&DrainRun> {
        if n == 1 {
            return self.base();
        }
        self.drains
            .iter()
            .find(|d| d.replicas == n && d.sink_latency() == Some(Duration::ZERO) && !d.fifo)
    }

    /// The FIFO drain with ordering when the relay has it, else the plain FIFO drain.
    fn ordered(&self) -> Option<&DrainRun> {
        let fifo = || self.drains.iter().filter(|d| d.fifo);
        fifo().find(|d| d.ordered).or_else(|| fifo().next())
    }

    fn fifo_unordered(&self) -> Option<&DrainRun> {
        self.drains.iter().find(|d| d.fifo && !d.ordered)
    }

    fn fauxqs(&self) -> Option<&DrainRun> {
        self.drains
            .iter()
            .find(|d| matches!(d.destination, Destination::Fauxqs))
    }

    fn sweep(&self) -> Vec<&DrainRun> {
        self.drains.iter().filter(|d| d.is_sweep()).collect()
    }

    fn sweep_at(&self, in_flight: usize) -> Option<&DrainRun> {
        self.sweep()
            .into_iter()
            .find(|d| d.max_in_flight == in_flight)
    }

    fn sweep_best(&self) -> Option<&DrainRun> {
        self.sweep()
            .into_iter()
            .max_by(|a, b| a.events_per_second().total_cmp(&b.events_per_second()))
    }

    /// Per destination of the long-group runs: (destination, one group's run, many groups' run).
    fn long_group_pairs(&self) -> Vec<(String, Option<&DrainRun>, Option<&DrainRun>)> {
        let mut destinations: Vec<String> = Vec::new();
        for d in &self.long_group {
            if !destinations.contains(&d.destination_label()) {
                destinations.push(d.destination_label());
            }
        }
        destinations
            .into_iter()
            .map(|dest| {
                let of = |one: bool| {
                    self.long_group
                        .iter()
                        .find(|d| d.destination_label() == dest && (d.groups == 1) == one)
                };
                (dest.clone(), of(true), of(false))
            })
            .collect()
    }

    /// One group's rate ÷ many groups', without the relays' start-up (see
    /// [`DrainRun::events_per_second_sending`]), and from their start.
    fn long_group_ratio(
        one: Option<&DrainRun>,
        many: Option<&DrainRun>,
    ) -> (Option<f64>, Option<f64>) {
        let (Some(one), Some(many)) = (one, many) else {
            return (None, None);
        };
        (
            one.events_per_second_sending()
                .zip(many.events_per_second_sending())
                .map(|(a, b)| a / b),
            Some(one.events_per_second() / many.events_per_second()),
        )
    }

    /// The large-event run at the relay's default byte budget.
    fn large_events_default(&self) -> Option<&DrainRun> {
        self.large_events
            .iter()
            .find(|d| !d.flags.iter().any(|f| f == "--max-bytes-in-flight"))
    }

    fn ratio(a: Option<&DrainRun>, b: Option<f64>) -> Option<f64> {
        Some(a?.events_per_second() / b?)
    }
}

fn fmt_ratio(v: Option<f64>) -> String {
    v.filter(|v| v.is_finite())
        .map_or("—".to_string(), |v| format!("{v:.2}"))
}
