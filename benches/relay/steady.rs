//! Group `steady`: commit-to-send latency at steady rates on the durable cluster, and why a
//! rate is or is not kept.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::cluster::Clusters;
use crate::harm;
use crate::procstat::{self, Snapshot};
use crate::progress::say;
use crate::relays::{check_alive, relay_args};
use crate::sampler::{Activity, Sampler};
use crate::settings::{Settings, PRODUCER_CONNECTIONS};
use crate::sink::Sink;
use crate::stats::{quantile, signed_ms};
use crate::support::{self, RelayProcess};
use crate::timeline::{self, Second};
use crate::workload::{self, Database};
use outbox_relay::outbox::OrderBy;

/// What one steady run measured, before the statistics.
pub struct SteadyInput {
    /// Events/s the producers aimed at.
    pub rate: u64,
    /// Producer time, from the first due event to the last commit.
    pub seconds: f64,
    /// Time over which `cpu` and `relay_cpu` were taken: production and catching up.
    pub measured_seconds: f64,
    /// Commit-to-send latency of each event in event order; `None` if it never arrived.
    pub latencies_ms: Vec<Option<f64>>,
    /// CPU seconds of the relay over `measured_seconds`.
    pub relay_cpu: f64,
    /// The relay's VmHWM at the end.
    pub relay_peak_rss_mib: f64,
    /// CPU of every process on the machine over `measured_seconds`.
    pub cpu: Snapshot,
    /// What the relay's database connections were doing, sampled.
    pub activity: Activity,
    /// SendMessageBatch requests the sink answered: entries ÷ requests says how full the
    /// batches were.
    pub sink_requests: u64,
    /// Entries the sink received, duplicates included.
    pub sink_entries: u64,
    /// How late the producers' INSERTs returned after they were due.
    pub producer_late_p50_ms: f64,
    /// See `producer_late_p50_ms`.
    pub producer_late_p99_ms: f64,
    /// What the producers' backends waited on (harm::WaitSampler).
    pub writer_waits: std::collections::BTreeMap<String, u64>,
    /// The run second by second (backlog, probe, vacuum, cores).
    pub timeline: Vec<Second>,
}

pub struct SteadyRun {
    /// Events/s the producers aimed at.
    pub rate: u64,
    /// Events the producers committed.
    pub events: usize,
    /// Events/s the producers reached: below `rate` when the database did not keep up.
    pub achieved_rate: f64,
    /// Events the sink never saw within the wait.
    pub missing: usize,
    /// Commit-to-send latency quantiles over the events that arrived.
    pub p50_ms: f64,
    /// See `p50_ms`.
    pub p99_ms: f64,
    /// See `p50_ms`.
    pub p999_ms: f64,
    /// The slowest event that arrived.
    pub max_ms: f64,
    /// Median latency in each fifth of the run (by event number): growing means the relay
    /// falls behind, flat means it keeps up.
    pub p50_ms_by_fifth: Vec<f64>,
    /// Sorted commit-to-send latencies, for the CDF.
    pub latencies_ms: Vec<f64>,
    /// CPU seconds of the relay over `measured_seconds`.
    pub relay_cpu: f64,
    /// The relay's VmHWM at the end.
    pub relay_peak_rss_mib: f64,
    /// CPU of every process on the machine over `measured_seconds`.
    pub cpu: Snapshot,
    /// What the relay's database connections were doing, sampled.
    pub activity: Activity,
    /// How full the relay's batches were at this rate.
    pub entries_per_request: f64,
    /// Time over which `cpu` and `relay_cpu` were taken.
    pub measured_seconds: f64,
    /// How late the producers' INSERTs returned after they were due: a rate not kept shows here.
    pub producer_late_p50_ms: f64,
    /// See `producer_late_p50_ms`.
    pub producer_late_p99_ms: f64,
    /// What the producers' backends waited on (harm::WaitSampler).
    pub writer_waits: std::collections::BTreeMap<String, u64>,
    /// The run second by second (backlog, probe, vacuum, cores).
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

    pub fn relay_cpu_per_10k(&self) -> f64 {
        self.relay_cpu / self.events.max(1) as f64 * 10_000.0
    }

    pub fn to_json(&self) -> Value {
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

/// A producer at `rate` events/s into an empty outbox, one relay on the 0 ms sink; commit-to-
/// send latency per event, from the producer's clock after COMMIT to the sink's on arrival.
async fn steady(
    settings: &Settings,
    cluster: &support::pg::PrivatePg,
    rate: u64,
    order: Option<OrderBy>,
) -> SteadyRun {
    let database = Database::create_in(cluster).await;
    let sink = std::sync::Arc::new(Sink::start(Duration::ZERO, true).await);
    let relay_id = format!("bench-steady-{rate}");
    // Group `order-by`: a FIFO queue, every group ordered, in the order asked for.
    let queue = if order.is_some() {
        "bench.fifo"
    } else {
        "bench"
    };
    let mut args = relay_args(
        settings,
        &database.db.url,
        &sink.queue_url(queue),
        &sink.endpoint,
        &relay_id,
        settings.in_flight,
    );
    if let Some(order) = order {
        if order == OrderBy::Transaction {
            database.order_by_transaction().await;
        }
        args.extend(["--ordered", "on", "--order-by", &order.to_string()].map(String::from));
    }
    let relay = RelayProcess::spawn_named(&relay_id, &args, &[]);
    // Ready once it answers /metrics; its LISTEN connection comes up just after that, and
    // events committed before it would wait for the 1 s poll instead of a wake-up.
    relay.metric("outbox_events_sent_total").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = Snapshot::take();
    let measuring = Instant::now();
    let relay_cpu_before = procstat::cpu_seconds(relay.pid()).unwrap_or(0.0);
    let sampler = Sampler::start(&database.db).await;
    let committed = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let timeline = timeline::Timeline::start(
        &database.db,
        std::sync::Arc::clone(&sink),
        std::sync::Arc::clone(&committed),
        relay.pid(),
    )
    .await;
    let writer_waits = harm::WaitSampler::start(&database.db).await;
    let produced = workload::produce(
        &database.db,
        &format!("s{rate}"),
        rate,
        settings.steady,
        PRODUCER_CONNECTIONS,
        committed,
    )
    .await;
    let writer_waits = writer_waits.finish().await;
    let total = produced.commits.len();
    let deadline = Instant::now() + Duration::from_secs(60);
    while sink.arrivals_len() < total && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let timeline = timeline.finish().await;
    let activity = sampler.finish().await;
    let relay_cpu = procstat::cpu_seconds(relay.pid()).unwrap_or(0.0) - relay_cpu_before;
    let relay_peak_rss_mib = procstat::peak_rss_mib(relay.pid()).unwrap_or(0.0);
    let cpu = Snapshot::take().since(&before);
    let measured_seconds = measuring.elapsed().as_secs_f64();
    check_alive(std::slice::from_ref(&relay));
    relay.sigterm();
    relay.wait_exit(Duration::from_secs(30)).await;

    let mut first_arrival: Vec<Option<Instant>> = vec![None; total];
    for (n, at) in sink.arrivals() {
        let slot = (n as usize)
            .checked_sub(1)
            .and_then(|i| first_arrival.get_mut(i));
        if let Some(slot) = slot {
            if slot.is_none_or(|earlier| at < earlier) {
                *slot = Some(at);
            }
        }
    }
    let latencies_ms: Vec<Option<f64>> = produced
        .commits
        .iter()
        .zip(&first_arrival)
        .map(|(commit, arrival)| {
            let (commit, arrival) = ((*commit)?, (*arrival)?);
            // An event can reach the sink before the producer's COMMIT call returns: the
            // notification goes out at commit, the reply still has to travel back.
            Some(signed_ms(commit, arrival))
        })
        .collect();
    let (sink_requests, sink_entries) = (sink.requests(), sink.entries());
    drop(sink);
    database.drop_now().await;
    let late = produced.lateness_ms();
    SteadyRun::new(SteadyInput {
        producer_late_p50_ms: quantile(&late, 0.5),
        producer_late_p99_ms: quantile(&late, 0.99),
        writer_waits,
        timeline,
        rate,
        seconds: produced.seconds,
        measured_seconds,
        latencies_ms,
        relay_cpu,
        relay_peak_rss_mib,
        cpu,
        activity,
        sink_requests,
        sink_entries,
    })
}

/// A run at each of `settings.steady_rates`, on the durable cluster.
pub async fn run(settings: &Settings, clusters: &mut Clusters) -> Vec<SteadyRun> {
    let mut runs = Vec::new();
    for &rate in &settings.steady_rates {
        let run = steady(settings, clusters.durable().await, rate, None).await;
        say(&format!(
            "steady {} events/s, durable (achieved {:.0}): commit-to-send p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms, max {:.2} ms; producers late p50 {:.1} ms, p99 {:.1} ms; {}",
            rate, run.achieved_rate, run.p50_ms, run.p99_ms, run.p999_ms, run.max_ms,
            run.producer_late_p50_ms, run.producer_late_p99_ms,
            timeline::summary(&run.timeline)
        ));
        runs.push(run);
    }
    runs
}

/// Group `order-by`: the steady stream at 2,000 events/s on the durable cluster, FIFO and
/// ordered, in insertion order and in transaction order, alternated `rounds` times.
pub async fn order_by(settings: &Settings, clusters: &mut Clusters, rounds: usize) {
    let rate = 2_000;
    let mut runs: Vec<(OrderBy, SteadyRun)> = Vec::new();
    for _ in 0..rounds {
        for order in [OrderBy::Id, OrderBy::Transaction] {
            let run = steady(settings, clusters.durable().await, rate, Some(order)).await;
            say(&format!(
                "order-by {order}: steady {rate} events/s, durable, FIFO ordered (achieved {:.0}): commit-to-send p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms",
                run.achieved_rate, run.p50_ms, run.p99_ms, run.p999_ms
            ));
            runs.push((order, run));
        }
    }
    for order in [OrderBy::Id, OrderBy::Transaction] {
        let of: Vec<&SteadyRun> = runs
            .iter()
            .filter(|(o, _)| *o == order)
            .map(|(_, r)| r)
            .collect();
        let median = |f: fn(&SteadyRun) -> f64| {
            let mut v: Vec<f64> = of.iter().map(|r| f(r)).collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        say(&format!(
            "order-by {order}: median of {} rounds: p50 {:.2} ms, p99 {:.2} ms",
            of.len(),
            median(|r| r.p50_ms),
            median(|r| r.p99_ms)
        ));
    }
}
