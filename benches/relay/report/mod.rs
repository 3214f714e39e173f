//! Results: the table printed at the end, results.json, and the data files the plots read.
//!
//! One file a part: [`tables`] the tables of delivery and ceilings, [`drain_tables`] those of
//! the long-group, large-event and tracing drains, [`cost_tables`] those of what the relay
//! costs the application, [`verdict`] the ratios and targets, [`files`] what is written to
//! disk; this file the results themselves and the runs the others look up.

mod cost_tables;
mod drain_tables;
mod files;
mod horizon_table;
mod rates_table;
mod tables;
mod verdict;

use std::time::Duration;

use serde_json::Value;

use crate::backlog::BacklogRun;
use crate::ceiling::CeilingRun;
use crate::drain::{Destination, DrainRun};
use crate::harm::HarmRun;
use crate::horizon::HorizonRun;
use crate::idle::{IdleClusterCpu, IdleRun};
use crate::many_tables::ManyTablesRun;
use crate::own_core::OwnCoreRun;
use crate::rates::RatesRun;
use crate::settings::Settings;
use crate::steady::SteadyRun;
use crate::storage::StorageRun;
use crate::tracing_group::TracingDrain;
use crate::wal::WalRun;

/// Entries per SendMessageBatch request (SQS's limit, and what the relay packs).
const ENTRIES_PER_REQUEST: f64 = 10.0;

pub struct Report {
    /// When, where and on what the run measured (results.json's `meta`).
    meta: Value,
    /// Mean payload size of the ceilings' backlog, for the ceiling table's title.
    pub payload_bytes: f64,
    /// Group `ceiling`.
    pub ceilings: Vec<CeilingRun>,
    /// Groups `drain`, `replicas`, `ordered`, `sweep` and `pooler`.
    pub drains: Vec<DrainRun>,
    /// Ordered FIFO drains of one backlog over many groups and over one (`long-group`).
    pub long_group: Vec<DrainRun>,
    /// Drains of events near SQS's size limit under byte budgets (`large-events`).
    pub large_events: Vec<DrainRun>,
    /// The same drain with tracing off and on, rounds in rotated order (`tracing`).
    pub tracing: Vec<TracingDrain>,
    /// Group `steady`.
    pub steady: Vec<SteadyRun>,
    /// Group `harm`, one run per wake-up mode.
    pub harm: Vec<HarmRun>,
    /// Group `harm` (or `harm-own-core`): the database on a core of its own, with the
    /// log-based anchor; `None` when not run or skipped.
    pub own_core: Option<OwnCoreRun>,
    /// Group `rates`: the relay's cost at production rates; `None` when not run or skipped.
    pub rates: Option<RatesRun>,
    /// Group `horizon`: the relay's cost while a snapshot holds the vacuum horizon; `None`
    /// when not run or skipped.
    pub horizon: Option<HorizonRun>,
    /// Group `wal`: WAL and database CPU per relayed event, one run per settlement mode.
    pub wal: Vec<WalRun>,
    /// Group `wal`: the default drain on a durable cluster.
    pub durable_drain: Option<DrainRun>,
    /// Group `idle`: every set of idle relays.
    pub idle: Vec<IdleRun>,
    /// Group `idle`: each cluster as a whole over the same window.
    pub idle_clusters: Vec<IdleClusterCpu>,
    /// Group `storage`, one run per variant.
    pub storage: Vec<StorageRun>,
    /// A large backlog drained while the application commits at a steady rate (`big-backlog`).
    pub big_backlog: Vec<BacklogRun>,
    /// One relay serving many tables (`many-tables`); `None` when not run.
    pub many_tables: Option<ManyTablesRun>,
    /// The whole run's time.
    pub seconds: f64,
    /// Whether the build has `--ordered`: what the ordered target's note says.
    ordered_flag: bool,
    /// Every relay's `--batch-size`, for the titles and the ceiling lookups.
    batch: usize,
    /// The relay's default `--max-in-flight`: which drain is the base and which sweep run is the default.
    in_flight: usize,
}

struct Target {
    /// What is measured.
    what: String,
    /// The bound, as text (`≥ 0.95`, `≤ 5 ms`).
    goal: String,
    /// What the run measured; `None`: not run.
    value: Option<f64>,
    /// Whether `value` is within `goal`; `None`: not run.
    met: Option<bool>,
    /// What the reader needs to judge the figure (which run, which bound).
    note: String,
}

impl Report {
    /// An empty report of a run with `settings`; `meta` from [`crate::meta::collect`].
    pub fn new(settings: &Settings, ordered_flag: bool, meta: Value) -> Report {
        Report {
            meta,
            payload_bytes: 0.0,
            ceilings: Vec::new(),
            drains: Vec::new(),
            long_group: Vec::new(),
            large_events: Vec::new(),
            tracing: Vec::new(),
            steady: Vec::new(),
            harm: Vec::new(),
            own_core: None,
            rates: None,
            horizon: None,
            wal: Vec::new(),
            durable_drain: None,
            idle: Vec::new(),
            idle_clusters: Vec::new(),
            storage: Vec::new(),
            big_backlog: Vec::new(),
            many_tables: None,
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

// Run by selftest.rs (`cargo test --bench relay`): the bench has no libtest harness.
pub mod tests {
    use super::fmt_ratio;

    pub fn ratios_print_two_decimals_and_a_dash_for_none() {
        assert_eq!(fmt_ratio(Some(0.956)), "0.96");
        assert_eq!(fmt_ratio(None), "—");
        assert_eq!(fmt_ratio(Some(f64::NAN)), "—");
        assert_eq!(fmt_ratio(Some(f64::INFINITY)), "—");
    }
}
