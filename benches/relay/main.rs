//! The relay benchmark: the real `outbox-relay` binary (release build) as a process against a
//! throwaway PostgreSQL, measured against the database's own ceiling in the same run.
//!
//! Run it with `scripts/bench` (installs what is missing, draws the plots); docs/benchmarks.md
//! says what each scenario measures and what the numbers mean. Knobs, all optional:
//!
//! | variable | default | |
//! |---|---|---|
//! | `OUTBOX_BENCH_QUICK` | off | `1`: a small run to try the benchmark out |
//! | `OUTBOX_BENCH_ROWS` | 200000 (quick: 20000) | backlog of each drain and ceiling run |
//! | `OUTBOX_BENCH_BATCH` | the relay's `--batch-size` default | every relay's `--batch-size`, and the ceiling's batch |
//! | `OUTBOX_BENCH_WINDOW` | 15 (quick: 5) | seconds a slow run may take before it is cut |
//! | `OUTBOX_BENCH_STEADY_SECONDS` | 15 (quick: 5) | producer time per steady rate |
//! | `OUTBOX_BENCH_HARM_SECONDS` | 15 (quick: 5) | writer time per harm cell |
//! | `OUTBOX_BENCH_HARM_ROUNDS` | 3 (quick: 1) | without/with alternations per writer count |
//! | `OUTBOX_BENCH_IDLE_SECONDS` | 60 (quick: 10) | measured idle window |
//! | `OUTBOX_BENCH_STORAGE_SECONDS` | 600 (quick: 60) | producer time of the storage run |
//! | `OUTBOX_BENCH_TRACING_ROUNDS` | 3 (quick: 1) | rounds of the tracing group (each runs every variant once) |
//! | `OUTBOX_BENCH_BACKLOG_ROWS` | 1000000 (quick: 100000) | backlog of the `big-backlog` group (the target: 10000000) |
//! | `OUTBOX_BENCH_BACKLOG_BASELINE_SECONDS` | 30 (quick: 10) | the application's 500 commits/s without the relay, before it starts |
//! | `OUTBOX_BENCH_ONLY` | all | comma list of `ceiling,drain,replicas,ordered,long-group,large-events,sweep,tracing,steady,harm,idle,storage,adopt,big-backlog,pooler` (adopt: see adopt.rs; big-backlog: backlog.rs; pooler: the drain with `--pooler transaction`, direct and through PgBouncer) |
//! | `OUTBOX_BENCH_RELAY_ARGS` | | extra flags for every relay, split on whitespace |
//! | `OUTBOX_BENCH_RELAY_PG_OPTIONS` | | server settings for the relays' own connections (libpq `options`), e.g. `-c synchronous_commit=off` |
//! | `OUTBOX_BENCH_OUT` | `target/bench` | where results.json and the plot data go |

#[path = "../../tests/support/mod.rs"]
mod support;

mod adopt;
mod backlog;
mod collector;
mod harm;
mod http;
mod procstat;
mod report;
mod sampler;
mod sink;
mod storage;
mod timeline;
mod workload;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use collector::Collector;
use procstat::Snapshot;
use report::{CeilingRun, DrainRun, Report, SteadyInput, SteadyRun, TraceRun, TracingDrain};
use sampler::Sampler;
use sink::Sink;
use support::RelayProcess;
use workload::{Backlog, Database, Payload};

/// What this run does; from the environment, see the table at the top.
pub struct Settings {
    pub quick: bool,
    pub rows: u64,
    /// `--batch-size` of every relay and the ceiling's batch: the relay's default unless
    /// `OUTBOX_BENCH_BATCH` says otherwise.
    pub batch: usize,
    /// The relay's default `--max-in-flight`; drains run at it unless they sweep.
    pub in_flight: usize,
    /// Runs that cannot finish the backlog in reasonable time stop after this long and
    /// report the rate they reached.
    pub window: Duration,
    pub steady: Duration,
    pub steady_rates: Vec<u64>,
    /// Writer time of one harm cell, and how many times without and with alternate.
    pub harm_seconds: Duration,
    pub harm_rounds: usize,
    /// Rounds of the tracing group; each round drains once per variant, in rotated order.
    pub tracing_rounds: usize,
    /// Idle relays run this long before the measured window, so that a wait that stretches
    /// with idleness has stretched.
    pub idle_settle: Duration,
    pub idle_window: Duration,
    /// Backlog of the `big-backlog` group, and its time without the relay first.
    pub backlog_rows: u64,
    pub backlog_baseline: Duration,
    pub storage_rate: u64,
    pub storage_duration: Duration,
    /// Table size is read this often during the storage run.
    pub storage_every: Duration,
    pub sweep: Vec<usize>,
    pub only: Option<Vec<String>>,
    pub relay_args: Vec<String>,
    /// libpq `options` added to every relay's database URL: tries a relay-side session
    /// setting without rebuilding the relay.
    pub relay_pg_options: Option<String>,
    pub out_dir: PathBuf,
}

/// In-region SQS answers SendMessageBatch in about this long.
const SQS_LATENCY: Duration = Duration::from_millis(15);
/// Producer connections for the steady runs. With durable commits one connection commits
/// ~300-500 rows/s and group commit needs many waiting at once (~4k/s with 16-64); open loop,
/// so idle connections cost nothing while the producers keep up.
const PRODUCER_CONNECTIONS: usize = 32;
/// A drain that has not finished by then is stuck, not slow.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(300);
/// How often a drain reads the relays' sent counters: a 200,000-row drain takes seconds.
const DRAIN_POLL: Duration = Duration::from_millis(50);
/// The long-group and large-event drains take a second or less, so they are read finer.
const SHORT_DRAIN_POLL: Duration = Duration::from_millis(10);
/// Long group: this many events, spread over [`workload::GROUPS`] groups, then all in one.
const LONG_GROUP_ROWS: u64 = 5_000;
/// Large events: this many, each with a payload of about [`LARGE_EVENT_BYTES`] (SQS takes
/// up to 1 MiB of body and attributes together).
const LARGE_EVENTS: u64 = 300;
const LARGE_EVENT_BYTES: usize = 900_000;
/// The offloaded large-events run sends every body above this many bytes through S3: all of
/// them.
const OFFLOAD_ABOVE: usize = 65_536;
/// A budget that bounds nothing here: the relay as it was before the byte budget (rows only).
const UNBOUNDED_BUDGET: &str = "1GiB";
/// The unbounded large-event run is skipped when its relay could come near this.
const UNBOUNDED_RSS_LIMIT: u64 = 1536 * 1024 * 1024;

impl Settings {
    fn from_env(relay_help: &str) -> Settings {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let number = |name: &str, default: u64| -> u64 {
            var(name).map_or(default, |v| {
                v.trim()
                    .replace('_', "")
                    .parse()
                    .unwrap_or_else(|_| panic!("{name}={v:?}: expected a whole number"))
            })
        };
        let quick = var("OUTBOX_BENCH_QUICK").is_some_and(|v| v != "0");
        let (rows, window, steady) = if quick {
            (20_000, 5, 5)
        } else {
            (200_000, 15, 15)
        };
        Settings {
            quick,
            rows: number("OUTBOX_BENCH_ROWS", rows),
            batch: number(
                "OUTBOX_BENCH_BATCH",
                help_default(relay_help, "--batch-size").unwrap_or(100),
            ) as usize,
            in_flight: help_default(relay_help, "--max-in-flight").unwrap_or(4) as usize,
            window: Duration::from_secs(number("OUTBOX_BENCH_WINDOW", window)),
            steady: Duration::from_secs(number("OUTBOX_BENCH_STEADY_SECONDS", steady)),
            steady_rates: vec![500, 2_000, 5_000],
            backlog_rows: number(
                "OUTBOX_BENCH_BACKLOG_ROWS",
                if quick { 100_000 } else { 1_000_000 },
            ),
            backlog_baseline: Duration::from_secs(number(
                "OUTBOX_BENCH_BACKLOG_BASELINE_SECONDS",
                if quick { 10 } else { 30 },
            )),
            harm_seconds: Duration::from_secs(number(
                "OUTBOX_BENCH_HARM_SECONDS",
                if quick { 5 } else { 15 },
            )),
            harm_rounds: number("OUTBOX_BENCH_HARM_ROUNDS", if quick { 1 } else { 3 }) as usize,
            tracing_rounds: number("OUTBOX_BENCH_TRACING_ROUNDS", if quick { 1 } else { 3 })
                as usize,
            idle_settle: Duration::from_secs(if quick { 3 } else { 10 }),
            idle_window: Duration::from_secs(number(
                "OUTBOX_BENCH_IDLE_SECONDS",
                if quick { 10 } else { 60 },
            )),
            storage_rate: 1_000,
            storage_duration: Duration::from_secs(number(
                "OUTBOX_BENCH_STORAGE_SECONDS",
                if quick { 60 } else { 600 },
            )),
            storage_every: Duration::from_secs(if quick { 10 } else { 30 }),
            // Below 4 requests in flight a drain only shows the bound in-flight × 10 / 15 ms
            // (measured before); the full run's time goes to the durable runs instead.
            sweep: if quick {
                vec![4, 16, 32]
            } else {
                vec![4, 8, 16, 32, 64]
            },
            only: var("OUTBOX_BENCH_ONLY")
                .map(|v| v.split(',').map(|s| s.trim().to_string()).collect()),
            relay_args: var("OUTBOX_BENCH_RELAY_ARGS")
                .map(|v| v.split_whitespace().map(str::to_string).collect())
                .unwrap_or_default(),
            relay_pg_options: var("OUTBOX_BENCH_RELAY_PG_OPTIONS"),
            out_dir: var("OUTBOX_BENCH_OUT")
                .map(PathBuf::from)
                .unwrap_or_else(|| support::repo_root().join("target/bench")),
        }
    }

    /// `url` with [`Settings::relay_pg_options`] added, for a relay's `--database-url`.
    pub fn relay_url(&self, url: &str) -> String {
        let Some(options) = &self.relay_pg_options else {
            return url.to_string();
        };
        let encoded: String = options
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        let separator = if url.contains('?') { '&' } else { '?' };
        format!("{url}{separator}options={encoded}")
    }

    fn runs(&self, group: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|only| only.iter().any(|g| g == group))
    }
}

/// Where a drain's relays send.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Destination {
    /// The local SQS-compatible server (fauxqs).
    Fauxqs,
    /// The minimal sink in this benchmark, answering after this delay.
    Sink(Duration),
}

pub struct DrainSpec {
    pub name: String,
    pub backlog: Backlog,
    /// How often the relays' sent counters are read: the resolution of the drain's time.
    pub poll: Duration,
    pub destination: Destination,
    pub replicas: usize,
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
}

/// Where a tracing drain's relays send their spans.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Traces {
    /// The benchmark's OTLP/HTTP collector ([`collector::Collector`]), answering each export
    /// after this delay.
    Collector(Duration),
    /// An address where nothing listens: the collector is down.
    CollectorDown,
}

impl Traces {
    /// How a run is told apart in the tables: where spans went, and any batch settings.
    pub fn label(&self, env: &[(String, String)]) -> String {
        let mut label = match self {
            Traces::Collector(d) if d.is_zero() => "tracing on".to_string(),
            Traces::Collector(d) => format!("tracing on, collector {} ms", d.as_millis()),
            Traces::CollectorDown => "tracing on, collector down".to_string(),
        };
        for (k, v) in env {
            label.push_str(&format!(", {k}={v}"));
        }
        label
    }
}

/// A collector that answers an export of 512 spans in this long keeps up with at most
/// 512 / 0.05 s ≈ 10,000 spans/s (the SDK exports one batch at a time): less than a drain.
/// A collector across a network, or a busy one, is this slow.
const SLOW_COLLECTOR: Duration = Duration::from_millis(50);

/// Environment variables given to a relay, in order.
type RelayEnv = Vec<(String, String)>;

/// The tracing group's runs: off, then where the spans go and the batch processor's
/// settings (`OTEL_BSP_*`; none: the SDK's defaults, as a relay gets them).
fn tracing_variants() -> Vec<(Option<Traces>, RelayEnv)> {
    let bsp = |pairs: &[(&str, &str)]| -> RelayEnv {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    vec![
        (None, Vec::new()),
        (Some(Traces::Collector(Duration::ZERO)), Vec::new()),
        (Some(Traces::CollectorDown), Vec::new()),
        (Some(Traces::Collector(SLOW_COLLECTOR)), Vec::new()),
        (
            Some(Traces::Collector(SLOW_COLLECTOR)),
            bsp(&[
                ("OTEL_BSP_MAX_QUEUE_SIZE", "8192"),
                ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "2048"),
            ]),
        ),
    ]
}

fn main() {
    let settings = Settings::from_env(&relay_run_help());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(run(settings));
}

async fn run(settings: Settings) {
    let started = Instant::now();
    let ordered_flag = relay_run_help().contains("--ordered");
    let mut report = Report::new(&settings, ordered_flag).await;
    say(&format!(
        "outbox-relay benchmark: {} rows per backlog, batch {}, max-in-flight {}, {} mode; relay {}",
        settings.rows,
        settings.batch,
        settings.in_flight,
        if settings.quick { "quick" } else { "full" },
        env!("CARGO_BIN_EXE_outbox-relay"),
    ));

    if settings.runs("ceiling") {
        for (ordered, workers) in [(false, 1), (false, 2), (false, 4), (true, 1)] {
            let database = Database::create().await;
            report.payload_bytes = database.fill(&Backlog::orders(settings.rows)).await;
            let outbox = if ordered {
                database.ordered_outbox()
            } else {
                std::sync::Arc::clone(&database.outbox)
            };
            let before = Snapshot::take();
            let sampler = Sampler::start(&database.db).await;
            let c = workload::ceiling(
                outbox,
                ordered,
                settings.batch as i64,
                workers,
                settings.rows,
            )
            .await;
            let activity = sampler.finish().await;
            let cpu = Snapshot::take().since(&before);
            say(&format!(
                "ceiling{} batch {} x {} worker(s): {:.0} rows/s (claim {:.2} ms, mark sent {:.2} ms, {:.2} cores busy); connections: {}",
                if ordered { " (ordered claim)" } else { "" },
                c.batch,
                c.workers,
                c.rows_per_second(),
                c.claim_ms,
                c.settle_ms,
                cpu.busy_cores(c.seconds),
                activity.summary()
            ));
            report.ceilings.push(CeilingRun {
                cpu,
                activity,
                ceiling: c,
            });
            database.drop_now().await;
        }
        // The least PostgreSQL allows, beside the relay's own SQL: same backlog, batch, one
        // connection.
        let database = Database::create().await;
        database.fill(&Backlog::orders(settings.rows)).await;
        let before = Snapshot::take();
        let c = workload::minimal_ceiling(&database.db, settings.batch as i64, settings.rows).await;
        let cpu = Snapshot::take().since(&before);
        say(&format!(
            "minimal ceiling batch {} x 1 worker: {:.0} rows/s (claim {:.2} ms, mark sent {:.2} ms, {:.2} cores busy)",
            c.batch,
            c.rows_per_second(),
            c.claim_ms,
            c.settle_ms,
            cpu.busy_cores(c.seconds),
        ));
        report.ceilings.push(CeilingRun {
            cpu,
            activity: sampler::Activity::default(),
            ceiling: c,
        });
        database.drop_now().await;
    }

    let sink0 = Destination::Sink(Duration::ZERO);
    let mut drains: Vec<DrainSpec> = Vec::new();
    if settings.runs("drain") {
        drains.push(spec(
            &settings,
            "drain, sink 0 ms",
            sink0,
            1,
            settings.in_flight,
        ));
        // More requests in flight also means more claims in delivery at once (the relay
        // derives one from the other): does a sink that costs nothing gain from it, or lose?
        let other = if settings.in_flight >= 16 { 4 } else { 16 };
        drains.push(spec(
            &settings,
            &format!("drain, sink 0 ms, in-flight {other}"),
            sink0,
            1,
            other,
        ));
        drains.push(spec(
            &settings,
            "drain, fauxqs",
            Destination::Fauxqs,
            1,
            settings.in_flight,
        ));
    }
    if settings.runs("replicas") {
        for replicas in [2, 4] {
            drains.push(spec(
                &settings,
                &format!("drain, sink 0 ms, {replicas} replicas"),
                sink0,
                replicas,
                settings.in_flight,
            ));
        }
    }
    if settings.runs("ordered") {
        // FIFO with per-group ordering, and FIFO without it, to tell the cost of ordering from
        // the cost of the FIFO fields. Builds before `--ordered` existed only had the latter.
        let modes: &[bool] = if ordered_flag {
            &[true, false]
        } else {
            &[false]
        };
        for &ordered in modes {
            let mut fifo = spec(
                &settings,
                match (ordered_flag, ordered) {
                    (true, true) => "drain, sink 0 ms, FIFO, --ordered on",
                    (true, false) => "drain, sink 0 ms, FIFO, --ordered off",
                    (false, _) => "drain, sink 0 ms, FIFO (no --ordered flag)",
                },
                sink0,
                1,
                settings.in_flight,
            );
            fifo.fifo = true;
            fifo.ordered = ordered;
            if ordered_flag {
                fifo.flags = vec![
                    "--ordered".to_string(),
                    if ordered { "on" } else { "off" }.to_string(),
                ];
            }
            drains.push(fifo);
        }
    }
    if settings.runs("sweep") {
        for &in_flight in &settings.sweep {
            let mut s = spec(
                &settings,
                &format!("drain, sink 15 ms, in-flight {in_flight}"),
                Destination::Sink(SQS_LATENCY),
                1,
                in_flight,
            );
            s.window = Some(settings.window);
            drains.push(s);
        }
    }
    if settings.runs("pooler") {
        // What --pooler transaction costs (unnamed statements, synchronous_commit per
        // transaction), on a direct connection and through PgBouncer, against the default.
        drains.push(spec(
            &settings,
            "drain, sink 0 ms, --pooler none",
            sink0,
            1,
            settings.in_flight,
        ));
        let mut unnamed = spec(
            &settings,
            "drain, sink 0 ms, --pooler transaction, direct",
            sink0,
            1,
            settings.in_flight,
        );
        unnamed.flags = vec!["--pooler".into(), "transaction".into()];
        drains.push(unnamed);
        let mut bounced = spec(
            &settings,
            "drain, sink 0 ms, --pooler transaction, PgBouncer",
            sink0,
            1,
            settings.in_flight,
        );
        bounced.flags = vec!["--pooler".into(), "transaction".into()];
        bounced.pgbouncer = true;
        drains.push(bounced);
    }
    for spec in drains {
        let run = drain(&settings, spec).await;
        say_drain(&run);
        report.drains.push(run);
    }

    if settings.runs("long-group") {
        // Ordered delivery sends up to 10 consecutive events of a group per FIFO request, one
        // request per group at a time: does one group's backlog drain at a fair share of the
        // rate of the same backlog spread over many groups? Each pair back to back, on the
        // sink (the relay's own limit) and on fauxqs (a real server's).
        for destination in [sink0, Destination::Fauxqs] {
            for groups in [workload::GROUPS, 1] {
                let mut s = spec(
                    &settings,
                    &format!(
                        "long group, {}, {} group{}",
                        match destination {
                            Destination::Fauxqs => "fauxqs",
                            Destination::Sink(_) => "sink 0 ms",
                        },
                        groups,
                        if groups == 1 { "" } else { "s" }
                    ),
                    destination,
                    1,
                    settings.in_flight,
                );
                s.backlog = Backlog {
                    rows: LONG_GROUP_ROWS,
                    groups,
                    payload: Payload::Order,
                };
                s.poll = SHORT_DRAIN_POLL;
                s.fifo = true;
                s.ordered = true;
                if ordered_flag {
                    s.flags = vec!["--ordered".to_string(), "on".to_string()];
                }
                let run = drain(&settings, s).await;
                say_drain(&run);
                report.long_group.push(run);
            }
        }
    }

    if settings.runs("large-events") {
        // Payloads near SQS's limit: what the relay holds with the default byte budget, a
        // smaller one, and one that bounds nothing (rows only, as before the budget); and with
        // the default budget, every body through S3 first (the sink's PutObject), against the
        // same events sent inline.
        let help = relay_run_help();
        let default_budget = help_value(&help, "--max-bytes-in-flight");
        let mut budgets: Vec<(Option<&str>, bool, Duration)> = vec![(None, false, Duration::ZERO)];
        if help.contains("--offload-bucket") {
            budgets.push((None, true, Duration::ZERO));
        }
        if default_budget.is_some() {
            budgets.extend([
                (Some("8MiB"), false, Duration::ZERO),
                (Some(UNBOUNDED_BUDGET), false, Duration::ZERO),
            ]);
        }
        // With a round trip per call, as in a region: S3 takes each body in its own call.
        budgets.push((None, false, SQS_LATENCY));
        if help.contains("--offload-bucket") {
            budgets.push((None, true, SQS_LATENCY));
        }
        for (budget, offload, delay) in budgets {
            let backlog = Backlog {
                rows: LARGE_EVENTS,
                groups: workload::GROUPS,
                payload: Payload::Blob(LARGE_EVENT_BYTES),
            };
            // Each payload byte is held about three times while in flight; unbounded, the whole
            // backlog can be.
            let worst = LARGE_EVENTS * LARGE_EVENT_BYTES as u64 * 3;
            if budget == Some(UNBOUNDED_BUDGET)
                && (worst > UNBOUNDED_RSS_LIMIT || worst > mem_available() / 2)
            {
                say(&format!(
                    "large events, --max-bytes-in-flight {UNBOUNDED_BUDGET}: skipped, the relay could hold ~{} MiB ({} MiB available)",
                    worst >> 20,
                    mem_available() >> 20
                ));
                continue;
            }
            let mut label = match (budget, &default_budget) {
                (Some(b), _) => format!("--max-bytes-in-flight {b}"),
                (None, Some(d)) => format!("--max-bytes-in-flight {d} (default)"),
                (None, None) => "no byte budget in this build".to_string(),
            };
            if offload {
                label.push_str(&format!(
                    ", bodies through S3 (--offload-threshold {OFFLOAD_ABOVE})"
                ));
            }
            let mut s = spec(
                &settings,
                &format!("large events, sink {} ms, {label}", delay.as_millis()),
                Destination::Sink(delay),
                1,
                settings.in_flight,
            );
            s.backlog = backlog;
            s.poll = SHORT_DRAIN_POLL;
            if let Some(b) = budget {
                s.flags = vec!["--max-bytes-in-flight".to_string(), b.to_string()];
            }
            s.offload_above = offload.then_some(OFFLOAD_ABOVE);
            let run = drain(&settings, s).await;
            say_drain(&run);
            report.large_events.push(run);
        }
    }

    if settings.runs("tracing") {
        // What exporting a span per event costs a drain: the standard drain (its backlog
        // carries a sampled traceparent in every row) with tracing off, exporting to a
        // collector that answers at once, and exporting to none (collector down). Each round
        // runs every variant, the order rotated, so drift of the machine falls on each alike.
        let variants = tracing_variants();
        for round in 1..=settings.tracing_rounds {
            for i in 0..variants.len() {
                let (traces, env) = &variants[(i + round - 1) % variants.len()];
                let label = traces.map_or("tracing off".to_string(), |t| t.label(env));
                let mut s = spec(
                    &settings,
                    &format!("{label}, round {round}"),
                    sink0,
                    1,
                    settings.in_flight,
                );
                s.traces = *traces;
                s.env = env.clone();
                let run = drain(&settings, s).await;
                say_drain(&run);
                if let Some(tr) = &run.traces {
                    say(&format!("{}: {}", run.name, tr.summary(run.sent)));
                }
                report.tracing.push(TracingDrain { round, run });
            }
        }
    }

    let help = relay_run_help();
    let modes = harm::Wakeup::modes(&help);
    let mut clusters = harm::Clusters::default();
    if settings.runs("steady") {
        for &rate in &settings.steady_rates {
            let run = steady(&settings, clusters.durable().await, rate).await;
            say(&format!(
                "steady {} events/s, durable (achieved {:.0}): commit-to-send p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms, max {:.2} ms; producers late p50 {:.1} ms, p99 {:.1} ms; {}",
                rate, run.achieved_rate, run.p50_ms, run.p99_ms, run.p999_ms, run.max_ms,
                run.producer_late_p50_ms, run.producer_late_p99_ms,
                timeline::summary(&run.timeline)
            ));
            report.steady.push(run);
        }
        clusters.stop();
    }

    if settings.runs("harm") {
        // Every writer count for the default mode; the others at 16 writers, enough to show
        // what each costs where commits group.
        for (i, wakeup) in modes.iter().enumerate() {
            let writers: &[usize] = if i == 0 { &[1, 16, 64] } else { &[16] };
            let run = harm::harm(&settings, clusters.for_mode(wakeup).await, wakeup, writers).await;
            for s in run.summaries() {
                say(&format!(
                    "harm, {}, {} writer(s): {:.0} commits/s with the relay, {:.0} without: {:.2}; commit-to-sent p50 {:.1} ms, p99 {:.1} ms, p99.9 {:.1} ms",
                    wakeup.label(),
                    s.writers,
                    harm::median(&s.with),
                    harm::median(&s.without),
                    s.ratio(),
                    report::quantile(&s.latencies_ms, 0.5),
                    report::quantile(&s.latencies_ms, 0.99),
                    report::quantile(&s.latencies_ms, 0.999),
                ));
            }
            report.harm.push(run);
        }
        clusters.stop();
    }

    if settings.runs("idle") {
        let (runs, cluster_cpu) = harm::idle(&settings, &mut clusters, &modes).await;
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
        report.idle = runs;
        report.idle_clusters = cluster_cpu;
        clusters.stop();
    }

    if settings.runs("storage") {
        let runs = storage::storage(&settings, clusters.durable().await, &modes[0], &help).await;
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
        report.storage = runs;
        clusters.stop();
    }

    if settings.runs("adopt") {
        adopt::run(&settings).await;
    }

    if settings.runs("big-backlog") {
        let run = backlog::big_backlog(&settings, &mut clusters).await;
        say(&run.summary());
        report.big_backlog.push(run);
        clusters.stop();
    }

    report.seconds = started.elapsed().as_secs_f64();
    std::fs::create_dir_all(&settings.out_dir).expect("create the output directory");
    report.write(&settings.out_dir);
    println!();
    print!("{}", report.table());
    say(&format!(
        "results: {}; whole run {:.0} s",
        settings.out_dir.join("results.json").display(),
        report.seconds
    ));
}

/// A drain of the standard backlog ([`Backlog::orders`] of `OUTBOX_BENCH_ROWS`).
fn spec(
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
    }
}

/// Progress goes to stdout with the table; the relays' own log lines go to stderr.
fn say(line: &str) {
    println!("{line}");
}

fn say_drain(run: &DrainRun) {
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

/// `MemAvailable` of /proc/meminfo in bytes (0 when unknown, which skips what needs memory).
fn mem_available() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemAvailable:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

/// The `[default: N]` clap prints under `flag` in `--help`.
fn help_default(help: &str, flag: &str) -> Option<u64> {
    help_value(help, flag)?.parse().ok()
}

/// The `[default: …]` clap prints under `flag` in `--help`, as text.
fn help_value(help: &str, flag: &str) -> Option<String> {
    let start = help.find(&format!("{flag} <"))?;
    let rest = &help[start..];
    // The flag's own block ends where the next flag starts.
    let block = &rest[..rest[2..].find("\n      -").map_or(rest.len(), |i| i + 2)];
    let value = block.split("[default: ").nth(1)?.split(']').next()?;
    Some(value.trim().to_string())
}

/// `outbox-relay run --help`, to learn which flags this build has.
fn relay_run_help() -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .args(["run", "--help"])
        .output()
        .expect("run outbox-relay run --help");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn relay_args(
    settings: &Settings,
    db_url: &str,
    queue_url: &str,
    endpoint: &str,
    relay_id: &str,
    max_in_flight: usize,
) -> Vec<String> {
    let db_url = settings.relay_url(db_url);
    let mut args: Vec<String> = [
        "run",
        "--database-url",
        &db_url,
        "--queue-url",
        queue_url,
        "--sqs-endpoint-url",
        endpoint,
        "--relay-id",
        relay_id,
        "--metrics-addr",
        "127.0.0.1:0",
        "--retention",
        "off",
        // Long enough that no lease runs out during a run: a takeover would be a different
        // benchmark.
        "--lease",
        "5m",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend([
        "--batch-size".to_string(),
        settings.batch.to_string(),
        "--max-in-flight".to_string(),
        max_in_flight.to_string(),
    ]);
    args.extend(settings.relay_args.iter().cloned());
    args
}

/// Sum of `outbox_events_sent_total` over the replicas.
async fn sent_total(relays: &[RelayProcess]) -> u64 {
    let mut sum = 0.0;
    for relay in relays {
        sum += relay
            .metric("outbox_events_sent_total")
            .await
            .unwrap_or(0.0);
    }
    sum as u64
}

/// Panics on a relay's first error line.
fn check_alive(relays: &[RelayProcess]) {
    check_alive_traced(relays, false);
}

/// [`check_alive`]; with `traced`, the trace exporter's own error lines (a collector that is
/// down) are expected: the run counts them instead.
fn check_alive_traced(relays: &[RelayProcess], traced: bool) {
    for relay in relays {
        if let Some(line) = relay.output().lines().find(|l| {
            (l.contains("ERROR") || l.starts_with("error:"))
                && !(traced && l.contains(report::EXPORTER_LOG_TARGET))
        }) {
            panic!(
                "{} reported an error: {line}\n{}",
                relay.name(),
                relay.output()
            );
        }
    }
}

/// A pre-filled backlog drained by `spec.replicas` relays; timed from the relays' start until
/// their `outbox_events_sent_total` adds up to the backlog (or the window ends).
async fn drain(settings: &Settings, spec: DrainSpec) -> DrainRun {
    let database = Database::create().await;
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
            let mut args = relay_args(
                settings,
                &database_url,
                &queue_url,
                &endpoint,
                &id,
                spec.max_in_flight,
            );
            args.extend(spec.flags.iter().cloned());
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
    for relay in &relays {
        relay.sigterm();
    }
    for relay in &relays {
        if relay.wait_exit(Duration::from_secs(30)).await.is_none() {
            relay.kill9();
        }
    }
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

/// A producer at `rate` events/s into an empty outbox, one relay on the 0 ms sink; commit-to-
/// send latency per event, from the producer's clock after COMMIT to the sink's on arrival.
async fn steady(settings: &Settings, cluster: &support::pg::PrivatePg, rate: u64) -> SteadyRun {
    let database = Database::create_in(cluster).await;
    let sink = std::sync::Arc::new(Sink::start(Duration::ZERO, true).await);
    let relay_id = format!("bench-steady-{rate}");
    let args = relay_args(
        settings,
        &database.db.url,
        &sink.queue_url("bench"),
        &sink.endpoint,
        &relay_id,
        settings.in_flight,
    );
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
            Some(if arrival >= commit {
                (arrival - commit).as_secs_f64() * 1000.0
            } else {
                -((commit - arrival).as_secs_f64() * 1000.0)
            })
        })
        .collect();
    let (sink_requests, sink_entries) = (sink.requests(), sink.entries());
    drop(sink);
    database.drop_now().await;
    let late = produced.lateness_ms();
    SteadyRun::new(SteadyInput {
        producer_late_p50_ms: report::quantile(&late, 0.5),
        producer_late_p99_ms: report::quantile(&late, 0.99),
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
