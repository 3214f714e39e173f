//! Group `horizon` (issue 36): what the relay costs while something holds the vacuum horizon
//! back, as a `pg_dump` does, beside what the application's writes and a log-based relay cost
//! in the same windows.
//!
//! Run it alone with
//!
//! ```text
//! cargo build --release --locked
//! OUTBOX_BENCH_ONLY=horizon scripts/bench
//! OUTBOX_BENCH_ONLY=horizon OUTBOX_BENCH_HOLD=30m OUTBOX_BENCH_HORIZON_RATES=1000 scripts/bench
//! ```
//!
//! (knobs: `OUTBOX_BENCH_HOLD` how long the snapshot is held, default 3 minutes;
//! `OUTBOX_BENCH_HORIZON_WINDOW` the window, default 30 s; `OUTBOX_BENCH_HORIZON_RATES` the
//! rates, default 200,2000; `--quick`: 10 s windows, a 1-minute hold.)
//!
//! The `rates` group's cluster and placement (rates.rs): durable, `wal_level=logical`,
//! `pg_stat_statements` with planning; PostgreSQL on the first core, the writers, the SQS sink
//! (answering after 15 ms), the relay and `pg_recvlogical` on the second (pinned.rs). For each
//! rate, from an empty table after a CHECKPOINT, one open-loop writer commits one event per
//! transaction at the rate (workload::PacedWriters, one connection per 100 events/s) while
//! the relay (build defaults, its own role) and a log-based relay (a `pgoutput` slot of a
//! publication of the table, streamed by `pg_recvlogical`) both read it. After a warm-up the
//! run is cut into windows:
//! - **free**: nothing holds the horizon (a few windows: autovacuum comes and goes);
//! - **held**: a second session runs [`HOLD_SQL`] at the first held window's start and stays
//!   idle in that transaction: a read-only REPEATABLE READ snapshot, no xid, what `pg_dump`
//!   keeps for a whole dump. Nothing deleted after it can be removed, and no index entry of
//!   such a row can be marked dead;
//! - **released**: the session commits at the first released window's start.
//!
//! Per window, as the `rates` group reads a cell: the cluster's CPU by part
//! (procstat::tree_cpu, split by `pg_stat_activity`: the relay's backends, the application's
//! writers, the WAL sender, the rest), the relay role's statements (pg_stat_statements, read
//! and reset at each window's end; the costliest named by the SQL file they come from),
//! `n_dead_tup` of the outbox, its lease table and its relay registry, the relay process's and
//! `pg_recvlogical`'s CPU, and the machine's CPU outside the benchmark's processes (other work
//! on the machine) and its load average. After the last window, each event's commit-to-sent,
//! by the window it committed in.
//!
//! The two readers run at once so that every window has both anchors; what that costs the
//! comparison: the WAL sender also decodes the relay's own writes (its lease rows and the
//! deletes of sent rows; the publication publishes inserts only, so none of them is sent),
//! and each competes with the other for the database's core. The application's write is its
//! backends' CPU per event; the log-based relay's cost is its WAL sender's.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::cluster::{drop_db, DURABLE_LOGICAL_STATEMENTS};
use crate::harm::{each_commit_to_sent, reset_outbox};
use crate::log_consumer::{Decoding, LogConsumer, PUBLICATION};
use crate::pinned::PinnedCluster;
use crate::procstat::{self, Snapshot, TreeCpu};
use crate::progress::say;
use crate::rates::{parts, relay_role, writer_connections, CpuSplit, Part};
use crate::relays::{migrate, start_relay, Wakeup};
use crate::settings::{Settings, SQS_LATENCY};
use crate::sink::Sink;
use crate::statements::{self, RelayStatements, Totals};
use crate::stats::quantile;
use crate::support::TestDb;
use crate::workload::PacedWriters;

/// The issue's rates, events/s (`OUTBOX_BENCH_HORIZON_RATES` picks others).
pub const RATES: [u64; 2] = [200, 2_000];
/// Writer time before the first window: the relay's polling and the slot settle.
const WARM_UP: Duration = Duration::from_secs(5);
/// What holds the horizon: a read-only snapshot, as `pg_dump` takes one.
pub const HOLD_SQL: &str = "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM pg_class";
/// The relay's statements named per window: the costliest this many.
const COSTLIEST: usize = 4;

/// What holds the horizon during a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Nothing.
    Free,
    /// The read-only snapshot.
    Held,
    /// Nothing any more: the snapshot's transaction has ended.
    Released,
}

impl Phase {
    pub fn label(self) -> &'static str {
        match self {
            Phase::Free => "free",
            Phase::Held => "held",
            Phase::Released => "released",
        }
    }
}

/// The windows of one rate, in order.
pub fn plan(free: usize, held: usize, released: usize) -> Vec<Phase> {
    [
        (Phase::Free, free),
        (Phase::Held, held),
        (Phase::Released, released),
    ]
    .iter()
    .flat_map(|&(phase, n)| std::iter::repeat_n(phase, n))
    .collect()
}

/// Windows of `window` that cover a hold of `hold`: at least one.
pub fn held_windows(hold: Duration, window: Duration) -> usize {
    (hold.as_secs_f64() / window.as_secs_f64()).ceil().max(1.0) as usize
}

/// What the statistics say of the relay's tables at a window's end.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Tables {
    /// `n_dead_tup` of the outbox.
    pub dead_outbox: i64,
    /// `n_dead_tup` of the lease table (`outbox_claims`).
    pub dead_claims: i64,
    /// `n_dead_tup` of the relay registry (`outbox_relays`).
    pub dead_relays: i64,
    /// Autovacuums of the outbox and of the lease table so far.
    pub autovacuums: (i64, i64),
}

impl Tables {
    async fn read(monitor: &tokio_postgres::Client) -> Tables {
        let rows = monitor
            .query(
                "SELECT relname::text, n_dead_tup, autovacuum_count FROM pg_stat_user_tables \
                 WHERE relname IN ('outbox', 'outbox_claims', 'outbox_relays')",
                &[],
            )
            .await
            .expect("read pg_stat_user_tables");
        let mut tables = Tables::default();
        for row in rows {
            let (dead, vacuums): (i64, i64) = (row.get(1), row.get(2));
            match row.get::<_, String>(0).as_str() {
                "outbox" => (tables.dead_outbox, tables.autovacuums.0) = (dead, vacuums),
                "outbox_claims" => (tables.dead_claims, tables.autovacuums.1) = (dead, vacuums),
                _ => tables.dead_relays = dead,
            }
        }
        tables
    }
}

/// Everything read at one window boundary.
struct Mark {
    at: Instant,
    cluster: TreeCpu,
    parts: BTreeMap<u32, Part>,
    relay: f64,
    recvlogical: f64,
    bench: f64,
    machine_busy: f64,
}

impl Mark {
    async fn take(postmaster: u32, readers: (u32, u32), monitor: &tokio_postgres::Client) -> Mark {
        let parts = parts(monitor).await;
        let run = |pid: u32| procstat::run_seconds(pid).unwrap_or(0.0);
        Mark {
            at: Instant::now(),
            cluster: procstat::tree_cpu(postmaster),
            parts,
            relay: run(readers.0),
            recvlogical: run(readers.1),
            bench: run(std::process::id()),
            machine_busy: Snapshot::take().machine_busy,
        }
    }
}

/// One window of one rate.
pub struct Window {
    /// The rate aimed at, events/s.
    pub rate: u64,
    /// What held the horizon.
    pub phase: Phase,
    /// Minutes from the phase's start to the window's end.
    pub minute: f64,
    /// When the window began and ended (events are counted by their commit).
    pub span: (Instant, Instant),
    /// Events committed in the window.
    pub events: u64,
    /// The cluster's CPU over the window, by part.
    pub cpu: CpuSplit,
    /// CPU seconds of the relay process, and of `pg_recvlogical`.
    pub relay_process: f64,
    /// See `relay_process`.
    pub recvlogical: f64,
    /// CPU seconds of this process (writers, sink, monitoring).
    pub bench: f64,
    /// The machine's CPU seconds outside the cluster and the processes above: other work on
    /// the machine, which makes a window's figures less reliable.
    pub others: f64,
    /// The one-minute load average at the window's end.
    pub load: f64,
    /// The relay's statements over the window.
    pub statements: RelayStatements,
    /// The relay's costliest statements (plan + execution), named by their SQL file.
    pub costliest: Vec<(String, Totals)>,
    /// The tables at the window's end.
    pub tables: Tables,
    /// Commit-to-sent of the events committed in the window, sorted.
    pub latencies_ms: Vec<f64>,
}

impl Window {
    pub fn seconds(&self) -> f64 {
        (self.span.1 - self.span.0).as_secs_f64()
    }

    /// `cpu` seconds per event of the window, µs.
    pub fn per_event(&self, cpu: f64) -> f64 {
        cpu / self.events as f64 * 1e6
    }

    /// The relay's backends, µs per event.
    pub fn relay_us(&self) -> f64 {
        self.per_event(self.cpu.relay)
    }

    /// The application's backends (its own writes), µs per event.
    pub fn app_us(&self) -> f64 {
        self.per_event(self.cpu.app)
    }

    /// The log-based relay's WAL sender, µs per event.
    pub fn log_us(&self) -> f64 {
        self.per_event(self.cpu.walsender)
    }

    /// The `q` quantile of the window's commit-to-sent, ms; `None` when nothing committed.
    pub fn p(&self, q: f64) -> Option<f64> {
        (!self.latencies_ms.is_empty()).then(|| quantile(&self.latencies_ms, q))
    }

    fn to_json(&self) -> Value {
        let s = self.seconds();
        json!({
            "phase": self.phase.label(),
            "minute": self.minute,
            "seconds": s,
            "events": self.events,
            "events_per_second": self.events as f64 / s,
            "relay_backends_share_of_a_core": self.cpu.relay / s,
            "relay_backends_us_per_event": self.relay_us(),
            "app_backends_us_per_event": self.app_us(),
            "walsender_us_per_event": self.log_us(),
            "rest_us_per_event": self.per_event(self.cpu.rest),
            "cluster_share_of_a_core": self.cpu.total() / s,
            "relay_over_app_write": self.relay_us() / self.app_us(),
            "relay_over_log_based": self.relay_us() / self.log_us(),
            "relay_statements_per_second": self.statements.calls() / s,
            "relay_statement_mean_ms": self.statements.total_ms() / self.statements.calls(),
            "relay_statements": self.statements.to_json(),
            "relay_costliest_statements": self.costliest.iter().map(|(source, t)| json!({
                "source": source,
                "calls": t.calls,
                "rows": t.rows,
                "plan_ms": t.plan_ms,
                "exec_ms": t.exec_ms,
            })).collect::<Vec<_>>(),
            "commit_to_sent_p50_ms": self.p(0.5),
            "commit_to_sent_p99_ms": self.p(0.99),
            "commit_to_sent_max_ms": self.latencies_ms.last(),
            "dead_outbox_rows": self.tables.dead_outbox,
            "dead_lease_rows": self.tables.dead_claims,
            "dead_registry_rows": self.tables.dead_relays,
            "outbox_autovacuums": self.tables.autovacuums.0,
            "lease_table_autovacuums": self.tables.autovacuums.1,
            "relay_process_share_of_a_core": self.relay_process / s,
            "pg_recvlogical_share_of_a_core": self.recvlogical / s,
            "bench_process_share_of_a_core": self.bench / s,
            "others_share_of_a_core": self.others / s,
            "load_average": self.load,
        })
    }
}

/// One rate's windows.
pub struct RateRun {
    /// The rate aimed at, events/s.
    pub rate: u64,
    /// Writer connections.
    pub connections: usize,
    /// Every window, in order.
    pub windows: Vec<Window>,
    /// Events that never reached the sink.
    pub missing: usize,
    /// Where the log-based relay's decoding stood when the writer stopped.
    pub decoding: Decoding,
}

impl RateRun {
    /// The relay's backends' µs per event over the free phase (its CPU over its events).
    pub fn free_us(&self) -> f64 {
        let free = || self.windows.iter().filter(|w| w.phase == Phase::Free);
        let cpu: f64 = free().map(|w| w.cpu.relay).sum();
        let events: u64 = free().map(|w| w.events).sum();
        cpu / events as f64 * 1e6
    }

    /// The last held window's µs per event ÷ the free phase's (the issue's target: ≤ 1.2 after
    /// 30 minutes).
    pub fn last_held_over_free(&self) -> Option<f64> {
        let last = self.windows.iter().rfind(|w| w.phase == Phase::Held)?;
        Some(last.relay_us() / self.free_us())
    }

    /// The free windows' highest and lowest µs per event ÷ their mean (the issue's target:
    /// within ±20 %).
    pub fn free_swing(&self) -> (f64, f64) {
        let free: Vec<f64> = self
            .windows
            .iter()
            .filter(|w| w.phase == Phase::Free)
            .map(Window::relay_us)
            .collect();
        let mean = free.iter().sum::<f64>() / free.len() as f64;
        let (min, max) = crate::stats::spread(&free);
        (min / mean, max / mean)
    }

    fn to_json(&self) -> Value {
        let (low, high) = self.free_swing();
        json!({
            "rate": self.rate,
            "writer_connections": self.connections,
            "free_relay_backends_us_per_event": self.free_us(),
            "last_held_over_free": self.last_held_over_free(),
            "free_windows_lowest_over_mean": low,
            "free_windows_highest_over_mean": high,
            "events_never_arrived": self.missing,
            "decoding_behind_bytes_at_end": self.decoding.behind_bytes,
            "decoding_catch_up_seconds": self.decoding.catch_up_seconds,
            "windows": self.windows.iter().map(Window::to_json).collect::<Vec<_>>(),
        })
    }
}

/// The whole group.
pub struct HorizonRun {
    /// The relay's wake-up mode (the build's default).
    pub wakeup: Wakeup,
    /// The database's core, and the core of everything else.
    pub cores: (usize, usize),
    /// The window, seconds.
    pub window_seconds: u64,
    /// How long the snapshot was held.
    pub hold: Duration,
    /// Flags every relay got beyond the build's defaults (`OUTBOX_BENCH_RELAY_ARGS`).
    pub relay_args: Vec<String>,
    /// One run per rate.
    pub rates: Vec<RateRun>,
}

impl HorizonRun {
    pub fn to_json(&self) -> Value {
        json!({
            "wakeup": self.wakeup.label(),
            "cluster": "durable, wal_level=logical, pg_stat_statements (track_planning, track=all)",
            "database_core": self.cores.0,
            "other_core": self.cores.1,
            "window_seconds": self.window_seconds,
            "hold_seconds": self.hold.as_secs_f64(),
            "hold": HOLD_SQL,
            "warm_up_seconds": WARM_UP.as_secs_f64(),
            "sink_latency_ms": SQS_LATENCY.as_secs_f64() * 1000.0,
            "extra_relay_args": self.relay_args,
            "rates": self.rates.iter().map(RateRun::to_json).collect::<Vec<_>>(),
        })
    }
}

/// Every rate; `None` (and a line saying why) on a machine where this process may use fewer
/// than two cores.
pub async fn run(settings: &Settings, wakeup: &Wakeup) -> Option<HorizonRun> {
    let pinned = PinnedCluster::start("horizon", DURABLE_LOGICAL_STATEMENTS).await?;
    let cluster = &pinned.cluster;
    let db = cluster.create_db().await;
    pinned.say_cores("horizon", &db).await;
    migrate(&db, wakeup).await;
    let relay_db = relay_role(cluster, &db).await;
    db.client()
        .await
        .batch_execute(&format!(
            "CREATE EXTENSION pg_stat_statements; \
             CREATE PUBLICATION {PUBLICATION} FOR TABLE outbox WITH (publish = 'insert')"
        ))
        .await
        .expect("set up pg_stat_statements and the log-based relay's publication");
    let postmaster = cluster.pid().expect("the cluster runs");
    let phases = plan(
        settings.horizon_free_windows,
        held_windows(settings.horizon_hold, settings.horizon_window),
        settings.horizon_released_windows,
    );
    let mut rates = Vec::new();
    for &rate in &settings.horizon_rates {
        let run = rate_run(settings, &db, &relay_db, wakeup, postmaster, rate, &phases).await;
        say_rate(&run);
        rates.push(run);
    }
    db.client()
        .await
        .batch_execute(&format!("DROP PUBLICATION {PUBLICATION}"))
        .await
        .expect("drop the publication");
    drop_db(cluster, &db).await;
    let run = HorizonRun {
        wakeup: wakeup.clone(),
        cores: pinned.cores,
        window_seconds: settings.horizon_window.as_secs(),
        hold: settings.horizon_hold,
        relay_args: settings.relay_args.clone(),
        rates,
    };
    drop(pinned);
    Some(run)
}

async fn rate_run(
    settings: &Settings,
    db: &TestDb,
    relay_db: &TestDb,
    wakeup: &Wakeup,
    postmaster: u32,
    rate: u64,
    phases: &[Phase],
) -> RateRun {
    // The lease table too: the rate before left its dead rows there.
    db.client()
        .await
        .batch_execute("TRUNCATE outbox_claims")
        .await
        .expect("empty the lease table");
    reset_outbox(db, true).await;
    let sink = Sink::start(SQS_LATENCY, true).await;
    let relay = start_relay(
        settings,
        relay_db,
        wakeup,
        &sink,
        &format!("bench-horizon-{rate}"),
        &[],
    )
    .await;
    let consumer = LogConsumer::start(db).await;
    let readers = (relay.pid(), consumer.pid());
    let files = statements::sql_files();
    let monitor = db.client().await;
    let window = settings.horizon_window;
    let connections = writer_connections(rate);
    let writers = PacedWriters::start(
        db,
        &format!("hz{rate}"),
        connections,
        rate as f64,
        WARM_UP + window * phases.len() as u32,
    )
    .await;
    let first = writers.pacing.start + WARM_UP;
    tokio::time::sleep_until(first.into()).await;
    statements::reset(&monitor).await;
    let mut mark = Mark::take(postmaster, readers, &monitor).await;
    let mut phase_start = mark.at;
    let mut hold: Option<tokio_postgres::Client> = None;
    let mut windows = Vec::new();
    for (i, &phase) in phases.iter().enumerate() {
        if i == 0 || phases[i - 1] != phase {
            phase_start = Instant::now();
            match phase {
                Phase::Held => {
                    let client = db.client().await;
                    client
                        .batch_execute(HOLD_SQL)
                        .await
                        .expect("hold the horizon");
                    hold = Some(client);
                }
                Phase::Released => {
                    if let Some(client) = hold.take() {
                        client
                            .batch_execute("COMMIT")
                            .await
                            .expect("release the hold");
                    }
                }
                Phase::Free => {}
            }
        }
        tokio::time::sleep_until((first + window * (i as u32 + 1)).into()).await;
        let next = Mark::take(postmaster, readers, &monitor).await;
        let each = statements::read_each(&monitor).await;
        statements::reset(&monitor).await;
        let tables = Tables::read(&monitor).await;
        let mut parts = mark.parts.clone();
        parts.extend(next.parts.clone());
        let cpu = CpuSplit::between(&mark.cluster, &next.cluster, &parts);
        let (relay_process, recvlogical, bench) = (
            next.relay - mark.relay,
            next.recvlogical - mark.recvlogical,
            next.bench - mark.bench,
        );
        let mut relay_statements = RelayStatements::default();
        let mut costliest: Vec<(String, Totals)> = Vec::new();
        for (query, totals) in each {
            relay_statements.add(&query, totals);
            costliest.push((statements::source(&query, &files), totals));
        }
        costliest
            .sort_by(|a, b| (b.1.plan_ms + b.1.exec_ms).total_cmp(&(a.1.plan_ms + a.1.exec_ms)));
        costliest.truncate(COSTLIEST);
        let w = Window {
            rate,
            phase,
            minute: (next.at - phase_start).as_secs_f64() / 60.0,
            span: (mark.at, next.at),
            events: 0,
            others: (next.machine_busy
                - mark.machine_busy
                - cpu.total()
                - relay_process
                - recvlogical
                - bench)
                .max(0.0),
            cpu,
            relay_process,
            recvlogical,
            bench,
            load: load_average(),
            statements: relay_statements,
            costliest,
            tables,
            latencies_ms: Vec::new(),
        };
        say_window(&w);
        windows.push(w);
        mark = next;
    }
    drop(hold);
    drop(monitor);
    let commits = writers.finish().await;
    let (each, missing) = each_commit_to_sent(&sink, relay, &commits).await;
    let commit_times: Vec<Instant> = commits.iter().map(|(_, at)| *at).collect();
    for w in &mut windows {
        let within = |at: &Instant| (w.span.0..w.span.1).contains(at);
        w.events = commit_times.iter().filter(|at| within(at)).count() as u64;
        w.latencies_ms = each
            .iter()
            .filter(|(at, _)| within(at))
            .map(|(_, ms)| *ms)
            .collect();
        w.latencies_ms.sort_by(f64::total_cmp);
    }
    let decoding = consumer.catch_up(db).await;
    consumer.stop(db).await;
    RateRun {
        rate,
        connections,
        windows,
        missing,
        decoding,
    }
}

/// The one-minute load average.
fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// A window as it ends (its events and latencies are counted after the run).
fn say_window(w: &Window) {
    let s = w.seconds();
    say(&format!(
        "  horizon, {}/s, {} {:.1} min: relay's backends {:.1}% of a core, app's {:.1}%, WAL sender {:.1}%, rest {:.1}%; relay {:.0} statements/s, {:.3} ms each; costliest {}; dead rows: outbox {}, lease table {}; others {:.0}% of a core, load {:.2}",
        w.rate,
        w.phase.label(),
        w.minute,
        w.cpu.relay / s * 100.0,
        w.cpu.app / s * 100.0,
        w.cpu.walsender / s * 100.0,
        w.cpu.rest / s * 100.0,
        w.statements.calls() / s,
        w.statements.total_ms() / w.statements.calls(),
        w.costliest
            .iter()
            .map(|(source, t)| format!(
                "{source} {:.0}/s {:.3} ms",
                t.calls / s,
                (t.plan_ms + t.exec_ms) / t.calls
            ))
            .collect::<Vec<_>>()
            .join(", "),
        w.tables.dead_outbox,
        w.tables.dead_claims,
        w.others / s * 100.0,
        w.load,
    ));
}

fn say_rate(run: &RateRun) {
    for w in &run.windows {
        say(&format!(
            "  horizon, {}/s, {} {:.1} min: {:.0} events/s; relay's backends {:.0} µs/event, app's write {:.0}, log-based {:.0} ({:.2}× the app's, {:.2}× log-based); commit-to-sent p50 {:.1} ms p99 {:.1} ms",
            run.rate,
            w.phase.label(),
            w.minute,
            w.events as f64 / w.seconds(),
            w.relay_us(),
            w.app_us(),
            w.log_us(),
            w.relay_us() / w.app_us(),
            w.relay_us() / w.log_us(),
            w.p(0.5).unwrap_or(f64::NAN),
            w.p(0.99).unwrap_or(f64::NAN),
        ));
    }
    let (low, high) = run.free_swing();
    say(&format!(
        "horizon, {}/s: relay's backends {:.0} µs/event free ({:+.0}% / {:+.0}% across its windows), last held window {:.2}× that{}",
        run.rate,
        run.free_us(),
        (low - 1.0) * 100.0,
        (high - 1.0) * 100.0,
        run.last_held_over_free().unwrap_or(f64::NAN),
        if run.missing > 0 {
            format!("; {} events never arrived", run.missing)
        } else {
            String::new()
        },
    ));
}

// Run by selftest.rs (`cargo test --bench relay`): the bench has no libtest harness.
pub mod tests {
    use super::*;

    pub fn phases_run_free_held_released_in_order() {
        use Phase::{Free, Held, Released};
        assert_eq!(plan(2, 3, 1), vec![Free, Free, Held, Held, Held, Released]);
        assert_eq!(plan(0, 1, 0), vec![Held]);
        let s = Duration::from_secs;
        assert_eq!(held_windows(s(180), s(30)), 6);
        assert_eq!(held_windows(s(190), s(30)), 7);
        assert_eq!(held_windows(s(1), s(30)), 1);
        assert_eq!(held_windows(s(1800), s(30)), 60);
    }

    pub fn the_held_ratio_is_the_last_held_window_over_the_free_phase() {
        let t0 = Instant::now();
        let window = |phase: Phase, relay: f64, events: u64| Window {
            rate: 100,
            phase,
            minute: 0.5,
            span: (t0, t0 + Duration::from_secs(10)),
            events,
            cpu: CpuSplit {
                app: 0.5,
                relay,
                walsender: 0.25,
                rest: 0.0,
            },
            relay_process: 0.0,
            recvlogical: 0.0,
            bench: 0.0,
            others: 0.0,
            load: 0.0,
            statements: RelayStatements::default(),
            costliest: Vec::new(),
            tables: Tables::default(),
            latencies_ms: Vec::new(),
        };
        let run = RateRun {
            rate: 100,
            connections: 1,
            // Free: 0.1 s over 1,000 events (100 µs), 0.3 s over 1,000 (300 µs): 200 µs.
            windows: vec![
                window(Phase::Free, 0.1, 1000),
                window(Phase::Free, 0.3, 1000),
                window(Phase::Held, 0.5, 1000),
                window(Phase::Held, 0.6, 1000),
                window(Phase::Released, 0.2, 1000),
            ],
            missing: 0,
            decoding: Decoding {
                behind_bytes: 0.0,
                catch_up_seconds: None,
            },
        };
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(close(run.free_us(), 200.0), "{}", run.free_us());
        assert!(close(run.last_held_over_free().unwrap(), 3.0));
        let (low, high) = run.free_swing();
        assert!(close(low, 0.5) && close(high, 1.5), "{low} {high}");
        let w = &run.windows[0];
        assert!(close(w.relay_us(), 100.0) && close(w.app_us(), 500.0) && close(w.log_us(), 250.0));
    }
}
