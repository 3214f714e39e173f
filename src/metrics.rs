//! Every metric name in one place, and the HTTP listener for `/metrics`, `/healthz`, `/readyz`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub const OLDEST_UNSENT_AGE: &str = "outbox_oldest_unsent_age_seconds";
pub const UNSENT_ROWS: &str = "outbox_unsent_rows";
pub const QUARANTINED_ROWS: &str = "outbox_quarantined_rows";
pub const OLDEST_QUARANTINED_AGE: &str = "outbox_oldest_quarantined_age_seconds";
pub const BLOCKED_ROWS: &str = "outbox_blocked_rows";
/// The times behind the ages (src/relay/reads.rs, rendered at each scrape): the oldest unsent
/// row's `created_at` as of the last read, when that read began, and whether the relay can
/// read the table now. Rules compute `time() - x`, which keeps growing while reads stop.
pub const OLDEST_UNSENT_TIMESTAMP: &str = "outbox_oldest_unsent_timestamp_seconds";
pub const TABLE_LAST_READ: &str = "outbox_table_last_read_timestamp_seconds";
pub const TABLE_UP: &str = "outbox_table_up";
/// When this relay process started, as client libraries' process collectors name it: its
/// changes count restarts, which a crash loop makes faster than `up` can show.
pub const PROCESS_START_TIME: &str = "process_start_time_seconds";
/// `--order-by transaction`: how long the oldest committed event has been held back behind
/// an older transaction that still runs (the claims' watermark), and how many are.
pub const WATERMARK_AGE: &str = "outbox_order_watermark_age_seconds";
pub const WATERMARK_HELD_ROWS: &str = "outbox_order_watermark_held_rows";
pub const EVENTS_SENT: &str = "outbox_events_sent_total";
pub const SEND_FAILURES: &str = "outbox_send_failures_total";
pub const OFFLOADED: &str = "outbox_offloaded_total";
pub const OFFLOAD_FAILURES: &str = "outbox_offload_failures_total";
pub const EVENTS_QUARANTINED: &str = "outbox_events_quarantined_total";
pub const LEASE_LOST: &str = "outbox_lease_lost_total";
/// Claims' settlements written, by how: `with_claim` (in the next claim's transaction) or
/// `alone` (a statement of its own, each try counted): the second costs a transaction each.
pub const SETTLEMENTS: &str = "outbox_settlements_total";
pub const SEND_DURATION: &str = "outbox_send_duration_seconds";
pub const DELIVERY_LAG: &str = "outbox_delivery_lag_seconds";
/// One claim statement, rows returned or none: what a growing backlog or a slow database
/// costs each claim (docs/operations.md, "Big backlogs").
pub const CLAIM_DURATION: &str = "outbox_claim_duration_seconds";
pub const REQUEST_CONCURRENCY_LIMIT: &str = "outbox_request_concurrency_limit";
/// The table's live relays by version and state (`claiming`, or `refused` by the schema), as
/// this relay's last registration renewal saw them: how far a rollout has come.
pub const RELAYS: &str = "outbox_relays";
/// A relay serving several tables: how many it serves (the table gauges carry a `table` label).
pub const TABLES: &str = "outbox_tables";
/// A relay serving several tables: 1 for each table it skips now, labelled `table`.
pub const TABLE_SKIPPED: &str = "outbox_table_skipped";
/// 1 for a table whose settlements change nothing (a trigger, a rule, row-level security undid
/// them): the relay stopped claiming it until restarted, labelled `table`.
pub const TABLE_BLOCKED: &str = "outbox_table_blocked";

/// How often histogram samples are folded into their buckets when nobody scrapes.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Installs the Prometheus recorder for this process and describes every metric.
pub fn install() -> Result<PrometheusHandle, String> {
    let latency_buckets = [
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    ];
    let lag_buckets = [
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
        300.0, 900.0, 3600.0,
    ];
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(SEND_DURATION.into()), &latency_buckets)
        .and_then(|b| b.set_buckets_for_metric(Matcher::Full(DELIVERY_LAG.into()), &lag_buckets))
        .and_then(|b| {
            b.set_buckets_for_metric(Matcher::Full(CLAIM_DURATION.into()), &latency_buckets)
        })
        .map_err(|e| e.to_string())?
        .install_recorder()
        .map_err(|e| e.to_string())?;
    describe();
    Ok(handle)
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_gauge!(
        OLDEST_UNSENT_AGE,
        Unit::Seconds,
        "now - created_at of the oldest unsent row (rows parked in quarantine included) as of the relay's last read of the table (every --stats-interval); 0 when none. Frozen while the relay cannot read: alert on time() - outbox_oldest_unsent_timestamp_seconds"
    );
    describe_gauge!(
        UNSENT_ROWS,
        "unsent rows, leased ones and rows parked in quarantine (blocked, destination) included"
    );
    describe_gauge!(QUARANTINED_ROWS, "rows in quarantine");
    describe_gauge!(
        OLDEST_QUARANTINED_AGE,
        Unit::Seconds,
        "now - quarantined_at of the row longest in quarantine, any reason; 0 when none"
    );
    describe_gauge!(
        BLOCKED_ROWS,
        "quarantined rows parked behind a quarantined event of their group (ordered delivery)"
    );
    describe_gauge!(
        WATERMARK_AGE,
        Unit::Seconds,
        "--order-by transaction: now - created_at of the oldest committed row held back because an older transaction still runs; 0 when none"
    );
    describe_gauge!(
        WATERMARK_HELD_ROWS,
        "--order-by transaction: committed unsent rows held back because an older transaction still runs"
    );
    describe_gauge!(
        RELAYS,
        "live relays of the table by version and state (claiming, refused by the schema), as this relay's last registration renewal saw them"
    );
    describe_counter!(EVENTS_SENT, "rows marked sent");
    describe_counter!(SEND_FAILURES, "failed sends per entry, by kind");
    describe_counter!(EVENTS_QUARANTINED, "rows quarantined, by reason");
    describe_counter!(
        OFFLOADED,
        "rows sent with their body in S3 (upload and SQS acknowledgement both done)"
    );
    describe_counter!(
        OFFLOAD_FAILURES,
        "failed S3 uploads of large bodies, by kind"
    );
    describe_counter!(
        LEASE_LOST,
        "settlements refused because another replica owns the row now"
    );
    describe_counter!(
        SETTLEMENTS,
        "claims' settlements written, by how: with_claim (in the next claim's transaction) or alone (a transaction of its own, each try)"
    );
    describe_histogram!(
        SEND_DURATION,
        Unit::Seconds,
        "one SQS SendMessageBatch call"
    );
    describe_histogram!(
        DELIVERY_LAG,
        Unit::Seconds,
        "created_at to acknowledged by SQS"
    );
    describe_histogram!(
        CLAIM_DURATION,
        Unit::Seconds,
        "one claim statement (lease and read of up to --batch-size rows)"
    );
    describe_gauge!(
        REQUEST_CONCURRENCY_LIMIT,
        "requests a destination may have in flight now (adaptive, at most --max-in-flight); destination: a configured queue, topic or s3://bucket, or other (the lowest of rows' own queues)"
    );
    describe_gauge!(
        TABLE_BLOCKED,
        "1 for a table whose settlements change nothing (a trigger, a rule or row-level security undid them): claims on it stopped until the relay restarts"
    );
    // Counters with labels appear only once touched; zero them so dashboards and alerts see
    // the series from the start.
    for kind in [
        "transient",
        "throttled",
        "permanent",
        "config",
        "destination",
    ] {
        metrics::counter!(SEND_FAILURES, "kind" => kind).absolute(0);
        metrics::counter!(OFFLOAD_FAILURES, "kind" => kind).absolute(0);
    }
    for reason in [
        "too_large",
        "invalid",
        "sender_fault",
        "rejected",
        "max_attempts",
        "blocked",
        "destination",
    ] {
        metrics::counter!(EVENTS_QUARANTINED, "reason" => reason).absolute(0);
    }
    describe_gauge!(
        PROCESS_START_TIME,
        Unit::Seconds,
        "when this relay process started, in seconds since the epoch"
    );
    metrics::gauge!(PROCESS_START_TIME).set(unix_seconds(std::time::SystemTime::now()));
    metrics::counter!(EVENTS_SENT).absolute(0);
    metrics::counter!(OFFLOADED).absolute(0);
    metrics::counter!(LEASE_LOST).absolute(0);
    for written in ["with_claim", "alone"] {
        metrics::counter!(SETTLEMENTS, "written" => written).absolute(0);
    }
}

/// `t` in seconds since the epoch, as Prometheus's `time()` counts them and the series that
/// are times carry them.
pub fn unix_seconds(t: std::time::SystemTime) -> f64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// What the probes report, updated by the relay loop.
#[derive(Debug)]
pub struct Health {
    started: Instant,
    /// Milliseconds since `started` at the last loop iteration: `/healthz` fails when stale.
    last_tick_ms: AtomicU64,
    /// How long without an iteration counts as stuck.
    stuck_after: Duration,
    /// The last database round trip succeeded.
    database_ok: AtomicBool,
    /// Set while a configuration error blocks sending (queue missing, access denied).
    config_error: Mutex<Option<String>>,
    /// Set while the relay does not claim: the schema no longer admits it, or its registration
    /// could not be renewed.
    not_claiming: Mutex<Option<String>>,
    /// Series rendered by their owner at each scrape rather than kept by the recorder: the
    /// per-table gauges of a relay serving several tables, whose set of tables changes (a
    /// series the recorder holds could not leave when its table drops out of the worst N).
    sections: Mutex<Vec<Section>>,
}

/// Renders Prometheus text exposition lines, `# HELP` and `# TYPE` included.
#[derive(Clone)]
pub struct Section(pub Arc<dyn Fn() -> String + Send + Sync>);

impl std::fmt::Debug for Section {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Section")
    }
}

impl Health {
    pub fn new(stuck_after: Duration) -> Arc<Health> {
        Arc::new(Health {
            started: Instant::now(),
            last_tick_ms: AtomicU64::new(0),
            stuck_after,
            database_ok: AtomicBool::new(false),
            config_error: Mutex::new(None),
            not_claiming: Mutex::new(None),
            sections: Mutex::new(Vec::new()),
        })
    }

    /// Adds series that `section` renders at every scrape, after the recorder's.
    pub fn add_section(&self, section: Section) {
        self.sections.lock().expect("sections lock").push(section);
    }

    fn render_sections(&self) -> String {
        let sections = self.sections.lock().expect("sections lock").clone();
        sections.iter().map(|render| (render.0)()).collect()
    }

    pub fn tick(&self) {
        let ms = self.started.elapsed().as_millis() as u64;
        self.last_tick_ms.store(ms, Ordering::Relaxed);
    }

    /// How often a loop that waits on purpose ticks: well inside `stuck_after`.
    pub fn tick_every(&self) -> Duration {
        self.stuck_after / 4
    }

    pub fn set_database_ok(&self, ok: bool) {
        self.database_ok.store(ok, Ordering::Relaxed);
    }

    pub fn set_config_error(&self, error: Option<String>) {
        *self.config_error.lock().expect("health lock") = error;
    }

    pub fn set_not_claiming(&self, why: Option<String>) {
        *self.not_claiming.lock().expect("health lock") = why;
    }

    fn live(&self) -> Result<(), String> {
        let last = Duration::from_millis(self.last_tick_ms.load(Ordering::Relaxed));
        let idle = self.started.elapsed().saturating_sub(last);
        if idle > self.stuck_after {
            Err(format!("relay loop has not run for {}s", idle.as_secs()))
        } else {
            Ok(())
        }
    }

    fn ready(&self) -> Result<(), String> {
        self.live()?;
        if !self.database_ok.load(Ordering::Relaxed) {
            // Before the first connection, why it is not there yet (`waiting for the database`).
            return Err(
                match self.not_claiming.lock().expect("health lock").as_ref() {
                    Some(why) => format!("database unreachable: {why}"),
                    None => "database unreachable".to_string(),
                },
            );
        }
        if let Some(error) = self.config_error.lock().expect("health lock").as_ref() {
            return Err(format!("configuration error: {error}"));
        }
        if let Some(why) = self.not_claiming.lock().expect("health lock").as_ref() {
            return Err(format!("not claiming: {why}"));
        }
        Ok(())
    }
}

/// Binds the listener now (so a bad address fails at start-up) and serves until `shutdown`,
/// keeping the recorder's upkeep going meanwhile.
pub async fn serve(
    addr: SocketAddr,
    handle: PrometheusHandle,
    health: Arc<Health>,
    shutdown: CancellationToken,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(upkeep(handle.clone(), UPKEEP_EVERY, shutdown.clone()));
    tokio::spawn(async move {
        loop {
            let (stream, _) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        tracing::warn!(error = %e, "metrics listener accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                _ = shutdown.cancelled() => return,
            };
            let handle = handle.clone();
            let health = Arc::clone(&health);
            tokio::spawn(async move {
                if let Err(e) = answer(stream, &handle, &health).await {
                    tracing::debug!(error = %e, "metrics request failed");
                }
            });
        }
    });
    Ok(bound)
}

/// The recorder keeps every histogram sample until a scrape or its upkeep folds them into the
/// buckets; unscraped, memory grew ~20 bytes per event. `install_recorder` leaves running the
/// upkeep to us (the exporter's own task comes with its HTTP server, which we do not use).
async fn upkeep(handle: PrometheusHandle, every: Duration, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => handle.run_upkeep(),
            _ = shutdown.cancelled() => return,
        }
    }
}

/// A deliberately tiny HTTP/1.1 responder: three GET paths, one response per connection.
/// Probes and scrapers need nothing more, and it keeps a web framework out of the build.
async fn answer(
    mut stream: tokio::net::TcpStream,
    handle: &PrometheusHandle,
    health: &Health,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 4096];
    let mut len = 0;
    let read = async {
        loop {
            let n = stream.read(&mut buf[len..]).await?;
            if n == 0 {
                break;
            }
            len += n;
            if buf[..len].windows(4).any(|w| w == b"\r\n\r\n") || len == buf.len() {
                break;
            }
        }
        Ok::<_, std::io::Error>(())
    };
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "request head timeout"))??;
    let head = String::from_utf8_lossy(&buf[..len]);
    let path = head
        .lines()
        .next()
        .and_then(|line| line.split_whitespace().nth(1))
        .unwrap_or("/");
    let path = path.split('?').next().unwrap_or(path);
    let (status, content_type, body) = match path {
        "/metrics" => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            handle.render() + &health.render_sections(),
        ),
        "/healthz" => probe(health.live()),
        "/readyz" => probe(health.ready()),
        _ => ("404 Not Found", "text/plain", "not found\n".to_string()),
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

fn probe(result: Result<(), String>) -> (&'static str, &'static str, String) {
    match result {
        Ok(()) => ("200 OK", "text/plain", "ok\n".to_string()),
        Err(why) => ("503 Service Unavailable", "text/plain", format!("{why}\n")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    /// The system allocator, counting what each thread allocates and frees, so a test can see
    /// how much memory something holds. Per thread, so tests running in parallel do not count
    /// each other's allocations.
    struct Counting;

    thread_local! {
        static NET_BYTES: Cell<isize> = const { Cell::new(0) };
    }

    fn count(delta: isize) {
        let _ = NET_BYTES.try_with(|n| n.set(n.get() + delta));
    }

    /// Bytes allocated minus bytes freed by this thread so far.
    fn net_bytes() -> isize {
        NET_BYTES.with(Cell::get)
    }

    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            let p = System.alloc(layout);
            if !p.is_null() {
                count(layout.size() as isize);
            }
            p
        }

        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            let p = System.alloc_zeroed(layout);
            if !p.is_null() {
                count(layout.size() as isize);
            }
            p
        }

        unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
            System.dealloc(p, layout);
            count(-(layout.size() as isize));
        }

        unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            let q = System.realloc(p, layout, new_size);
            if !q.is_null() {
                count(new_size as isize - layout.size() as isize);
            }
            q
        }
    }

    #[global_allocator]
    static ALLOCATOR: Counting = Counting;

    /// The recorder keeps every histogram sample until something drains it; without a scrape
    /// only the upkeep does (issue: RSS grew ~20 bytes per event when nobody scraped). What is
    /// observable is the memory the samples hold: recorded on this thread, and with a
    /// current-thread runtime drained and freed on it too. The upkeep runs every 10 ms here
    /// (every 5 s in the relay), so that a real half second stands for minutes unscraped.
    #[tokio::test(flavor = "current_thread")]
    async fn histogram_samples_do_not_pile_up_when_nobody_scrapes() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let shutdown = CancellationToken::new();
        tokio::spawn(upkeep(
            recorder.handle(),
            Duration::from_millis(10),
            shutdown.clone(),
        ));

        let samples = 100_000isize;
        let before = net_bytes();
        metrics::with_local_recorder(&recorder, || {
            let histogram = metrics::histogram!(SEND_DURATION);
            for i in 0..samples {
                histogram.record(i as f64 * 1e-6);
            }
        });
        let held = net_bytes() - before;
        assert!(
            held >= samples * 8,
            "recorded samples are held: {held} bytes"
        );

        // A while without a scrape: fifty upkeeps.
        tokio::time::sleep(Duration::from_millis(500)).await;
        // Drained storage is freed by crossbeam's epoch collector: let it run here.
        for _ in 0..16 {
            crossbeam_epoch::pin().flush();
        }
        let kept = net_bytes() - before;
        println!("{samples} samples: {held} bytes recorded, {kept} kept");
        shutdown.cancel();
        assert!(
            kept < samples * 8 / 10,
            "{samples} samples still hold {kept} bytes (recorded: {held}) after a minute without a scrape"
        );
    }

    #[test]
    fn liveness_fails_when_the_loop_stops_ticking() {
        let health = Health::new(Duration::from_millis(50));
        health.tick();
        assert!(health.live().is_ok());
        std::thread::sleep(Duration::from_millis(80));
        assert!(health.live().unwrap_err().contains("has not run"));
        health.tick();
        assert!(health.live().is_ok());
    }

    #[test]
    fn readiness_needs_the_database_and_no_config_error() {
        let health = Health::new(Duration::from_secs(60));
        health.tick();
        assert_eq!(health.ready().unwrap_err(), "database unreachable");
        health.set_database_ok(true);
        assert!(health.ready().is_ok());
        health.set_config_error(Some("queue does not exist".into()));
        assert!(health.ready().unwrap_err().contains("queue does not exist"));
        health.set_config_error(None);
        assert!(health.ready().is_ok());
    }
}
