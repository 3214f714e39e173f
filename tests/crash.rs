//! Real processes, real faults: kill -9, a frozen replica, several replicas, SIGTERM.

use std::collections::HashMap;
use std::time::Duration;

use crate::scenario::{copies, count, events, insert, migrated_db, run_args, wait_count};
use crate::support::{
    count_claims, create_queue, receive_all, sqs, wait_until, FaultProxy, Mode, RelayProcess,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_killed_after_sqs_accepted_a_batch_is_followed_by_a_resend_with_the_same_event_id()
{
    let n = 20;
    let db = migrated_db().await;
    let client = db.client().await;
    let queue = create_queue("kill9", &[]).await;
    let proxy = FaultProxy::start(sqs().endpoint());
    // SQS gets the batch and keeps the messages; the relay never hears back before it dies.
    proxy.set_mode(Mode::Hold);
    let written = events("kill9", n, 4);
    insert(&client, &written, Duration::ZERO).await;

    // The send timeout leaves time to kill the relay before its own SDK gives up on the answer.
    let timing = [
        "--lease",
        "4s",
        "--send-timeout",
        "2s",
        "--settle-margin",
        "1s",
    ];
    let mut first_args = run_args(&db, &queue, proxy.endpoint(), &timing);
    first_args.extend([
        "--batch-size".into(),
        "10".into(),
        "--max-in-flight".into(),
        "1".into(),
    ]);
    let first = RelayProcess::spawn_named("doomed", &first_args, &[]);
    wait_until(
        "a batch accepted by SQS, its answer held",
        Duration::from_secs(20),
        || async { proxy.held() >= 1 },
    )
    .await;
    first.kill9();
    first
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("killed");
    assert_eq!(
        count(&client, "sent_at IS NOT NULL").await,
        0,
        "nothing was marked"
    );
    proxy.set_mode(Mode::Pass);

    let second = RelayProcess::spawn_named(
        "heir",
        &run_args(&db, &queue, sqs().endpoint(), &timing),
        &[],
    );
    // The dead relay's lease runs out, then the heir claims and sends everything.
    wait_count(
        &client,
        "sent_at IS NOT NULL",
        n as i64,
        Duration::from_secs(60),
    )
    .await;
    let received = receive_all(&queue, n + 10, Duration::from_secs(60)).await;
    let by_id = copies(&received);
    assert_eq!(by_id.len(), n, "nothing lost");
    let resent = by_id.values().filter(|&&c| c == 2).count();
    assert_eq!(
        resent, 10,
        "the batch SQS accepted before the kill arrives twice: {by_id:?}"
    );
    assert!(by_id.values().all(|&c| c <= 2));
    drop(second);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_lease_expired_cannot_settle_rows_another_replica_now_owns() {
    let n = 10;
    let db = migrated_db().await;
    let client = db.client().await;
    let queue = create_queue("takeover", &[]).await;
    let proxy = FaultProxy::start(sqs().endpoint());
    proxy.set_mode(Mode::Hold);
    let written = events("takeover", n, 2);
    insert(&client, &written, Duration::ZERO).await;

    let timing = [
        "--lease",
        "2s",
        "--send-timeout",
        "1s",
        "--settle-margin",
        "500ms",
    ];
    let mut a_args = run_args(&db, &queue, proxy.endpoint(), &timing);
    a_args.extend(["--relay-id".into(), "replica-a".into()]);
    let a = RelayProcess::spawn_named("a", &a_args, &[]);
    wait_until(
        "A's batch is at SQS, the answer held",
        Duration::from_secs(20),
        || async { proxy.held() >= 1 },
    )
    .await;
    // A freezes (a long GC pause, a stopped VM) holding SQS's answer; its lease runs out.
    a.sigstop();
    // SIGSTOP is not instant: release SQS's answer only once A is really stopped, or A may
    // settle before its lease runs out.
    wait_until("A is stopped", Duration::from_secs(10), || async {
        std::fs::read_to_string(format!("/proc/{}/stat", a.pid()))
            .map(|stat| {
                stat.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('T')
            })
            .unwrap_or(false)
    })
    .await;
    proxy.set_mode(Mode::Pass);
    wait_until("A's lease expired", Duration::from_secs(10), || async {
        count(
            &client,
            "id IN (SELECT unnest(ids) FROM outbox_claims WHERE until >= now())",
        )
        .await
            == 0
    })
    .await;
    assert!(
        count_claims(&client, "owner = 'replica-a'").await >= 1,
        "A's ended claim is still there for B to take over"
    );

    let mut b_args = run_args(&db, &queue, sqs().endpoint(), &timing);
    b_args.extend(["--relay-id".into(), "replica-b".into()]);
    let b = RelayProcess::spawn_named("b", &b_args, &[]);
    wait_count(
        &client,
        "sent_at IS NOT NULL",
        n as i64,
        Duration::from_secs(30),
    )
    .await;
    // B sent them all: B's claim took every row over from A's ended one (that attempt counted),
    // and B's settlement counted its own.
    wait_until("B counts what it sent", Duration::from_secs(10), || async {
        b.metric("outbox_events_sent_total").await == Some(n as f64)
    })
    .await;
    assert_eq!(count(&client, "attempts = 2").await, n as i64);
    assert_eq!(count_claims(&client, "owner = 'replica-a'").await, 0);
    let before: HashMap<i64, String> = snapshot(&client).await;

    // A wakes up and tries to settle what it sent: every settlement is refused.
    a.sigcont();
    wait_until(
        "A counts its lost leases",
        Duration::from_secs(30),
        || async { a.metric("outbox_lease_lost_total").await == Some(n as f64) },
    )
    .await;
    assert_eq!(
        snapshot(&client).await,
        before,
        "A's late settlement changed nothing"
    );
    assert_eq!(count_claims(&client, "owner = 'replica-a'").await, 0);
    assert_eq!(b.metric("outbox_lease_lost_total").await, Some(0.0));
    assert_eq!(a.metric("outbox_events_sent_total").await, Some(0.0));
    let received = receive_all(&queue, 2 * n, Duration::from_secs(30)).await;
    assert!(
        copies(&received).values().all(|&c| c == 2),
        "both sends carry the same event_id"
    );
}

/// Every row as a settlement could change it.
async fn snapshot(client: &tokio_postgres::Client) -> HashMap<i64, String> {
    client
        .query(
            "SELECT id, concat_ws('|', message_id, sent_at, attempts, available_at, last_error, \
                                  quarantined_at) FROM outbox",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_relay_processes_share_ten_thousand_rows_without_sending_any_twice() {
    let n = 10_000;
    let db = migrated_db().await;
    let client = db.client().await;
    let queue = create_queue("four", &[]).await;
    let written = events("four", n, 100);
    for chunk in written.chunks(2_000) {
        insert(&client, chunk, Duration::ZERO).await;
    }
    let relays: Vec<RelayProcess> = (0..4)
        .map(|i| {
            RelayProcess::spawn_named(
                &format!("r{i}"),
                &run_args(
                    &db,
                    &queue,
                    sqs().endpoint(),
                    &["--relay-id", &format!("replica-{i}")],
                ),
                &[],
            )
        })
        .collect();
    wait_count(
        &client,
        "sent_at IS NOT NULL",
        n as i64,
        Duration::from_secs(180),
    )
    .await;
    let received = receive_all(&queue, n, Duration::from_secs(180)).await;
    let by_id = copies(&received);
    assert_eq!(by_id.len(), n, "every row arrives");
    let twice = by_id.values().filter(|&&c| c > 1).count();
    assert_eq!(twice, 0, "no message is received twice in a crash-free run");
    let mut sent_by = Vec::new();
    for relay in &relays {
        sent_by.push(
            relay
                .metric("outbox_events_sent_total")
                .await
                .unwrap_or(0.0) as usize,
        );
    }
    assert_eq!(
        sent_by.iter().sum::<usize>(),
        n,
        "each row is counted sent by one replica: {sent_by:?}"
    );
    let owners = sent_by.iter().filter(|&&s| s > 0).count();
    assert!(
        owners >= 2,
        "the work was shared, {owners} replica(s) sent rows: {sent_by:?}"
    );
    assert_eq!(count_claims(&client, "true").await, 0, "no lease left");
    drop(relays);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_a_steady_stream_exits_zero_and_leaves_no_row_leased() {
    let db = migrated_db().await;
    let client = db.client().await;
    let queue = create_queue("sigterm", &[]).await;
    // Slow answers keep batches in flight when the signal lands.
    let proxy = FaultProxy::start(sqs().endpoint());
    proxy.set_mode(Mode::Delay(Duration::from_millis(300)));
    let mut a = run_args(&db, &queue, proxy.endpoint(), &["--relay-id", "stopping"]);
    a.extend(["--batch-size".into(), "20".into()]);
    let relay = RelayProcess::spawn(&a, &[]);

    let producer_client = db.client().await;
    let producer = tokio::spawn(async move {
        for round in 0..400 {
            let batch = events(&format!("steady-{round}"), 5, 5);
            insert(&producer_client, &batch, Duration::ZERO).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    wait_until("some rows sent", Duration::from_secs(30), || async {
        count(&client, "sent_at IS NOT NULL").await >= 50
    })
    .await;
    wait_until("a batch in flight", Duration::from_secs(10), || async {
        count(
            &client,
            "sent_at IS NULL \
             AND id IN (SELECT unnest(ids) FROM outbox_claims \
                        WHERE owner = 'stopping' AND until > now())",
        )
        .await
            > 0
    })
    .await;
    relay.sigterm();
    let status = relay
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("relay exits after SIGTERM");
    producer.abort();
    assert!(status.success(), "exit status {status:?}");
    assert_eq!(
        count_claims(&client, "owner = 'stopping'").await,
        0,
        "every lease was settled or released"
    );
    // In-flight sends were finished and recorded: whatever reached the queue is marked sent.
    let sent = count(&client, "sent_at IS NOT NULL").await as usize;
    let received = receive_all(&queue, sent, Duration::from_secs(60)).await;
    let by_id = copies(&received);
    let marked: std::collections::HashSet<String> = client
        .query("SELECT event_id FROM outbox WHERE sent_at IS NOT NULL", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(by_id.len(), marked.len());
    assert!(
        by_id.keys().all(|id| marked.contains(id)),
        "a message on the queue whose row is not marked"
    );
    assert!(relay.output().contains("relay stopped"));
}
