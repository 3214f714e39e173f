//! Storage: what the outbox table costs the application's disk under a steady stream, for the
//! relay's default retention, for rows kept (`--retention 7d`) and for `--delete-on-ack`.
//!
//! The variants run at once, each in a database of its own on the durable cluster with its
//! own producer and relay, so the long run is paid once; table size is read every
//! `settings.storage_every`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::cluster::drop_db;
use crate::help::help_value;
use crate::progress::say;
use crate::relays::{check_alive, migrate, start_relay, stop, Wakeup};
use crate::settings::{Settings, SQS_LATENCY};
use crate::sink::Sink;
use crate::stats::slope;
use crate::support::pg::PrivatePg;
use crate::support::TestDb;
use crate::workload;

/// One size reading.
#[derive(Clone, Copy, Debug)]
pub struct SizeSample {
    /// Since the variant's producer started.
    pub seconds: f64,
    /// pg_total_relation_size: heap + indexes + TOAST (+ free space and visibility maps).
    pub total: i64,
    /// pg_relation_size: the heap alone.
    pub heap: i64,
    /// pg_indexes_size.
    pub indexes: i64,
    /// n_live_tup of pg_stat_user_tables: rows the table holds.
    pub live_rows: i64,
    /// n_dead_tup: rows VACUUM has still to reclaim.
    pub dead_rows: i64,
    /// Events committed so far.
    pub events: u64,
    /// Taken while the producer ran; the last sample is taken after it stopped, when VACUUM
    /// may already have truncated the table, and is left out of the slopes.
    pub producing: bool,
}

pub struct StorageRun {
    /// The variant, as the tables name it.
    pub name: String,
    /// The variant's relay flags.
    pub flags: Vec<String>,
    /// Events/s its producer aimed at.
    pub rate: u64,
    /// Every size reading, the last after the producer stopped.
    pub samples: Vec<SizeSample>,
    /// Events the producer committed.
    pub events: u64,
    /// Producer time.
    pub seconds: f64,
}

impl StorageRun {
    /// Least-squares growth in bytes per second over the samples from `from` seconds on.
    pub fn slope(&self, from: f64) -> f64 {
        let pts: Vec<(f64, f64)> = self
            .samples
            .iter()
            .filter(|s| s.producing && s.seconds >= from)
            .map(|s| (s.seconds, s.total as f64))
            .collect();
        slope(&pts)
    }

    /// Events per second the producers reached.
    pub fn achieved_rate(&self) -> f64 {
        self.events as f64 / self.seconds
    }

    /// Bytes the table grew per event over the whole run.
    pub fn bytes_per_event(&self) -> f64 {
        self.slope(0.0) / self.achieved_rate()
    }

    /// Growth per day at the run's rate, from the second half's slope (after retention or
    /// vacuum had a chance to act).
    pub fn growth_per_day(&self) -> f64 {
        self.slope(self.seconds / 2.0) * 86_400.0
    }

    pub fn last(&self) -> Option<&SizeSample> {
        self.samples.last()
    }

    /// Smallest and largest size over the second half of the production: a table that
    /// stays flat keeps both about where they are.
    pub fn second_half_range(&self) -> (i64, i64) {
        let half = self
            .samples
            .iter()
            .filter(|s| s.producing && s.seconds >= self.seconds / 2.0);
        (
            half.clone().map(|s| s.total).min().unwrap_or(0),
            half.map(|s| s.total).max().unwrap_or(0),
        )
    }

    pub fn max_total(&self) -> i64 {
        self.samples.iter().map(|s| s.total).max().unwrap_or(0)
    }

    pub fn to_json(&self) -> Value {
        json!({
            "name": self.name,
            "flags": self.flags,
            "cluster": "durable",
            "rate": self.rate,
            "achieved_rate": self.achieved_rate(),
            "events": self.events,
            "seconds": self.seconds,
            "growth_bytes_per_second_whole_run": self.slope(0.0),
            "growth_bytes_per_second_second_half": self.slope(self.seconds / 2.0),
            "bytes_per_event_whole_run": self.bytes_per_event(),
            "growth_bytes_per_day_at_this_rate": self.growth_per_day(),
            "max_total_bytes": self.max_total(),
            "second_half_min_total_bytes": self.second_half_range().0,
            "second_half_max_total_bytes": self.second_half_range().1,
            "samples": self.samples.iter().map(|s| json!({
                "seconds": s.seconds,
                "total_bytes": s.total,
                "heap_bytes": s.heap,
                "index_bytes": s.indexes,
                "toast_and_maps_bytes": s.total - s.heap - s.indexes,
                "live_rows": s.live_rows,
                "dead_rows": s.dead_rows,
                "events_committed": s.events,
                "producer_running": s.producing,
            })).collect::<Vec<_>>(),
        })
    }
}

/// The variants: the build's default retention, rows kept a week, delete on acknowledgement
/// (left out where it is the default: `--retention 0`).
pub fn variants(relay_help: &str) -> Vec<(String, Vec<String>)> {
    let default = help_value(relay_help, "--retention").unwrap_or_else(|| "?".into());
    let mut v = vec![(format!("default (--retention {default})"), Vec::new())];
    if default != "7d" {
        v.push((
            "--retention 7d".to_string(),
            vec!["--retention".into(), "7d".into()],
        ));
    }
    if default != "0" {
        v.push((
            "--delete-on-ack".to_string(),
            vec!["--delete-on-ack".to_string()],
        ));
    }
    v
}

pub async fn storage(
    settings: &Settings,
    cluster: &PrivatePg,
    wakeup: &Wakeup,
    relay_help: &str,
) -> Vec<StorageRun> {
    let rate = settings.storage_rate;
    let sink = Sink::start(SQS_LATENCY, false).await;
    let mut sets = Vec::new();
    for (name, flags) in variants(relay_help) {
        let db = cluster.create_db().await;
        migrate(&db, wakeup).await;
        let id = format!("bench-storage-{}", sets.len());
        let relay = start_relay(settings, &db, wakeup, &sink, &id, &flags).await;
        sets.push((name, flags, db, relay));
    }
    let started = Instant::now();
    let runs = futures_util::future::join_all(sets.iter().enumerate().map(
        |(i, (name, flags, db, _))| async move {
            let committed = Arc::new(AtomicU64::new(0));
            let stop = Arc::new(AtomicBool::new(false));
            let sampler = tokio::spawn(sample_sizes(
                TestDb {
                    name: db.name.clone(),
                    url: db.url.clone(),
                },
                Arc::clone(&committed),
                settings.storage_every,
                Arc::clone(&stop),
            ));
            let prefix = format!("st{i}");
            let producing = workload::produce(
                db,
                &prefix,
                rate,
                settings.storage_duration,
                8,
                Arc::clone(&committed),
            );
            let produced = producing.await;
            stop.store(true, Ordering::Relaxed);
            let mut samples = sampler.await.expect("size sampler");
            let mut last = size_sample(db, produced.seconds, &committed).await;
            last.producing = false;
            samples.push(last);
            let events = produced.commits.iter().flatten().count() as u64;
            StorageRun {
                name: name.clone(),
                flags: flags.clone(),
                rate,
                samples,
                events,
                seconds: produced.seconds,
            }
        },
    ))
    .await;
    say(&format!(
        "  storage: {} variants at {rate} events/s for {:.0} s",
        runs.len(),
        started.elapsed().as_secs_f64()
    ));
    for (_, _, db, relay) in &sets {
        check_alive(std::slice::from_ref(relay));
        stop(std::slice::from_ref(relay)).await;
        drop_db(cluster, db).await;
    }
    runs
}

/// Reads the table's size at once and then every `every` until `stop` is set.
async fn sample_sizes(
    db: TestDb,
    committed: Arc<AtomicU64>,
    every: Duration,
    stop: Arc<AtomicBool>,
) -> Vec<SizeSample> {
    let start = Instant::now();
    let mut samples = Vec::new();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if stop.load(Ordering::Relaxed) {
            return samples;
        }
        samples.push(size_sample(&db, start.elapsed().as_secs_f64(), &committed).await);
    }
}

async fn size_sample(db: &TestDb, seconds: f64, committed: &AtomicU64) -> SizeSample {
    let client = db.client().await;
    let row = client
        .query_one(
            "SELECT pg_total_relation_size('outbox'), pg_relation_size('outbox'), \
                    pg_indexes_size('outbox'), \
                    coalesce(n_live_tup, 0), coalesce(n_dead_tup, 0) \
             FROM pg_stat_user_tables WHERE relid = 'outbox'::regclass",
            &[],
        )
        .await
        .expect("table size");
    SizeSample {
        seconds,
        total: row.get(0),
        heap: row.get(1),
        indexes: row.get(2),
        live_rows: row.get(3),
        dead_rows: row.get(4),
        events: committed.load(Ordering::Relaxed),
        producing: true,
    }
}

/// The variants at once on the durable cluster, a progress line for each.
pub async fn run(
    settings: &Settings,
    cluster: &PrivatePg,
    wakeup: &Wakeup,
    relay_help: &str,
) -> Vec<StorageRun> {
    let runs = storage(settings, cluster, wakeup, relay_help).await;
    for r in &runs {
        say(&format!(
            "storage, {}: {:.0} events/s for {:.0} s: table {:.1} MiB at the end (max {:.1}), {:.0} bytes/event over the run, {:.2} GiB/day at this rate (second half's slope)",
            r.name,
            r.achieved_rate(),
            r.seconds,
            r.last().map_or(0.0, |l| l.total as f64 / 1048576.0),
            r.max_total() as f64 / 1048576.0,
            r.bytes_per_event(),
            r.growth_per_day() / 1073741824.0,
        ));
    }
    runs
}
