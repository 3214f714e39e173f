//! Results: the table printed at the end, results.json, and the data files the plots read.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::backlog::BacklogRun;
use crate::collector::{Collector, Received};
use crate::harm::{self, HarmRun, IdleClusterCpu, IdleRun};
use crate::procstat::Snapshot;
use crate::sampler::Activity;
use crate::storage::StorageRun;
use crate::timeline::{self, Second};
use crate::workload::Ceiling;
use crate::{support, Destination, Settings, Traces, SQS_LATENCY};

/// Entries per SendMessageBatch request (SQS's limit, and what the relay packs).
const ENTRIES_PER_REQUEST: f64 = 10.0;

pub struct CeilingRun {
    pub ceiling: Ceiling,
    pub cpu: Snapshot,
    pub activity: Activity,
}

pub struct DrainRun {
    pub name: String,
    pub destination: Destination,
    pub replicas: usize,
    pub max_in_flight: usize,
    pub fifo: bool,
    pub ordered: bool,
    pub flags: Vec<String>,
    pub rows: u64,
    /// Message groups of the backlog (distinct `aggregate_id`s).
    pub groups: u64,
    pub sent: u64,
    pub seconds: f64,
    /// When a reading first saw an event sent, and how many it saw: what comes before is the
    /// relay's start-up, which weighs on a drain of a second or less.
    pub first_sent: Option<(f64, u64)>,
    /// When half the backlog had been sent: a drain whose second half is slower than its
    /// first pays for what the first half left behind.
    pub half_seconds: Option<f64>,
    /// Stopped at the window rather than at the end of the backlog.
    pub cut: bool,
    /// utime + stime of all replicas over the run.
    pub relay_cpu: f64,
    /// Largest VmHWM among the replicas.
    pub relay_peak_rss_mib: f64,
    pub cpu: Snapshot,
    /// What the relays' database connections were doing, sampled.
    pub activity: Activity,
    /// Rows still unsent after a full drain (should be 0).
    pub unsent_after: Option<i64>,
    /// Sink only: entries received (duplicates included) and requests.
    pub received: Option<u64>,
    pub requests: Option<u64>,
    /// Sink only: offloaded bodies it received (PutObject requests).
    pub objects: Option<u64>,
    pub fifo_behind: u64,
    pub fifo_missing_group: u64,
    pub payload_bytes: f64,
    pub table_mib_before: f64,
    pub table_mib_after: f64,
    /// From SIGTERM until every replica exited (a traced relay flushes its spans then).
    pub exit_seconds: f64,
    /// Tracing drains only (`None`: no OTLP endpoint set).
    pub traces: Option<TraceRun>,
}

/// One drain of the tracing group.
pub struct TracingDrain {
    /// 1-based; each round drains once per variant.
    pub round: usize,
    pub run: DrainRun,
}

impl TracingDrain {
    /// `tracing off`, or what [`TraceRun::label`] says.
    pub fn variant(&self) -> String {
        self.run
            .traces
            .as_ref()
            .map_or("tracing off".to_string(), TraceRun::label)
    }
}

/// Log lines of OpenTelemetry's own crates carry their crate name as the target
/// (`opentelemetry_sdk`, `opentelemetry-otlp`, ...).
pub const EXPORTER_LOG_TARGET: &str = "opentelemetry";

/// What became of a tracing drain's spans.
pub struct TraceRun {
    pub export: Traces,
    /// The batch processor's settings given to the relay (`OTEL_BSP_*`); empty: its defaults.
    pub settings: Vec<(String, String)>,
    /// What the collector received, decoded (`None` when it was down).
    pub received: Option<Received>,
    /// Spans the batch processor dropped because its queue was full: the SDK's own count,
    /// logged at shutdown (`dropped_span_count`), summed over the replicas.
    pub dropped: u64,
    /// Exports that failed (one error line each from the SDK).
    pub export_errors: u64,
}

impl TraceRun {
    pub fn new(
        export: Traces,
        settings: &[(String, String)],
        collector: Option<&Collector>,
        logs: &str,
    ) -> TraceRun {
        let dropped = logs
            .lines()
            .filter_map(|l| {
                let rest = l.split("dropped_span_count=").nth(1)?;
                let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
                digits.parse::<u64>().ok()
            })
            .sum();
        let export_errors = logs
            .lines()
            .filter(|l| l.contains("BatchSpanProcessor.ExportError"))
            .count() as u64;
        TraceRun {
            export,
            settings: settings.to_vec(),
            received: collector.map(Collector::received),
            dropped,
            export_errors,
        }
    }

    /// How the run is told apart in the tables.
    pub fn label(&self) -> String {
        self.export.label(&self.settings)
    }

    /// One line for the progress output.
    pub fn summary(&self, events: u64) -> String {
        let received = self.received.as_ref().map_or(
            "collector down, nothing received".to_string(),
            |r| {
                format!(
                    "{} spans received for {events} events ({} distinct events, {} in their row's trace) in {} requests, {:.0} bytes per span",
                    r.spans,
                    r.events,
                    r.in_row_trace,
                    r.requests,
                    r.bytes as f64 / r.spans.max(1) as f64
                )
            },
        );
        format!(
            "{received}; {} dropped (queue full), {} export errors",
            self.dropped, self.export_errors
        )
    }

    fn to_json(&self) -> Value {
        json!({
            "export": match self.export {
                Traces::Collector(_) => "collector",
                Traces::CollectorDown => "collector down",
            },
            "collector_delay_ms": match self.export {
                Traces::Collector(d) => Some(d.as_millis() as u64),
                Traces::CollectorDown => None,
            },
            "settings": self.settings.iter().map(|(k, v)| (k.clone(), Value::from(v.clone()))).collect::<serde_json::Map<_, _>>(),
            "collector_requests": self.received.as_ref().map(|r| r.requests),
            "collector_bytes": self.received.as_ref().map(|r| r.bytes),
            "spans_received": self.received.as_ref().map(|r| r.spans),
            "events_with_a_span_received": self.received.as_ref().map(|r| r.events),
            "spans_in_their_rows_trace": self.received.as_ref().map(|r| r.in_row_trace),
            "undecodable_requests": self.received.as_ref().map(|r| r.undecodable),
            "spans_dropped_queue_full": self.dropped,
            "export_errors": self.export_errors,
        })
    }
}

impl DrainRun {
    pub fn events_per_second(&self) -> f64 {
        self.sent as f64 / self.seconds
    }

    /// Events/s over the first and the second half of the backlog (full drains only).
    pub fn halves(&self) -> Option<(f64, f64)> {
        let half = self.half_seconds.filter(|_| !self.cut)?;
        let rows = self.rows as f64 / 2.0;
        Some((rows / half, rows / (self.seconds - half).max(1e-9)))
    }

    /// Events/s from the first reading that saw one sent to the end: the drain without the
    /// relay's start-up.
    pub fn events_per_second_sending(&self) -> Option<f64> {
        let (at, sent) = self.first_sent?;
        (self.seconds > at).then(|| (self.sent - sent) as f64 / (self.seconds - at))
    }

    /// Entries per SendMessageBatch the sink received.
    pub fn entries_per_request(&self) -> Option<f64> {
        Some(self.received? as f64 / self.requests?.max(1) as f64)
    }

    pub fn relay_cpu_per_10k(&self) -> f64 {
        self.relay_cpu / self.sent.max(1) as f64 * 10_000.0
    }

    pub fn busy_cores(&self) -> f64 {
        self.cpu.busy_cores(self.seconds)
    }

    fn sink_latency(&self) -> Option<Duration> {
        match self.destination {
            Destination::Sink(d) => Some(d),
            Destination::Fauxqs => None,
        }
    }

    fn destination_label(&self) -> String {
        match self.destination {
            Destination::Fauxqs => "fauxqs".to_string(),
            Destination::Sink(d) => format!("sink {} ms", d.as_millis()),
        }
    }

    /// The reference drain: one relay, defaults, standard queue, sink answering at once.
    fn is_base(&self, default_in_flight: usize) -> bool {
        self.sink_latency() == Some(Duration::ZERO)
            && self.replicas == 1
            && !self.fifo
            && self.max_in_flight == default_in_flight
    }

    fn is_sweep(&self) -> bool {
        self.sink_latency() == Some(SQS_LATENCY) && self.replicas == 1 && !self.fifo
    }

    fn to_json(&self) -> Value {
        json!({
            "name": self.name,
            "destination": self.destination_label(),
            "sink_latency_ms": self.sink_latency().map(|d| d.as_millis() as u64),
            "replicas": self.replicas,
            "max_in_flight": self.max_in_flight,
            "fifo": self.fifo,
            "ordered": self.ordered,
            "flags": self.flags,
            "rows": self.rows,
            "groups": self.groups,
            "sent": self.sent,
            "seconds": self.seconds,
            "first_sent_seconds": self.first_sent.map(|f| f.0),
            "cut_at_window": self.cut,
            "events_per_second": self.events_per_second(),
            "events_per_second_after_first_sent": self.events_per_second_sending(),
            "events_per_second_first_half": self.halves().map(|h| h.0),
            "events_per_second_second_half": self.halves().map(|h| h.1),
            "relay_cpu_seconds": self.relay_cpu,
            "relay_cpu_seconds_per_10k_events": self.relay_cpu_per_10k(),
            "relay_peak_rss_mib": self.relay_peak_rss_mib,
            "postgres_cpu_seconds": self.cpu.postgres,
            "bench_process_cpu_seconds": self.cpu.bench,
            "fauxqs_cpu_seconds": self.cpu.fauxqs,
            "other_processes_cpu_seconds": self.cpu.others(self.relay_cpu),
            "machine_busy_cores": self.busy_cores(),
            "relay_connections_busy": self.activity.busy(),
            "relay_connection_samples": self.activity.samples,
            "relay_connection_waits": self.activity.waits,
            "unsent_after": self.unsent_after,
            "sink_entries_received": self.received,
            "sink_requests": self.requests,
            "fifo_entries_behind_their_group": self.fifo_behind,
            "fifo_entries_without_group": self.fifo_missing_group,
            "payload_bytes_mean": self.payload_bytes,
            "table_mib_before": self.table_mib_before,
            "table_mib_after": self.table_mib_after,
            "exit_seconds": self.exit_seconds,
            "traces": self.traces.as_ref().map(TraceRun::to_json),
        })
    }
}

/// What one steady run measured, before the statistics.
pub struct SteadyInput {
    pub rate: u64,
    /// Producer time, from the first due event to the last commit.
    pub seconds: f64,
    /// Time over which `cpu` and `relay_cpu` were taken: production and catching up.
    pub measured_seconds: f64,
    /// Commit-to-send latency of each event in event order; `None` if it never arrived.
    pub latencies_ms: Vec<Option<f64>>,
    pub relay_cpu: f64,
    pub relay_peak_rss_mib: f64,
    pub cpu: Snapshot,
    pub activity: Activity,
    /// SendMessageBatch requests the sink answered: entries ÷ requests says how full the
    /// batches were.
    pub sink_requests: u64,
    pub sink_entries: u64,
    /// How late the producers' INSERTs returned after they were due.
    pub producer_late_p50_ms: f64,
    pub producer_late_p99_ms: f64,
    /// What the producers' backends waited on (harm::WaitSampler).
    pub writer_waits: std::collections::BTreeMap<String, u64>,
    pub timeline: Vec<Second>,
}

pub struct SteadyRun {
    pub rate: u64,
    pub events: usize,
    pub achieved_rate: f64,
    /// Events the sink never saw within the wait.
    pub missing: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
    /// Median latency in each fifth of the run (by event number): growing means the relay
    /// falls behind, flat means it keeps up.
    pub p50_ms_by_fifth: Vec<f64>,
    /// Sorted commit-to-send latencies, for the CDF.
    latencies_ms: Vec<f64>,
    pub relay_cpu: f64,
    pub relay_peak_rss_mib: f64,
    pub cpu: Snapshot,
    pub activity: Activity,
    pub entries_per_request: f64,
    pub measured_seconds: f64,
    pub producer_late_p50_ms: f64,
    pub producer_late_p99_ms: f64,
    pub writer_waits: std::collections::BTreeMap<String, u64>,
    pub timeline: Vec<Second>,
}

impl SteadyRun {
    pub fn new(input: SteadyInput) -> SteadyRun {
        let events = input.latencies_ms.len();
        let sorted_of = |part: &[Option<f64>]| {
            let mut v: Vec<f64> = part.iter().flatten().copied().collect();
            v.sort_by(f64::total_cmp);
            v
        };
        let latencies_ms = sorted_of(&input.latencies_ms);
        let fifth = events.div_ceil(5).max(1);
        let p50_ms_by_fifth = input
            .latencies_ms
            .chunks(fifth)
            .map(|part| quantile(&sorted_of(part), 0.5))
            .collect();
        let q = |p: f64| quantile(&latencies_ms, p);
        SteadyRun {
            rate: input.rate,
            events,
            achieved_rate: events as f64 / input.seconds,
            missing: events - latencies_ms.len(),
            p50_ms: q(0.5),
            p99_ms: q(0.99),
            p999_ms: q(0.999),
            max_ms: latencies_ms.last().copied().unwrap_or(f64::NAN),
            p50_ms_by_fifth,
            latencies_ms,
            relay_cpu: input.relay_cpu,
            relay_peak_rss_mib: input.relay_peak_rss_mib,
            cpu: input.cpu,
            activity: input.activity,
            entries_per_request: input.sink_entries as f64 / input.sink_requests.max(1) as f64,
            measured_seconds: input.measured_seconds,
            producer_late_p50_ms: input.producer_late_p50_ms,
            producer_late_p99_ms: input.producer_late_p99_ms,
            writer_waits: input.writer_waits,
            timeline: input.timeline,
        }
    }

    fn relay_cpu_per_10k(&self) -> f64 {
        self.relay_cpu / self.events.max(1) as f64 * 10_000.0
    }

    fn to_json(&self) -> Value {
        json!({
            "rate": self.rate,
            "events": self.events,
            "achieved_rate": self.achieved_rate,
            "missing": self.missing,
            "p50_ms": self.p50_ms,
            "p90_ms": quantile(&self.latencies_ms, 0.9),
            "p99_ms": self.p99_ms,
            "p999_ms": self.p999_ms,
            "max_ms": self.max_ms,
            "p50_ms_by_fifth_of_run": self.p50_ms_by_fifth,
            "negative_latencies": self.latencies_ms.iter().filter(|l| **l < 0.0).count(),
            "entries_per_request": self.entries_per_request,
            "relay_connections_busy": self.activity.busy(),
            "relay_connection_samples": self.activity.samples,
            "relay_connection_waits": self.activity.waits,
            "relay_cpu_seconds": self.relay_cpu,
            "relay_cpu_seconds_per_10k_events": self.relay_cpu_per_10k(),
            "relay_peak_rss_mib": self.relay_peak_rss_mib,
            "postgres_cpu_seconds": self.cpu.postgres,
            "bench_process_cpu_seconds": self.cpu.bench,
            "other_processes_cpu_seconds": self.cpu.others(self.relay_cpu),
            "machine_busy_cores": self.cpu.busy_cores(self.measured_seconds),
            "cluster": "durable",
            "producer_late_p50_ms": self.producer_late_p50_ms,
            "producer_late_p99_ms": self.producer_late_p99_ms,
            "producer_backend_samples": self.writer_waits,
            "timeline_summary": timeline::summary(&self.timeline),
            "timeline": self.timeline.iter().map(|s| s.to_json()).collect::<Vec<_>>(),
        })
    }
}

/// Nearest-rank quantile of sorted values.
pub fn quantile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

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

    fn ratios(&self) -> Vec<(String, Option<f64>)> {
        let c1 = self.ceiling(1);
        let c4 = self.ceiling(4);
        let base_rate = self.base().map(DrainRun::events_per_second);
        let b = self.batch;
        let mut r = vec![
            (
                format!("drain, sink 0 ms ÷ ceiling (batch {b}, 1 worker)"),
                Self::ratio(self.base(), c1),
            ),
            (
                format!("drain, sink 0 ms ÷ minimal ceiling (batch {b}, 1 connection)"),
                Self::ratio(self.base(), self.minimal_ceiling()),
            ),
            (
                "relay's ceiling ÷ minimal ceiling (what our SQL costs)".to_string(),
                c1.zip(self.minimal_ceiling()).map(|(r, m)| r / m),
            ),
            (
                format!("drain, sink 0 ms ÷ ceiling (batch {b}, 4 workers)"),
                Self::ratio(self.base(), c4),
            ),
            (
                format!(
                    "drain, sink 15 ms, in-flight {} ÷ ceiling (batch {b}, 1 worker)",
                    self.in_flight
                ),
                Self::ratio(self.sweep_at(self.in_flight), c1),
            ),
        ];
        if let Some(best) = self.sweep_best() {
            r.push((
                format!(
                    "drain, sink 15 ms, best (in-flight {}) ÷ ceiling (batch {b}, 1 worker)",
                    best.max_in_flight
                ),
                Self::ratio(Some(best), c1),
            ));
        }
        r.extend([
            (
                format!("drain, fauxqs ÷ ceiling (batch {b}, 1 worker)"),
                Self::ratio(self.fauxqs(), c1),
            ),
            (
                "ordered FIFO ÷ unordered (sink 0 ms)".to_string(),
                Self::ratio(self.ordered(), base_rate),
            ),
            (
                "FIFO --ordered off ÷ unordered (sink 0 ms)".to_string(),
                Self::ratio(self.fifo_unordered(), base_rate),
            ),
            (
                format!("ordered FIFO drain ÷ ordered ceiling (batch {b}, 1 worker)"),
                Self::ratio(self.ordered(), self.ceiling_of(true, 1)),
            ),
            (
                format!("ordered ceiling ÷ ceiling (batch {b}, 1 worker)"),
                self.ceiling_of(true, 1).zip(c1).map(|(o, u)| o / u),
            ),
            (
                "2 replicas ÷ 1".to_string(),
                Self::ratio(self.replicas(2), base_rate),
            ),
            (
                "ceiling 2 workers ÷ 1 worker (what the database permits)".to_string(),
                self.ceiling(2).zip(c1).map(|(two, one)| two / one),
            ),
            (
                "4 replicas ÷ 1".to_string(),
                Self::ratio(self.replicas(4), base_rate),
            ),
            (
                "4 replicas ÷ ceiling (4 workers)".to_string(),
                Self::ratio(self.replicas(4), c4),
            ),
        ]);
        for (dest, one, many) in self.long_group_pairs() {
            let (sending, from_start) = Self::long_group_ratio(one, many);
            r.push((
                format!(
                    "long group ({dest}): 1 group ÷ {} groups, after the first send",
                    many.map_or(0, |m| m.groups)
                ),
                sending,
            ));
            r.push((
                format!(
                    "long group ({dest}): 1 group ÷ {} groups, from the relay's start",
                    many.map_or(0, |m| m.groups)
                ),
                from_start,
            ));
        }
        r
    }

    fn targets(&self) -> Vec<Target> {
        let at_least = |what: &str, goal: f64, value: Option<f64>, note: String| Target {
            what: what.to_string(),
            goal: format!("≥ {goal}"),
            value,
            met: value.map(|v| v >= goal),
            note,
        };
        let at_most = |what: &str, goal: f64, unit: &str, value: Option<f64>| Target {
            what: what.to_string(),
            goal: format!("≤ {goal} {unit}"),
            value,
            met: value.map(|v| v <= goal),
            note: String::new(),
        };
        let c1 = self.ceiling(1);
        let steady_2k = self.steady.iter().find(|s| s.rate == 2_000);
        let best = self.sweep_best();
        let mut targets = Vec::new();
        // Issue 9: no harm to the application's database, measured on durable commits, for
        // the build's default wake-up (the first harm run).
        if let Some(run) = self.harm.first() {
            let label = run.wakeup.label();
            for s in run.summaries() {
                targets.push(at_least(
                    &format!("commits with ÷ without the relay, {} writer(s)", s.writers),
                    0.95,
                    Some(s.ratio()),
                    format!(
                        "{label}; medians {:.0} / {:.0} commits/s",
                        harm::median(&s.with),
                        harm::median(&s.without)
                    ),
                ));
                if s.writers == 16 {
                    targets.push(at_most(
                        "commit-to-sent p50, 16 writers",
                        5.0,
                        "ms",
                        Some(quantile(&s.latencies_ms, 0.5)),
                    ));
                    targets.push(at_most(
                        "commit-to-sent p99, 16 writers",
                        25.0,
                        "ms",
                        Some(quantile(&s.latencies_ms, 0.99)),
                    ));
                }
            }
        }
        let steady_5k = self.steady.iter().find(|s| s.rate == 5_000);
        targets.push(at_most(
            "steady 5,000/s (durable): commit-to-send p50",
            5.0,
            "ms",
            steady_5k.map(|s| s.p50_ms),
        ));
        targets.push(at_most(
            "steady 5,000/s (durable): commit-to-send p99",
            25.0,
            "ms",
            steady_5k.map(|s| s.p99_ms),
        ));
        if let Some(default) = self
            .harm
            .first()
            .map(|h| h.wakeup.clone())
            .or_else(|| self.idle.first().map(|i| i.wakeup.clone()))
        {
            for (relays, goal) in [(1usize, 1.0), (4, 3.0)] {
                let run = self
                    .idle
                    .iter()
                    .find(|i| i.wakeup == default && i.relays == relays);
                targets.push(at_most(
                    &format!("idle, {relays} relay(s): their PostgreSQL backends, % of a core"),
                    goal,
                    "%",
                    run.map(|r| r.per_second(r.backend_cpu) * 100.0),
                ));
            }
        }
        targets.push(at_least(
            "drain ÷ minimal ceiling (sink 0 ms, batch, 1 replica)",
            0.8,
            Self::ratio(self.base(), self.minimal_ceiling()),
            "fsync=off cluster, like the ceilings".to_string(),
        ));
        targets.extend([
            at_least(
                "drain ÷ ceiling, sink 0 ms",
                0.6,
                Self::ratio(self.base(), c1),
                "ceiling: same batch, 1 worker (a relay claims and settles on one connection)"
                    .to_string(),
            ),
            at_least(
                "drain ÷ ceiling, sink 15 ms (default in-flight)",
                0.5,
                Self::ratio(self.sweep_at(self.in_flight), c1),
                format!(
                    "bound by in-flight × 10 / 15 ms = {:.0} events/s",
                    self.in_flight as f64 * ENTRIES_PER_REQUEST / SQS_LATENCY.as_secs_f64()
                ),
            ),
            at_least(
                "drain ÷ ceiling, sink 15 ms (best in-flight)",
                0.5,
                Self::ratio(best, c1),
                best.map_or(String::new(), |b| {
                    format!("--max-in-flight {}", b.max_in_flight)
                }),
            ),
            at_most(
                "steady 2,000/s: commit-to-send p50",
                5.0,
                "ms",
                steady_2k.map(|s| s.p50_ms),
            ),
            at_most(
                "steady 2,000/s: commit-to-send p99",
                25.0,
                "ms",
                steady_2k.map(|s| s.p99_ms),
            ),
            at_least(
                "ordered FIFO (1,000 groups) ÷ unordered",
                0.5,
                Self::ratio(self.ordered(), self.base().map(DrainRun::events_per_second)),
                if self.ordered_flag {
                    "--ordered on vs. the standard-queue drain".to_string()
                } else {
                    "the relay has no --ordered flag yet: plain FIFO fields only".to_string()
                },
            ),
            at_least(
                "2 replicas ÷ 1",
                1.3,
                Self::ratio(
                    self.replicas(2),
                    self.base().map(DrainRun::events_per_second),
                ),
                self.ceiling(2).zip(c1).map_or(String::new(), |(two, one)| {
                    format!("the database itself: 2 connections ÷ 1 = {:.2}", two / one)
                }),
            ),
            at_most(
                "relay peak RSS during a drain",
                40.0,
                "MiB",
                self.drains
                    .iter()
                    .map(|d| d.relay_peak_rss_mib)
                    .reduce(f64::max),
            ),
        ]);
        // Issue 10: a long group drains fast; large events stay inside a 256 MiB container.
        let pairs = self.long_group_pairs();
        if pairs.is_empty() {
            targets.push(at_least(
                "long group: one group's 5,000 events ÷ 5,000 over 1,000 groups",
                0.3,
                None,
                String::new(),
            ));
        }
        for (dest, one, many) in pairs {
            targets.push(at_least(
                &format!("long group ({dest}): one group's 5,000 events ÷ 5,000 over 1,000 groups"),
                0.3,
                Self::long_group_ratio(one, many).0,
                "ordered FIFO; rates after the first send".to_string(),
            ));
        }
        targets.push(at_most(
            "relay peak RSS, ~900 KB events, default --max-bytes-in-flight",
            256.0,
            "MiB",
            self.large_events_default().map(|d| d.relay_peak_rss_mib),
        ));
        targets
    }

    pub fn table(&self) -> String {
        let mut t = String::new();
        let b = self.batch;
        let c1 = self.ceiling(1);
        if !self.ceilings.is_empty() {
            let _ = writeln!(
                t,
                "### Database ceiling: the relay's claim + mark-sent SQL, and the minimal one, no queue ({} rows, ~{:.0}-byte payloads; fsync=off cluster)\n",
                self.meta["rows"], self.payload_bytes
            );
            let _ = writeln!(
                t,
                "| claim | batch | workers | rows/s | claim ms | claim ms, first → last tenth | mark sent ms | connections busy | CPU s postgres / bench / others | cores busy |"
            );
            let _ = writeln!(t, "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|");
            for c in &self.ceilings {
                let _ = writeln!(
                    t,
                    "| {} | {} | {} | {:.0} | {:.2} | {:.2} → {:.2} | {:.2} | {:.0}% | {:.1} / {:.1} / {:.1} | {:.2} |",
                    if c.ceiling.minimal {
                        "minimal"
                    } else if c.ceiling.ordered {
                        "ordered"
                    } else {
                        "standard"
                    },
                    c.ceiling.batch,
                    c.ceiling.workers,
                    c.ceiling.rows_per_second(),
                    c.ceiling.claim_ms,
                    c.ceiling.claim_ms_by_tenth.first().copied().unwrap_or(f64::NAN),
                    c.ceiling.claim_ms_by_tenth.last().copied().unwrap_or(f64::NAN),
                    c.ceiling.settle_ms,
                    c.activity.busy() * 100.0,
                    c.cpu.postgres,
                    c.cpu.bench,
                    c.cpu.others(0.0),
                    c.cpu.busy_cores(c.ceiling.seconds)
                );
            }
        }
        if !self.drains.is_empty() {
            let _ = writeln!(
                t,
                "\n### Drains (relay: --batch-size {b}, standard queue unless FIFO; fsync=off cluster)\n"
            );
            let _ = writeln!(
                t,
                "| run | in-flight | events/s | ÷ ceiling (1 worker) | 1st → 2nd half events/s | seconds | relay CPU s / 10k | relay peak RSS MiB | relay DB conn busy | CPU s relay / postgres / bench+sink / fauxqs / others | cores busy |"
            );
            let _ = writeln!(t, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|");
            for d in &self.drains {
                let _ = writeln!(
                    t,
                    "| {}{} | {} | {:.0} | {} | {} | {:.1} | {:.2} | {:.1} | {:.0}% | {:.1} / {:.1} / {:.1} / {:.1} / {:.1} | {:.2} |",
                    d.name,
                    if d.cut {
                        format!(" (cut at {:.0} s: {} sent)", d.seconds, d.sent)
                    } else {
                        String::new()
                    },
                    d.max_in_flight,
                    d.events_per_second(),
                    fmt_ratio(c1.map(|c| d.events_per_second() / c)),
                    d.halves()
                        .map_or("—".to_string(), |(a, b)| format!("{a:.0} → {b:.0}")),
                    d.seconds,
                    d.relay_cpu_per_10k(),
                    d.relay_peak_rss_mib,
                    d.activity.busy() * 100.0,
                    d.relay_cpu,
                    d.cpu.postgres,
                    d.cpu.bench,
                    d.cpu.fauxqs,
                    d.cpu.others(d.relay_cpu),
                    d.busy_cores()
                );
            }
        }
        self.long_group_table(&mut t);
        self.large_events_table(&mut t);
        self.tracing_tables(&mut t);
        if !(self.ceilings.is_empty()
            && self.drains.is_empty()
            && self.long_group.is_empty()
            && self.large_events.is_empty()
            && self.tracing.is_empty()
            && self.steady.is_empty())
        {
            let _ = writeln!(
                t,
                "\n### What the relays' database connections did (pg_stat_activity every 20 ms)\n"
            );
            let _ = writeln!(t, "| run | samples |");
            let _ = writeln!(t, "|---|---|");
            for c in self.ceilings.iter().filter(|c| !c.ceiling.minimal) {
                let _ = writeln!(
                    t,
                    "| ceiling{}, {} worker(s) | {} |",
                    if c.ceiling.ordered { " (ordered)" } else { "" },
                    c.ceiling.workers,
                    c.activity.summary()
                );
            }
            for d in self
                .drains
                .iter()
                .chain(&self.long_group)
                .chain(&self.large_events)
                .chain(self.tracing.iter().map(|t| &t.run))
            {
                let _ = writeln!(t, "| {} | {} |", d.name, d.activity.summary());
            }
            for r in &self.steady {
                let _ = writeln!(t, "| steady {}/s | {} |", r.rate, r.activity.summary());
            }
        }
        if !self.steady.is_empty() {
            let _ = writeln!(
                t,
                "\n### Steady: commit-to-send latency (one relay, sink 0 ms, single-row transactions; durable cluster)\n"
            );
            let _ = writeln!(
                t,
                "| rate/s | achieved/s | events | p50 ms | p99 ms | p99.9 ms | max ms | p50 ms by fifth of the run | entries per request | relay DB conn busy | relay CPU s / 10k | CPU s others | cores busy |"
            );
            let _ = writeln!(
                t,
                "|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|"
            );
            for s in &self.steady {
                let missing = if s.missing > 0 {
                    format!(" ({} missing)", s.missing)
                } else {
                    String::new()
                };
                let by_fifth = s
                    .p50_ms_by_fifth
                    .iter()
                    .map(|v| format!("{v:.1}"))
                    .collect::<Vec<_>>()
                    .join(" → ");
                let _ = writeln!(
                    t,
                    "| {} | {:.0} | {}{} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {:.1} | {:.0}% | {:.2} | {:.1} | {:.2} |",
                    s.rate,
                    s.achieved_rate,
                    s.events,
                    missing,
                    s.p50_ms,
                    s.p99_ms,
                    s.p999_ms,
                    s.max_ms,
                    by_fifth,
                    s.entries_per_request,
                    s.activity.busy() * 100.0,
                    s.relay_cpu_per_10k(),
                    s.cpu.others(s.relay_cpu),
                    s.cpu.busy_cores(s.measured_seconds)
                );
            }
        }
        if !self.steady.is_empty() {
            let _ = writeln!(
                t,
                "\n### Steady: why a rate is or is not kept (durable cluster)\n"
            );
            let _ = writeln!(
                t,
                "| rate/s | producers late p50 / p99 ms | producers' backends | second by second |"
            );
            let _ = writeln!(t, "|---:|---|---|---|");
            for s in &self.steady {
                let _ = writeln!(
                    t,
                    "| {} | {:.1} / {:.1} | {} | {} |",
                    s.rate,
                    s.producer_late_p50_ms,
                    s.producer_late_p99_ms,
                    harm::shares(&s.writer_waits),
                    timeline::summary(&s.timeline)
                );
            }
        }
        self.harm_tables(&mut t);
        let _ = writeln!(t, "\n### Ratios (same run)\n");
        let _ = writeln!(t, "| ratio | value |");
        let _ = writeln!(t, "|---|---:|");
        for (what, value) in self.ratios() {
            let _ = writeln!(t, "| {what} | {} |", fmt_ratio(value));
        }
        let _ = writeln!(t, "\n### Targets\n");
        let _ = writeln!(t, "| target | goal | measured | met | note |");
        let _ = writeln!(t, "|---|---|---:|---|---|");
        for target in self.targets() {
            let _ = writeln!(
                t,
                "| {} | {} | {} | {} | {} |",
                target.what,
                target.goal,
                target.value.map_or("—".to_string(), |v| format!("{v:.2}")),
                match target.met {
                    Some(true) => "yes",
                    Some(false) => "NO",
                    None => "not run",
                },
                target.note
            );
        }
        t
    }

    fn long_group_table(&self, t: &mut String) {
        if self.long_group.is_empty() {
            return;
        }
        let _ = writeln!(
            t,
            "\n### Long group: one group's backlog against the same backlog over many groups (ordered FIFO, --batch-size {}; fsync=off cluster)\n",
            self.batch
        );
        let _ = writeln!(
            t,
            "| run | groups | events | events/s | events/s after the first send | seconds (first send seen at) | requests | entries per request | entries behind their group | relay CPU s / 10k | relay DB conn busy | CPU s others | cores busy |"
        );
        let _ = writeln!(
            t,
            "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"
        );
        for d in &self.long_group {
            let _ = writeln!(
                t,
                "| {} | {} | {} | {:.0} | {} | {:.2} ({}) | {} | {} | {} | {:.2} | {:.0}% | {:.1} | {:.2} |",
                d.name,
                d.groups,
                d.sent,
                d.events_per_second(),
                d.events_per_second_sending()
                    .map_or("—".to_string(), |r| format!("{r:.0}")),
                d.seconds,
                d.first_sent
                    .map_or("—".to_string(), |(at, n)| format!("{at:.2} s, {n} sent")),
                d.requests.map_or("—".to_string(), |r| r.to_string()),
                d.entries_per_request()
                    .map_or("—".to_string(), |e| format!("{e:.1}")),
                if d.requests.is_some() {
                    d.fifo_behind.to_string()
                } else {
                    "—".to_string()
                },
                d.relay_cpu_per_10k(),
                d.activity.busy() * 100.0,
                d.cpu.others(d.relay_cpu),
                d.busy_cores()
            );
        }
        let _ = writeln!(t);
        let _ = writeln!(
            t,
            "| destination | 1 group ÷ many, after the first send | from the relay's start |"
        );
        let _ = writeln!(t, "|---|---:|---:|");
        for (dest, one, many) in self.long_group_pairs() {
            let (sending, from_start) = Self::long_group_ratio(one, many);
            let _ = writeln!(
                t,
                "| {dest} | {} | {} |",
                fmt_ratio(sending),
                fmt_ratio(from_start)
            );
        }
    }

    fn tracing_tables(&self, t: &mut String) {
        if self.tracing.is_empty() {
            return;
        }
        let rows = self.tracing[0].run.rows;
        let _ = writeln!(
            t,
            "\n### Tracing: the same drain with spans exported (sink 0 ms, {rows} events each with a sampled traceparent, --batch-size {}, --max-in-flight {}; fsync=off cluster)\n",
            self.batch, self.in_flight
        );
        let mut variants: Vec<String> = Vec::new();
        for d in &self.tracing {
            if !variants.contains(&d.variant()) {
                variants.push(d.variant());
            }
        }
        let off: Vec<&TracingDrain> = self
            .tracing
            .iter()
            .filter(|d| d.run.traces.is_none())
            .collect();
        let off_rates: Vec<f64> = off.iter().map(|d| d.run.events_per_second()).collect();
        let off_median = harm::median(&off_rates);
        let _ = writeln!(
            t,
            "| variant | events/s, median (each round) | ÷ tracing off, medians | ÷ tracing off, each round | relay CPU s / 10k, median | relay peak RSS MiB, max | spans received ÷ events | spans dropped, queue full | export errors |"
        );
        let _ = writeln!(t, "|---|---|---:|---|---:|---:|---:|---:|---:|");
        for variant in &variants {
            let runs: Vec<&TracingDrain> = self
                .tracing
                .iter()
                .filter(|d| &d.variant() == variant)
                .collect();
            let rates: Vec<f64> = runs.iter().map(|d| d.run.events_per_second()).collect();
            let rate = harm::median(&rates);
            let each_round = runs
                .iter()
                .map(|d| {
                    let same_round_off = off.iter().find(|o| o.round == d.round);
                    fmt_ratio(
                        same_round_off
                            .map(|o| d.run.events_per_second() / o.run.events_per_second()),
                    )
                })
                .collect::<Vec<_>>()
                .join(", ");
            let traced: Vec<&TraceRun> =
                runs.iter().filter_map(|d| d.run.traces.as_ref()).collect();
            let received: Option<u64> = traced
                .iter()
                .map(|tr| tr.received.as_ref().map(|r| r.spans))
                .sum();
            let sent: u64 = runs.iter().map(|d| d.run.sent).sum();
            let _ =
                writeln!(
                t,
                "| {variant} | {rate:.0} ({}) | {} | {each_round} | {:.2} | {:.1} | {} | {} | {} |",
                rates
                    .iter()
                    .map(|r| format!("{r:.0}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                fmt_ratio(Some(rate / off_median)),
                harm::median(&runs.iter().map(|d| d.run.relay_cpu_per_10k()).collect::<Vec<_>>()),
                runs.iter()
                    .map(|d| d.run.relay_peak_rss_mib)
                    .fold(0.0, f64::max),
                if traced.is_empty() {
                    "—".to_string()
                } else {
                    received.map_or("— (down)".to_string(), |r| {
                        format!("{:.3} ({r} / {sent})", r as f64 / sent.max(1) as f64)
                    })
                },
                if traced.is_empty() {
                    "—".to_string()
                } else {
                    traced.iter().map(|tr| tr.dropped).sum::<u64>().to_string()
                },
                if traced.is_empty() {
                    "—".to_string()
                } else {
                    traced
                        .iter()
                        .map(|tr| tr.export_errors)
                        .sum::<u64>()
                        .to_string()
                },
            );
        }
        let _ = writeln!(t);
        let _ = writeln!(
            t,
            "| run | events/s | seconds | relay CPU s / 10k | relay peak RSS MiB | spans received | events with a span | spans in their row's trace | dropped, queue full | export requests | spans per request | bytes per span | export errors | exit s | CPU s relay / postgres / bench+sink / others | cores busy |"
        );
        let _ = writeln!(
            t,
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"
        );
        for d in &self.tracing {
            let r = &d.run;
            let received = r.traces.as_ref().and_then(|tr| tr.received.as_ref());
            let dash = || "—".to_string();
            let _ = writeln!(
                t,
                "| {} | {:.0} | {:.1} | {:.2} | {:.1} | {} | {} | {} | {} | {} | {} | {} | {} | {:.2} | {:.1} / {:.1} / {:.1} / {:.1} | {:.2} |",
                r.name,
                r.events_per_second(),
                r.seconds,
                r.relay_cpu_per_10k(),
                r.relay_peak_rss_mib,
                received.map_or_else(dash, |x| x.spans.to_string()),
                received.map_or_else(dash, |x| x.events.to_string()),
                received.map_or_else(dash, |x| x.in_row_trace.to_string()),
                r.traces.as_ref().map_or_else(dash, |tr| tr.dropped.to_string()),
                received.map_or_else(dash, |x| x.requests.to_string()),
                received.map_or_else(dash, |x| format!(
                    "{:.0}",
                    x.spans as f64 / x.requests.max(1) as f64
                )),
                received.map_or_else(dash, |x| format!(
                    "{:.0}",
                    x.bytes as f64 / x.spans.max(1) as f64
                )),
                r.traces
                    .as_ref()
                    .map_or_else(dash, |tr| tr.export_errors.to_string()),
                r.exit_seconds,
                r.relay_cpu,
                r.cpu.postgres,
                r.cpu.bench,
                r.cpu.others(r.relay_cpu),
                r.busy_cores()
            );
        }
    }

    fn large_events_table(&self, t: &mut String) {
        if self.large_events.is_empty() {
            return;
        }
        let _ = writeln!(
            t,
            "\n### Large events: a backlog near SQS's message size limit (standard queue, --batch-size {}, --max-in-flight {}; fsync=off cluster; ÷ default: against the default-budget inline run on the same sink)\n",
            self.batch, self.in_flight
        );
        let _ = writeln!(
            t,
            "| run | events | payload bytes (mean) | events/s | ÷ default | seconds | relay peak RSS MiB | relay CPU s | ÷ default | requests | entries per request | objects to S3 | CPU s others | cores busy |"
        );
        let _ = writeln!(
            t,
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        for d in &self.large_events {
            // Each sink's first run (the default budget, bodies inline) is its baseline.
            let base = self
                .large_events
                .iter()
                .find(|b| b.destination == d.destination)
                .unwrap_or(d);
            let _ = writeln!(
                t,
                "| {} | {} | {:.0} | {:.0} | {:.2} | {:.2} | {:.1} | {:.2} | {:.2} | {} | {} | {} | {:.1} | {:.2} |",
                d.name,
                d.sent,
                d.payload_bytes,
                d.events_per_second(),
                d.events_per_second() / base.events_per_second(),
                d.seconds,
                d.relay_peak_rss_mib,
                d.relay_cpu,
                d.relay_cpu / base.relay_cpu,
                d.requests.map_or("—".to_string(), |r| r.to_string()),
                d.entries_per_request()
                    .map_or("—".to_string(), |e| format!("{e:.1}")),
                d.objects.map_or("—".to_string(), |o| o.to_string()),
                d.cpu.others(d.relay_cpu),
                d.busy_cores()
            );
        }
    }

    /// results.json, table.md, and the plot data: inflight.tsv, inflight0.tsv, latency_cdf.tsv,
    /// plot_vars.gp.
    pub fn write(&self, dir: &Path) {
        let results = json!({
            "meta": self.meta,
            "payload_bytes_mean": self.payload_bytes,
            "seconds": self.seconds,
            "ceiling": self.ceilings.iter().map(|c| json!({
                "ordered": c.ceiling.ordered,
                "minimal": c.ceiling.minimal,
                "batch": c.ceiling.batch,
                "workers": c.ceiling.workers,
                "rows": c.ceiling.rows,
                "seconds": c.ceiling.seconds,
                "rows_per_second": c.ceiling.rows_per_second(),
                "claim_ms": c.ceiling.claim_ms,
                "mark_sent_ms": c.ceiling.settle_ms,
                "claim_ms_by_tenth_of_drain": c.ceiling.claim_ms_by_tenth,
                "postgres_cpu_seconds": c.cpu.postgres,
                "bench_process_cpu_seconds": c.cpu.bench,
                "other_processes_cpu_seconds": c.cpu.others(0.0),
                "machine_busy_cores": c.cpu.busy_cores(c.ceiling.seconds),
                "connections_busy": c.activity.busy(),
                "connection_samples": c.activity.samples,
                "connection_waits": c.activity.waits,
            })).collect::<Vec<_>>(),
            "drains": self.drains.iter().map(DrainRun::to_json).collect::<Vec<_>>(),
            "long_group": self.long_group.iter().map(DrainRun::to_json).collect::<Vec<_>>(),
            "large_events": self.large_events.iter().map(DrainRun::to_json).collect::<Vec<_>>(),
            "tracing": self.tracing.iter().map(|t| {
                let mut run = t.run.to_json();
                run["round"] = json!(t.round);
                run["variant"] = json!(t.variant());
                run
            }).collect::<Vec<_>>(),
            "steady": self.steady.iter().map(SteadyRun::to_json).collect::<Vec<_>>(),
            "harm": self.harm.iter().map(HarmRun::to_json).collect::<Vec<_>>(),
            "idle": self.idle.iter().map(IdleRun::to_json).collect::<Vec<_>>(),
            "idle_whole_clusters": self.idle_clusters.iter().map(|c| json!({
                "cluster": c.cluster,
                "seconds": c.seconds,
                "cpu_seconds": c.cpu,
                "percent_of_a_core": c.cpu / c.seconds * 100.0,
            })).collect::<Vec<_>>(),
            "storage": self.storage.iter().map(StorageRun::to_json).collect::<Vec<_>>(),
            "big_backlog": self.big_backlog.iter().map(BacklogRun::to_json).collect::<Vec<_>>(),
            "ratios": self.ratios().into_iter().map(|(what, v)| json!({"ratio": what, "value": v})).collect::<Vec<_>>(),
            "targets": self.targets().into_iter().map(|t| json!({
                "target": t.what, "goal": t.goal, "value": t.value, "met": t.met, "note": t.note,
            })).collect::<Vec<_>>(),
        });
        write(
            &dir.join("results.json"),
            &serde_json::to_string_pretty(&results).expect("results as JSON"),
        );
        write(&dir.join("table.md"), &self.table());

        let mut inflight = String::from("# in_flight\tevents_per_s\tlatency_bound_per_s\n");
        for d in self.sweep() {
            let bound = d.max_in_flight as f64 * ENTRIES_PER_REQUEST / SQS_LATENCY.as_secs_f64();
            let _ = writeln!(
                inflight,
                "{}\t{:.1}\t{:.1}",
                d.max_in_flight,
                d.events_per_second(),
                bound
            );
        }
        write(&dir.join("inflight.tsv"), &inflight);
        let mut inflight0 = String::from("# in_flight\tevents_per_s (sink 0 ms, 1 replica)\n");
        for d in self
            .drains
            .iter()
            .filter(|d| d.sink_latency() == Some(Duration::ZERO) && d.replicas == 1 && !d.fifo)
        {
            let _ = writeln!(
                inflight0,
                "{}\t{:.1}",
                d.max_in_flight,
                d.events_per_second()
            );
        }
        write(&dir.join("inflight0.tsv"), &inflight0);

        // One block per rate (gnuplot `index`), at most ~2,000 points each.
        let mut cdf = String::new();
        for s in &self.steady {
            let _ = writeln!(cdf, "# rate {}\n# latency_ms\tfraction", s.rate);
            let n = s.latencies_ms.len();
            let step = (n / 2000).max(1);
            for i in (0..n)
                .step_by(step)
                .chain(std::iter::once(n.saturating_sub(1)))
            {
                if n == 0 {
                    break;
                }
                let _ = writeln!(
                    cdf,
                    "{:.4}\t{:.6}",
                    s.latencies_ms[i].max(0.01),
                    (i + 1) as f64 / n as f64
                );
            }
            cdf.push_str("\n\n");
        }
        write(&dir.join("latency_cdf.tsv"), &cdf);

        let mut vars = String::new();
        let num = |v: Option<f64>| v.filter(|v| v.is_finite()).unwrap_or(0.0);
        let _ = writeln!(vars, "ceiling1 = {:.1}", num(self.ceiling(1)));
        let _ = writeln!(vars, "ceiling4 = {:.1}", num(self.ceiling(4)));
        let _ = writeln!(
            vars,
            "drain0 = {:.1}",
            num(self.base().map(DrainRun::events_per_second))
        );
        let _ = writeln!(vars, "batch = {}", self.batch);
        let _ = writeln!(vars, "steady_blocks = {}", self.steady.len());
        for (i, s) in self.steady.iter().enumerate() {
            let _ = writeln!(
                vars,
                "steady_title{i} = \"{}/s: p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms\"",
                s.rate, s.p50_ms, s.p99_ms, s.p999_ms
            );
        }
        write(&dir.join("plot_vars.gp"), &vars);
    }
}

impl Report {
    /// Harm, idle and storage: the tables of what the relay costs the application.
    fn harm_tables(&self, t: &mut String) {
        if !self.harm.is_empty() {
            let _ = writeln!(
                t,
                "\n### Harm: application commits/s with the relay ÷ without (durable cluster; closed-loop single-row INSERTs; medians of alternating cells)\n"
            );
            let _ = writeln!(
                t,
                "| wake-up | cluster | writers | without (each cell) | with (each cell) | with ÷ without | commit-to-sent p50 / p99 / p99.9 ms | writers' backends, with the relay |"
            );
            let _ = writeln!(t, "|---|---|---:|---|---|---:|---|---|");
            for run in &self.harm {
                for s in run.summaries() {
                    let cells = |v: &[f64]| {
                        v.iter()
                            .map(|x| format!("{x:.0}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    };
                    let mut waits = std::collections::BTreeMap::new();
                    for c in run
                        .cells
                        .iter()
                        .filter(|c| c.writers == s.writers && c.with_relay)
                    {
                        for (k, n) in &c.writer_waits {
                            *waits.entry(k.clone()).or_insert(0) += n;
                        }
                    }
                    let _ = writeln!(
                        t,
                        "| {} | {} | {} | {:.0} ({}) | {:.0} ({}) | **{:.2}** | {:.1} / {:.1} / {:.1}{} | {} |",
                        run.wakeup.label(),
                        run.wakeup.cluster_label(),
                        s.writers,
                        harm::median(&s.without),
                        cells(&s.without),
                        harm::median(&s.with),
                        cells(&s.with),
                        s.ratio(),
                        quantile(&s.latencies_ms, 0.5),
                        quantile(&s.latencies_ms, 0.99),
                        quantile(&s.latencies_ms, 0.999),
                        if s.missing > 0 {
                            format!(" ({} never arrived)", s.missing)
                        } else {
                            String::new()
                        },
                        harm::shares(&waits),
                    );
                }
            }
        }
        if !self.idle.is_empty() {
            let _ = writeln!(
                t,
                "\n### Idle relays: what they cost with nothing to send (durable clusters; every set at once, each in its own database)\n"
            );
            let _ = writeln!(
                t,
                "| wake-up | cluster | relays | seconds | transactions/s | their PostgreSQL backends, % of a core | relay processes, % of a core |"
            );
            let _ = writeln!(t, "|---|---|---:|---:|---:|---:|---:|");
            for r in &self.idle {
                let _ = writeln!(
                    t,
                    "| {} | {} | {} | {:.0} | {:.2} | {:.2} | {:.2} |",
                    r.wakeup.label(),
                    r.wakeup.cluster_label(),
                    r.relays,
                    r.seconds,
                    r.per_second(r.transactions as f64),
                    r.per_second(r.backend_cpu) * 100.0,
                    r.per_second(r.relay_cpu) * 100.0,
                );
            }
            for c in &self.idle_clusters {
                let _ = writeln!(
                    t,
                    "\nWhole {} cluster over the same window (postmaster, background processes and every backend above): {:.2}% of a core.",
                    c.cluster,
                    c.cpu / c.seconds * 100.0
                );
            }
        }
        if !self.storage.is_empty() {
            let _ = writeln!(
                t,
                "\n### Storage: the outbox table under a steady stream (durable cluster; variants at once, each in its own database)\n"
            );
            let _ = writeln!(
                t,
                "| relay | events/s | seconds | size every sample (last: producers stopped), MiB | 2nd half min – max MiB | at the end: heap / indexes / rest MiB | bytes/event (whole run) | growth per day at this rate (2nd half) |"
            );
            let _ = writeln!(t, "|---|---:|---:|---|---|---|---:|---:|");
            for r in &self.storage {
                let mib = |b: i64| b as f64 / 1048576.0;
                let sizes = r
                    .samples
                    .iter()
                    .map(|x| format!("{:.0}", mib(x.total)))
                    .collect::<Vec<_>>()
                    .join(" → ");
                let end = r.last().map_or(String::new(), |l| {
                    format!(
                        "{:.1} / {:.1} / {:.1}",
                        mib(l.heap),
                        mib(l.indexes),
                        mib(l.total - l.heap - l.indexes)
                    )
                });
                let (low, high) = r.second_half_range();
                let _ = writeln!(
                    t,
                    "| {} | {:.0} | {:.0} | {} | {:.0} – {:.0} | {} | {:.0} | {:.2} GiB |",
                    r.name,
                    r.achieved_rate(),
                    r.seconds,
                    sizes,
                    mib(low),
                    mib(high),
                    end,
                    r.bytes_per_event(),
                    r.growth_per_day() / 1073741824.0,
                );
            }
        }
    }
}

fn fmt_ratio(v: Option<f64>) -> String {
    v.filter(|v| v.is_finite())
        .map_or("—".to_string(), |v| format!("{v:.2}"))
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}
