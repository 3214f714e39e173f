//! Failover: a primary and its streaming standby. The primary is killed and the standby
//! promoted under a relay on a multi-host URL with `target_session_attrs=read-write`; and a
//! multi-host URL without it whose first host is the standby. Times are printed for
//! docs/benchmarks.md, never asserted.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::scenario::{copies, count, events, insert, migrate, run_args, wait_count, Producer};
use crate::support::pg::PrivatePg;
use crate::support::{create_queue, receive_all, sqs, RelayProcess, TestDb};

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

async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// A primary with a migrated database and a hot standby streaming it.
async fn primary_and_standby() -> (PrivatePg, PrivatePg, TestDb) {
    let primary = PrivatePg::start().await;
    let db = primary.create_db().await;
    migrate(&db, "outbox").await;
    let standby = primary.standby().await;
    (primary, standby, db)
}

/// `postgres://…@127.0.0.1:P1,127.0.0.1:P2/db`, with `query` after it when not empty.
fn multi_host_url(first: &PrivatePg, second: &PrivatePg, db: &str, query: &str) -> String {
    let mut url = format!(
        "postgres://postgres:{}@127.0.0.1:{},127.0.0.1:{}/{db}",
        first.password(),
        first.port(),
        second.port()
    );
    if !query.is_empty() {
        url.push('?');
        url.push_str(query);
    }
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_committed_row_arrives_across_a_promotion() {
    let (primary, standby, db) = primary_and_standby().await;
    // Synchronous, so every commit the application saw is on the standby when the primary
    // dies; set only now, or the standby would inherit it and wait for a standby of its own.
    let admin = connect(&primary.admin_url()).await;
    // Two statements: ALTER SYSTEM refuses to run in the implicit transaction of a batch.
    for sql in [
        "ALTER SYSTEM SET synchronous_standby_names = '*'",
        "SELECT pg_reload_conf()",
    ] {
        admin
            .batch_execute(sql)
            .await
            .expect("make the standby synchronous");
    }
    crate::support::wait_until(
        "the standby is synchronous",
        Duration::from_secs(30),
        || async {
            admin
                .query_one(
                    "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'",
                    &[],
                )
                .await
                .map(|r| r.get::<_, i64>(0) == 1)
                .unwrap_or(false)
        },
    )
    .await;
    drop(admin);
    let url = multi_host_url(
        &primary,
        &standby,
        &db.name,
        "target_session_attrs=read-write",
    );
    let both = TestDb {
        name: db.name.clone(),
        url: url.clone(),
    };
    let queue = create_queue("failover", &[]).await;
    let relay = RelayProcess::spawn(&run_args(&both, &queue, sqs().endpoint(), &TIMINGS), &[]);
    let producer = Producer::start(&url, "failover", 60, 20, Duration::from_millis(50));
    let watch = connect(&db.url).await;
    crate::support::wait_until(
        "the relay sends on the primary",
        Duration::from_secs(30),
        || async { count(&watch, "sent_at IS NOT NULL").await >= 200 },
    )
    .await;
    drop(watch);
    primary.kill_immediate().await;
    standby.promote().await;
    let promoted = Instant::now();
    let new_primary = connect(&standby.url(&db.name)).await;
    let marker = events("after-promotion", 1, 1);
    insert(&new_primary, &marker, Duration::ZERO).await;
    crate::support::wait_until(
        "the first row after promotion is sent",
        Duration::from_secs(60),
        || async {
            count(
                &new_primary,
                "event_id = 'after-promotion-0' AND sent_at IS NOT NULL",
            )
            .await
                == 1
        },
    )
    .await;
    eprintln!(
        "failover: first row written after promotion sent {:?} after it",
        promoted.elapsed()
    );
    let report = producer.finish().await;
    let total = report.events.len() + 1;
    wait_count(
        &new_primary,
        "sent_at IS NOT NULL",
        total as i64,
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(count(&new_primary, "quarantined_at IS NOT NULL").await, 0);

    let messages = receive_all(&queue, total, Duration::from_secs(60)).await;
    let by_id = copies(&messages);
    let wanted: HashSet<String> = report
        .events
        .iter()
        .chain(&marker)
        .map(|e| e.event_id.clone())
        .collect();
    let arrived: HashSet<String> = by_id.keys().cloned().collect();
    assert_eq!(
        arrived, wanted,
        "every committed row arrives, and nothing else"
    );
    // A copy is a message whose body belongs to its event_id: the payload names its batch.
    for m in &messages {
        let id = crate::scenario::attr(m, "event_id").unwrap();
        let body: serde_json::Value = serde_json::from_str(m.body().unwrap()).unwrap();
        if let Some(batch) = body.get("batch") {
            assert!(
                id.starts_with(&format!("failover-{batch}-")),
                "{id}: {body}"
            );
        }
    }
    let extra: usize = by_id.values().map(|n| n - 1).sum();
    eprintln!(
        "failover: {total} rows committed, all arrived, {extra} copies (same event_id), {} producer retries",
        report.retries
    );
    assert!(
        relay.wait_exit(Duration::ZERO).await.is_none(),
        "the relay ended"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_first_in_the_url_is_left_for_the_primary() {
    let (primary, standby, db) = primary_and_standby().await;
    let url = multi_host_url(&standby, &primary, &db.name, "");
    let both = TestDb {
        name: db.name.clone(),
        url,
    };
    let queue = create_queue("standby-first", &[]).await;
    let rows = events("standby-first", 30, 5);
    let client = connect(&db.url).await;
    insert(&client, &rows, Duration::ZERO).await;
    let relay = RelayProcess::spawn(&run_args(&both, &queue, sqs().endpoint(), &TIMINGS), &[]);
    wait_count(&client, "sent_at IS NOT NULL", 30, Duration::from_secs(60)).await;
    let output = relay.output();
    let warn = output
        .lines()
        .find(|l| l.contains("takes no writes"))
        .unwrap_or_else(|| panic!("no WARN about the read-only host:\n{output}"));
    assert!(warn.contains("WARN"), "{warn}");
    assert!(
        warn.contains(&format!("127.0.0.1:{}", standby.port())),
        "the WARN names the standby: {warn}"
    );
    let messages = receive_all(&queue, 30, Duration::from_secs(30)).await;
    assert_eq!(copies(&messages).len(), 30);
}

/// Issue 26, defect 5: a URL with only a standby in it is not an endless failover. The relay
/// says, in one line, which host it is, that it is in recovery and what to do, and does not
/// turn it into "cannot connect: database does not allow writes".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_with_only_a_standby_names_the_standby() {
    let (_primary, standby, db) = primary_and_standby().await;
    let client = connect(&db.url).await;
    insert(&client, &events("lone-standby", 5, 1), Duration::ZERO).await;
    let only_standby = TestDb {
        name: db.name.clone(),
        url: standby.url(&db.name),
    };
    let queue = create_queue("lone-standby", &[]).await;
    let relay = RelayProcess::spawn(
        &run_args(&only_standby, &queue, sqs().endpoint(), &TIMINGS),
        &[],
    );
    let line = relay
        .wait_for_line("is a standby", Duration::from_secs(30))
        .await
        .unwrap_or_else(|| panic!("no line naming the standby:\n{}", relay.output()));
    assert!(
        line.contains(&format!("127.0.0.1:{}", standby.port()))
            && line.contains("pg_is_in_recovery()")
            && line.contains("point --database-url at the primary"),
        "{line}"
    );
    // Tried again, it says the same, never the misleading connect error.
    crate::support::wait_until("a second try", Duration::from_secs(30), || async {
        relay.output().matches("is a standby").count() >= 2
    })
    .await;
    let output = relay.output();
    assert!(!output.contains("does not allow writes"), "{output}");
    assert_eq!(count(&client, "sent_at IS NOT NULL").await, 0);
}
