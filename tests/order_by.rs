//! `--order-by transaction`: a group's events reach a FIFO queue in the order of their writing
//! transactions, whatever the claims' timing, and no event overtakes one an older transaction
//! may still write. The watermark's hold-back on /metrics and in `status`; what is refused.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::scenario::{
    args, attr, copies, count, events, insert, migrate_with, migrated_db, relay_args_for,
    relay_command, run_args, wait_count, Event,
};
use crate::support::{create_queue, receive_all, run_to_end, sqs, wait_until, RelayProcess};

/// Per group, the event_ids in the documented order: the writing transactions', then `id`.
async fn documented_order(client: &tokio_postgres::Client) -> HashMap<String, Vec<String>> {
    let mut by_group: HashMap<String, Vec<String>> = HashMap::new();
    for row in client
        .query(
            "SELECT aggregate_id, event_id FROM outbox ORDER BY xact_id, id",
            &[],
        )
        .await
        .unwrap()
    {
        by_group.entry(row.get(0)).or_default().push(row.get(1));
    }
    by_group
}

/// Per (aggregate_type, aggregate_id), the event_ids in the documented order.
async fn documented_order_by_type(
    client: &tokio_postgres::Client,
) -> HashMap<(String, String), Vec<String>> {
    let mut by_group: HashMap<(String, String), Vec<String>> = HashMap::new();
    for row in client
        .query(
            "SELECT aggregate_type, aggregate_id, event_id FROM outbox ORDER BY xact_id, id",
            &[],
        )
        .await
        .unwrap()
    {
        by_group
            .entry((row.get(0), row.get(1)))
            .or_default()
            .push(row.get(2));
    }
    by_group
}

/// Per group, the event_ids in the order the consumer received them (first copies).
fn received_order(received: &[aws_sdk_sqs::types::Message]) -> HashMap<String, Vec<String>> {
    let mut by_group: HashMap<String, Vec<String>> = HashMap::new();
    for m in received {
        let seq = by_group
            .entry(attr(m, "aggregate_id").unwrap().to_string())
            .or_default();
        let id = attr(m, "event_id").unwrap().to_string();
        if !seq.contains(&id) {
            seq.push(id);
        }
    }
    by_group
}

fn event(id: &str, aggregate: &str) -> Event {
    let mut e = events(id, 1, 1).remove(0);
    e.event_id = id.to_string();
    e.aggregate_id = aggregate.to_string();
    e
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_waits_while_an_older_transaction_of_its_group_is_open_then_the_group_arrives_in_transaction_order(
) {
    // An install of before: rows written then read as the earliest transaction once migrated.
    let db = migrated_db().await;
    let client = db.client().await;
    insert(&client, &[event("a-0", "A")], Duration::ZERO).await;
    migrate_with(&db, &["--order-by", "transaction"]).await;
    let zero: i64 = client
        .query_one("SELECT count(*) FROM outbox WHERE xact_id = '0'::xid8", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(zero, 1, "the row of before reads as transaction 0");
    insert(&client, &[event("c-0", "C")], Duration::ZERO).await;

    let queue = create_queue("xact.fifo", &[]).await;
    let relay = RelayProcess::spawn(
        &run_args(
            &db,
            &queue,
            sqs().endpoint(),
            &["--order-by", "transaction"],
        ),
        &[],
    );
    wait_count(&client, "sent_at IS NOT NULL", 2, Duration::from_secs(60)).await;

    // T1 writes A-1 and stays open; T2 then writes A-2 and B-1 and commits.
    let t1 = db.client().await;
    t1.batch_execute("BEGIN").await.unwrap();
    insert(&t1, &[event("a-1", "A")], Duration::ZERO).await;
    insert(
        &client,
        &[event("a-2", "A"), event("b-1", "B")],
        Duration::ZERO,
    )
    .await;
    wait_until(
        "the held-back rows are on /metrics",
        Duration::from_secs(30),
        || async { relay.metric("outbox_order_watermark_held_rows").await == Some(2.0) },
    )
    .await;
    // Several polls later nothing has overtaken T1: A-2 could be sent before A-1 otherwise,
    // and B-1 waits too (the watermark is one for the whole database cluster).
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(count(&client, "sent_at IS NOT NULL").await, 2);
    let age = relay
        .metric("outbox_order_watermark_age_seconds")
        .await
        .unwrap();
    assert!(age >= 1.0, "the hold-back has an age: {age}");
    let status = relay_command(&["status", "--database-url", &db.url]).await;
    assert!(status.contains("held back"), "{status}");

    t1.batch_execute("COMMIT").await.unwrap();
    wait_count(&client, "sent_at IS NOT NULL", 5, Duration::from_secs(60)).await;
    wait_until(
        "the hold-back is over on /metrics",
        Duration::from_secs(30),
        || async { relay.metric("outbox_order_watermark_held_rows").await == Some(0.0) },
    )
    .await;
    let received = receive_all(&queue, 5, Duration::from_secs(60)).await;
    let order = received_order(&received);
    assert_eq!(order["A"], ["a-0", "a-1", "a-2"], "transaction order");
    assert_eq!(order, documented_order(&client).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interleaved_writers_of_few_groups_reach_their_queues_in_transaction_order_across_routes_two_relays_and_kill_9(
) {
    let db = migrated_db().await;
    migrate_with(
        &db,
        &["--order-by", "transaction", "--fair-by", "aggregate_type"],
    )
    .await;
    let client = db.client().await;
    // One tenant's events go to a FIFO queue of their own by a route: a group is (destination,
    // key), so g1 of tenant-0 and g1 of tenant-1 are two groups with an order each.
    let queue = create_queue("xact-chaos.fifo", &[]).await;
    let routed = create_queue("xact-chaos-routed.fifo", &[]).await;
    let route = format!("tenant-1={routed}");
    let seed = fastrand::u64(..);
    let relay_for = |name: &str| {
        let mut a = relay_args_for(&db, &queue, sqs().endpoint(), name);
        a.extend(args(&[
            "--order-by",
            "transaction",
            "--fair-by",
            "aggregate_type",
            "--route",
            &route,
        ]));
        RelayProcess::spawn_named(name, &a, &[])
    };
    let mut relays = vec![relay_for("x0"), relay_for("x1")];

    // Writers whose transactions overlap: each writes 1-3 events of three groups, pausing
    // inside the transaction, so later transactions often commit first.
    let (writers, transactions) = (6, 25);
    let mut tasks = Vec::new();
    for w in 0..writers {
        let c = db.client().await;
        let mut rng = fastrand::Rng::with_seed(seed ^ w as u64);
        tasks.push(tokio::spawn(async move {
            let mut written = 0;
            for t in 0..transactions {
                c.batch_execute("BEGIN").await.unwrap();
                for e in 0..rng.usize(1..=3) {
                    let group = ["g1", "g2", "g3"][rng.usize(0..3)];
                    let mut ev = event(&format!("w{w}-t{t}-e{e}"), group);
                    ev.aggregate_type = format!("tenant-{}", rng.usize(0..2));
                    insert(&c, &[ev], Duration::ZERO).await;
                    written += 1;
                    tokio::time::sleep(Duration::from_millis(rng.u64(0..40))).await;
                }
                c.batch_execute("COMMIT").await.unwrap();
            }
            written
        }));
    }
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut kills = 0;
    while tasks.iter().any(|t| !t.is_finished()) || kills < 2 {
        tokio::time::sleep(Duration::from_millis(rng.u64(200..600))).await;
        if kills < 2 {
            let victim = rng.usize(0..relays.len());
            relays[victim].kill9();
            kills += 1;
            relays[victim] = relay_for(&format!("x{victim}-{kills}"));
        }
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    let started = Instant::now();
    wait_count(
        &client,
        "sent_at IS NOT NULL",
        total as i64,
        Duration::from_secs(120),
    )
    .await;
    drop(relays);
    let default_queue = receive_all(&queue, 1, Duration::from_secs(120)).await;
    let routed_queue = receive_all(&routed, 1, Duration::from_secs(120)).await;
    let mut received_by_group = HashMap::new();
    for (tenant, messages) in [("tenant-0", &default_queue), ("tenant-1", &routed_queue)] {
        assert!(
            messages
                .iter()
                .all(|m| attr(m, "aggregate_type") == Some(tenant)),
            "each tenant's events reach its own queue"
        );
        for (group, ids) in received_order(messages) {
            received_by_group.insert((tenant.to_string(), group), ids);
        }
    }
    let received: Vec<_> = default_queue.into_iter().chain(routed_queue).collect();
    let by_id = copies(&received);
    println!(
        "transaction order: seed={seed} events={total} kills={kills} copies={} drained_in={:?}",
        received.len(),
        started.elapsed()
    );
    assert_eq!(by_id.len(), total, "every event arrives");
    assert!(
        by_id.values().all(|&c| c == 1),
        "FIFO deduplication drops every resend"
    );
    let documented = documented_order_by_type(&client).await;
    assert_eq!(documented.len(), 6, "three groups on each of two queues");
    assert_eq!(received_by_group, documented, "seed={seed}");
    // The interleaving was real: some group's transaction order differs from its id order.
    let by_id_order: Vec<String> = client
        .query("SELECT event_id FROM outbox ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let by_xact: Vec<String> = client
        .query("SELECT event_id FROM outbox ORDER BY xact_id, id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_ne!(
        by_id_order, by_xact,
        "seed={seed}: no transaction overlapped another"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn combinations_transaction_order_cannot_take_are_refused_at_start_up_with_one_line() {
    let db = migrated_db().await;
    let queue = create_queue("xact-refused.fifo", &[]).await;
    let cases: Vec<(Vec<String>, &str)> = vec![
        // Not migrated for it: the line names the command.
        (
            run_args(
                &db,
                &queue,
                sqs().endpoint(),
                &["--order-by", "transaction"],
            ),
            "--order-by transaction`",
        ),
        (
            run_args(
                &db,
                &queue,
                sqs().endpoint(),
                &["--order-by", "transaction", "--ordered", "off"],
            ),
            "--order-by transaction orders every group",
        ),
        (
            args(&[
                "migrate",
                "--database-url",
                &db.url,
                "--adopt",
                "--table",
                "outboxevent",
                "--column",
                "event_id=id",
                "--order-by",
                "transaction",
            ]),
            "not supported on an adopted table",
        ),
    ];
    for (command, expected) in cases {
        let (status, output) = run_to_end(&command, &[], Duration::from_secs(30)).await;
        assert!(!status.success(), "{command:?}: {output}");
        let errors: Vec<&str> = output.lines().filter(|l| l.contains(expected)).collect();
        assert_eq!(errors.len(), 1, "{command:?}: {output}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_a_fifo_topic_an_event_waits_for_an_older_open_transaction_of_its_group() {
    use crate::support::{create_topic, subscribe_queue};

    let db = migrated_db().await;
    migrate_with(&db, &["--order-by", "transaction"]).await;
    let client = db.client().await;
    let topic = create_topic("xact-topic.fifo").await;
    let subscribed = create_queue("xact-topic-sub.fifo", &[]).await;
    subscribe_queue(&topic, &subscribed, true).await;
    let relay = RelayProcess::spawn(
        &run_args(
            &db,
            &topic,
            sqs().endpoint(),
            &[
                "--sns-endpoint-url",
                sqs().endpoint(),
                "--order-by",
                "transaction",
            ],
        ),
        &[],
    );
    let t1 = db.client().await;
    t1.batch_execute("BEGIN").await.unwrap();
    insert(&t1, &[event("t-1", "A")], Duration::ZERO).await;
    insert(&client, &[event("t-2", "A")], Duration::ZERO).await;
    wait_until(
        "the held-back row is on /metrics",
        Duration::from_secs(30),
        || async { relay.metric("outbox_order_watermark_held_rows").await == Some(1.0) },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(count(&client, "sent_at IS NOT NULL").await, 0);
    t1.batch_execute("COMMIT").await.unwrap();
    wait_count(&client, "sent_at IS NOT NULL", 2, Duration::from_secs(60)).await;
    let received = receive_all(&subscribed, 2, Duration::from_secs(60)).await;
    assert_eq!(received_order(&received)["A"], ["t-1", "t-2"]);
}
