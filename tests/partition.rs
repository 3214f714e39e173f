//! The relay's database connection through a TCP fault proxy (gone dark, reset) and a database
//! that stops and comes back: the relay replaces what it lost and delivers every row, no row is
//! settled twice, and no row reaches the queue more often than the relay said it would send it
//! again. Times are printed for docs/benchmarks.md, never asserted.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::scenario::{copies, events, insert, migrate, migrated_db, run_args, set_arg, Producer};
use crate::support::pg::PrivatePg;
use crate::support::{create_queue, pg, receive_all, sqs, RelayProcess, TcpProxy, TestDb};

const BATCHES: usize = 40;
const BATCH_SIZE: usize = 10;

/// Short leases so rows held on a lost connection come back within seconds; a one-second
/// round-trip deadline so a dark connection is given up quickly.
const TIMINGS: [&str; 8] = [
    "--lease",
    "4s",
    "--send-timeout",
    "1s",
    "--settle-margin",
    "1s",
    "--db-timeout",
    "1s",
];

/// Records every change of a row's settlement (sent or quarantined), so a test can tell that
/// each row was settled once.
async fn log_settlements(client: &tokio_postgres::Client) {
    client
        .batch_execute(
            "CREATE TABLE settle_log (id bigint NOT NULL);
             CREATE FUNCTION log_settlement() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN INSERT INTO settle_log VALUES (NEW.id); RETURN NEW; END $$;
             CREATE TRIGGER log_settlement AFTER UPDATE ON outbox FOR EACH ROW
             WHEN (OLD.sent_at IS DISTINCT FROM NEW.sent_at
                   OR OLD.quarantined_at IS DISTINCT FROM NEW.quarantined_at)
             EXECUTE FUNCTION log_settlement();",
        )
        .await
        .expect("install the settlement log");
}

/// Rows settled more than once, and rows settled at all.
async fn settlements(client: &tokio_postgres::Client) -> (i64, i64) {
    let row = client
        .query_one(
            "SELECT (SELECT count(*) FROM (SELECT id FROM settle_log GROUP BY id HAVING count(*) > 1) AS twice),
                    (SELECT count(DISTINCT id) FROM settle_log)",
            &[],
        )
        .await
        .expect("read the settlement log");
    (row.get(0), row.get(1))
}

async fn sent_at_set(client: &tokio_postgres::Client, event_id: &str) -> bool {
    client
        .query_one(
            "SELECT count(*) FROM outbox WHERE event_id = $1 AND sent_at IS NOT NULL",
            &[&event_id],
        )
        .await
        .map(|r| r.get::<_, i64>(0) == 1)
        .unwrap_or(false)
}

/// Waits until the row is sent; returns how long that took.
async fn time_to_send(client: &tokio_postgres::Client, event_id: &str, since: Instant) -> Duration {
    crate::support::wait_until(
        &format!("{event_id} is sent"),
        Duration::from_secs(60),
        || sent_at_set(client, event_id),
    )
    .await;
    since.elapsed()
}

#[derive(Debug, Clone, Copy)]
enum Fault {
    /// The relay's connections stop forwarding both ways and stay open.
    Dark,
    /// The relay's connections are reset.
    Reset,
}

/// Rows the relay said it would send again, each a copy on the queue it may make: settlements it
/// could not record within their lease, found refused because the lease had moved on, or could
/// not confirm (each logged with `rows=`), and entries whose send failed, which SQS may have
/// kept all the same (`outbox_send_failures_total`, one per entry).
async fn announced_resends(relay: &RelayProcess) -> usize {
    const RESENDING: [&str; 3] = [
        "could not record outcomes before the lease ends",
        "lease lost: another replica owns these rows now",
        "could not look whether a settlement that changed fewer rows than it meant to took effect",
    ];
    let logged: usize = relay
        .output()
        .lines()
        .filter(|l| RESENDING.iter().any(|r| l.contains(r)))
        .map(|l| {
            let rows = l
                .rsplit_once(" rows=")
                .unwrap_or_else(|| panic!("no rows= in {l}"))
                .1;
            let digits = rows
                .split(|c: char| !c.is_ascii_digit())
                .next()
                .unwrap_or("");
            digits
                .parse::<usize>()
                .unwrap_or_else(|e| panic!("rows= in {l}: {e}"))
        })
        .sum();
    let mut failed = 0.0;
    for kind in crate::faults::KINDS {
        failed += relay
            .metric(&format!("outbox_send_failures_total{{kind=\"{kind}\"}}"))
            .await
            .unwrap_or(0.0);
    }
    logged + failed as usize
}

/// A producer writes while the relay delivers through the proxy; the fault hits the relay's
/// connections mid-run. Afterwards every row is sent once in the table, every event is on the
/// queue, each copy beyond the first is one the relay announced ([`announced_resends`]), and
/// the relay opened new connections.
async fn delivers_through(fault: Fault) {
    let db = migrated_db().await;
    let client = db.client().await;
    log_settlements(&client).await;
    let queue = create_queue("partition", &[]).await;
    let proxy = TcpProxy::start(pg().port());
    let through = TestDb {
        name: db.name.clone(),
        url: proxy.url_through(&db.url),
    };
    let relay = RelayProcess::spawn(&run_args(&through, &queue, sqs().endpoint(), &TIMINGS), &[]);
    let producer = Producer::start(
        &db.url,
        "partition",
        BATCHES,
        BATCH_SIZE,
        Duration::from_millis(50),
    );
    crate::support::wait_until("the relay sends", Duration::from_secs(30), || async {
        crate::scenario::count(&client, "sent_at IS NOT NULL").await >= 50
    })
    .await;
    let before = proxy.accepted();
    match fault {
        Fault::Dark => proxy.blackhole_existing(),
        Fault::Reset => proxy.reset_existing(),
    }
    let faulted = Instant::now();
    let marker = events(&format!("after-{fault:?}"), 1, 1);
    insert(&client, &marker, Duration::ZERO).await;
    // The loop is never stuck past one round-trip deadline, so liveness holds throughout.
    let mut unhealthy = 0;
    while !sent_at_set(&client, &marker[0].event_id).await {
        if relay.http_status("/healthz").await != 200 {
            unhealthy += 1;
        }
        assert!(
            faulted.elapsed() < Duration::from_secs(60),
            "the row after the fault was not sent"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(unhealthy, 0, "/healthz failed after the fault");
    let took = time_to_send(&client, &marker[0].event_id, faulted).await;
    eprintln!("partition {fault:?}: first row written after the fault sent {took:?} after it");
    let report = producer.finish().await;
    let total = report.events.len() + 1;
    crate::scenario::wait_count(
        &client,
        "sent_at IS NOT NULL",
        total as i64,
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(
        crate::scenario::count(&client, "quarantined_at IS NOT NULL").await,
        0
    );
    assert!(
        proxy.accepted() > before,
        "the relay opened no new connection after the fault"
    );
    let (twice, settled) = settlements(&client).await;
    assert_eq!(twice, 0, "rows settled more than once");
    assert_eq!(settled, total as i64);

    let messages = receive_all(&queue, total, Duration::from_secs(60)).await;
    let by_id = copies(&messages);
    let wanted: HashSet<String> = report
        .events
        .iter()
        .chain(&marker)
        .map(|e| e.event_id.clone())
        .collect();
    let arrived: HashSet<String> = by_id.keys().cloned().collect();
    assert_eq!(arrived, wanted, "every row arrives, and nothing else");
    // A lost settlement is retried, fenced, within its lease: a copy is made only where the
    // relay gave a settlement up or a send failed, and says so. Any other copy is a row sent
    // again behind the relay's back.
    let extra: usize = by_id.values().map(|n| n - 1).sum();
    let announced = announced_resends(&relay).await;
    eprintln!(
        "partition {fault:?}: {total} rows, {extra} copies (same event_id), {announced} announced"
    );
    assert!(
        extra <= announced,
        "{extra} copies on the queue, but the relay announced {announced} rows to send again: {:?}",
        by_id.iter().filter(|(_, n)| **n > 1).collect::<Vec<_>>()
    );

    let output = relay.output();
    if let Fault::Dark = fault {
        let warn = output
            .lines()
            .find(|l| l.contains("database connection dropped"))
            .unwrap_or_else(|| panic!("no WARN about the dark connection:\n{output}"));
        assert!(warn.contains("WARN"), "{warn}");
        assert!(
            warn.contains("no answer from the database within 1s"),
            "{warn}"
        );
    }
    assert!(
        output.contains("database connection established"),
        "no new connection logged:\n{output}"
    );
    assert!(!output.contains(db.url.as_str()) && !output.contains(pg().password()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dark_connection_is_replaced_and_every_row_is_delivered_and_settled_once_with_only_announced_copies(
) {
    delivers_through(Fault::Dark).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_connection_is_replaced_and_every_row_is_delivered_and_settled_once_with_only_announced_copies(
) {
    delivers_through(Fault::Reset).await;
}

/// The database stops for a while and comes back; the relay's reconnect back-off is capped by
/// `--db-retry-max`, not by SQS's `--retry-max` (60 s here), so a row written after the
/// database came back is delivered within seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_written_after_the_database_came_back_is_delivered() {
    let cluster = PrivatePg::start().await;
    let db = cluster.create_db().await;
    migrate(&db, "outbox").await;
    let queue = create_queue("db-back", &[]).await;
    let mut args = run_args(&db, &queue, sqs().endpoint(), &TIMINGS);
    set_arg(&mut args, "--retry-max", "60s");
    let relay = RelayProcess::spawn(&args, &[]);
    let first = events("before", 10, 3);
    insert(&db.client().await, &first, Duration::ZERO).await;
    crate::scenario::wait_count(
        &db.client().await,
        "sent_at IS NOT NULL",
        10,
        Duration::from_secs(30),
    )
    .await;
    cluster.stop_fast().await;
    // Long enough for the back-off to reach its cap several times over.
    tokio::time::sleep(Duration::from_secs(8)).await;
    cluster.start_again().await;
    let back = Instant::now();
    let client = db.client().await;
    let later = events("after-restart", 1, 1);
    insert(&client, &later, Duration::ZERO).await;
    let took = time_to_send(&client, &later[0].event_id, back).await;
    eprintln!("database restart: row written after the database came back sent {took:?} after it");
    let messages = receive_all(&queue, 11, Duration::from_secs(30)).await;
    let by_id = copies(&messages);
    assert!(by_id.contains_key(&later[0].event_id));
    assert_eq!(by_id.len(), 11);
    assert!(
        relay.wait_exit(Duration::ZERO).await.is_none(),
        "the relay ended"
    );
}

/// The wake-up connection (`notify`'s LISTEN, `logical`'s replication stream) idles, so only
/// its own check notices it went dark: the relay says so, connects it anew, and keeps
/// delivering.
async fn wakeups_survive_the_dark(wakeup: &str, db: &TestDb, upstream_port: u16, lost: &str) {
    let client = db.client().await;
    let queue = create_queue("dark-wakeup", &[]).await;
    let proxy = TcpProxy::start(upstream_port);
    let through = TestDb {
        name: db.name.clone(),
        url: proxy.url_through(&db.url),
    };
    let mut timings = TIMINGS.to_vec();
    timings.extend(["--wakeup", wakeup]);
    // "wake-ups connected" is logged at debug level.
    let debug = [(
        "RUST_LOG".to_string(),
        "info,outbox_relay::relay=debug".to_string(),
    )];
    let relay = RelayProcess::spawn(
        &run_args(&through, &queue, sqs().endpoint(), &timings),
        &debug,
    );
    let first = events("before-dark", 1, 1);
    insert(&client, &first, Duration::ZERO).await;
    time_to_send(&client, &first[0].event_id, Instant::now()).await;
    relay
        .wait_for_line("wake-ups connected", Duration::from_secs(30))
        .await
        .unwrap_or_else(|| panic!("the wake-ups never connected:\n{}", relay.output()));
    let before = proxy.accepted();
    let seen = relay.output().lines().count();
    proxy.blackhole_existing();
    let mut line = None;
    crate::support::wait_until("the relay notices", Duration::from_secs(30), || {
        line = relay
            .output()
            .lines()
            .skip(seen)
            .find(|l| l.contains("wake-up connection lost"))
            .map(str::to_string);
        std::future::ready(line.is_some())
    })
    .await;
    let line = line.unwrap();
    assert!(line.contains("WARN") && line.contains(lost), "{line}");
    let later = events("after-dark", 1, 1);
    insert(&client, &later, Duration::ZERO).await;
    time_to_send(&client, &later[0].event_id, Instant::now()).await;
    assert!(
        proxy.accepted() > before,
        "no new connection after the fault"
    );
    let messages = receive_all(&queue, 2, Duration::from_secs(30)).await;
    assert_eq!(copies(&messages).len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dark_listen_connection_is_replaced() {
    let db = crate::support::fresh_db().await;
    crate::scenario::migrate_with(&db, &["--wakeup", "notify"]).await;
    wakeups_survive_the_dark(
        "notify",
        &db,
        pg().port(),
        "no answer from the database within 1s (checking the wake-up connection",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dark_logical_wakeup_connection_is_replaced() {
    let cluster = PrivatePg::start_with(&["wal_level=logical"]).await;
    let db = cluster.create_db().await;
    crate::scenario::migrate_with(&db, &["--wakeup", "logical"]).await;
    // A status update every second (the deadline), dead after one more without an answer.
    wakeups_survive_the_dark(
        "logical",
        &db,
        cluster.port(),
        "no word from the server in 2s",
    )
    .await;
}

/// A slow connection is not a dead one: with every chunk delayed well inside the deadline, the
/// relay keeps its connection and delivers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_connection_within_the_deadline_is_kept() {
    let db = migrated_db().await;
    let client = db.client().await;
    let queue = create_queue("slow-db", &[]).await;
    let proxy = TcpProxy::start(pg().port());
    proxy.set_delay(Duration::from_millis(100));
    let through = TestDb {
        name: db.name.clone(),
        url: proxy.url_through(&db.url),
    };
    let timings = [
        "--lease",
        "6s",
        "--send-timeout",
        "1s",
        "--settle-margin",
        "1s",
        "--db-timeout",
        "3s",
    ];
    let relay = RelayProcess::spawn(&run_args(&through, &queue, sqs().endpoint(), &timings), &[]);
    let rows = events("slow-db", 50, 5);
    insert(&client, &rows, Duration::ZERO).await;
    crate::scenario::wait_count(&client, "sent_at IS NOT NULL", 50, Duration::from_secs(60)).await;
    let messages = receive_all(&queue, 50, Duration::from_secs(30)).await;
    assert_eq!(copies(&messages).len(), 50);
    let output = relay.output();
    assert!(
        !output.contains("database connection dropped"),
        "a slow connection was taken for a dead one:\n{output}"
    );
    // Logged only when the shared session connects anew.
    assert!(
        !output.contains("database connection established"),
        "the relay replaced its connection:\n{output}"
    );
}

/// A claim runs in a transaction of its own behind the claims' lock. A connection the relay
/// gave up on leaves its backend behind on the server, still waiting for that lock or idle in
/// its transaction holding it, for as long as TCP takes to tell (minutes). The relay's
/// transactions carry its deadline to the server (`statement_timeout`,
/// `idle_in_transaction_session_timeout`), so such backends end by themselves instead of
/// piling up behind the lock: held here by another session for six deadlines, the relay's
/// waiting backends never number more than the one it is using and the one being cancelled,
/// and every row is delivered once the lock is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_the_relay_gave_up_on_end_on_the_server_instead_of_piling_up_behind_the_lock() {
    let db = migrated_db().await;
    let client = db.client().await;
    let queue = create_queue("lock-held", &[]).await;
    let holder = db.client().await;
    holder
        .batch_execute(
            "BEGIN; SELECT pg_advisory_xact_lock(1869968482, 'outbox_claims'::regclass::oid::int)",
        )
        .await
        .unwrap();
    let timings = [
        "--lease",
        "6s",
        "--send-timeout",
        "1s",
        "--settle-margin",
        "1s",
        "--db-timeout",
        "1s",
    ];
    let relay = RelayProcess::spawn(&run_args(&db, &queue, sqs().endpoint(), &timings), &[]);
    let rows = events("lock-held", 20, 4);
    insert(&client, &rows, Duration::ZERO).await;
    let waiting = "SELECT count(*) FROM pg_stat_activity \
                   WHERE datname = current_database() AND application_name LIKE 'outbox-relay%' \
                   AND wait_event_type = 'Lock'";
    let mut most = 0;
    let until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < until {
        let n: i64 = client.query_one(waiting, &[]).await.unwrap().get(0);
        most = most.max(n);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        most <= 2,
        "{most} of the relay's backends waited for the claims' lock at once"
    );
    assert!(
        relay.output().contains("claiming rows"),
        "the relay's claims met the held lock:\n{}",
        relay.output()
    );
    holder.batch_execute("COMMIT").await.unwrap();
    crate::scenario::wait_count(&client, "sent_at IS NOT NULL", 20, Duration::from_secs(60)).await;
    let messages = receive_all(&queue, 20, Duration::from_secs(30)).await;
    assert_eq!(copies(&messages).len(), 20);
    assert!(
        copies(&messages).values().all(|&n| n == 1),
        "each row sent once"
    );
}

/// A claim that commits on the server while its answer comes back after the relay gave it up
/// (docs/failure-handling.md, "The database"): the server's answers held up 3 s for a
/// moment, past the two-second `--db-timeout`, while the relay claims a backlog of 1,000 rows. Before its
/// next claim the relay removes the claims it gave up on, so their rows are sent long before
/// their 60 s lease would have ended, and no row's attempt count includes the claim given up
/// on. Without the release the test waited for the lease and found rows with two attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_committed_after_the_relay_gave_it_up_is_released_before_its_next_claim() {
    let db = migrated_db().await;
    let client = db.client().await;
    let queue = create_queue("given-up", &[]).await;
    let proxy = TcpProxy::start(pg().port());
    let through = TestDb {
        name: db.name.clone(),
        url: proxy.url_through(&db.url),
    };
    let timings = [
        "--lease",
        "60s",
        "--send-timeout",
        "1s",
        "--settle-margin",
        "1s",
        "--db-timeout",
        "2s",
        "--batch-size",
        "10",
    ];
    let relay = RelayProcess::spawn(&run_args(&through, &queue, sqs().endpoint(), &timings), &[]);
    relay.metrics_addr(Duration::from_secs(30)).await;
    let sent = || async {
        client
            .query_one("SELECT count(*) FROM outbox WHERE sent_at IS NOT NULL", &[])
            .await
            .unwrap()
            .get::<_, i64>(0)
    };
    // Each try writes a backlog, and once the relay is sending it holds the server's answers
    // up past the deadline for a moment: a claim in flight then commits unseen.
    let (mut total, mut released) = (0, None);
    for attempt in 0..5 {
        insert(
            &client,
            &events(&format!("given-up-{attempt}"), 1000, 10),
            Duration::ZERO,
        )
        .await;
        total += 1000;
        let started = total - 1000 + 50;
        crate::support::wait_until("the relay sends", Duration::from_secs(60), || async {
            sent().await >= started
        })
        .await;
        proxy.set_answer_delay(Duration::from_millis(3000));
        tokio::time::sleep(Duration::from_millis(4000)).await;
        proxy.set_answer_delay(Duration::ZERO);
        released = relay
            .wait_for_line("released the claims given up on", Duration::from_secs(10))
            .await;
        if released.is_some() {
            break;
        }
    }
    assert!(
        released.is_some(),
        "no claim given up on had committed in five tries:\n{}",
        relay.output()
    );
    // Well within the 60 s lease that the claims given up on would have held their rows for.
    crate::scenario::wait_count(
        &client,
        "sent_at IS NOT NULL",
        total,
        Duration::from_secs(40),
    )
    .await;
    let twice: i64 = client
        .query_one("SELECT count(*) FROM outbox WHERE attempts <> 1", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(twice, 0, "rows whose attempts count a claim given up on");
    let messages = receive_all(&queue, total as usize, Duration::from_secs(30)).await;
    assert_eq!(copies(&messages).len(), total as usize);
}

/// The link goes dark while the relay starts: its first connection was made, and its
/// registration waits on a lock when the proxy stops forwarding on every open connection. The
/// start used to wait for that answer for as long as TCP takes to give up, not ready and
/// silent (simulation seed 13374753696320402105); now its statements are bounded together, and
/// the start is tried again on new connections, which the proxy forwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_that_goes_dark_while_the_relay_starts_delays_the_start_only() {
    let db = migrated_db().await;
    let client = db.client().await;
    let queue = create_queue("dark-start", &[]).await;
    let proxy = TcpProxy::start(pg().port());
    let through = TestDb {
        name: db.name.clone(),
        url: proxy.url_through(&db.url),
    };
    // Holds the registry: the relay's first registration waits behind this transaction.
    let mut locker = db.client().await;
    let lock = locker.transaction().await.unwrap();
    lock.batch_execute("LOCK TABLE outbox_relays IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let relay = RelayProcess::spawn(&run_args(&through, &queue, sqs().endpoint(), &TIMINGS), &[]);
    crate::support::wait_until(
        "the relay's registration waits for the lock",
        Duration::from_secs(30),
        || async {
            client
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity
                     WHERE datname = current_database() AND wait_event_type = 'Lock'
                       AND query LIKE '%INSERT INTO%outbox_relays%'",
                    &[],
                )
                .await
                .map(|r| r.get::<_, i64>(0) == 1)
                .unwrap_or(false)
        },
    )
    .await;
    let before = proxy.accepted();
    proxy.blackhole_existing();
    lock.rollback().await.unwrap();
    let marker = events("after-dark-start", 1, 1);
    insert(&client, &marker, Duration::ZERO).await;
    let dark = Instant::now();
    while !sent_at_set(&client, &marker[0].event_id).await {
        assert!(
            dark.elapsed() < Duration::from_secs(60),
            "the relay did not start after its link went dark:\n{}",
            relay.output()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        proxy.accepted() > before,
        "the relay opened no new connection"
    );
    let output = relay.output();
    assert!(
        output.contains("waiting for the database: no answer from the database within"),
        "{output}"
    );
}
