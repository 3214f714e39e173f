//! Group `adopt`: what `migrate --adopt` costs the application. A Debezium-shaped table of
//! `OUTBOX_BENCH_ADOPT_ROWS` rows (2,000,000 by default, ~700 MB; quick: 200,000) on a durable
//! cluster (`fsync=on`, `synchronous_commit=on`), four writers inserting one row per
//! transaction throughout, and the insert latency while the adoption runs against the same
//! writers' latency just before it.
//!
//! `OUTBOX_BENCH_ADOPT_BEFORE=PATH` also runs another build's binary first (e.g. main's, for a
//! before/after), each on a table of its own. Results go to stdout and `adopt.json`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::cluster::DURABLE;
use crate::progress::say;
use crate::settings::Settings;
use crate::stats::rounded_rank_quantile as quantile;
use crate::support::pg::{connect, PrivatePg};

/// Writers inserting while the adoption runs, as in the report that asked for this figure.
const WRITERS: usize = 4;
/// Writers' latency measured before the adoption starts, as the baseline.
const BASELINE: Duration = Duration::from_secs(5);

#[derive(Debug, serde::Serialize)]
pub struct AdoptRun {
    /// The `outbox-relay` binary that adopted: this build, or `OUTBOX_BENCH_ADOPT_BEFORE`'s.
    pub binary: String,
    /// Rows of the adopted table.
    pub rows: i64,
    /// Its size before the adoption.
    pub table_mb: f64,
    /// How long `migrate --adopt` ran.
    pub adopt_seconds: f64,
    /// Whether it exited successfully.
    pub exit_ok: bool,
    /// Inserts started while the adoption ran.
    pub inserts: usize,
    /// Insert latency quantiles of the writers while the adoption ran.
    pub p50_ms: f64,
    /// See `p50_ms`.
    pub p99_ms: f64,
    /// The slowest insert while the adoption ran: what a lock would show.
    pub max_ms: f64,
    /// Same writers, the seconds before the adoption.
    pub baseline_p99_ms: f64,
    /// See `baseline_p99_ms`.
    pub baseline_max_ms: f64,
}

pub async fn run(settings: &Settings) -> Vec<AdoptRun> {
    let rows: i64 = std::env::var("OUTBOX_BENCH_ADOPT_ROWS")
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(if settings.quick { 200_000 } else { 2_000_000 });
    let mut binaries: Vec<PathBuf> = Vec::new();
    if let Some(before) = std::env::var_os("OUTBOX_BENCH_ADOPT_BEFORE") {
        binaries.push(PathBuf::from(before));
    }
    binaries.push(PathBuf::from(env!("CARGO_BIN_EXE_outbox-relay")));
    // Durable, as production commits: a lock or a flush shows in the writers' latency.
    let pg = PrivatePg::start_with(DURABLE).await;
    let mut runs = Vec::new();
    for binary in &binaries {
        let db = pg.create_db().await;
        let run = measure(&db.url, binary, rows).await;
        say(&format!(
            "adopt {} rows ({:.0} MB), {WRITERS} writers, durable: adopt {:.1} s ({}), insert latency during it p50 {:.2} ms, p99 {:.2} ms, max {:.1} ms over {} inserts (before it: p99 {:.2} ms, max {:.1} ms); binary {}",
            run.rows,
            run.table_mb,
            run.adopt_seconds,
            if run.exit_ok { "ok" } else { "FAILED" },
            run.p50_ms,
            run.p99_ms,
            run.max_ms,
            run.inserts,
            run.baseline_p99_ms,
            run.baseline_max_ms,
            run.binary,
        ));
        runs.push(run);
    }
    std::fs::create_dir_all(&settings.out_dir).expect("create the output directory");
    std::fs::write(
        settings.out_dir.join("adopt.json"),
        serde_json::to_string_pretty(&runs).expect("serialise"),
    )
    .expect("write adopt.json");
    runs
}

async fn measure(url: &str, binary: &Path, rows: i64) -> AdoptRun {
    let client = connect(url).await;
    client
        .batch_execute(crate::support::DEBEZIUM_OUTBOX_DDL)
        .await
        .unwrap();
    let chunk = 100_000;
    let mut done = 0;
    while done < rows {
        let n = chunk.min(rows - done);
        client
            .execute(
                "INSERT INTO outboxevent
                 SELECT gen_random_uuid(), 'order', (g % 5000)::text, 'OrderCreated',
                        jsonb_build_object('order', g, 'customer', md5(g::text),
                                           'note', repeat('x', 140))
                 FROM generate_series($1::bigint, $2::bigint) g",
                &[&done, &(done + n - 1)],
            )
            .await
            .unwrap();
        done += n;
    }
    client
        .batch_execute("VACUUM ANALYZE outboxevent")
        .await
        .unwrap();
    let table_mb: f64 = client
        .query_one(
            "SELECT pg_total_relation_size('outboxevent')::float8 / 1048576",
            &[],
        )
        .await
        .unwrap()
        .get(0);

    let stop = Arc::new(AtomicBool::new(false));
    let origin = Instant::now();
    // (start offset, latency) of every insert.
    let samples: Arc<Mutex<Vec<(Duration, Duration)>>> = Arc::default();
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let (stop, samples, url) = (stop.clone(), samples.clone(), url.to_string());
        writers.push(tokio::spawn(async move {
            let c = connect(&url).await;
            let insert = c
                .prepare(
                    "INSERT INTO outboxevent (id, aggregatetype, aggregateid, type, payload)
                     VALUES (gen_random_uuid(), 'order', $1::text, 'OrderCreated',
                             jsonb_build_object('writer', $1::text, 'note', repeat('x', 120)))",
                )
                .await
                .unwrap();
            let key = w.to_string();
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                c.execute(&insert, &[&key]).await.unwrap();
                let latency = started.elapsed();
                samples.lock().unwrap().push((started - origin, latency));
            }
        }));
    }
    tokio::time::sleep(BASELINE).await;
    let adopt_start = origin.elapsed();
    let mut cmd = Command::new(binary);
    cmd.args([
        "migrate",
        "--adopt",
        "--database-url",
        url,
        "--table",
        "outboxevent",
    ])
    .args(crate::support::DEBEZIUM_COLUMNS)
    .env("RUST_LOG", "warn")
    .stdin(Stdio::null());
    let status = tokio::task::spawn_blocking(move || cmd.status())
        .await
        .unwrap()
        .expect("run migrate --adopt");
    let adopt_end = origin.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }

    let samples = samples.lock().unwrap();
    let ms = |d: &Duration| d.as_secs_f64() * 1000.0;
    let mut during: Vec<f64> = samples
        .iter()
        .filter(|(at, _)| *at >= adopt_start && *at <= adopt_end)
        .map(|(_, l)| ms(l))
        .collect();
    let mut before: Vec<f64> = samples
        .iter()
        .filter(|(at, _)| *at < adopt_start)
        .map(|(_, l)| ms(l))
        .collect();
    during.sort_by(f64::total_cmp);
    before.sort_by(f64::total_cmp);
    AdoptRun {
        binary: binary.display().to_string(),
        rows,
        table_mb,
        adopt_seconds: (adopt_end - adopt_start).as_secs_f64(),
        exit_ok: status.success(),
        inserts: during.len(),
        p50_ms: quantile(&during, 0.50),
        p99_ms: quantile(&during, 0.99),
        max_ms: during.last().copied().unwrap_or(0.0),
        baseline_p99_ms: quantile(&before, 0.99),
        baseline_max_ms: before.last().copied().unwrap_or(0.0),
    }
}
