//! One drain: a pre-filled backlog sent by relay processes to fauxqs or the benchmark's sink,
//! timed until the relays have sent it; and what it measured ([`DrainRun`]).

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::cluster::DURABLE;
use crate::collector::{self, Collector};
use crate::procstat::{self, Snapshot};
use crate::progress::say;
use crate::relays::{check_alive_traced, relay_args, relay_args_with_defaults, sent_total, stop};
use crate::sampler::{Activity, Sampler};
use crate::settings::{Settings, SQS_LATENCY};
use crate::sink::Sink;
use crate::support::pg::PrivatePg;
use crate::support::{self, RelayProcess};
use crate::traces::{TraceRun, Traces};
use crate::workload::{Backlog, Database};

/// A drain that has not finished by then is stuck, not slow.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(300);
/// How often a drain reads the relays' sent counters: a 200,000-row drain takes seconds.
pub const DRAIN_POLL: Duration = Duration::from_millis(50);
/// The long-group and large-event drains take a second or less, so they are read finer.
pub const SHORT_DRAIN_POLL: Duration = Duration::from_millis(10);

/// Where a drain's relays send.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Destination {
    /// The local SQS-compatible server (fauxqs).
    Fauxqs,
    /// The minimal sink in this benchmark, answering after this delay.
    Sink(Duration),
}

pub struct DrainSpec {
    /// How the run is told apart in the progress lines and the tables.
    pub name: String,
    /// The rows written before the relays start.
    pub backlog: Backlog,
    /// How often the relays' sent counters are read: the resolution of the drain's time.
    pub poll: Duration,
    /// Where the relays send.
    pub destination: Destination,
    /// Relays draining the same table at once.
    pub replicas: usize,
    /// Every relay's `--max-in-flight`.
    pub max_in_flight: usize,
    /// Queue name ends in `.fifo` (message groups: `backlog.groups`).
    pub fifo: bool,
    /// Per-group ordered delivery asked for (`--ordered on`).
    pub ordered: bool,
    /// Extra relay flags of this run (e.g. `--ordered`).
    pub flags: Vec<String>,
    /// Stop after this long and report the rate reached.
    pub window: Option<Duration>,
    /// Where the relays export spans; `None`: tracing off (no OTLP endpoint set).
    pub traces: Option<Traces>,
    /// Extra environment of the relays (e.g. `OTEL_BSP_MAX_QUEUE_SIZE`): the harness scrubs
    /// the benchmark's own `OTEL_*` variables, so settings reach a relay only from here.
    pub env: Vec<(String, String)>,
    /// Sink only: bodies above this many bytes go through S3 first (`--offload-bucket`,
    /// `--offload-threshold`), to the sink's PutObject.
    pub offload_above: Option<usize>,
    /// The relays reach the database through a PgBouncer of the run's own in transaction
    /// pooling (2 server connections), with `--pooler transaction`.
    pub pgbouncer: bool,
    /// On a durable cluster of the drain's own (`fsync=on`, `synchronous_commit=on`) instead
    /// of the shared `fsync=off` one, and with the relay's own `--retention` and `--lease`:
    /// the drain as production runs it.
    pub durable: bool,
    /// The table migrated for `--order-by transaction`, and the relays run with it.
    pub order_by_transaction: bool,
}

/// A drain of the standard backlog ([`Backlog::orders`] of `OUTBOX_BENCH_ROWS`).
pub fn spec(
    settings: &Settings,
    name: &str,
    destination: Destination,
    replicas: usize,
    max_in_flight: usize,
) -> DrainSpec {
    DrainSpec {
        name: name.to_string(),
        backlog: Backlog::orders(settings.rows),
        poll: DRAIN_POLL,
        destination,
        replicas,
        max_in_flight,
        fifo: false,
        ordered: false,
        flags: Vec::new(),
        window: None,
        traces: None,
        env: Vec::new(),
        offload_above: None,
        pgbouncer: false,
        durable: false,
        order_by_transaction: false,
    }
}

pub fn say_drain(run: &DrainRun) {
    say(&format!(
        "{}: {:.0} events/s ({} in {:.2} s{}), relay {:.2} CPU s/10k events, peak RSS {:.1} MiB, {:.2} cores busy; relay DB connections: {}",
        run.name,
        run.events_per_second(),
        run.sent,
        run.seconds,
        if run.cut { ", cut at the window" } else { "" },
        run.relay_cpu_per_10k(),
        run.relay_peak_rss_mib,
        run.busy_cores(),
        run.activity.summary(),
    ));
}

/// A pre-filled backlog drained by `spec.replicas` relays; timed from the relays' start until
/// their `outbox_events_sent_total` adds up to the backlog (or the window ends).
pub async fn drain(settings: &Settings, spec: DrainSpec) -> DrainRun {
    let cluster = match spec.durable {
        true => Some(PrivatePg::start_with(DURABLE).await),
        false => None,
    };
    let database = match &cluster {
        Some(cluster) => Database::create_in(cluster).await,
        None => Database::create().await,
    };
    if spec.order_by_transaction {
        database.order_by_transaction().await;
    }
    let rows = spec.backlog.rows;
    let payload_bytes = database.fill(&spec.backlog).await;
    let table_mib_before = database.size_mib().await;
    let queue = if spec.fifo { "bench.fifo" } else { "bench" };
    let (sink, queue_url, endpoint) = match spec.destination {
        Destination::Fauxqs => {
            let url = support::create_queue(queue, &[]).await;
            (None, url, support::sqs().endpoint().to_string())
        }
        Destination::Sink(delay) => {
            let sink = Sink::start(delay, false).await;
            let url = sink.queue_url(queue);
            let endpoint = sink.endpoint.clone();
            (Some(sink), url, endpoint)
        }
    };
    let collector = match spec.traces {
        Some(Traces::Collector(delay)) => Some(Collector::start(delay).await),
        _ => None,
    };
    let mut env = spec.env.clone();
    match (spec.traces, &collector) {
        (Some(Traces::Collector(_)), Some(c)) => {
            env.push(("OTEL_EXPORTER_OTLP_ENDPOINT".into(), c.endpoint.clone()))
        }
        (Some(Traces::CollectorDown), _) => env.push((
            "OTEL_EXPORTER_OTLP_ENDPOINT".into(),
            collector::down_endpoint(),
        )),
        _ => {}
    }
    let tag = spec.name.replace([' ', ',', '-', '.', '=', '(', ')'], "");
    let bouncer = match spec.pgbouncer {
        true => Some(
            support::PgBouncer::start(
                support::pg().port(),
                support::pg().password(),
                support::Pooling {
                    mode: support::PoolMode::Transaction,
                    size: 2,
                    reset: false,
                },
            )
            .await,
        ),
        false => None,
    };
    let database_url = match &bouncer {
        Some(b) => b.url_for(&database.db.name),
        None => database.db.url.clone(),
    };
    let before = Snapshot::take();
    let started = Instant::now();
    let relays: Vec<RelayProcess> = (0..spec.replicas)
        .map(|i| {
            let id = format!("bench-{tag}-{i}");
            let args_of = match spec.durable {
                true => relay_args_with_defaults,
                false => relay_args,
            };
            let mut args = args_of(
                settings,
                &database_url,
                &queue_url,
                &endpoint,
                &id,
                spec.max_in_flight,
            );
            args.extend(spec.flags.iter().cloned());
            if spec.order_by_transaction {
                args.extend(["--order-by".to_string(), "transaction".to_string()]);
            }
            if let Some(threshold) = spec.offload_above {
                args.extend(
                    [
                        "--offload-bucket",
                        "bench-large-events",
                        "--offload-threshold",
                        &threshold.to_string(),
                        "--s3-endpoint-url",
                        &endpoint,
                    ]
                    .map(String::from),
                );
            }
            RelayProcess::spawn_named(&id, &args, &env)
        })
        .collect();
    let sampler = Sampler::start(&database.db).await;
    let mut sent;
    let mut cut = false;
    let mut half_seconds = None;
    let mut first_sent_seconds = None;
    loop {
        tokio::time::sleep(spec.poll).await;
        sent = sent_total(&relays).await;
        if first_sent_seconds.is_none() && sent > 0 {
            first_sent_seconds = Some((started.elapsed().as_secs_f64(), sent));
        }
        if half_seconds.is_none() && sent * 2 >= rows {
            half_seconds = Some(started.elapsed().as_secs_f64());
        }
        if sent >= rows {
            break;
        }
        let elapsed = started.elapsed();
        if spec.window.is_some_and(|w| elapsed >= w) {
            cut = true;
            break;
        }
        check_alive_traced(&relays, spec.traces.is_some());
        if elapsed >= DRAIN_TIMEOUT {
            let outputs: Vec<String> = relays.iter().map(|r| r.output()).collect();
            panic!(
                "{}: only {sent} of {rows} sent after {DRAIN_TIMEOUT:?}\n{}",
                spec.name,
                outputs.join("\n")
            );
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let relay_cpu: f64 = relays
        .iter()
        .filter_map(|r| procstat::cpu_seconds(r.pid()))
        .sum();
    let relay_peak_rss_mib = relays
        .iter()
        .filter_map(|r| procstat::peak_rss_mib(r.pid()))
        .fold(0.0, f64::max);
    let cpu = Snapshot::take().since(&before);
    let activity = sampler.finish().await;
    let stopping = Instant::now();
    stop(&relays).await;
    let exit_seconds = stopping.elapsed().as_secs_f64();
    let traces = spec.traces.map(|export| {
        let logs: Vec<String> = relays.iter().map(RelayProcess::output).collect();
        TraceRun::new(export, &spec.env, collector.as_ref(), &logs.join("\n"))
    });
    drop(collector);
    let unsent_after = if cut {
        None
    } else {
        Some(database.unsent().await)
    };
    let table_mib_after = database.size_mib().await;
    let (fifo_behind, fifo_missing_group) = sink.as_ref().map_or((0, 0), Sink::fifo_violations);
    let received = sink.as_ref().map(Sink::entries);
    let requests = sink.as_ref().map(Sink::requests);
    let objects = sink.as_ref().map(Sink::objects);
    drop(sink);
    database.drop_now().await;
    drop(cluster);
    DrainRun {
        name: spec.name,
        destination: spec.destination,
        replicas: spec.replicas,
        max_in_flight: spec.max_in_flight,
        fifo: spec.fifo,
        ordered: spec.ordered,
        flags: spec.flags,
        rows,
        groups: spec.backlog.groups,
        sent,
        seconds,
        half_seconds,
        first_sent: first_sent_seconds,
        cut,
        relay_cpu,
        relay_peak_rss_mib,
        cpu,
        activity,
        unsent_after,
        received,
        requests,
        objects,
        fifo_behind,
        fifo_missing_group,
        payload_bytes,
        table_mib_before,
        table_mib_after,
        exit_seconds,
        traces,
    }
}

pub struct DrainRun {
    /// From [`DrainSpec::name`]: the row's label in the tables.
    pub name: String,
    /// Where the relays sent: which table rows compare with which.
    pub destination: Destination,
    /// Relays that drained at once.
    pub replicas: usize,
    /// Every relay's `--max-in-flight`: the sweep's x axis.
    pub max_in_flight: usize,
    /// Drained into a `.fifo` queue.
    pub fifo: bool,
    /// Drained with per-group ordering (`--ordered on`).
    pub ordered: bool,
    /// The run's extra relay flags, to tell runs of one group apart.
    pub flags: Vec<String>,
    /// Rows of the backlog.
    pub rows: u64,
    /// Message groups of the backlog (distinct `aggregate_id`s).
    pub groups: u64,
    /// Events the relays counted as sent (`outbox_events_sent_total`) when the drain ended.
    pub sent: u64,
    /// From the relays' start until the backlog was sent (or the window ended).
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
    /// CPU of every process on the machine over the run, by kind.
    pub cpu: Snapshot,
    /// What the relays' database connections were doing, sampled.
    pub activity: Activity,
    /// Rows still unsent after a full drain (should be 0).
    pub unsent_after: Option<i64>,
    /// Sink only: entries received (duplicates included) and requests.
    pub received: Option<u64>,
    /// Sink only: SendMessageBatch requests it answered.
    pub requests: Option<u64>,
    /// Sink only: offloaded bodies it received (PutObject requests).
    pub objects: Option<u64>,
    /// Sink only: FIFO entries that arrived behind a later entry of their group (should be 0).
    pub fifo_behind: u64,
    /// Sink only: FIFO entries without a message group (should be 0).
    pub fifo_missing_group: u64,
    /// Mean payload size of the backlog, as the relay measures it.
    pub payload_bytes: f64,
    /// The outbox table's size before the drain and after it (`--retention off` keeps sent rows).
    pub table_mib_before: f64,
    /// See `table_mib_before`.
    pub table_mib_after: f64,
    /// From SIGTERM until every replica exited (a traced relay flushes its spans then).
    pub exit_seconds: f64,
    /// Tracing drains only (`None`: no OTLP endpoint set).
    pub traces: Option<TraceRun>,
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

    pub fn sink_latency(&self) -> Option<Duration> {
        match self.destination {
            Destination::Sink(d) => Some(d),
            Destination::Fauxqs => None,
        }
    }

    pub fn destination_label(&self) -> String {
        match self.destination {
            Destination::Fauxqs => "fauxqs".to_string(),
            Destination::Sink(d) => format!("sink {} ms", d.as_millis()),
        }
    }

    /// The reference drain: one relay, defaults, standard queue, sink answering at once.
    pub fn is_base(&self, default_in_flight: usize) -> bool {
        self.sink_latency() == Some(Duration::ZERO)
            && self.replicas == 1
            && !self.fifo
            && self.max_in_flight == default_in_flight
    }

    pub fn is_sweep(&self) -> bool {
        self.sink_latency() == Some(SQS_LATENCY) && self.replicas == 1 && !self.fifo
    }

    pub fn to_json(&self) -> Value {
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
