//! Group `many-tables`: one relay serving many outbox tables (`run --tables 't_*.outbox'`),
//! against the same relay on one table in the same run.
//!
//! On a durable cluster of its own (`fsync=on`, `synchronous_commit=on`, `pg_stat_statements`
//! counting top-level statements and their planning), each database holding schemas `t_1` … `t_N` with an outbox
//! each, made by the real `outbox-relay migrate --table t_1.outbox … --table t_N.outbox`:
//!
//! 1. **Idle** with 1, 100 and 1,000 tables (1,000 at `--poll-interval` 100 ms and 1 s), and the
//!    plain one-table relay (`--table t_1.outbox`): every relay at once, each in a database of
//!    its own, over `OUTBOX_BENCH_IDLE_SECONDS` after the idle group's settling time. Per relay:
//!    its backends' CPU and its process's (scheduler run time, /proc/PID/task/*/schedstat), its
//!    database's statements (`pg_stat_statements` calls) and transactions (`pg_stat_database`),
//!    and how many backends it holds; all read from the `postgres` database.
//! 2. **Fairness** with 1,000 tables: `t_1` holds a backlog of `OUTBOX_BENCH_BACKLOG_ROWS` rows
//!    (one `INSERT … SELECT generate_series`, then `VACUUM ANALYZE`); while the relay drains it, a
//!    writer commits one row every 200 ms into another table (spread over all 999), and each such
//!    row's commit-to-sink latency is kept; once with the default `--active-tables` and once
//!    with `--active-tables 1`.
//! 3. **Spread over 100 tables against one table**: (a) a drain of `OUTBOX_BENCH_ROWS` rows
//!    spread evenly over 100 tables, against the same rows in one table (plain relay, and the
//!    many-table mode on that one table); (b) a paced writer at [`STEADY_RATE`] events/s
//!    (32 connections, open loop) spread over 100 tables against into one table, for
//!    `OUTBOX_BENCH_STEADY_SECONDS`: delivered rate, commit-to-sink latency, and the relay's
//!    backends' CPU per event.
//!
//! Every relay runs the build's defaults (delete on acknowledgement, `--wakeup poll`) to the
//! benchmark's sink answering at once.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::backend_cpu::BackendCpu;
use crate::procstat;
use crate::progress::say;
use crate::relays::{self, check_alive, relay_args_with_defaults};
use crate::settings::{Settings, PRODUCER_CONNECTIONS};
use crate::sink::Sink;
use crate::stats::{quantile, signed_ms};
use crate::support::pg::connect;
use crate::support::pg::PrivatePg;
use crate::support::{self, RelayProcess, TestDb};
use crate::workload::{self, headers_sql, order_payload_sql, GROUPS};

/// The group's cluster: durable, and `pg_stat_statements` to count the relays' statements.
const CLUSTER: &[&str] = &[
    "fsync=on",
    "synchronous_commit=on",
    "shared_preload_libraries=pg_stat_statements",
    "pg_stat_statements.track=top",
    "pg_stat_statements.track_planning=on",
];

/// The relays' own application_name prefix (`outbox-relay/VERSION`).
const RELAY_APP: &str = "outbox-relay";

/// The pattern every many-table relay serves.
const PATTERN: &str = "t_*.outbox";

/// Tables of the fairness run and of the idle group's largest set.
const MANY: usize = 1_000;

/// Tables of the spread drain and stream.
const SPREAD: usize = 100;

/// Events/s of the paced writer of part 3(b).
pub const STEADY_RATE: u64 = 2_000;

/// The fairness writer's pace: one row into a quiet table this often.
const QUIET_EVERY: Duration = Duration::from_millis(200);

/// Event numbers of the quiet tables' rows start here, apart from the backlog's.
const QUIET_BASE: u64 = 1_000_000_000;

/// A database of `tables` outboxes `t_1.outbox` … and how long `migrate` took.
struct Tenants {
    db: TestDb,
    tables: usize,
    migrate_seconds: f64,
}

/// `outbox-relay migrate --table t_1.outbox … --table t_N.outbox` in a new database: each
/// table (and its schema) created by the relay's own migration, one after the other.
async fn tenants(cluster: &PrivatePg, tables: usize) -> Tenants {
    let db = cluster.create_db().await;
    let mut args = vec![
        "migrate".to_string(),
        "--database-url".to_string(),
        db.url.clone(),
    ];
    for i in 1..=tables {
        args.extend(["--table".to_string(), format!("t_{i}.outbox")]);
    }
    let started = Instant::now();
    let (status, output) = support::run_to_end(&args, &[], Duration::from_secs(1_800)).await;
    assert!(
        status.success(),
        "outbox-relay migrate of {tables} tables failed:\n{output}"
    );
    Tenants {
        db,
        tables,
        migrate_seconds: started.elapsed().as_secs_f64(),
    }
}

/// A relay on `db` to `sink`: the build's defaults, then `extra` (`--tables …` or `--table …`).
/// Returns once it serves /metrics.
async fn start(
    settings: &Settings,
    db: &TestDb,
    sink: &Sink,
    id: &str,
    extra: &[&str],
) -> RelayProcess {
    let mut args = relay_args_with_defaults(
        settings,
        &db.url,
        &sink.queue_url("bench"),
        &sink.endpoint,
        id,
        settings.in_flight,
    );
    args.extend(extra.iter().map(|s| s.to_string()));
    let relay = RelayProcess::spawn_named(id, &args, &[]);
    relay.metric("outbox_events_sent_total").await;
    check_alive(std::slice::from_ref(&relay));
    relay
}

fn many_flags(extra: &[&'static str]) -> Vec<&'static str> {
    let mut flags = vec!["--tables", PATTERN];
    flags.extend(extra);
    flags
}

const ONE_TABLE: &[&str] = &["--table", "t_1.outbox"];

// ---------------------------------------------------------------------------------------
// 1. Idle

/// One idle relay: what it cost over the window.
pub struct IdleCell {
    /// How the relay was started, for the tables.
    pub label: String,
    /// Outbox tables in its database.
    pub tables: usize,
    pub seconds: f64,
    /// CPU seconds of its PostgreSQL backends and of its process over the window.
    pub backend_cpu: f64,
    /// See `backend_cpu`.
    pub relay_cpu: f64,
    /// Statements its database ran (`pg_stat_statements` calls, top level).
    pub statements: f64,
    /// Times they were planned: as many as `statements` when no plan is reused.
    pub plans: f64,
    /// Milliseconds they spent planning and executing.
    pub plan_ms: f64,
    /// See `plan_ms`.
    pub exec_ms: f64,
    /// Transactions of its database (`xact_commit + xact_rollback`).
    pub transactions: i64,
    /// Its backends at the window's end.
    pub backends: usize,
    /// How long `migrate` took to create its tables.
    pub migrate_seconds: f64,
}

impl IdleCell {
    fn per_second(&self, v: f64) -> f64 {
        v / self.seconds
    }

    fn to_json(&self) -> Value {
        json!({
            "relay": self.label,
            "tables": self.tables,
            "seconds": self.seconds,
            "backends": self.backends,
            "postgres_backends_percent_of_a_core": self.per_second(self.backend_cpu) * 100.0,
            "relay_percent_of_a_core": self.per_second(self.relay_cpu) * 100.0,
            "statements_per_second": self.per_second(self.statements),
            "plans_per_second": self.per_second(self.plans),
            "planning_ms_per_second": self.per_second(self.plan_ms),
            "execution_ms_per_second": self.per_second(self.exec_ms),
            "transactions_per_second": self.per_second(self.transactions as f64),
            "migrate_seconds": self.migrate_seconds,
        })
    }
}

struct IdleSample {
    transactions: i64,
    statements: f64,
    plans: f64,
    plan_ms: f64,
    exec_ms: f64,
    /// pid -> scheduler run time of each of the relay's backends.
    backends: BTreeMap<u32, f64>,
    relay_cpu: f64,
}

/// Read from the `postgres` database, so that the sample adds nothing to the relay's.
async fn idle_sample(
    admin: &tokio_postgres::Client,
    db: &TestDb,
    relay: &RelayProcess,
) -> IdleSample {
    let row = admin
        .query_one(
            "SELECT (SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database WHERE datname = $1), \
                    s.calls, s.plans, s.plan_ms, s.exec_ms \
             FROM (SELECT coalesce(sum(calls), 0)::float8 AS calls, coalesce(sum(plans), 0)::float8 AS plans, \
                          coalesce(sum(total_plan_time), 0)::float8 AS plan_ms, \
                          coalesce(sum(total_exec_time), 0)::float8 AS exec_ms \
                   FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid \
                   WHERE d.datname = $1) AS s",
            &[&db.name],
        )
        .await
        .expect("pg_stat_database and pg_stat_statements");
    let pids: Vec<i32> = admin
        .query(
            "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND application_name LIKE $2 || '%'",
            &[&db.name, &RELAY_APP],
        )
        .await
        .expect("pg_stat_activity")
        .iter()
        .map(|r| r.get(0))
        .collect();
    IdleSample {
        transactions: row.get(0),
        statements: row.get(1),
        plans: row.get(2),
        plan_ms: row.get(3),
        exec_ms: row.get(4),
        backends: pids
            .into_iter()
            .filter_map(|pid| Some((pid as u32, procstat::run_seconds(pid as u32)?)))
            .collect(),
        relay_cpu: procstat::run_seconds(relay.pid()).unwrap_or(0.0),
    }
}

/// Every idle relay at once, each in its database; one window measures them all.
async fn idle(
    settings: &Settings,
    cluster: &PrivatePg,
    sets: &[(&str, &Tenants, Vec<&'static str>)],
) -> Vec<IdleCell> {
    let sink = Sink::start(Duration::ZERO, false).await;
    let mut relays = Vec::new();
    for (i, (_, t, flags)) in sets.iter().enumerate() {
        relays.push(
            start(
                settings,
                &t.db,
                &sink,
                &format!("bench-many-idle-{i}"),
                flags,
            )
            .await,
        );
    }
    tokio::time::sleep(settings.idle_settle).await;
    let admin = connect(&cluster.admin_url()).await;
    let mut before = Vec::new();
    for ((_, t, _), relay) in sets.iter().zip(&relays) {
        before.push(idle_sample(&admin, &t.db, relay).await);
    }
    let started = Instant::now();
    tokio::time::sleep(settings.idle_window).await;
    let mut cells = Vec::new();
    for (((label, t, _), relay), b) in sets.iter().zip(&relays).zip(&before) {
        let a = idle_sample(&admin, &t.db, relay).await;
        cells.push(IdleCell {
            label: label.to_string(),
            tables: t.tables,
            seconds: started.elapsed().as_secs_f64(),
            backend_cpu: a
                .backends
                .iter()
                .filter_map(|(pid, cpu)| Some(cpu - b.backends.get(pid)?))
                .sum(),
            relay_cpu: a.relay_cpu - b.relay_cpu,
            // The sample's own statement of the window's start is not in this database.
            statements: a.statements - b.statements,
            plans: a.plans - b.plans,
            plan_ms: a.plan_ms - b.plan_ms,
            exec_ms: a.exec_ms - b.exec_ms,
            transactions: a.transactions - b.transactions,
            backends: a.backends.len(),
            migrate_seconds: t.migrate_seconds,
        });
    }
    check_alive(&relays);
    relays::stop(&relays).await;
    cells
}

// ---------------------------------------------------------------------------------------
// 2. Fairness

/// A backlog in one table drained while quiet tables get a row now and then.
pub struct FairRun {
    /// `--active-tables` (the default when `None`).
    pub active_tables: Option<usize>,
    pub tables: usize,
    pub backlog: u64,
    /// From the first row sent to the backlog and the quiet rows all sent.
    pub drain_seconds: f64,
    /// Commit-to-sink latency of the quiet tables' rows committed while the backlog drained,
    /// sorted.
    pub quiet_ms: Vec<f64>,
    /// Quiet rows committed then that never reached the sink.
    pub quiet_missing: usize,
    /// CPU seconds of the relay's backends and process over the run.
    pub backend_cpu: f64,
    /// See `backend_cpu`.
    pub relay_cpu: f64,
}

impl FairRun {
    fn rows_per_second(&self) -> f64 {
        self.backlog as f64 / self.drain_seconds.max(1e-9)
    }

    fn q(&self, p: f64) -> f64 {
        quantile(&self.quiet_ms, p)
    }

    fn label(&self) -> String {
        match self.active_tables {
            Some(n) => format!("--active-tables {n}"),
            None => "default --active-tables".to_string(),
        }
    }

    fn to_json(&self) -> Value {
        json!({
            "active_tables": self.active_tables,
            "tables": self.tables,
            "backlog_rows": self.backlog,
            "drain_seconds": self.drain_seconds,
            "backlog_rows_per_second": self.rows_per_second(),
            "quiet_rows": self.quiet_ms.len(),
            "quiet_missing": self.quiet_missing,
            "quiet_ms": {"p50": self.q(0.5), "p99": self.q(0.99), "max": self.quiet_ms.last()},
            "relay_backends_cpu_seconds": self.backend_cpu,
            "relay_cpu_seconds": self.relay_cpu,
        })
    }
}

/// Writes `rows` order events into `table` in one statement, then VACUUM ANALYZE.
async fn fill(db: &TestDb, table: &str, prefix: &str, rows: u64) {
    if rows == 0 {
        return;
    }
    let client = db.client().await;
    client
        .execute(
            &format!(
                "INSERT INTO {table} (event_id, aggregate_type, aggregate_id, event_type, payload, headers) \
                 SELECT '{prefix}-' || g, 'order', (g % {GROUPS})::text, 'order.paid', {}, {} \
                 FROM generate_series(1, $1::bigint) AS g",
                order_payload_sql("g"),
                headers_sql("g"),
            ),
            &[&(rows as i64)],
        )
        .await
        .expect("fill a backlog");
    client
        .batch_execute(&format!("VACUUM ANALYZE {table}"))
        .await
        .expect("vacuum the backlog");
}

/// The quiet table of quiet row `n`: spread over `t_2` … `t_{tables}`.
fn quiet_table(n: u64, tables: usize) -> usize {
    2 + (n.wrapping_mul(7_919) % (tables as u64 - 1)) as usize
}

async fn fairness(
    settings: &Settings,
    t: &Tenants,
    rows: u64,
    active_tables: Option<usize>,
) -> FairRun {
    fill(&t.db, "t_1.outbox", "bl", rows).await;
    let sink = Sink::start(Duration::ZERO, true).await;
    let active = active_tables.map(|n| n.to_string());
    let mut flags: Vec<&str> = many_flags(&[]);
    if let Some(n) = &active {
        flags.extend(["--active-tables", n]);
    }
    let backends = BackendCpu::start(&t.db).await;
    let relay = start(settings, &t.db, &sink, "bench-many-fair", &flags).await;
    let stop = Arc::new(AtomicBool::new(false));
    let committed = Arc::new(AtomicU64::new(0));
    let writer = {
        let client = workload::writer_client(&t.db).await;
        let mut statements = HashMap::new();
        for i in 2..=t.tables {
            let sql = workload::insert_sql_into(&format!("t_{i}.outbox"));
            statements.insert(i, client.prepare(&sql).await.expect("prepare insert"));
        }
        let (stop, committed, tables) = (Arc::clone(&stop), Arc::clone(&committed), t.tables);
        tokio::spawn(async move {
            let mut commits = Vec::new();
            let mut tick = tokio::time::interval(QUIET_EVERY);
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                n += 1;
                let number = QUIET_BASE + n;
                client
                    .execute(
                        &statements[&quiet_table(n, tables)],
                        &[
                            &format!("quiet-{number}"),
                            &(n % GROUPS).to_string(),
                            &(number as i64),
                        ],
                    )
                    .await
                    .expect("quiet insert");
                committed.fetch_add(1, Ordering::Relaxed);
                commits.push((number, Instant::now()));
            }
            commits
        })
    };
    let started = Instant::now();
    let limit = Duration::from_secs(300 + rows / 1_000);
    let mut first_sent = None;
    let drained = loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let sent = relay
            .metric("outbox_events_sent_total")
            .await
            .unwrap_or(0.0);
        if sent > 0.0 && first_sent.is_none() {
            first_sent = Some(Instant::now());
        }
        if sent >= (rows + committed.load(Ordering::Relaxed)) as f64 {
            break Instant::now();
        }
        check_alive(std::slice::from_ref(&relay));
        assert!(
            started.elapsed() < limit,
            "many tables, fairness: {sent} of {rows} + quiet rows sent after {limit:?}\n{}",
            relay.output()
        );
    };
    stop.store(true, Ordering::Relaxed);
    let commits = writer.await.expect("quiet writer");
    // The quiet rows of the last moments reach the sink too.
    let deadline = Instant::now() + Duration::from_secs(10);
    while (sink.arrivals_len() as u64) < rows + commits.len() as u64 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let relay_cpu = procstat::cpu_seconds(relay.pid()).unwrap_or(0.0);
    relays::stop(std::slice::from_ref(&relay)).await;
    let (backend_cpu, _) = backends.finish().await;
    let mut arrived: HashMap<u64, Instant> = HashMap::new();
    for (n, at) in sink.arrivals() {
        if n > QUIET_BASE {
            arrived.entry(n).or_insert(at);
        }
    }
    let during: Vec<&(u64, Instant)> = commits.iter().filter(|(_, at)| *at <= drained).collect();
    let mut quiet_ms: Vec<f64> = during
        .iter()
        .filter_map(|(n, at)| Some(signed_ms(*at, *arrived.get(n)?)))
        .collect();
    quiet_ms.sort_by(f64::total_cmp);
    FairRun {
        active_tables,
        tables: t.tables,
        backlog: rows,
        drain_seconds: (drained - first_sent.unwrap_or(started)).as_secs_f64(),
        quiet_missing: during.len() - quiet_ms.len(),
        quiet_ms,
        backend_cpu,
        relay_cpu,
    }
}

// ---------------------------------------------------------------------------------------
// 3. Spread over 100 tables against one table

/// A drain of the same rows, spread or in one table.
pub struct SpreadDrain {
    pub label: String,
    pub tables: usize,
    pub rows: u64,
    pub seconds: f64,
    pub backend_cpu: f64,
    pub relay_cpu: f64,
}

impl SpreadDrain {
    fn rows_per_second(&self) -> f64 {
        self.rows as f64 / self.seconds.max(1e-9)
    }

    fn to_json(&self) -> Value {
        json!({
            "relay": self.label,
            "tables": self.tables,
            "rows": self.rows,
            "seconds": self.seconds,
            "rows_per_second": self.rows_per_second(),
            "relay_backends_cpu_seconds": self.backend_cpu,
            "relay_cpu_seconds": self.relay_cpu,
            "relay_backends_us_per_event": self.backend_cpu / self.rows.max(1) as f64 * 1e6,
        })
    }
}

/// `rows` spread evenly over the database's tables, drained by one relay started with `flags`.
async fn spread_drain(
    settings: &Settings,
    t: &Tenants,
    label: &str,
    rows: u64,
    flags: &[&str],
) -> SpreadDrain {
    let each = rows / t.tables as u64;
    for i in 1..=t.tables {
        let extra = if i == 1 { rows % t.tables as u64 } else { 0 };
        fill(&t.db, &format!("t_{i}.outbox"), "d", each + extra).await;
    }
    let sink = Sink::start(Duration::ZERO, false).await;
    let backends = BackendCpu::start(&t.db).await;
    let started = Instant::now();
    let relay = start(settings, &t.db, &sink, "bench-many-drain", flags).await;
    let limit = Duration::from_secs(300 + rows / 1_000);
    loop {
        if sink.entries() >= rows {
            break;
        }
        check_alive(std::slice::from_ref(&relay));
        assert!(
            started.elapsed() < limit,
            "many tables, drain {label}: {} of {rows} sent after {limit:?}\n{}",
            sink.entries(),
            relay.output()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    let relay_cpu = procstat::cpu_seconds(relay.pid()).unwrap_or(0.0);
    relays::stop(std::slice::from_ref(&relay)).await;
    let (backend_cpu, _) = backends.finish().await;
    SpreadDrain {
        label: label.to_string(),
        tables: t.tables,
        rows,
        seconds,
        backend_cpu,
        relay_cpu,
    }
}

/// A paced stream, spread over the database's tables or into one.
pub struct SpreadStream {
    pub label: String,
    pub tables: usize,
    pub rate: u64,
    pub events: usize,
    /// Events the sink saw ÷ the time from the first due event to the last arrival.
    pub delivered_per_second: f64,
    /// Sorted commit-to-sink latencies.
    pub latencies_ms: Vec<f64>,
    pub missing: usize,
    /// CPU seconds of the relay's backends and process over the run.
    pub backend_cpu: f64,
    /// See `backend_cpu`.
    pub relay_cpu: f64,
}

impl SpreadStream {
    fn us_per_event(&self, cpu: f64) -> f64 {
        cpu / self.events.max(1) as f64 * 1e6
    }

    fn to_json(&self) -> Value {
        json!({
            "relay": self.label,
            "tables": self.tables,
            "rate": self.rate,
            "events": self.events,
            "missing": self.missing,
            "delivered_per_second": self.delivered_per_second,
            "p50_ms": quantile(&self.latencies_ms, 0.5),
            "p99_ms": quantile(&self.latencies_ms, 0.99),
            "max_ms": self.latencies_ms.last(),
            "relay_backends_us_per_event": self.us_per_event(self.backend_cpu),
            "relay_us_per_event": self.us_per_event(self.relay_cpu),
        })
    }
}

/// [`STEADY_RATE`] events/s for `settings.steady`, event n into `t_{n % tables + 1}`, one row
/// per transaction over [`PRODUCER_CONNECTIONS`] connections, open loop.
async fn spread_stream(
    settings: &Settings,
    t: &Tenants,
    label: &str,
    flags: &[&str],
) -> SpreadStream {
    let sink = Sink::start(Duration::ZERO, true).await;
    let backends = BackendCpu::start(&t.db).await;
    let relay = start(settings, &t.db, &sink, "bench-many-stream", flags).await;
    let mut writers = Vec::new();
    for _ in 0..PRODUCER_CONNECTIONS {
        let client = workload::writer_client(&t.db).await;
        let mut statements = Vec::new();
        for i in 1..=t.tables {
            let sql = workload::insert_sql_into(&format!("t_{i}.outbox"));
            statements.push(client.prepare(&sql).await.expect("prepare insert"));
        }
        writers.push((client, statements));
    }
    let pacing = workload::Pacing {
        start: Instant::now() + Duration::from_millis(20),
        rate: STEADY_RATE as f64,
        duration: settings.steady,
    };
    let next = Arc::new(AtomicU64::new(1));
    let mut tasks = tokio::task::JoinSet::new();
    let tables = t.tables as u64;
    for (client, statements) in writers {
        let next = Arc::clone(&next);
        tasks.spawn(async move {
            let mut done = Vec::new();
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n > pacing.events() || Instant::now() > pacing.end() {
                    return done;
                }
                tokio::time::sleep_until(pacing.due(n).into()).await;
                client
                    .execute(
                        &statements[(n % tables) as usize],
                        &[&format!("s-{n}"), &(n % GROUPS).to_string(), &(n as i64)],
                    )
                    .await
                    .expect("stream insert");
                done.push((n, Instant::now()));
            }
        });
    }
    let mut commits = Vec::new();
    while let Some(done) = tasks.join_next().await {
        commits.extend(done.expect("stream writer"));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while sink.arrivals_len() < commits.len() && Instant::now() < deadline {
        check_alive(std::slice::from_ref(&relay));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let relay_cpu = procstat::cpu_seconds(relay.pid()).unwrap_or(0.0);
    relays::stop(std::slice::from_ref(&relay)).await;
    let (backend_cpu, _) = backends.finish().await;
    let mut arrived: HashMap<u64, Instant> = HashMap::new();
    for (n, at) in sink.arrivals() {
        arrived.entry(n).or_insert(at);
    }
    let last = arrived.values().max().copied().unwrap_or(pacing.start);
    let mut latencies_ms: Vec<f64> = commits
        .iter()
        .filter_map(|(n, at)| Some(signed_ms(*at, *arrived.get(n)?)))
        .collect();
    latencies_ms.sort_by(f64::total_cmp);
    SpreadStream {
        label: label.to_string(),
        tables: t.tables,
        rate: STEADY_RATE,
        events: commits.len(),
        delivered_per_second: latencies_ms.len() as f64
            / last
                .saturating_duration_since(pacing.start)
                .as_secs_f64()
                .max(1e-9),
        missing: commits.len() - latencies_ms.len(),
        latencies_ms,
        backend_cpu,
        relay_cpu,
    }
}

// ---------------------------------------------------------------------------------------
// The group

pub struct ManyTablesRun {
    pub idle: Vec<IdleCell>,
    pub fairness: Vec<FairRun>,
    pub drains: Vec<SpreadDrain>,
    pub streams: Vec<SpreadStream>,
}

impl ManyTablesRun {
    pub fn to_json(&self) -> Value {
        json!({
            "cluster": "durable (fsync=on, synchronous_commit=on), pg_stat_statements track=top",
            "idle": self.idle.iter().map(IdleCell::to_json).collect::<Vec<_>>(),
            "fairness": self.fairness.iter().map(FairRun::to_json).collect::<Vec<_>>(),
            "drains": self.drains.iter().map(SpreadDrain::to_json).collect::<Vec<_>>(),
            "streams": self.streams.iter().map(SpreadStream::to_json).collect::<Vec<_>>(),
        })
    }

    /// The group's tables, for the report printed at the end.
    pub fn table(&self) -> String {
        let mut t = String::new();
        let base_idle = self.idle.first();
        let _ = writeln!(
            t,
            "\n### Many tables in one relay: idle (durable cluster, every relay at once, each in its database)\n"
        );
        let _ = writeln!(
            t,
            "| relay | tables | backends | statements/s | plans/s | planning / executing ms/s | transactions/s | its backends, % of a core | ÷ one table | relay process, % of a core | ÷ one table | migrate s |"
        );
        let _ = writeln!(
            t,
            "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|"
        );
        for c in &self.idle {
            let ratio = |v: f64, b: Option<f64>| match b {
                Some(b) if b > 0.0 => format!("{:.1}", v / b),
                _ => "—".to_string(),
            };
            let _ = writeln!(
                t,
                "| {} | {} | {} | {:.1} | {:.1} | {:.1} / {:.1} | {:.1} | {:.2} | {} | {:.2} | {} | {:.1} |",
                c.label,
                c.tables,
                c.backends,
                c.per_second(c.statements),
                c.per_second(c.plans),
                c.per_second(c.plan_ms),
                c.per_second(c.exec_ms),
                c.per_second(c.transactions as f64),
                c.per_second(c.backend_cpu) * 100.0,
                ratio(c.backend_cpu, base_idle.map(|b| b.backend_cpu)),
                c.per_second(c.relay_cpu) * 100.0,
                ratio(c.relay_cpu, base_idle.map(|b| b.relay_cpu)),
                c.migrate_seconds,
            );
        }
        if !self.fairness.is_empty() {
            let _ = writeln!(
                t,
                "\n### Many tables: a backlog in one table, a row every 200 ms into one of the others\n"
            );
            let _ = writeln!(
                t,
                "| relay | tables | backlog | backlog rows/s | quiet rows | quiet p50 ms | p99 ms | max ms | missing |"
            );
            let _ = writeln!(t, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
            for f in &self.fairness {
                let _ = writeln!(
                    t,
                    "| {} | {} | {} | {:.0} | {} | {:.1} | {:.1} | {:.1} | {} |",
                    f.label(),
                    f.tables,
                    f.backlog,
                    f.rows_per_second(),
                    f.quiet_ms.len(),
                    f.q(0.5),
                    f.q(0.99),
                    f.quiet_ms.last().copied().unwrap_or(f64::NAN),
                    f.quiet_missing,
                );
            }
        }
        if !self.drains.is_empty() {
            let base = self.drains.first().map(SpreadDrain::rows_per_second);
            let _ = writeln!(
                t,
                "\n### Many tables: the same backlog in one table or spread\n"
            );
            let _ = writeln!(
                t,
                "| relay | tables | rows | rows/s | ÷ one table | relay backends µs/event | relay CPU s |"
            );
            let _ = writeln!(t, "|---|---:|---:|---:|---:|---:|---:|");
            for d in &self.drains {
                let _ = writeln!(
                    t,
                    "| {} | {} | {} | {:.0} | {:.2} | {:.1} | {:.1} |",
                    d.label,
                    d.tables,
                    d.rows,
                    d.rows_per_second(),
                    base.map_or(f64::NAN, |b| d.rows_per_second() / b),
                    d.backend_cpu / d.rows.max(1) as f64 * 1e6,
                    d.relay_cpu,
                );
            }
        }
        if !self.streams.is_empty() {
            let base = self.streams.first().map(|s| s.us_per_event(s.backend_cpu));
            let _ = writeln!(
                t,
                "\n### Many tables: a paced stream into one table or spread (durable commits)\n"
            );
            let _ = writeln!(
                t,
                "| relay | tables | events/s asked | events | delivered/s | p50 ms | p99 ms | max ms | missing | relay backends µs/event | ÷ one table | relay process µs/event |"
            );
            let _ = writeln!(
                t,
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
            );
            for s in &self.streams {
                let us = s.us_per_event(s.backend_cpu);
                let _ = writeln!(
                    t,
                    "| {} | {} | {} | {} | {:.0} | {:.1} | {:.1} | {:.1} | {} | {:.1} | {:.2} | {:.1} |",
                    s.label,
                    s.tables,
                    s.rate,
                    s.events,
                    s.delivered_per_second,
                    quantile(&s.latencies_ms, 0.5),
                    quantile(&s.latencies_ms, 0.99),
                    s.latencies_ms.last().copied().unwrap_or(f64::NAN),
                    s.missing,
                    us,
                    base.map_or(f64::NAN, |b| us / b),
                    s.us_per_event(s.relay_cpu),
                );
            }
        }
        t
    }
}

/// The group: its own durable cluster, stopped at the end.
pub async fn run(settings: &Settings) -> ManyTablesRun {
    let cluster = PrivatePg::start_with(CLUSTER).await;
    connect(&cluster.admin_url())
        .await
        .batch_execute("CREATE EXTENSION pg_stat_statements")
        .await
        .expect("pg_stat_statements in the postgres database");
    let mut sets = Vec::new();
    for tables in [1, 1, SPREAD, MANY, MANY] {
        let t = tenants(&cluster, tables).await;
        say(&format!(
            "many tables: migrate of {tables} table(s) took {:.1} s",
            t.migrate_seconds
        ));
        sets.push(t);
    }
    let [one, one_many, hundred, thousand, thousand_slow] = &sets[..] else {
        unreachable!("five sets")
    };
    let idle_sets = [
        ("--table t_1.outbox (one table)", one, ONE_TABLE.to_vec()),
        ("--tables t_*.outbox", one_many, many_flags(&[])),
        ("--tables t_*.outbox", hundred, many_flags(&[])),
        ("--tables t_*.outbox", thousand, many_flags(&[])),
        (
            "--tables t_*.outbox --poll-interval 1s",
            thousand_slow,
            many_flags(&["--poll-interval", "1s"]),
        ),
    ];
    let idle = idle(settings, &cluster, &idle_sets).await;
    for c in &idle {
        say(&format!(
            "many tables, idle, {} over {} table(s): {} backends, {:.1} statements/s ({:.1} plans/s; {:.1} ms planning, {:.1} ms executing per s), {:.1} transactions/s, its backends {:.2}% of a core, relay {:.2}%",
            c.label,
            c.tables,
            c.backends,
            c.per_second(c.statements),
            c.per_second(c.plans),
            c.per_second(c.plan_ms),
            c.per_second(c.exec_ms),
            c.per_second(c.transactions as f64),
            c.per_second(c.backend_cpu) * 100.0,
            c.per_second(c.relay_cpu) * 100.0,
        ));
    }

    let mut fairness = Vec::new();
    for active in [None, Some(1)] {
        fairness.push(fair_run(settings, thousand, active).await);
    }

    let mut drains = Vec::new();
    for (label, t, flags) in [
        ("--table t_1.outbox (one table)", one, ONE_TABLE.to_vec()),
        ("--tables t_*.outbox, one table", one_many, many_flags(&[])),
        ("--tables t_*.outbox, spread", hundred, many_flags(&[])),
    ] {
        let d = spread_drain(settings, t, label, settings.rows, &flags).await;
        say(&format!(
            "many tables, drain of {} rows over {} table(s), {label}: {:.0} rows/s ({:.1} s), relay backends {:.1} µs/event",
            d.rows,
            d.tables,
            d.rows_per_second(),
            d.seconds,
            d.backend_cpu / d.rows.max(1) as f64 * 1e6,
        ));
        drains.push(d);
    }

    let mut streams = Vec::new();
    for (label, t, flags) in [
        ("--table t_1.outbox (one table)", one, ONE_TABLE.to_vec()),
        ("--tables t_*.outbox, one table", one_many, many_flags(&[])),
        ("--tables t_*.outbox, spread", hundred, many_flags(&[])),
    ] {
        let s = spread_stream(settings, t, label, &flags).await;
        say(&format!(
            "many tables, {} events/s over {} table(s), {label}: {} events, delivered {:.0}/s, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms, {} missing; relay backends {:.1} µs/event, relay {:.1} µs/event",
            s.rate,
            s.tables,
            s.events,
            s.delivered_per_second,
            quantile(&s.latencies_ms, 0.5),
            quantile(&s.latencies_ms, 0.99),
            s.latencies_ms.last().copied().unwrap_or(f64::NAN),
            s.missing,
            s.us_per_event(s.backend_cpu),
            s.us_per_event(s.relay_cpu),
        ));
        streams.push(s);
    }
    drop(cluster);
    ManyTablesRun {
        idle,
        fairness,
        drains,
        streams,
    }
}

/// One fairness run over the 1,000 tables, and its progress line.
async fn fair_run(settings: &Settings, t: &Tenants, active: Option<usize>) -> FairRun {
    let f = fairness(settings, t, settings.backlog_rows, active).await;
    say(&format!(
        "many tables, fairness, {} tables, {}: backlog of {} drained at {:.0} rows/s ({:.1} s); quiet rows {} (missing {}): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; relay backends {:.0} CPU s, relay {:.0}",
        f.tables,
        f.label(),
        f.backlog,
        f.rows_per_second(),
        f.drain_seconds,
        f.quiet_ms.len(),
        f.quiet_missing,
        f.q(0.5),
        f.q(0.99),
        f.quiet_ms.last().copied().unwrap_or(f64::NAN),
        f.backend_cpu,
        f.relay_cpu,
    ));
    f
}
