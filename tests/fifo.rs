//! FIFO queues: per-group order across replicas and crashes, poison that blocks only its
//! group, fair claiming, routing and the CloudEvents envelope.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::scenario::{
    args, attr, copies, count, events, insert, insert_to, migrate_with, migrated_db,
    relay_args_for, relay_command, run_args, wait_count, Event,
};
use crate::support::{create_queue, receive_all, sqs, wait_until, FaultProxy, Mode, RelayProcess};

/// event_id -> id, to check order at the consumer.
pub async fn ids_by_event(client: &tokio_postgres::Client) -> HashMap<String, i64> {
    client
        .query("SELECT event_id, id FROM outbox", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// Per group, the ids in the order the consumer received them; counts pairs out of order.
pub fn order_violations(
    received: &[aws_sdk_sqs::types::Message],
    ids: &HashMap<String, i64>,
) -> (usize, HashMap<String, Vec<i64>>) {
    let mut by_group: HashMap<String, Vec<i64>> = HashMap::new();
    for m in received {
        let group = attr(m, "aggregate_id").unwrap().to_string();
        let id = ids[attr(m, "event_id").unwrap()];
        by_group.entry(group).or_default().push(id);
    }
    let violations = by_group
        .values()
        .map(|seq| seq.windows(2).filter(|w| w[0] >= w[1]).count())
        .sum();
    (violations, by_group)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_order_per_group_holds_across_three_replicas_kill_9_and_lost_acknowledgements() {
    let (groups, per_group) = (100, 50);
    let total = groups * per_group;
    let db = migrated_db().await;
    let client = db.client().await;
    let queue = create_queue("ordered.fifo", &[]).await;
    // Interleaved across groups, in id order within each group.
    let written = events("fifo", total, groups);
    for chunk in written.chunks(1000) {
        insert(&client, chunk, Duration::ZERO).await;
    }
    let proxy = FaultProxy::start(sqs().endpoint());
    // The first two batches reach SQS but their answers are lost.
    proxy.fault_next(Mode::DropResponse, 2);
    let seed = fastrand::u64(..);
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut relays: Vec<RelayProcess> = (0..3)
        .map(|i| {
            RelayProcess::spawn_named(
                &format!("f{i}"),
                &relay_args_for(&db, &queue, proxy.endpoint(), &format!("fifo-{i}")),
                &[],
            )
        })
        .collect();
    let mut kills = 0;
    let started = Instant::now();
    // Until every row is sent and both early kills happened: on a fast machine the rows can
    // all be sent before the second kill's turn (many.rs's three replicas once drained so).
    while count(&client, "sent_at IS NOT NULL").await < total as i64 || kills < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(240),
            "not drained in time"
        );
        tokio::time::sleep(Duration::from_millis(rng.u64(100..400))).await;
        // Two kills early, whatever the dice say, then maybe two more.
        if kills < 2 || (kills < 4 && rng.bool()) {
            let victim = rng.usize(0..relays.len());
            relays[victim].kill9();
            kills += 1;
            relays[victim] = RelayProcess::spawn_named(
                &format!("f{victim}-{kills}"),
                &relay_args_for(
                    &db,
                    &queue,
                    proxy.endpoint(),
                    &format!("fifo-{victim}-{kills}"),
                ),
                &[],
            );
        }
    }
    let lost_acks = proxy.faulted();
    drop(relays);
    let received = receive_all(&queue, total, Duration::from_secs(120)).await;
    let by_id = copies(&received);
    let (violations, by_group) = order_violations(&received, &ids_by_event(&client).await);
    let twice = by_id.values().filter(|&&c| c > 1).count();
    println!(
        "fifo chaos: seed={seed} groups={groups} events={total} kills={kills} lost_acks={lost_acks} \
         duplicates={twice} order_violations={violations} drained_in={:?}",
        started.elapsed()
    );
    assert_eq!(by_id.len(), total, "every event arrives");
    assert_eq!(twice, 0, "FIFO deduplication drops every resend");
    assert_eq!(by_group.len(), groups);
    assert_eq!(violations, 0, "order within a group is kept");
    assert!(kills >= 2, "relays were killed");
    assert_eq!(lost_acks, 2, "two acknowledgements were lost");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisoned_head_blocks_only_its_group_until_it_is_retried_then_the_group_completes_in_order(
) {
    let db = migrated_db().await;
    let client = db.client().await;
    let queue = create_queue("poison.fifo", &[("MaximumMessageSize", "1024")]).await;
    // Ten groups of ten; the second event of group agg-3 is too big for the queue.
    let mut written: Vec<Event> = events("poison", 100, 10);
    let poisoned = 13; // index 13 -> group agg-3, its second event
    written[poisoned].payload = serde_json::json!({"blob": "z".repeat(3000)});
    insert(&client, &written, Duration::ZERO).await;
    let relay = RelayProcess::spawn(&run_args(&db, &queue, sqs().endpoint(), &[]), &[]);

    // Every other group completes; agg-3 stops at its first event.
    wait_count(&client, "sent_at IS NOT NULL", 91, Duration::from_secs(60)).await;
    wait_count(
        &client,
        "quarantine_reason = 'blocked'",
        8,
        Duration::from_secs(30),
    )
    .await;
    // The relay read the queue's size limit and refused the event before sending it, so no
    // event of its group behind it could be accepted first.
    assert_eq!(count(&client, "quarantine_reason = 'too_large'").await, 1);
    assert_eq!(
        count(&client, "sent_at IS NOT NULL AND aggregate_id = 'agg-3'").await,
        1
    );
    wait_until(
        "the blocked rows are on /metrics",
        Duration::from_secs(10),
        || async { relay.metric("outbox_blocked_rows").await == Some(8.0) },
    )
    .await;
    let listed = relay_command(&["quarantine", "list", "--database-url", &db.url]).await;
    assert!(
        listed.contains("poison-13") && listed.contains("too_large"),
        "{listed}"
    );
    assert_eq!(listed.matches("blocked").count(), 8, "{listed}");

    // Fix the cause, re-drive the head only: the relay releases the rest of the group.
    crate::support::set_max_message_size(&queue, 262_144).await;
    let moved = relay_command(&[
        "quarantine",
        "retry",
        "--event-id",
        &written[poisoned].event_id,
        "--database-url",
        &db.url,
    ])
    .await;
    assert!(moved.contains("moved 1 "), "{moved}");
    wait_count(&client, "sent_at IS NOT NULL", 100, Duration::from_secs(60)).await;

    let received = receive_all(&queue, 100, Duration::from_secs(60)).await;
    let by_id = copies(&received);
    assert_eq!(by_id.len(), 100);
    assert!(by_id.values().all(|&c| c == 1));
    let (violations, by_group) = order_violations(&received, &ids_by_event(&client).await);
    assert_eq!(violations, 0, "{by_group:?}");
    assert_eq!(by_group["agg-3"].len(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_fair_claiming_a_late_row_of_a_quiet_key_overtakes_a_large_backlog() {
    let db = crate::support::fresh_db().await;
    migrate_with(&db, &["--fair-by", "aggregate_type"]).await;
    let client = db.client().await;
    let backlog = 100_000;
    client
        .execute(
            "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload)
             SELECT 'bulk-' || g, 'import', (g % 100)::text, 'row.imported', jsonb_build_object('n', g)
             FROM generate_series(1, $1::int) g",
            &[&backlog],
        )
        .await
        .unwrap();
    client
        .batch_execute(
            "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload)
             VALUES ('tenant-b-1', 'order', '1', 'order.paid', '{\"b\": 1}')",
        )
        .await
        .unwrap();
    let queue = create_queue("fair", &[]).await;
    let batch = 100;
    let relay = RelayProcess::spawn(
        &run_args(
            &db,
            &queue,
            sqs().endpoint(),
            &["--fair-by", "aggregate_type", "--batch-size", "100"],
        ),
        &[],
    );
    wait_count(
        &client,
        "event_id = 'tenant-b-1' AND sent_at IS NOT NULL",
        1,
        Duration::from_secs(60),
    )
    .await;
    relay.sigterm();
    relay.wait_exit(Duration::from_secs(30)).await;
    let ahead: i64 = client
        .query_one(
            "SELECT count(*) FROM outbox WHERE aggregate_type = 'import'
             AND sent_at <= (SELECT sent_at FROM outbox WHERE event_id = 'tenant-b-1')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let claims_before = ahead as f64 / batch as f64;
    println!("fairness: {ahead} backlog rows were sent before the late row (~{claims_before:.1} claims); strict id order: {backlog}");
    // The late row rides in the first claim after it was written; claims already in flight
    // (at most a few) may go first.
    assert!(
        ahead <= 5 * batch as i64,
        "{ahead} rows of the backlog went first"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_send_rows_to_three_queues_and_cloudevents_envelopes_carry_every_field() {
    let db = migrated_db().await;
    let client = db.client().await;
    let orders = create_queue("route-orders", &[]).await;
    let invoices = create_queue("route-invoices", &[]).await;
    let other = create_queue("route-default", &[]).await;
    let mut written = events("route", 30, 5);
    for (i, e) in written.iter_mut().enumerate() {
        e.aggregate_type = ["order", "invoice", "customer"][i % 3].to_string();
    }
    insert(&client, &written, Duration::ZERO).await;
    let relay = RelayProcess::spawn(
        &run_args(
            &db,
            &other,
            sqs().endpoint(),
            &[
                "--route",
                &format!("order={orders}"),
                "--route",
                &format!("invoice={invoices}"),
                "--message-format",
                "cloudevents",
                "--cloudevents-source",
                "/shop/orders-service",
            ],
        ),
        &[],
    );
    wait_count(&client, "sent_at IS NOT NULL", 30, Duration::from_secs(60)).await;
    let created: HashMap<String, String> = client
        .query(
            "SELECT event_id, to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') FROM outbox",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    for (queue, aggregate_type) in [
        (&orders, "order"),
        (&invoices, "invoice"),
        (&other, "customer"),
    ] {
        let received = receive_all(queue, 10, Duration::from_secs(30)).await;
        assert_eq!(received.len(), 10, "{aggregate_type}");
        for m in &received {
            let event_id = attr(m, "event_id").unwrap();
            let e = written.iter().find(|e| e.event_id == event_id).unwrap();
            assert_eq!(e.aggregate_type, aggregate_type, "routed by aggregate_type");
            let v: serde_json::Value = serde_json::from_str(m.body().unwrap()).unwrap();
            assert_eq!(v["specversion"], "1.0");
            assert_eq!(v["id"], e.event_id.as_str());
            assert_eq!(v["type"], e.event_type.as_str());
            assert_eq!(v["source"], "/shop/orders-service");
            assert_eq!(v["subject"], e.aggregate_id.as_str());
            assert_eq!(v["time"], created[event_id].as_str());
            assert_eq!(v["datacontenttype"], "application/json");
            assert_eq!(v["data"], e.payload);
            assert_eq!(v.as_object().unwrap().len(), 8, "no other fields: {v}");
        }
    }
    drop(relay);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_defaults_two_relays_keep_group_order_and_delete_every_sent_row() {
    // The defaults together: polling wake-up, rows deleted on acknowledgement, ordered
    // delivery turned on by the FIFO queue; rows arrive while the relays already run.
    let (groups, per_group) = (20, 20);
    let total = groups * per_group;
    let db = migrated_db().await;
    let client = db.client().await;
    let queue = create_queue("defaults.fifo", &[]).await;
    let defaults = |id: &str| {
        let mut a = relay_args_for(&db, &queue, sqs().endpoint(), id);
        let at = a.iter().position(|x| x == "--retention").unwrap();
        a.drain(at..at + 2);
        a
    };
    let relays: Vec<RelayProcess> = (0..2)
        .map(|i| RelayProcess::spawn(&defaults(&format!("defaults-{i}")), &[]))
        .collect();
    let written = events("dflt", total, groups);
    // Rows are deleted once sent, so their order is read from how they were written: one
    // connection, one row after the other, so write order is id order.
    let ids: HashMap<String, i64> = written
        .iter()
        .enumerate()
        .map(|(i, e)| (e.event_id.clone(), i as i64))
        .collect();
    for chunk in written.chunks(40) {
        insert(&client, chunk, Duration::ZERO).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let received = receive_all(&queue, total, Duration::from_secs(120)).await;
    let (violations, by_group) = order_violations(&received, &ids);
    assert_eq!(copies(&received).len(), total, "every event arrives");
    assert_eq!(by_group.len(), groups);
    assert_eq!(violations, 0, "order within a group is kept");
    wait_count(&client, "true", 0, Duration::from_secs(30)).await;
    for relay in &relays {
        assert!(relay.output().contains("wakeup=poll"), "{}", relay.output());
    }
}

/// Fair claiming combined with ordered delivery (a FIFO queue): every claim of this mode failed
/// with "expected 4 parameters but got 5" before claim strategies owned their parameters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_claiming_on_a_fifo_queue_delivers_every_group_in_order() {
    let db = crate::support::fresh_db().await;
    let (status, output) = crate::support::run_to_end(
        &args(&[
            "migrate",
            "--database-url",
            &db.url,
            "--fair-by",
            "aggregate_type",
        ]),
        &[],
        Duration::from_secs(30),
    )
    .await;
    assert!(status.success(), "{output}");
    let client = db.client().await;
    let mut written = events("fairfifo", 300, 12);
    for (i, e) in written.iter_mut().enumerate() {
        e.aggregate_type = ["order", "invoice", "refund"][i % 3].to_string();
    }
    insert(&client, &written, Duration::ZERO).await;
    let ids = ids_by_event(&client).await;
    let queue = create_queue("fair-ordered.fifo", &[]).await;
    let extra = ["--fair-by", "aggregate_type"];
    // `check` prepares the claim statement of this mode with its parameters, as `run` does.
    let mut check_args = run_args(&db, &queue, sqs().endpoint(), &extra);
    check_args[0] = "check".to_string();
    let check_args: Vec<&str> = check_args.iter().map(String::as_str).collect();
    let check = relay_command(&check_args).await;
    assert!(!check.contains("FAIL"), "{check}");
    let relay = RelayProcess::spawn(&run_args(&db, &queue, sqs().endpoint(), &extra), &[]);
    let received = receive_all(&queue, written.len(), Duration::from_secs(60)).await;
    let (violations, by_group) = order_violations(&received, &ids);
    assert_eq!(
        copies(&received).len(),
        written.len(),
        "every event arrives"
    );
    assert_eq!(by_group.len(), 12);
    assert_eq!(violations, 0, "order within a group is kept");
    assert!(
        !relay.output().contains("claim failed"),
        "{}",
        relay.output()
    );
}

/// With a standard default queue, rows that carry their own FIFO queue_url are ordered per
/// group (before, ordering was decided from --queue-url and --route only, and batches of one
/// group went out concurrently).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_with_their_own_fifo_queue_keep_group_order_while_the_default_queue_is_standard() {
    let db = migrated_db().await;
    let client = db.client().await;
    let standard = create_queue("own-std", &[]).await;
    let fifo = create_queue("own.fifo", &[]).await;
    let written = events("ownfifo", 400, 8);
    // Every other row goes to the FIFO queue; the rest to the default, standard one.
    let queues: Vec<Option<String>> = (0..written.len())
        .map(|i| (i % 2 == 0).then(|| fifo.clone()))
        .collect();
    for (chunk, queues) in written.chunks(50).zip(queues.chunks(50)) {
        insert_to(&client, chunk, queues).await;
    }
    let ids = ids_by_event(&client).await;
    let relays: Vec<RelayProcess> = (0..2)
        .map(|i| {
            RelayProcess::spawn_named(
                &format!("own{i}"),
                &relay_args_for(&db, &standard, sqs().endpoint(), &format!("own-{i}")),
                &[],
            )
        })
        .collect();
    let on_fifo = receive_all(&fifo, 200, Duration::from_secs(90)).await;
    let on_standard = receive_all(&standard, 200, Duration::from_secs(90)).await;
    assert_eq!(
        copies(&on_fifo).len(),
        200,
        "every FIFO-bound event arrives"
    );
    assert_eq!(copies(&on_standard).len(), 200);
    let (violations, by_group) = order_violations(&on_fifo, &ids);
    assert_eq!(by_group.len(), 4, "{by_group:?}");
    assert_eq!(violations, 0, "order within a group is kept: {by_group:?}");
    drop(relays);
}
