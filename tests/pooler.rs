//! Through PgBouncer (Debian's 1.18, started by the harness): relays deliver every row, and an
//! application session through the same pool keeps its own settings all the while
//! (`synchronous_commit = on`, `plan_cache_mode = auto`); `migrate`, `check`, `status` and
//! `quarantine` work through it; the wake-up modes that cannot cross a pooler are refused.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::SimpleQueryMessage;

use crate::support::pg::PrivatePg;

use crate::scenario::{args, count, events, insert, relay_command, run_args, wait_count};
use crate::support::{
    create_queue, fresh_db, pg, receive_all, run_to_end, sqs, PgBouncer, PoolMode, Pooling,
    RelayProcess, TestDb,
};

const SETTINGS: &str = "SHOW synchronous_commit; SHOW plan_cache_mode; SHOW lock_timeout; \
                        SHOW statement_timeout; SHOW idle_in_transaction_session_timeout; \
                        SHOW jit; SHOW default_transaction_isolation; \
                        SELECT count(*) FROM pg_prepared_statements";

/// What an application session reads of the settings a relay or `migrate` could leave behind,
/// in one transaction (so from one server connection).
async fn app_settings(app: &tokio_postgres::Client) -> Vec<String> {
    app.simple_query(SETTINGS)
        .await
        .expect("SHOW through the pool")
        .into_iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(row) => row.get(0).map(str::to_string),
            _ => None,
        })
        .collect()
}

/// PostgreSQL's defaults, which the test cluster keeps, and no prepared statement.
fn defaults() -> Vec<String> {
    ["on", "auto", "0", "0", "0", "on", "read committed", "0"]
        .map(String::from)
        .to_vec()
}

/// Samples [`app_settings`] on `app` until stopped; returns every sample.
fn sample(
    app: tokio_postgres::Client,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<Vec<String>>> {
    tokio::spawn(async move {
        let mut samples = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            samples.push(app_settings(&app).await);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        samples
    })
}

async fn bouncer(mode: PoolMode, size: u32) -> PgBouncer {
    PgBouncer::start(
        pg().port(),
        pg().password(),
        Pooling {
            mode,
            size,
            // Session pooling's default reset would wipe what a leaving client left behind,
            // and hide it.
            reset: false,
        },
    )
    .await
}

/// The test's database as reached through the pool.
fn through(bouncer: &PgBouncer, db: &TestDb) -> TestDb {
    TestDb {
        name: db.name.clone(),
        url: bouncer.url_for(&db.name),
    }
}

async fn migrate_through(pooled: &TestDb, extra: &[&str]) {
    let mut command = args(&["migrate", "--database-url", &pooled.url]);
    command.extend(args(extra));
    let (status, output) = run_to_end(&command, &[], Duration::from_secs(60)).await;
    assert!(
        status.success(),
        "migrate {extra:?} through pgbouncer: {output}"
    );
}

/// Two relays through transaction pooling deliver every row, rows written before and while
/// they run, and the application's session through the same pool reads its own settings in
/// every sample. `pooler` is the relays' `--pooler` flag, or none at all (the default detects
/// the pooler).
async fn two_relays_through_transaction_pooling(size: u32, pooler: &[&str]) {
    let db = fresh_db().await;
    let bouncer = bouncer(PoolMode::Transaction, size).await;
    let pooled = through(&bouncer, &db);
    migrate_through(&pooled, &["--pooler", "transaction"]).await;
    let queue = create_queue("pooler", &[]).await;
    let direct = db.client().await;
    let before = events(&format!("tx{size}-before"), 300, 30);
    insert(&direct, &before, Duration::ZERO).await;

    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample(bouncer.client(&db.name).await, Arc::clone(&stop));
    let relays: Vec<RelayProcess> = ["a", "b"]
        .iter()
        .map(|id| {
            RelayProcess::spawn_named(
                id,
                &run_args(
                    &pooled,
                    &queue,
                    sqs().endpoint(),
                    &[&["--relay-id", id, "--batch-size", "20"], pooler].concat(),
                ),
                &[],
            )
        })
        .collect();
    let during = events(&format!("tx{size}-during"), 300, 30);
    for chunk in during.chunks(30) {
        insert(&direct, chunk, Duration::ZERO).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let total = (before.len() + during.len()) as i64;
    wait_count(
        &direct,
        "sent_at IS NOT NULL",
        total,
        Duration::from_secs(90),
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    let samples = sampler.await.unwrap();
    for relay in &relays {
        relay.sigterm();
    }
    for relay in &relays {
        assert!(relay.wait_exit(Duration::from_secs(30)).await.is_some());
        let output = relay.output();
        assert!(!output.contains("prepared statement"), "{output}");
        if pooler.is_empty() {
            assert!(
                output.contains("a connection pooler answers for PostgreSQL"),
                "{output}"
            );
        }
    }

    let received = receive_all(&queue, total as usize, Duration::from_secs(60)).await;
    let ids: std::collections::HashSet<String> = received
        .iter()
        .filter_map(|m| crate::scenario::attr(m, "event_id").map(str::to_string))
        .collect();
    for e in before.iter().chain(&during) {
        assert!(ids.contains(&e.event_id), "{} never arrived", e.event_id);
    }
    assert!(samples.len() >= 10, "only {} samples", samples.len());
    for s in &samples {
        assert_eq!(
            s,
            &defaults(),
            "the application's session through the pool read {s:?}"
        );
    }
    // After the relays are gone too, on every server connection of the pool at once.
    let apps = futures_util::future::join_all((0..size).map(|_| bouncer.client(&db.name))).await;
    let holds: Vec<_> = apps.iter().map(|a| a.batch_execute("BEGIN")).collect();
    futures_util::future::try_join_all(holds).await.unwrap();
    for app in &apps {
        assert_eq!(app_settings(app).await, defaults());
    }
    println!(
        "pool size {size}: {} rows delivered by two relays, {} samples of the application's settings",
        received.len(),
        samples.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relays_through_transaction_pooling_of_one_connection() {
    two_relays_through_transaction_pooling(1, &["--pooler", "transaction"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relays_through_transaction_pooling_of_three_connections() {
    two_relays_through_transaction_pooling(3, &["--pooler", "transaction"]).await;
}

/// Issue 26, defect 4: a managed platform's DATABASE_URL through PgBouncer, and no flag. The
/// default detects the pooler and leaves nothing on its connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_leaves_nothing_on_a_transaction_pool_of_one_connection() {
    two_relays_through_transaction_pooling(1, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_leaves_nothing_on_a_transaction_pool_of_three_connections() {
    two_relays_through_transaction_pooling(3, &[]).await;
}

/// What `--pooler none` would do behind a transaction pool (leave `synchronous_commit = off`
/// to the application's session) is refused at start, in one line naming `--pooler`, before
/// the relay sets anything; the application's session keeps its settings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_explicit_pooler_none_behind_a_transaction_pool_is_refused_at_start() {
    let db = fresh_db().await;
    let bouncer = bouncer(PoolMode::Transaction, 1).await;
    let pooled = through(&bouncer, &db);
    migrate_through(&pooled, &["--pooler", "transaction"]).await;
    let queue = create_queue("pooler-leak", &[]).await;
    let direct = db.client().await;
    insert(&direct, &events("leak", 20, 5), Duration::ZERO).await;
    let (status, output) = run_to_end(
        &run_args(&pooled, &queue, sqs().endpoint(), &["--pooler", "none"]),
        &[],
        Duration::from_secs(30),
    )
    .await;
    let app = bouncer.client(&db.name).await;
    assert_eq!(app_settings(&app).await, defaults());
    assert!(!status.success(), "{output}");
    let errors: Vec<&str> = output.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(errors.len(), 1, "{output}");
    assert!(
        errors[0].contains("--pooler none, but a connection pooler answers for PostgreSQL"),
        "{output}"
    );
    assert_eq!(count(&direct, "sent_at IS NOT NULL").await, 0);
}

/// A wake-up that needs a session (LISTEN) or a replication connection, behind a pooler the
/// default detected: refused at start, one line naming what to use instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wakeups_that_need_a_session_are_refused_behind_a_detected_pooler() {
    let db = fresh_db().await;
    let bouncer = bouncer(PoolMode::Transaction, 1).await;
    let pooled = through(&bouncer, &db);
    migrate_through(&pooled, &["--pooler", "transaction"]).await;
    for (wakeup, fix) in [("notify", "--pooler session"), ("logical", "--wakeup poll")] {
        let (status, output) = run_to_end(
            &run_args(
                &pooled,
                "http://127.0.0.1:9/000000000000/never",
                sqs().endpoint(),
                &["--wakeup", wakeup],
            ),
            &[],
            Duration::from_secs(30),
        )
        .await;
        assert!(!status.success(), "{output}");
        let errors: Vec<&str> = output.lines().filter(|l| l.starts_with("error")).collect();
        assert_eq!(errors.len(), 1, "{output}");
        assert!(
            errors[0].contains(&format!(
                "--wakeup {wakeup} cannot work through the connection pooler detected"
            )) && errors[0].contains(fix),
            "{output}"
        );
    }
}

/// Session pooling with `--wakeup notify` (LISTEN holds its session): the relay delivers, and
/// once it is gone the server connections it used are handed to the application with the
/// server's own settings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_with_notify_through_session_pooling_leaves_its_connections_clean() {
    let db = fresh_db().await;
    // The relay's claims, its settlements, its maintenance and its LISTEN connection.
    let size = 4;
    let bouncer = bouncer(PoolMode::Session, size).await;
    let pooled = through(&bouncer, &db);
    migrate_through(&pooled, &["--pooler", "session", "--wakeup", "notify"]).await;
    let queue = create_queue("pooler-session", &[]).await;
    let direct = db.client().await;
    let relay = RelayProcess::spawn(
        &run_args(
            &pooled,
            &queue,
            sqs().endpoint(),
            &["--pooler", "session", "--wakeup", "notify"],
        ),
        &[],
    );
    crate::support::wait_until(
        "the relay LISTENs through the pool",
        Duration::from_secs(30),
        || async { count_listeners(&direct).await == 1 },
    )
    .await;
    let written = events("session", 50, 5);
    for chunk in written.chunks(10) {
        insert(&direct, chunk, Duration::ZERO).await;
    }
    wait_count(&direct, "sent_at IS NOT NULL", 50, Duration::from_secs(20)).await;
    relay.sigterm();
    assert!(relay.wait_exit(Duration::from_secs(30)).await.is_some());
    let apps = futures_util::future::join_all((0..size).map(|_| bouncer.client(&db.name))).await;
    for app in &apps {
        assert_eq!(app_settings(app).await, defaults());
    }
    assert_eq!(
        receive_all(&queue, 50, Duration::from_secs(30)).await.len(),
        50
    );
}

async fn count_listeners(direct: &tokio_postgres::Client) -> i64 {
    direct
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN %'",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// `migrate` (twice: idempotent), `status`, `quarantine list` / `retry` and `check` through a
/// transaction pool of one connection, which then still has the server's settings and holds no
/// migration lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_check_status_and_quarantine_work_through_transaction_pooling() {
    let db = fresh_db().await;
    let bouncer = bouncer(PoolMode::Transaction, 1).await;
    let pooled = through(&bouncer, &db);
    let pooler = ["--pooler", "transaction"];
    migrate_through(&pooled, &pooler).await;
    migrate_through(
        &pooled,
        &[&pooler[..], &["--fair-by", "event_type"]].concat(),
    )
    .await;
    let direct = db.client().await;
    let locks: i64 = direct
        .query_one(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        locks, 0,
        "a migration lock stayed behind on the pool's connection"
    );
    let app = bouncer.client(&db.name).await;
    assert_eq!(app_settings(&app).await, defaults());
    let valid: i64 = direct
        .query_one(
            "SELECT count(*) FROM pg_index WHERE indrelid = 'outbox'::regclass AND indisvalid",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(valid >= 6, "{valid} valid indexes");

    insert(&direct, &events("ops", 3, 1), Duration::ZERO).await;
    direct
        .batch_execute(
            "UPDATE outbox SET quarantined_at = now(), quarantine_reason = 'rejected', \
             last_error = 'test' WHERE event_id = 'ops-1'",
        )
        .await
        .unwrap();
    let with_pool = |command: &[&str]| {
        let mut a = args(command);
        a.extend(args(&[
            "--database-url",
            &pooled.url,
            "--pooler",
            "transaction",
        ]));
        a
    };
    let (status, output) = run_to_end(
        &with_pool(&["status", "--json"]),
        &[],
        Duration::from_secs(30),
    )
    .await;
    assert!(status.success(), "{output}");
    assert!(output.contains("\"unsent\":2"), "{output}");
    let (status, output) = run_to_end(
        &with_pool(&["quarantine", "list"]),
        &[],
        Duration::from_secs(30),
    )
    .await;
    assert!(status.success() && output.contains("ops-1"), "{output}");
    let (status, output) = run_to_end(
        &with_pool(&["quarantine", "retry", "--all"]),
        &[],
        Duration::from_secs(30),
    )
    .await;
    assert!(status.success() && output.contains("moved 1 "), "{output}");
    assert_eq!(count(&direct, "quarantined_at IS NULL").await, 3);

    let queue = create_queue("pooler-check", &[]).await;
    let check = |pooler: &str| {
        args(&[
            "check",
            "--database-url",
            &pooled.url,
            "--queue-url",
            &queue,
            "--sqs-endpoint-url",
            sqs().endpoint(),
            "--pooler",
            pooler,
        ])
    };
    let (status, output) = run_to_end(&check("transaction"), &[], Duration::from_secs(60)).await;
    assert!(status.success(), "{output}");
    assert!(
        output.contains("ok   connections: --pooler transaction (transaction pooling"),
        "{output}"
    );
    assert_eq!(app_settings(&app).await, defaults(), "after check");
    // An explicit `none` is refused; the default says what it detected.
    let (status, output) = run_to_end(&check("none"), &[], Duration::from_secs(60)).await;
    assert!(!status.success(), "{output}");
    assert!(
        output.contains("--pooler none, but a connection pooler answers for PostgreSQL"),
        "{output}"
    );
    let (status, output) = run_to_end(&check("auto"), &[], Duration::from_secs(60)).await;
    assert!(status.success(), "{output}");
    assert!(
        output.contains("ok   connections: --pooler auto (a connection pooler detected"),
        "{output}"
    );
    assert_eq!(app_settings(&app).await, defaults(), "after check auto");
}

/// Refused before anything starts, with one line: exit 2, the configuration's code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wakeups_that_cannot_cross_a_transaction_pooler_are_refused_at_start_up() {
    let db = fresh_db().await;
    let queue = "http://127.0.0.1:9/000000000000/never";
    for wakeup in ["notify", "logical"] {
        let (status, output) = run_to_end(
            &run_args(
                &db,
                queue,
                sqs().endpoint(),
                &["--pooler", "transaction", "--wakeup", wakeup],
            ),
            &[],
            Duration::from_secs(30),
        )
        .await;
        assert_eq!(status.code(), Some(2), "{output}");
        assert_eq!(output.trim().lines().count(), 1, "{output}");
        assert!(output.contains(&format!("--wakeup {wakeup}")), "{output}");
    }
    let (status, output) = run_to_end(
        &run_args(
            &db,
            queue,
            sqs().endpoint(),
            &["--pooler", "session", "--wakeup", "logical"],
        ),
        &[],
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(status.code(), Some(2), "{output}");
    assert!(output.contains("replication connection"), "{output}");
}

/// Issue 26, defect 1 through a pooler: the server connections PgBouncer opens get the role's
/// `repeatable read`, and the pooled statements state READ COMMITTED per transaction; three
/// relays with no `--pooler` flag deliver each row once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeatable_read_by_default_through_a_transaction_pool_each_row_once() {
    let db = fresh_db().await;
    let bouncer = bouncer(PoolMode::Transaction, 3).await;
    let pooled = through(&bouncer, &db);
    migrate_through(&pooled, &[]).await;
    let queue = create_queue("pooler-rr", &[]).await;
    let direct = db.client().await;
    let written = events("pooled-rr", 900, 50);
    insert(&direct, &written, Duration::ZERO).await;
    crate::settings::impose(&db, "default_transaction_isolation = 'repeatable read'").await;
    crate::settings::delivered_once(&pooled, &queue, &direct, &written, 3).await;
}

/// Every transaction a relay opens through a transaction pool is bounded by the server from
/// its first message: the BEGIN and its `idle_in_transaction_session_timeout` leave together.
/// The maintenance connection used to send a BEGIN of its own and its settings after it; a
/// link gone dark between the two left the pool's server connection idle in a transaction
/// that no timeout ended (for as long as TCP takes to tell), and a pool of one was held from
/// both relays and the application (simulation seed 12172163297347410868: 59 rows never
/// left the table). An operator's `quarantine retry` and `replay` through the pool too: they
/// began with tokio-postgres's own `START TRANSACTION` ("2 of 59 transactions began without
/// their idle timeout").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_transaction_through_a_pool_starts_with_its_idle_timeout_in_the_same_message() {
    let cluster = PrivatePg::start_with(&["log_statement=all", "log_line_prefix=%a|"]).await;
    let db = cluster.create_db().await;
    let bouncer = PgBouncer::start(
        cluster.port(),
        cluster.password(),
        Pooling {
            mode: PoolMode::Transaction,
            size: 1,
            reset: false,
        },
    )
    .await;
    let pooled = through(&bouncer, &db);
    migrate_through(&pooled, &[]).await;
    let queue = create_queue("pool-begin", &[]).await;
    let direct = db.client().await;
    insert(&direct, &events("pool-begin", 50, 5), Duration::ZERO).await;
    const APP: &str = "relay-begins";
    let relayed = TestDb {
        name: db.name.clone(),
        url: format!("{}?application_name={APP}", pooled.url),
    };
    let relay = RelayProcess::spawn(
        &run_args(
            &relayed,
            &queue,
            sqs().endpoint(),
            &["--maintenance-timeout", "7s"],
        ),
        &[],
    );
    wait_count(&direct, "sent_at IS NOT NULL", 50, Duration::from_secs(60)).await;
    // The maintenance connection's statements (statistics every 200 ms) carry its own timeout.
    let maintenance = "idle_in_transaction_session_timeout = 7000";
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !cluster.log().contains(maintenance) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    relay.sigterm();
    assert!(relay.wait_exit(Duration::from_secs(30)).await.is_some());
    // An operator's commands through the same pool: a re-drive and a replay, each a write.
    direct
        .batch_execute(
            "UPDATE outbox SET sent_at = NULL, quarantined_at = now(), quarantine_reason = 'invalid' \
             WHERE id = (SELECT min(id) FROM outbox)",
        )
        .await
        .unwrap();
    let redriven = relay_command(&[
        "quarantine",
        "retry",
        "--all",
        "--database-url",
        &relayed.url,
    ])
    .await;
    assert!(redriven.contains("moved 1 "), "{redriven}");
    let replayed =
        relay_command(&["replay", "--since", "1h", "--database-url", &relayed.url]).await;
    assert!(replayed.contains("replayed 49 sent row(s)"), "{replayed}");
    let log = cluster.log();
    let begins: Vec<&str> = log
        .lines()
        .filter_map(|l| l.strip_prefix(&format!("{APP}|")))
        .filter_map(|l| l.split_once("statement: ").map(|(_, s)| s))
        .filter(|s| {
            let s = s.to_ascii_uppercase();
            s.starts_with("BEGIN") || s.starts_with("START TRANSACTION")
        })
        .collect();
    // Bounded: an idle timeout set in the BEGIN's own message, and not to 0 (off).
    let unbounded: Vec<&&str> = begins
        .iter()
        .filter(|b| {
            b.split("idle_in_transaction_session_timeout = ")
                .nth(1)
                .and_then(|v| v.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|v| v.parse::<u64>().ok())
                .is_none_or(|ms| ms == 0)
        })
        .collect();
    assert!(
        unbounded.is_empty(),
        "{} of {} transactions began without their idle timeout: {unbounded:#?}",
        unbounded.len(),
        begins.len()
    );
    assert!(
        begins.iter().any(|b| b.contains(maintenance)),
        "no maintenance transaction seen: {begins:#?}"
    );
}
