//! Group `harm-own-core` (part of `harm`): the relay's harm as production has it, with the
//! database on a core of its own and a log-based consumer as the anchor.
//!
//! On the same-core table the relay process competes with PostgreSQL for the two cores; in
//! production the relay is a sidecar beside the application and only its SQL runs on the
//! database host. Here the cluster runs on a core of its own and this process (writers, the
//! SQS sink), the relay and `pg_recvlogical` on the second (pinned.rs says how). The
//! writers share the second core with the relay (the application and the sidecar on one
//! host); each cell says how busy each core was, so a full second core, which would cap the
//! writers rather than the database, shows.
//!
//! Cells, on one durable cluster with `wal_level=logical` (so the cells differ only in who
//! reads the table), alternated in an order rotated every round:
//! - `none`: nothing reads the table (the relay's trigger disabled);
//! - `relay`: the relay with the build's defaults, sending to the sink after 15 ms;
//! - `log-based`: no relay; a `pgoutput` slot on a publication of the table streamed by
//!   `pg_recvlogical` (what Debezium or Sequin cost the database: decoding, on its core).

use std::collections::BTreeMap;
use std::time::Instant;

use serde_json::{json, Value};

use crate::affinity;
use crate::cluster::{drop_db, DURABLE_LOGICAL_SLOTS};
use crate::harm::{commit_to_sent, reset_outbox, WaitSampler};
use crate::log_consumer::{Decoding, LogConsumer, PUBLICATION};
use crate::pinned::PinnedCluster;
use crate::procstat;
use crate::progress::say;
use crate::relays::{migrate, start_relay, Wakeup};
use crate::settings::{Settings, SQS_LATENCY};
use crate::sink::Sink;
use crate::stats::{median, per_round_ratios, quantile, rotated, shares, spread};
use crate::support::pg::PrivatePg;
use crate::support::TestDb;
use crate::workload;

/// Closed-loop writers of the table's two rows.
const WRITERS: [usize; 2] = [16, 64];

/// Who reads the outbox table during a cell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reader {
    /// Nothing: the application alone.
    None,
    /// The relay with the build's defaults.
    Relay,
    /// `pg_recvlogical` on a `pgoutput` slot: the log-based anchor.
    LogBased,
}

impl Reader {
    pub const ALL: [Reader; 3] = [Reader::None, Reader::Relay, Reader::LogBased];

    pub fn label(self) -> &'static str {
        match self {
            Reader::None => "none",
            Reader::Relay => "relay",
            Reader::LogBased => "log-based",
        }
    }
}

/// One cell: `writers` closed-loop writers for a while, with one reader (or none).
pub struct Cell {
    /// Closed-loop writers of the cell.
    pub writers: usize,
    /// 0-based alternation the cell belongs to.
    pub round: usize,
    /// Who read the table.
    pub reader: Reader,
    /// What the writers reached: the figure compared across readers.
    pub commits_per_second: f64,
    /// Writer time of the cell.
    pub seconds: f64,
    /// Commit-to-sent of every event (relay cells only), sorted; and how many never arrived.
    pub latencies_ms: Vec<f64>,
    /// See `latencies_ms`.
    pub missing: usize,
    /// CPU seconds of the cluster (postmaster, backends, reaped children) during the cell:
    /// what the database core did.
    pub postgres_cpu: f64,
    /// Wall time over which `postgres_cpu` was read: the writer time, their connecting and
    /// the samplers' start and end.
    pub cpu_seconds: f64,
    /// CPU seconds of the reader's own process (relay or `pg_recvlogical`) during the cell.
    pub reader_cpu: f64,
    /// CPU seconds of this process (writers, sink, samplers) during the cell: with
    /// `reader_cpu`, how busy the other core was, which caps the writers if it is full.
    pub bench_cpu: f64,
    /// The cores the reader's process could run on (`None`: no reader).
    pub reader_cores: Option<String>,
    /// Log-based cells: how far decoding was behind when the writers stopped, and how long it
    /// took to catch up (the anchor's counterpart of commit-to-sent).
    pub decoding: Option<Decoding>,
    /// What the writers' backends waited on, sampled.
    pub writer_waits: BTreeMap<String, u64>,
    /// The same for the relay's backends (none in the other cells): what paces the relay.
    pub relay_waits: BTreeMap<String, u64>,
}

/// The whole table: the cores used and every cell, or why it was skipped.
pub struct OwnCoreRun {
    /// The wake-up mode of the relay cells (the build's default).
    pub wakeup: Wakeup,
    /// The database's core, and the core of everything else.
    pub cores: (usize, usize),
    /// Every cell, in the order run.
    pub cells: Vec<Cell>,
}

/// One writer count, summarised.
pub struct Summary {
    /// The writer count summarised.
    pub writers: usize,
    /// Commits/s of each reader's cells, `(round, commits/s)`, in the order of [`Reader::ALL`].
    pub by_reader: [Vec<(usize, f64)>; 3],
    /// Commit-to-sent over every relay cell, sorted.
    pub latencies_ms: Vec<f64>,
    /// Events that never arrived, over every relay cell.
    pub missing: usize,
}

impl Summary {
    pub fn values(&self, reader: Reader) -> Vec<f64> {
        self.cells(reader).iter().map(|(_, v)| *v).collect()
    }

    fn cells(&self, reader: Reader) -> &[(usize, f64)] {
        let i = Reader::ALL
            .iter()
            .position(|r| *r == reader)
            .expect("a reader");
        &self.by_reader[i]
    }

    pub fn median(&self, reader: Reader) -> f64 {
        median(&self.values(reader))
    }

    /// Ratio of the medians of `a`'s and `b`'s cells.
    pub fn ratio(&self, a: Reader, b: Reader) -> f64 {
        self.median(a) / self.median(b)
    }

    /// Median of the per-round ratios of `a`'s and `b`'s cells.
    pub fn round_ratio(&self, a: Reader, b: Reader) -> f64 {
        median(&per_round_ratios(self.cells(a), self.cells(b)))
    }
}

impl OwnCoreRun {
    pub fn summaries(&self) -> Vec<Summary> {
        let mut writers: Vec<usize> = self.cells.iter().map(|c| c.writers).collect();
        writers.sort_unstable();
        writers.dedup();
        writers
            .into_iter()
            .map(|w| {
                let cells = || self.cells.iter().filter(move |c| c.writers == w);
                let of = |reader: Reader| {
                    cells()
                        .filter(|c| c.reader == reader)
                        .map(|c| (c.round, c.commits_per_second))
                        .collect()
                };
                let mut latencies_ms: Vec<f64> = cells()
                    .flat_map(|c| c.latencies_ms.iter().copied())
                    .collect();
                latencies_ms.sort_by(f64::total_cmp);
                Summary {
                    writers: w,
                    by_reader: Reader::ALL.map(of),
                    latencies_ms,
                    missing: cells().map(|c| c.missing).sum(),
                }
            })
            .collect()
    }

    /// Mean share of each core used in `reader`'s cells at `writers`: (the database's, by the
    /// cluster; the other, by this process and the reader).
    pub fn cores_busy(&self, writers: usize, reader: Reader) -> (f64, f64) {
        let cells: Vec<&Cell> = self
            .cells
            .iter()
            .filter(|c| c.writers == writers && c.reader == reader)
            .collect();
        let database: f64 = cells.iter().map(|c| c.postgres_cpu).sum();
        let other: f64 = cells.iter().map(|c| c.reader_cpu + c.bench_cpu).sum();
        let seconds: f64 = cells.iter().map(|c| c.cpu_seconds).sum();
        (database / seconds, other / seconds)
    }

    pub fn to_json(&self) -> Value {
        use Reader::{LogBased, None as Nothing, Relay};
        json!({
            "wakeup": self.wakeup.label(),
            "cluster": "durable, wal_level=logical",
            "database_core": self.cores.0,
            "other_core": self.cores.1,
            "summary": self.summaries().iter().map(|s| {
                let cell = |r: Reader| {
                    let (min, max) = spread(&s.values(r));
                    json!({
                        "commits_per_second": s.values(r),
                        "median": s.median(r),
                        "min": min,
                        "max": max,
                        "database_core_busy": self.cores_busy(s.writers, r).0,
                        "other_core_busy": self.cores_busy(s.writers, r).1,
                    })
                };
                json!({
                    "writers": s.writers,
                    "none": cell(Nothing),
                    "relay": cell(Relay),
                    "log_based": cell(LogBased),
                    "relay_over_none": s.ratio(Relay, Nothing),
                    "log_based_over_none": s.ratio(LogBased, Nothing),
                    "relay_over_log_based": s.ratio(Relay, LogBased),
                    "relay_over_none_median_of_rounds": s.round_ratio(Relay, Nothing),
                    "log_based_over_none_median_of_rounds": s.round_ratio(LogBased, Nothing),
                    "relay_over_log_based_median_of_rounds": s.round_ratio(Relay, LogBased),
                    "commit_to_sent_p50_ms": quantile(&s.latencies_ms, 0.5),
                    "commit_to_sent_p99_ms": quantile(&s.latencies_ms, 0.99),
                    "events_never_arrived": s.missing,
                })
            }).collect::<Vec<_>>(),
            "cells": self.cells.iter().map(|c| json!({
                "writers": c.writers,
                "round": c.round,
                "reader": c.reader.label(),
                "commits_per_second": c.commits_per_second,
                "seconds": c.seconds,
                "commit_to_sent_p50_ms": (!c.latencies_ms.is_empty()).then(|| quantile(&c.latencies_ms, 0.5)),
                "commit_to_sent_p99_ms": (!c.latencies_ms.is_empty()).then(|| quantile(&c.latencies_ms, 0.99)),
                "postgres_cpu_seconds": c.postgres_cpu,
                "postgres_cpu_window_seconds": c.cpu_seconds,
                "reader_cores": c.reader_cores,
                "decoding_behind_bytes_at_end": c.decoding.map(|d| d.behind_bytes),
                "decoding_catch_up_seconds": c.decoding.and_then(|d| d.catch_up_seconds),
                "reader_process_cpu_seconds": c.reader_cpu,
                "bench_process_cpu_seconds": c.bench_cpu,
                "other_core_busy": (c.reader_cpu + c.bench_cpu) / c.cpu_seconds,
                "writer_backend_samples": c.writer_waits,
                "relay_backend_samples": c.relay_waits,
            })).collect::<Vec<_>>(),
        })
    }
}

/// The own-core table for the build's default wake-up; `None` (and a line saying why) on a
/// machine where this process may use fewer than two cores.
pub async fn run(settings: &Settings, wakeup: &Wakeup) -> Option<OwnCoreRun> {
    let pinned = PinnedCluster::start("harm, own core", DURABLE_LOGICAL_SLOTS).await?;
    let (cluster, (database_core, other_core)) = (&pinned.cluster, pinned.cores);
    let db = cluster.create_db().await;
    pinned.say_cores("harm, own core", &db).await;
    migrate(&db, wakeup).await;
    db.client()
        .await
        .batch_execute(&format!(
            "CREATE PUBLICATION {PUBLICATION} FOR TABLE outbox"
        ))
        .await
        .expect("create the log-based cells' publication");
    let mut cells = Vec::new();
    for round in 0..settings.own_core_rounds {
        for &writers in &WRITERS {
            for reader in rotated(&Reader::ALL, round) {
                let cell = cell(settings, cluster, &db, wakeup, writers, round, reader).await;
                say(&format!(
                    "  harm, own core, {writers} writers, round {}, {}{}: {:.0} commits/s{}; database core {:.0}% busy, the other {:.0}%; writers: {}{}",
                    round + 1,
                    reader.label(),
                    match &cell.reader_cores {
                        Some(cores) => format!(" (on core {cores})"),
                        None => String::new(),
                    },
                    cell.commits_per_second,
                    match (reader, cell.decoding) {
                        (Reader::Relay, _) => format!(
                            ", commit-to-sent p50 {:.1} ms p99 {:.1} ms",
                            quantile(&cell.latencies_ms, 0.5),
                            quantile(&cell.latencies_ms, 0.99)
                        ),
                        (_, Some(d)) => format!(
                            ", decoding {:.0} kB behind at the end, caught up in {}",
                            d.behind_bytes / 1000.0,
                            d.catch_up_seconds
                                .map_or("over 60 s".to_string(), |s| format!("{:.0} ms", s * 1000.0))
                        ),
                        _ => String::new(),
                    },
                    cell.postgres_cpu / cell.cpu_seconds * 100.0,
                    (cell.reader_cpu + cell.bench_cpu) / cell.cpu_seconds * 100.0,
                    shares(&cell.writer_waits),
                    if cell.relay_waits.is_empty() {
                        String::new()
                    } else {
                        format!("; relay's backends: {}", shares(&cell.relay_waits))
                    },
                ));
                cells.push(cell);
            }
        }
    }
    db.client()
        .await
        .batch_execute(&format!("DROP PUBLICATION {PUBLICATION}"))
        .await
        .expect("drop the publication");
    drop_db(cluster, &db).await;
    drop(pinned);
    let run = OwnCoreRun {
        wakeup: wakeup.clone(),
        cores: (database_core, other_core),
        cells,
    };
    for s in run.summaries() {
        use Reader::{LogBased, None as Nothing, Relay};
        let cell = |r: Reader| {
            let (min, max) = spread(&s.values(r));
            format!("{:.0} ({min:.0}–{max:.0})", s.median(r))
        };
        say(&format!(
            "harm, own core, {} writers: commits/s none {}, relay {}, log-based {}; relay ÷ none {:.2} (rounds {:.2}), log-based ÷ none {:.2} (rounds {:.2}), relay ÷ log-based {:.2} (rounds {:.2}); commit-to-sent p50 {:.1} ms, p99 {:.1} ms{}",
            s.writers,
            cell(Nothing),
            cell(Relay),
            cell(LogBased),
            s.ratio(Relay, Nothing),
            s.round_ratio(Relay, Nothing),
            s.ratio(LogBased, Nothing),
            s.round_ratio(LogBased, Nothing),
            s.ratio(Relay, LogBased),
            s.round_ratio(Relay, LogBased),
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

async fn cell(
    settings: &Settings,
    cluster: &PrivatePg,
    db: &TestDb,
    wakeup: &Wakeup,
    writers: usize,
    round: usize,
    reader: Reader,
) -> Cell {
    reset_outbox(db, reader == Reader::Relay).await;
    let tag = format!("oc{writers}r{round}{}", reader.label().replace('-', ""));
    let sink = Sink::start(SQS_LATENCY, reader == Reader::Relay).await;
    let relay = match reader {
        Reader::Relay => {
            Some(start_relay(settings, db, wakeup, &sink, &format!("bench-{tag}"), &[]).await)
        }
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
    let reader_cpu = || reader_pid.and_then(procstat::cpu_seconds).unwrap_or(0.0);
    let postmaster = cluster.pid().expect("the cluster runs");
    let reader_cores = reader_pid.map(|pid| affinity::list(&affinity::allowed(pid as i32)));
    let bench_cpu = || procstat::cpu_seconds(std::process::id()).unwrap_or(0.0);
    let (postgres_before, reader_before) = (procstat::tree_cpu_seconds(postmaster), reader_cpu());
    let bench_before = bench_cpu();
    let window = Instant::now();
    let waits = WaitSampler::start(db).await;
    let relay_sampler = WaitSampler::start_for(db, "outbox-relay%").await;
    let written = workload::closed_loop(db, &tag, writers, settings.own_core_seconds).await;
    let writer_waits = waits.finish().await;
    let relay_waits = relay_sampler.finish().await;
    let postgres_cpu = procstat::tree_cpu_seconds(postmaster) - postgres_before;
    let cpu_seconds = window.elapsed().as_secs_f64();
    let reader_cpu = reader_cpu() - reader_before;
    let bench_cpu = bench_cpu() - bench_before;
    let (latencies_ms, missing) = match relay {
        Some(relay) => commit_to_sent(&sink, relay, &written).await,
        None => (Vec::new(), 0),
    };
    let decoding = match &consumer {
        Some(consumer) => Some(consumer.catch_up(db).await),
        None => None,
    };
    if let Some(consumer) = consumer {
        consumer.stop(db).await;
    }
    Cell {
        writers,
        round,
        reader,
        commits_per_second: written.commits_per_second(),
        seconds: written.seconds,
        latencies_ms,
        missing,
        postgres_cpu,
        cpu_seconds,
        reader_cpu,
        bench_cpu,
        reader_cores,
        decoding,
        writer_waits,
        relay_waits,
    }
}
