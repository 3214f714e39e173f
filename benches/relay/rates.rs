//! Group `rates`: what the relay costs at the rates production runs (issue 27), beside what
//! the application's own writes cost and what a log-based relay costs, in the same cells.
//!
//! Run it alone with
//!
//! ```text
//! cargo build --release --locked
//! OUTBOX_BENCH_ONLY=rates scripts/bench
//! ```
//!
//! (knobs: `OUTBOX_BENCH_RATES=200,2000` picks rates, `OUTBOX_BENCH_RATE_SECONDS` the measured
//! window of a cell, `OUTBOX_BENCH_RATE_ROUNDS` the rounds, `OUTBOX_BENCH_RELAY_ARGS` flags for
//! the relay, e.g. `--linger 50ms`; `--quick`: 5 s cells, one round).
//!
//! One durable cluster (`fsync=on`, `synchronous_commit=on`, `wal_level=logical`,
//! `pg_stat_statements` with `track_planning = on` and `track = all`), its postmaster (and so
//! every backend) on the first core, the writers, the SQS sink, the relay and `pg_recvlogical`
//! on the second (pinned.rs). For each rate (50, 200, 500, 2,000 and 5,000 events/s) and round,
//! three cells in an order rotated every round (stats::rotated), each from the same table state
//! (TRUNCATE of the outbox and its lease table, then CHECKPOINT):
//! - `none`: the application alone;
//! - `relay`: the relay with the build's defaults (plus `OUTBOX_BENCH_RELAY_ARGS`), connected
//!   as a role of its own ([`RELAY_ROLE`]), sending to the sink, which answers after 15 ms
//!   (settings::SQS_LATENCY) as in-region SQS does;
//! - `log-based`: a `pgoutput` slot on a publication of the table, streamed by `pg_recvlogical`.
//!
//! In each cell an open-loop writer commits one event per transaction at the rate: event n is
//! due at start + (n - 1) / rate (workload::Pacing), over [`writer_connections`] connections,
//! one per 100 events/s, so that a durable commit's 2–3.5 ms does not cap the rate. The first [`WARM_UP`] lets the relay (its fast polling) and
//! the slot reach their steady state; the measured window is the rest of the writer's time.
//! Over the window:
//! - from /proc, the CPU of every process of the cluster (procstat::tree_cpu: the scheduler's
//!   run time of each live process, schedstat, not clock ticks, which miss the short bursts of
//!   a backend at low rates; exited processes through the postmaster's reaped ticks), split by `pg_stat_activity` read at the window's
//!   start and again at its end (a connection the relay replaced is found then): the
//!   application's backends (`application_name` bench-writer), the relay's (role
//!   [`RELAY_ROLE`]), the WAL sender, and the rest (postmaster, WAL writer, checkpointer,
//!   background writer, autovacuum launcher and workers, the benchmark's own monitoring
//!   connection, and any backend that exited within the window: the writers keep their
//!   connections until the window has been read, since a writer's backend that exits first
//!   is counted here); the relay process's CPU and
//!   `pg_recvlogical`'s;
//! - from `pg_stat_statements` (reset at the window's start, read at its end), the relay
//!   role's statements (statements.rs): claims, the events they took, planning and execution
//!   per claim and per settlement, probes;
//! - from the sink, commit-to-sent of every event of the relay cell (the warm-up's included).
//!
//! The table, one line per rate, medians over rounds (min–max):
//! - `events/s`: the rate the writer reached in the window (events committed in it ÷ its
//!   length), relay cells;
//! - `app write µs/event`: the `none` cell's whole-cluster CPU ÷ its events;
//! - `relay adds µs/event (× app)`: the relay cell's cluster CPU per event minus the `none`
//!   cell's of the same round (per event, so that a writer a little off the rate changes
//!   nothing), and that ÷ the app's write (issue 27's target: ≤ 0.25);
//! - `its backends µs/event`: of that, what the relay's own backends used;
//! - `log-based adds µs/event (walsender)`: the same subtraction for the log-based cell, and
//!   its WAL sender's part;
//! - `relay ÷ log-based`: the two added costs' ratio, per round (target: ≤ 1);
//! - `relay process`: its CPU, % of a core and µs/event; `pg_recvlogical`: % of a core;
//! - `its backends µs per claim cycle`: the relay's backends' CPU over the claims (issue 47's
//!   target: ≤ 400), and `statements / transactions per cycle` (statements.rs);
//! - `claims/s`, `events/claim`, `plan / exec ms per claim` (the leasing statement and the
//!   advisory lock before it), `per settlement`, `probes/s`: from pg_stat_statements;
//! - `commit-to-sent p50 / p99 ms`: over every event of every round's relay cell.
//!
//! results.json's `rates` has every cell (each part of the CPU, every statement kind's
//! calls, plans, rows and times, the latencies' quantiles, the decoding lag at the end of the
//! log-based cells) and the summary per rate.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::cluster::{drop_db, DURABLE_LOGICAL_STATEMENTS};
use crate::harm::{commit_to_sent, reset_outbox};
use crate::log_consumer::{Decoding, LogConsumer, PUBLICATION};
use crate::own_core::Reader;
use crate::pinned::PinnedCluster;
use crate::procstat::{self, TreeCpu};
use crate::progress::say;
use crate::relays::{migrate, start_relay, Wakeup};
use crate::settings::{Settings, SQS_LATENCY};
use crate::sink::Sink;
use crate::statements::{self, RelayStatements, RELAY_ROLE};
use crate::stats::{median, quantile, rotated, spread};
use crate::support::pg::PrivatePg;
use crate::support::TestDb;
use crate::workload::{PacedWriters, Written, WRITER_APP};

/// The issue's rates, events/s (`OUTBOX_BENCH_RATES` picks some).
pub const RATES: [u64; 5] = [50, 200, 500, 2_000, 5_000];
/// Writer time before the measured window: the relay's polling and the slot settle.
pub const WARM_UP: Duration = Duration::from_secs(2);

/// Writer connections for `rate` events/s: one per 100/s, at most 64, so that each has 10 ms
/// per commit, 3–4 times a durable commit's time here. Fewer fell short on a busy machine:
/// one connection reached 138–171 of 200/s, one per 200/s 3,000 of 5,000/s.
pub fn writer_connections(rate: u64) -> usize {
    rate.div_ceil(100).clamp(1, 64) as usize
}

/// Who a backend of the cluster works for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// The application's writers.
    App,
    /// The relay's connections.
    Relay,
    /// A WAL sender (the log-based reader's).
    WalSender,
    /// Everything else: background processes, autovacuum, the benchmark's monitoring.
    Rest,
}

/// Which part a `pg_stat_activity` row is.
pub fn part_of(backend_type: &str, user: Option<&str>, application_name: &str) -> Part {
    if backend_type == "walsender" {
        Part::WalSender
    } else if user == Some(RELAY_ROLE) {
        Part::Relay
    } else if backend_type == "client backend" && application_name == WRITER_APP {
        Part::App
    } else {
        Part::Rest
    }
}

/// A cluster's CPU over a window, seconds, by part.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CpuSplit {
    /// The application's backends.
    pub app: f64,
    /// The relay's backends.
    pub relay: f64,
    /// WAL senders.
    pub walsender: f64,
    /// The rest (see [`Part::Rest`]), exited processes included.
    pub rest: f64,
}

impl CpuSplit {
    pub fn total(&self) -> f64 {
        self.app + self.relay + self.walsender + self.rest
    }

    /// Between `start` and `end` of one cluster, each live process counted by its part in
    /// `parts` (one born in the window from zero); whatever is not a known part's, the exited
    /// processes' time among it, is the rest.
    pub fn between(start: &TreeCpu, end: &TreeCpu, parts: &BTreeMap<u32, Part>) -> CpuSplit {
        let mut split = CpuSplit::default();
        for (pid, now) in &end.own {
            let used = now - start.own.get(pid).copied().unwrap_or(0.0);
            match parts.get(pid).copied().unwrap_or(Part::Rest) {
                Part::App => split.app += used,
                Part::Relay => split.relay += used,
                Part::WalSender => split.walsender += used,
                Part::Rest => {}
            }
        }
        split.rest = end.total() - start.total() - split.app - split.relay - split.walsender;
        split
    }
}

/// `with`'s CPU per event minus `without`'s, each `(cpu seconds, events)`, in µs: what a
/// reader adds to each event. Per event rather than per cell, so that two cells a few events
/// apart compare as the same rate.
pub fn added_us_per_event(with: (f64, f64), without: (f64, f64)) -> f64 {
    (with.0 / with.1 - without.0 / without.1) * 1e6
}

/// One cell: the writer at one rate for a while, with one reader (or none).
pub struct Cell {
    /// The rate the writer aimed at, events/s.
    pub rate: u64,
    /// 0-based round the cell belongs to.
    pub round: usize,
    /// Who read the table.
    pub reader: Reader,
    /// Writer connections.
    pub connections: usize,
    /// Events committed within the measured window.
    pub events: u64,
    /// The measured window, seconds (from the CPU reading at its start to the one at its end).
    pub seconds: f64,
    /// The cluster's CPU over the window, by part.
    pub cpu: CpuSplit,
    /// The relay's backends found at the window's start, and at its end.
    pub relay_backends: (usize, usize),
    /// The live processes of the rest that used the most CPU in the window: (process title,
    /// seconds), what the rest is made of.
    pub rest_top: Vec<(String, f64)>,
    /// CPU seconds of the reader's process (relay or `pg_recvlogical`) over the window.
    pub reader_cpu: f64,
    /// CPU seconds of this process (writers, sink) over the window: with `reader_cpu`, how
    /// busy the second core was.
    pub bench_cpu: f64,
    /// The relay's statements over the window (relay cells).
    pub statements: Option<RelayStatements>,
    /// Commit-to-sent of every event of the cell (relay cells), sorted; and how many never
    /// arrived.
    pub latencies_ms: Vec<f64>,
    /// See `latencies_ms`.
    pub missing: usize,
    /// Log-based cells: how far decoding was behind when the writer stopped.
    pub decoding: Option<Decoding>,
}

impl Cell {
    /// Events/s the writer reached in the window.
    pub fn reached(&self) -> f64 {
        self.events as f64 / self.seconds
    }

    /// The whole cluster's CPU per event, µs.
    pub fn cluster_us_per_event(&self) -> f64 {
        self.cpu.total() / self.events as f64 * 1e6
    }

    fn cpu_and_events(&self) -> (f64, f64) {
        (self.cpu.total(), self.events as f64)
    }

    fn to_json(&self) -> Value {
        let q = |p: f64| (!self.latencies_ms.is_empty()).then(|| quantile(&self.latencies_ms, p));
        json!({
            "rate": self.rate,
            "round": self.round,
            "reader": self.reader.label(),
            "writer_connections": self.connections,
            "events": self.events,
            "seconds": self.seconds,
            "events_per_second": self.reached(),
            "cluster_cpu_seconds": self.cpu.total(),
            "app_backends_cpu_seconds": self.cpu.app,
            "relay_backends_cpu_seconds": self.cpu.relay,
            "walsender_cpu_seconds": self.cpu.walsender,
            "rest_cpu_seconds": self.cpu.rest,
            "cluster_us_per_event": self.cluster_us_per_event(),
            "relay_backends_at_start": self.relay_backends.0,
            "relay_backends_at_end": self.relay_backends.1,
            "rest_costliest": self.rest_top.iter().map(|(title, cpu)| json!({"process": title, "cpu_seconds": cpu})).collect::<Vec<_>>(),
            "reader_process_cpu_seconds": self.reader_cpu,
            "bench_process_cpu_seconds": self.bench_cpu,
            "other_core_busy": (self.reader_cpu + self.bench_cpu) / self.seconds,
            "relay_statements": self.statements.as_ref().map(RelayStatements::to_json),
            "commit_to_sent_p50_ms": q(0.5),
            "commit_to_sent_p99_ms": q(0.99),
            "commit_to_sent_max_ms": self.latencies_ms.last(),
            "events_never_arrived": self.missing,
            "decoding_behind_bytes_at_end": self.decoding.map(|d| d.behind_bytes),
            "decoding_catch_up_seconds": self.decoding.and_then(|d| d.catch_up_seconds),
        })
    }
}

/// One round of one rate: the figures the table takes medians of.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RoundFigures {
    /// The round.
    pub round: usize,
    /// Events/s the relay cell's writer reached.
    pub reached: f64,
    /// The `none` cell's cluster CPU per event, µs.
    pub app_us: f64,
    /// What the relay adds per event, µs, and that ÷ `app_us`.
    pub relay_added_us: f64,
    /// See `relay_added_us`.
    pub relay_over_app: f64,
    /// The relay's own backends' CPU per event, µs.
    pub relay_backends_us: f64,
    /// What the log-based reader adds per event, µs; its WAL sender's CPU per event, µs.
    pub log_added_us: f64,
    /// See `log_added_us`.
    pub walsender_us: f64,
    /// `relay_added_us ÷ log_added_us`.
    pub relay_over_log: f64,
    /// The relay process's CPU, share of a core, and µs per event.
    pub relay_process_share: f64,
    /// See `relay_process_share`.
    pub relay_process_us: f64,
    /// `pg_recvlogical`'s CPU, share of a core.
    pub recvlogical_share: f64,
    /// Claims per second, events per claim, probes per second.
    pub claims_per_second: f64,
    /// See `claims_per_second`.
    pub events_per_claim: f64,
    /// See `claims_per_second`.
    pub probes_per_second: f64,
    /// Planning and execution per claim, ms.
    pub claim_ms: (f64, f64),
    /// Planning and execution per settlement, ms.
    pub settlement_ms: (f64, f64),
    /// The relay's backends' CPU per claim cycle (the claim, its settlement, and the share of
    /// gauges and maintenance that falls to it), µs.
    pub cycle_backend_us: f64,
    /// Statements and transactions per claim cycle (statements.rs).
    pub statements_per_cycle: f64,
    /// See `statements_per_cycle`.
    pub transactions_per_cycle: f64,
}

impl RoundFigures {
    /// From one round's three cells.
    pub fn of(none: &Cell, relay: &Cell, log: &Cell) -> RoundFigures {
        let app_us = none.cluster_us_per_event();
        let relay_added_us = added_us_per_event(relay.cpu_and_events(), none.cpu_and_events());
        let log_added_us = added_us_per_event(log.cpu_and_events(), none.cpu_and_events());
        let s = relay.statements.clone().unwrap_or_default();
        RoundFigures {
            round: relay.round,
            reached: relay.reached(),
            app_us,
            relay_added_us,
            relay_over_app: relay_added_us / app_us,
            relay_backends_us: relay.cpu.relay / relay.events as f64 * 1e6,
            log_added_us,
            walsender_us: log.cpu.walsender / log.events as f64 * 1e6,
            relay_over_log: relay_added_us / log_added_us,
            relay_process_share: relay.reader_cpu / relay.seconds,
            relay_process_us: relay.reader_cpu / relay.events as f64 * 1e6,
            recvlogical_share: log.reader_cpu / log.seconds,
            claims_per_second: s.claim.calls / relay.seconds,
            events_per_claim: s.events_per_claim(),
            probes_per_second: s.probe.calls / relay.seconds,
            claim_ms: s.per_claim_ms(),
            settlement_ms: s.per_settlement_ms(),
            cycle_backend_us: relay.cpu.relay / s.claim.calls * 1e6,
            statements_per_cycle: s.statements_per_claim(),
            transactions_per_cycle: s.transactions_per_claim(),
        }
    }
}

/// One rate over every round.
pub struct RateSummary {
    /// The rate aimed at, events/s.
    pub rate: u64,
    /// Each round with all three cells.
    pub rounds: Vec<RoundFigures>,
    /// Commit-to-sent over every relay cell of the rate, sorted.
    pub latencies_ms: Vec<f64>,
    /// Events that never arrived, over every relay cell.
    pub missing: usize,
}

impl RateSummary {
    /// Median and (min, max) over the rounds of one figure.
    pub fn of(&self, figure: impl Fn(&RoundFigures) -> f64) -> (f64, (f64, f64)) {
        let values: Vec<f64> = self.rounds.iter().map(figure).collect();
        (median(&values), spread(&values))
    }

    fn to_json(&self) -> Value {
        let figure = |f: &dyn Fn(&RoundFigures) -> f64| {
            let values: Vec<f64> = self.rounds.iter().map(f).collect();
            let (min, max) = spread(&values);
            json!({ "median": median(&values), "min": min, "max": max, "rounds": values })
        };
        json!({
            "rate": self.rate,
            "events_per_second": figure(&|r| r.reached),
            "app_write_us_per_event": figure(&|r| r.app_us),
            "relay_added_db_us_per_event": figure(&|r| r.relay_added_us),
            "relay_added_over_app_write": figure(&|r| r.relay_over_app),
            "relay_backends_us_per_event": figure(&|r| r.relay_backends_us),
            "log_based_added_db_us_per_event": figure(&|r| r.log_added_us),
            "log_based_walsender_us_per_event": figure(&|r| r.walsender_us),
            "relay_over_log_based": figure(&|r| r.relay_over_log),
            "relay_process_share_of_a_core": figure(&|r| r.relay_process_share),
            "relay_process_us_per_event": figure(&|r| r.relay_process_us),
            "pg_recvlogical_share_of_a_core": figure(&|r| r.recvlogical_share),
            "claims_per_second": figure(&|r| r.claims_per_second),
            "events_per_claim": figure(&|r| r.events_per_claim),
            "probes_per_second": figure(&|r| r.probes_per_second),
            "claim_plan_ms": figure(&|r| r.claim_ms.0),
            "claim_exec_ms": figure(&|r| r.claim_ms.1),
            "settlement_plan_ms": figure(&|r| r.settlement_ms.0),
            "settlement_exec_ms": figure(&|r| r.settlement_ms.1),
            "relay_backends_us_per_claim_cycle": figure(&|r| r.cycle_backend_us),
            "statements_per_claim_cycle": figure(&|r| r.statements_per_cycle),
            "transactions_per_claim_cycle": figure(&|r| r.transactions_per_cycle),
            "commit_to_sent_p50_ms": quantile(&self.latencies_ms, 0.5),
            "commit_to_sent_p99_ms": quantile(&self.latencies_ms, 0.99),
            "events_never_arrived": self.missing,
        })
    }
}

/// The whole group: where it ran and every cell.
pub struct RatesRun {
    /// The relay cells' wake-up mode (the build's default).
    pub wakeup: Wakeup,
    /// The database's core, and the core of everything else.
    pub cores: (usize, usize),
    /// The measured window of a cell, seconds (after [`WARM_UP`]).
    pub window_seconds: u64,
    /// Flags every relay got beyond the build's defaults (`OUTBOX_BENCH_RELAY_ARGS`).
    pub relay_args: Vec<String>,
    /// Every cell, in the order run.
    pub cells: Vec<Cell>,
}

impl RatesRun {
    pub fn summaries(&self) -> Vec<RateSummary> {
        let mut rates: Vec<u64> = self.cells.iter().map(|c| c.rate).collect();
        rates.sort_unstable();
        rates.dedup();
        rates
            .into_iter()
            .map(|rate| {
                let of = |round: usize, reader: Reader| {
                    self.cells
                        .iter()
                        .find(|c| c.rate == rate && c.round == round && c.reader == reader)
                };
                let mut rounds: Vec<usize> = self
                    .cells
                    .iter()
                    .filter(|c| c.rate == rate)
                    .map(|c| c.round)
                    .collect();
                rounds.dedup();
                let relay_cells = || {
                    self.cells
                        .iter()
                        .filter(move |c| c.rate == rate && c.reader == Reader::Relay)
                };
                let mut latencies_ms: Vec<f64> = relay_cells()
                    .flat_map(|c| c.latencies_ms.iter().copied())
                    .collect();
                latencies_ms.sort_by(f64::total_cmp);
                RateSummary {
                    rate,
                    rounds: rounds
                        .into_iter()
                        .filter_map(|r| {
                            Some(RoundFigures::of(
                                of(r, Reader::None)?,
                                of(r, Reader::Relay)?,
                                of(r, Reader::LogBased)?,
                            ))
                        })
                        .collect(),
                    latencies_ms,
                    missing: relay_cells().map(|c| c.missing).sum(),
                }
            })
            .collect()
    }

    pub fn to_json(&self) -> Value {
        json!({
            "wakeup": self.wakeup.label(),
            "cluster": "durable, wal_level=logical, pg_stat_statements (track_planning, track=all)",
            "database_core": self.cores.0,
            "other_core": self.cores.1,
            "warm_up_seconds": WARM_UP.as_secs_f64(),
            "window_seconds": self.window_seconds,
            "sink_latency_ms": SQS_LATENCY.as_secs_f64() * 1000.0,
            "extra_relay_args": self.relay_args,
            "summary": self.summaries().iter().map(RateSummary::to_json).collect::<Vec<_>>(),
            "cells": self.cells.iter().map(Cell::to_json).collect::<Vec<_>>(),
        })
    }
}

/// Every rate and round; `None` (and a line saying why) on a machine where this process may
/// use fewer than two cores.
pub async fn run(settings: &Settings, wakeup: &Wakeup) -> Option<RatesRun> {
    let pinned = PinnedCluster::start("rates", DURABLE_LOGICAL_STATEMENTS).await?;
    let cluster = &pinned.cluster;
    let db = cluster.create_db().await;
    pinned.say_cores("rates", &db).await;
    migrate(&db, wakeup).await;
    let relay_db = relay_role(cluster, &db).await;
    db.client()
        .await
        .batch_execute(&format!(
            "CREATE EXTENSION pg_stat_statements; CREATE PUBLICATION {PUBLICATION} FOR TABLE outbox"
        ))
        .await
        .expect("set up pg_stat_statements and the log-based cells' publication");
    let mut cells = Vec::new();
    for round in 0..settings.rate_rounds {
        for &rate in &settings.rates {
            for reader in rotated(&Reader::ALL, round) {
                let c = cell(
                    settings, cluster, &db, &relay_db, wakeup, rate, round, reader,
                )
                .await;
                say_cell(&c);
                cells.push(c);
            }
        }
    }
    db.client()
        .await
        .batch_execute(&format!("DROP PUBLICATION {PUBLICATION}"))
        .await
        .expect("drop the publication");
    drop_db(cluster, &db).await;
    let run = RatesRun {
        wakeup: wakeup.clone(),
        cores: pinned.cores,
        window_seconds: settings.rate_seconds.as_secs(),
        relay_args: settings.relay_args.clone(),
        cells,
    };
    drop(pinned);
    for s in run.summaries() {
        let m = |f: &dyn Fn(&RoundFigures) -> f64| s.of(f).0;
        say(&format!(
            "rates, {} events/s (reached {:.0}): app write {:.0} µs/event; relay adds {:.0} µs/event ({:.2}× the app's), log-based {:.0} ({:.2} relay ÷ log-based); relay process {:.1}% of a core ({:.0} µs/event); {:.0} claims/s, {:.1} events/claim, its backends {:.0} µs per claim cycle, {:.1} statements and {:.1} transactions per cycle; commit-to-sent p50 {:.1} ms p99 {:.1} ms{}",
            s.rate,
            m(&|r| r.reached),
            m(&|r| r.app_us),
            m(&|r| r.relay_added_us),
            m(&|r| r.relay_over_app),
            m(&|r| r.log_added_us),
            m(&|r| r.relay_over_log),
            m(&|r| r.relay_process_share) * 100.0,
            m(&|r| r.relay_process_us),
            m(&|r| r.claims_per_second),
            m(&|r| r.events_per_claim),
            m(&|r| r.cycle_backend_us),
            m(&|r| r.statements_per_cycle),
            m(&|r| r.transactions_per_cycle),
            quantile(&s.latencies_ms, 0.5),
            quantile(&s.latencies_ms, 0.99),
            if s.missing > 0 {
                format!(", {} never arrived", s.missing)
            } else {
                String::new()
            },
        ));
    }
    Some(run)
}

/// Creates [`RELAY_ROLE`] (a superuser, as the `postgres` role the writers use, so that only
/// the name differs) and returns `db` as that role sees it, for the relay's `--database-url`.
pub async fn relay_role(cluster: &PrivatePg, db: &TestDb) -> TestDb {
    // The cluster's own random superuser password: hex, so it needs no quoting.
    let password = cluster.password();
    db.client()
        .await
        .batch_execute(&format!(
            "CREATE ROLE {RELAY_ROLE} LOGIN SUPERUSER PASSWORD '{password}'"
        ))
        .await
        .expect("create the relay's role");
    TestDb {
        name: db.name.clone(),
        url: format!(
            "postgres://{RELAY_ROLE}:{password}@127.0.0.1:{}/{}",
            cluster.port(),
            db.name
        ),
    }
}

/// Which part each backend of `db`'s cluster is, now.
pub async fn parts(monitor: &tokio_postgres::Client) -> BTreeMap<u32, Part> {
    monitor
        .query(
            "SELECT pid, coalesce(backend_type, ''), usename::text, coalesce(application_name, '') \
             FROM pg_stat_activity",
            &[],
        )
        .await
        .expect("read pg_stat_activity")
        .iter()
        .map(|row| {
            let pid: i32 = row.get(0);
            let user: Option<String> = row.get(2);
            (
                pid as u32,
                part_of(row.get(1), user.as_deref(), row.get(3)),
            )
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
async fn cell(
    settings: &Settings,
    cluster: &PrivatePg,
    db: &TestDb,
    relay_db: &TestDb,
    wakeup: &Wakeup,
    rate: u64,
    round: usize,
    reader: Reader,
) -> Cell {
    // The lease table too: a relay cell leaves its dead rows, which every claim reads.
    db.client()
        .await
        .batch_execute("TRUNCATE outbox_claims")
        .await
        .expect("empty the lease table");
    reset_outbox(db, reader == Reader::Relay).await;
    let tag = format!("r{rate}x{round}{}", reader.label().replace('-', ""));
    let sink = Sink::start(SQS_LATENCY, reader == Reader::Relay).await;
    let relay = match reader {
        Reader::Relay => Some(
            start_relay(
                settings,
                relay_db,
                wakeup,
                &sink,
                &format!("bench-{tag}"),
                &[],
            )
            .await,
        ),
        _ => None,
    };
    let consumer = match reader {
        Reader::LogBased => Some(LogConsumer::start(db).await),
        _ => None,
    };
    let reader_pid = relay
        .as_ref()
        .map(|r| r.pid())
        .or(consumer.as_ref().map(LogConsumer::pid));
    let reader_cpu = || reader_pid.and_then(procstat::run_seconds).unwrap_or(0.0);
    let bench_cpu = || procstat::run_seconds(std::process::id()).unwrap_or(0.0);
    let postmaster = cluster.pid().expect("the cluster runs");
    let monitor = db.client().await;
    let connections = writer_connections(rate);
    let writers = PacedWriters::start(
        db,
        &tag,
        connections,
        rate as f64,
        WARM_UP + settings.rate_seconds,
    )
    .await;
    let pacing = writers.pacing;

    tokio::time::sleep_until((pacing.start + WARM_UP).into()).await;
    let alone = || async {
        match &relay {
            Some(relay) => {
                relay
                    .metric("outbox_settlements_total{written=\"alone\"}")
                    .await
            }
            None => None,
        }
    };
    statements::reset(&monitor).await;
    let alone_start = alone().await;
    let mut backends = parts(&monitor).await;
    let relay_at_start = backends.values().filter(|p| **p == Part::Relay).count();
    let (cpu_start, reader_start, bench_start) =
        (procstat::tree_cpu(postmaster), reader_cpu(), bench_cpu());
    let window_start = Instant::now();

    tokio::time::sleep_until(pacing.end().into()).await;
    let cpu_end = procstat::tree_cpu(postmaster);
    let (reader_cpu, bench_cpu) = (reader_cpu() - reader_start, bench_cpu() - bench_start);
    let window_end = Instant::now();
    let alone_end = alone().await;
    let statements = match reader {
        Reader::Relay => {
            let mut read = statements::read(&monitor).await;
            read.settlements_alone = alone_start.zip(alone_end).map(|(a, b)| b - a);
            Some(read)
        }
        _ => None,
    };
    let at_end = parts(&monitor).await;
    let relay_at_end = at_end.values().filter(|p| **p == Part::Relay).count();
    backends.extend(at_end);
    drop(monitor);

    let commits = writers.finish().await;
    let events = commits
        .iter()
        .filter(|(_, at)| (window_start..=window_end).contains(at))
        .count() as u64;
    let seconds = (window_end - window_start).as_secs_f64();
    let (latencies_ms, missing) = match relay {
        Some(relay) => {
            let written = Written {
                committed_in_time: commits.len() as u64,
                commits,
                seconds,
            };
            commit_to_sent(&sink, relay, &written).await
        }
        None => (Vec::new(), 0),
    };
    let decoding = match &consumer {
        Some(consumer) => Some(consumer.catch_up(db).await),
        None => None,
    };
    if let Some(consumer) = consumer {
        consumer.stop(db).await;
    }
    let mut rest_top: Vec<(String, f64)> = cpu_end
        .own
        .iter()
        .filter(|(pid, _)| backends.get(pid).is_none_or(|p| *p == Part::Rest))
        .map(|(pid, now)| {
            let title = std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
                .unwrap_or_default()
                .replace('\0', " ");
            let title = format!("{pid} {}", title.trim());
            (title, now - cpu_start.own.get(pid).copied().unwrap_or(0.0))
        })
        .collect();
    rest_top.sort_by(|a, b| b.1.total_cmp(&a.1));
    rest_top.truncate(3);
    Cell {
        rate,
        round,
        reader,
        connections,
        events,
        seconds,
        rest_top,
        cpu: CpuSplit::between(&cpu_start, &cpu_end, &backends),
        relay_backends: (relay_at_start, relay_at_end),
        reader_cpu,
        bench_cpu,
        statements,
        latencies_ms,
        missing,
        decoding,
    }
}

fn say_cell(c: &Cell) {
    let per_event = |cpu: f64| cpu / c.events as f64 * 1e6;
    let reader = match (c.reader, &c.statements, c.decoding) {
        (Reader::Relay, Some(s), _) => {
            let (plan, exec) = s.per_claim_ms();
            format!(
                "; relay process {:.1}% of a core; {:.0} claims/s, {:.1} events/claim, {plan:.2} / {exec:.2} ms plan / exec per claim, {:.0} probes/s; relay backends {}→{}; commit-to-sent p50 {:.1} ms p99 {:.1} ms{}",
                c.reader_cpu / c.seconds * 100.0,
                s.claim.calls / c.seconds,
                s.events_per_claim(),
                s.probe.calls / c.seconds,
                c.relay_backends.0,
                c.relay_backends.1,
                quantile(&c.latencies_ms, 0.5),
                quantile(&c.latencies_ms, 0.99),
                if c.missing > 0 {
                    format!(", {} never arrived", c.missing)
                } else {
                    String::new()
                },
            )
        }
        (_, _, Some(d)) => format!(
            "; pg_recvlogical {:.1}% of a core; decoding {:.0} kB behind at the end",
            c.reader_cpu / c.seconds * 100.0,
            d.behind_bytes / 1000.0
        ),
        _ => String::new(),
    };
    say(&format!(
        "  rates, {} events/s, round {}, {}: reached {:.0}/s over {} connection(s); cluster {:.1}% of a core, {:.0} µs/event (app {:.0}, relay {:.0}, walsender {:.0}, rest {:.0}); other core {:.0}% busy; rest's largest: {}{reader}",
        c.rate,
        c.round + 1,
        c.reader.label(),
        c.reached(),
        c.connections,
        c.cpu.total() / c.seconds * 100.0,
        c.cluster_us_per_event(),
        per_event(c.cpu.app),
        per_event(c.cpu.relay),
        per_event(c.cpu.walsender),
        per_event(c.cpu.rest),
        (c.reader_cpu + c.bench_cpu) / c.seconds * 100.0,
        c.rest_top
            .iter()
            .map(|(title, cpu)| format!("{title} {:.2} s", cpu))
            .collect::<Vec<_>>()
            .join(", "),
    ));
}

// Run by selftest.rs (`cargo test --bench relay`): the bench has no libtest harness.
pub mod tests {
    use std::collections::BTreeMap;

    use super::*;

    pub fn writers_get_one_connection_per_100_events_a_second() {
        assert_eq!(writer_connections(50), 1);
        assert_eq!(writer_connections(200), 2);
        assert_eq!(writer_connections(201), 3);
        assert_eq!(writer_connections(500), 5);
        assert_eq!(writer_connections(5_000), 50);
        assert_eq!(writer_connections(1_000_000), 64);
        assert_eq!(writer_connections(0), 1);
    }

    pub fn backends_are_parted_by_sender_role_and_application() {
        assert_eq!(
            part_of("walsender", Some("postgres"), "pg_recvlogical"),
            Part::WalSender
        );
        assert_eq!(
            part_of("client backend", Some(RELAY_ROLE), "outbox-relay"),
            Part::Relay
        );
        assert_eq!(
            part_of("client backend", Some("postgres"), WRITER_APP),
            Part::App
        );
        assert_eq!(part_of("client backend", Some("postgres"), ""), Part::Rest);
        assert_eq!(part_of("autovacuum worker", None, ""), Part::Rest);
        assert_eq!(part_of("walwriter", None, ""), Part::Rest);
    }

    pub fn cpu_is_split_by_part_and_exited_processes_fall_to_the_rest() {
        let tree = |own: &[(u32, f64)], reaped: f64| TreeCpu {
            own: own.iter().copied().collect(),
            reaped,
        };
        // 1 postmaster, 2 a writer, 3 the relay's backend, 4 a walsender, 5 an autovacuum
        // worker that exits in the window, 6 a relay backend born in it.
        let start = tree(&[(1, 1.0), (2, 2.0), (3, 3.0), (4, 0.5), (5, 0.25)], 10.0);
        let end = tree(&[(1, 1.5), (2, 2.5), (3, 3.75), (4, 1.0), (6, 0.125)], 10.5);
        let parts: BTreeMap<u32, Part> = [
            (2, Part::App),
            (3, Part::Relay),
            (4, Part::WalSender),
            (6, Part::Relay),
        ]
        .into_iter()
        .collect();
        let split = CpuSplit::between(&start, &end, &parts);
        assert_eq!(split.app, 0.5);
        assert_eq!(split.relay, 0.875);
        assert_eq!(split.walsender, 0.5);
        // Postmaster 0.5, plus the worker: 0.5 reaped minus the 0.25 it had at the start.
        assert_eq!(split.rest, 0.75);
        assert_eq!(split.total(), end.total() - start.total());
    }

    pub fn added_cpu_is_per_event_and_the_ratios_follow() {
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9 * b.abs().max(1.0);
        // None: 0.5 s over 2,000 events (250 µs each); relay: 1.5 s over 2,000 (+500 µs);
        // log-based: 1.0 s over 2,500 (400 µs, +150 µs).
        assert!(
            close(added_us_per_event((1.5, 2000.0), (0.5, 2000.0)), 500.0),
            "{}",
            added_us_per_event((1.5, 2000.0), (0.5, 2000.0))
        );
        assert!(
            close(added_us_per_event((1.0, 2500.0), (0.5, 2000.0)), 150.0),
            "{}",
            added_us_per_event((1.0, 2500.0), (0.5, 2000.0))
        );
        let cell = |reader: Reader, cpu: f64, events: u64, reader_cpu: f64| Cell {
            rate: 200,
            round: 0,
            reader,
            connections: 1,
            events,
            seconds: 10.0,
            cpu: CpuSplit {
                app: cpu / 2.0,
                relay: if reader == Reader::Relay {
                    cpu / 4.0
                } else {
                    0.0
                },
                walsender: if reader == Reader::LogBased {
                    cpu / 4.0
                } else {
                    0.0
                },
                rest: if reader == Reader::None {
                    cpu / 2.0
                } else {
                    cpu / 4.0
                },
            },
            relay_backends: (2, 2),
            rest_top: Vec::new(),
            reader_cpu,
            bench_cpu: 0.0,
            statements: None,
            latencies_ms: Vec::new(),
            missing: 0,
            decoding: None,
        };
        let r = RoundFigures::of(
            &cell(Reader::None, 0.5, 2000, 0.0),
            &cell(Reader::Relay, 1.5, 2000, 0.25),
            &cell(Reader::LogBased, 1.0, 2500, 0.5),
        );
        assert!(close(r.app_us, 250.0), "{}", r.app_us);
        assert!(close(r.relay_added_us, 500.0), "{}", r.relay_added_us);
        assert!(close(r.relay_over_app, 2.0), "{}", r.relay_over_app);
        assert!(close(r.relay_backends_us, 187.5), "{}", r.relay_backends_us);
        assert!(close(r.walsender_us, 100.0), "{}", r.walsender_us);
        assert!(close(r.relay_over_log, 500.0 / 150.0));
        assert!(
            close(r.relay_process_share, 0.025),
            "{}",
            r.relay_process_share
        );
        assert!(close(r.relay_process_us, 125.0), "{}", r.relay_process_us);
        assert!(close(r.recvlogical_share, 0.05), "{}", r.recvlogical_share);
        assert!(close(r.reached, 200.0), "{}", r.reached);
    }
}
