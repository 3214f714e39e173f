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
//! | `OUTBOX_BENCH_HARM_SECONDS` | 15, own-core table 8 (quick: 5) | writer time per harm cell |
//! | `OUTBOX_BENCH_HARM_ROUNDS` | 3, own-core table 5 (quick: 1) | alternations per writer count (own-core: each round runs none, relay, log-based in rotated order) |
//! | `OUTBOX_BENCH_WAL_ROWS` | 20000 (quick: 5000) | events of each settlement mode of the `wal` group |
//! | `OUTBOX_BENCH_DURABLE_DRAIN_ROWS` | 50000 (quick: 10000) | backlog of the `wal` group's durable drain |
//! | `OUTBOX_BENCH_IDLE_SECONDS` | 60 (quick: 10) | measured idle window |
//! | `OUTBOX_BENCH_STORAGE_SECONDS` | 600 (quick: 60) | producer time of the storage run |
//! | `OUTBOX_BENCH_TRACING_ROUNDS` | 3 (quick: 1) | rounds of the tracing group (each runs every variant once) |
//! | `OUTBOX_BENCH_BACKLOG_ROWS` | 1000000 (quick: 100000) | backlog of the `big-backlog` group (the target: 10000000) |
//! | `OUTBOX_BENCH_BACKLOG_BASELINE_SECONDS` | 30 (quick: 10) | the application's 500 commits/s without the relay, before it starts |
//! | `OUTBOX_BENCH_RATE_SECONDS` | 20 (quick: 5) | measured window of each `rates` cell, after a 2 s warm-up |
//! | `OUTBOX_BENCH_RATE_ROUNDS` | 3 (quick: 1) | rounds of the `rates` group (each runs none, relay, log-based at every rate, in rotated order) |
//! | `OUTBOX_BENCH_RATES` | 50,200,500,2000,5000 | the `rates` group's rates, events/s, comma-separated |
//! | `OUTBOX_BENCH_HORIZON_RATES` | 200,2000 | the `horizon` group's rates, events/s, comma-separated |
//! | `OUTBOX_BENCH_HORIZON_WINDOW` | 30 (quick: 10) | seconds of each `horizon` window |
//! | `OUTBOX_BENCH_HOLD` | 3m (quick: 1m) | how long the `horizon` group holds its snapshot (humantime, e.g. `30m`) |
//! | `OUTBOX_BENCH_ONLY` | all | comma list of `ceiling,drain,replicas,ordered,long-group,large-events,sweep,tracing,steady,harm,harm-own-core,rates,horizon,wal,idle,storage,adopt,big-backlog,pooler,order-by,many-tables,console` (rates: the relay's database CPU per event at production rates beside the application's write and a log-based reader's, its process, claims and their planning, commit-to-sent, see rates.rs; horizon: the same costs per window while a read-only REPEATABLE READ snapshot holds the vacuum horizon, and before and after, see horizon.rs; order-by: the FIFO ordered drain and the 2,000/s durable steady stream in insertion and in transaction order, see steady.rs; harm: the same-core table and the own-core one, see own_core.rs; harm-own-core: the own-core one alone; wal: WAL and database CPU per relayed event for each settlement mode, and a drain on a durable cluster, see wal.rs; adopt: see adopt.rs; big-backlog: backlog.rs; many-tables: one relay over 1, 100 and 1,000 tables idle, a backlog in one of 1,000 beside quiet ones, and 100 tables against one, see many_tables.rs; pooler: the drain with `--pooler transaction`, direct and through PgBouncer; console: the console's pages on 1,000,000 unsent and 100,000 quarantined rows beside `status`, see console.rs) |
//! | `OUTBOX_BENCH_RELAY_ARGS` | | extra flags for every relay, split on whitespace |
//! | `OUTBOX_BENCH_RELAY_PG_OPTIONS` | | server settings for the relays' own connections (libpq `options`), e.g. `-c synchronous_commit=off` |
//! | `OUTBOX_BENCH_OUT` | `target/bench` | where results.json and the plot data go |

#[path = "../../tests/support/mod.rs"]
mod support;

mod adopt;
mod affinity;
mod backend_cpu;
mod backlog;
mod ceiling;
mod cluster;
mod collector;
mod console;
mod drain;
mod drains;
mod harm;
mod help;
mod horizon;
mod idle;
mod large_events;
mod log_consumer;
mod many_tables;
mod meta;
mod own_core;
mod pinned;
mod procstat;
mod progress;
mod rates;
mod relays;
mod report;
mod sampler;
mod selftest;
mod settings;
mod sink;
mod statements;
mod stats;
mod steady;
mod storage;
mod timeline;
mod traces;
mod tracing_group;
mod wal;
mod waldump;
mod workload;

use std::time::Instant;

use cluster::Clusters;
use help::relay_run_help;
use progress::say;
use relays::Wakeup;
use report::Report;
use settings::Settings;

fn main() {
    // A debug build is what `cargo test --bench relay` makes: it runs the unit tests (see
    // selftest.rs); `cargo bench` and scripts/bench build the release one, the benchmark.
    if cfg!(debug_assertions) {
        let filters: Vec<String> = std::env::args()
            .skip(1)
            .filter(|a| !a.starts_with('-'))
            .collect();
        return selftest::run(&filters);
    }
    let settings = Settings::from_env(&relay_run_help());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(run(settings));
}

/// Every group `OUTBOX_BENCH_ONLY` lets run, in this order; then the tables and the files.
async fn run(settings: Settings) {
    let started = Instant::now();
    let ordered_flag = relay_run_help().contains("--ordered");
    let meta = meta::collect(&settings, ordered_flag).await;
    let mut report = Report::new(&settings, ordered_flag, meta);
    say(&format!(
        "outbox-relay benchmark: {} rows per backlog, batch {}, max-in-flight {}, {} mode; relay {}",
        settings.rows,
        settings.batch,
        settings.in_flight,
        if settings.quick { "quick" } else { "full" },
        env!("CARGO_BIN_EXE_outbox-relay"),
    ));

    if settings.runs("ceiling") {
        (report.payload_bytes, report.ceilings) = ceiling::run(&settings).await;
    }
    report.drains = drains::run(&settings, drains::specs(&settings, ordered_flag)).await;
    if settings.runs("long-group") {
        report.long_group = drains::long_group(&settings, ordered_flag).await;
    }
    if settings.runs("large-events") {
        report.large_events = large_events::run(&settings).await;
    }
    if settings.runs("tracing") {
        report.tracing = tracing_group::run(&settings).await;
    }

    let help = relay_run_help();
    let modes = Wakeup::modes(&help);
    let mut clusters = Clusters::default();
    if settings.runs("steady") {
        report.steady = steady::run(&settings, &mut clusters).await;
        clusters.stop();
    }
    if settings.runs("order-by") {
        let ratio = |name: &str| {
            report
                .drains
                .iter()
                .find(|d| d.name == name)
                .map(|d| d.events_per_second())
        };
        if let (Some(id), Some(transaction)) = (
            ratio("drain, sink 0 ms, FIFO, --ordered on, --order-by id"),
            ratio("drain, sink 0 ms, FIFO, --ordered on, --order-by transaction"),
        ) {
            say(&format!(
                "order-by: drain {transaction:.0} events/s with --order-by transaction, {id:.0} with --order-by id: {:.2}x",
                transaction / id
            ));
        }
        steady::order_by(&settings, &mut clusters, 3).await;
        clusters.stop();
    }
    if settings.runs("harm") {
        report.harm = harm::run(&settings, &mut clusters, &modes).await;
        clusters.stop();
    }
    if settings.runs("harm") || settings.runs("harm-own-core") {
        report.own_core = own_core::run(&settings, &modes[0]).await;
    }
    if settings.runs("rates") {
        report.rates = rates::run(&settings, &modes[0]).await;
    }
    if settings.runs("horizon") {
        report.horizon = horizon::run(&settings, &modes[0]).await;
    }
    if settings.runs("wal") {
        (report.wal, report.durable_drain) =
            wal::run(&settings, &mut clusters, &modes[0], &help).await;
        clusters.stop();
    }
    if settings.runs("idle") {
        (report.idle, report.idle_clusters) = idle::run(&settings, &mut clusters, &modes).await;
        clusters.stop();
    }
    if settings.runs("storage") {
        report.storage = storage::run(&settings, clusters.durable().await, &modes[0], &help).await;
        clusters.stop();
    }
    if settings.runs("adopt") {
        adopt::run(&settings).await;
    }
    if settings.runs("big-backlog") {
        report
            .big_backlog
            .push(backlog::run(&settings, &mut clusters).await);
        clusters.stop();
    }

    if settings.runs("many-tables") {
        report.many_tables = Some(many_tables::run(&settings).await);
    }
    if settings.runs("console") {
        console::run().await;
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
