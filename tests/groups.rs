//! What a group is: (destination, group key), the same in the claim, the planner and the
//! parking. An unreadable row holds its group like any quarantined row; one group's quarantine
//! never holds a group of the same key on another destination; fair claiming on a FIFO queue
//! reaches a quiet tenant however many groups the backlog has; header numbers keep their text.

use std::time::Duration;

use crate::scenario::{attr, migrate_with, migrated_db, run_args};
use crate::support::{create_queue, receive_all, sqs, RelayProcess};

/// `(sent, quarantine_reason)` of the row `event_id`, once it is either.
async fn settled(client: &tokio_postgres::Client, event_id: &str) -> (bool, Option<String>) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let row = client
            .query_one(
                "SELECT sent_at IS NOT NULL, quarantine_reason FROM outbox WHERE event_id = $1",
                &[&event_id],
            )
            .await
            .unwrap();
        let state: (bool, Option<String>) = (row.get(0), row.get(1));
        if state.0 || state.1.is_some() {
            return state;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{event_id} neither sent nor quarantined within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A-1, A-2 (headers that are not an object: unreadable) and A-3, one group, one transaction,
/// on a FIFO queue; returns what became of A-3 and the event ids that arrived, in order.
async fn unreadable_mid_group(on_poison: &str) -> (bool, Option<String>, Vec<String>) {
    let db = migrated_db().await;
    let client = db.client().await;
    client
        .batch_execute(
            "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload, headers)
             VALUES ('A-1', 'order', 'A', 'order.placed', '{\"n\": 1}', '{}'),
                    ('A-2', 'order', 'A', 'order.placed', '{\"n\": 2}', '[1]'),
                    ('A-3', 'order', 'A', 'order.placed', '{\"n\": 3}', '{}')",
        )
        .await
        .unwrap();
    let queue = create_queue("unreadable.fifo", &[]).await;
    let relay = RelayProcess::spawn(
        &run_args(&db, &queue, sqs().endpoint(), &["--on-poison", on_poison]),
        &[],
    );
    let (_, a2) = settled(&client, "A-2").await;
    assert_eq!(a2.as_deref(), Some("invalid"), "{}", relay.output());
    let (a3_sent, a3) = settled(&client, "A-3").await;
    let expected = if a3_sent { 2 } else { 1 };
    let received = receive_all(&queue, expected, Duration::from_secs(30)).await;
    let order = received
        .iter()
        .map(|m| attr(m, "event_id").unwrap().to_string())
        .collect();
    (a3_sent, a3, order)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_row_mid_group_holds_the_rows_behind_it_under_on_poison_block() {
    let (a3_sent, a3, received) = unreadable_mid_group("block").await;
    assert!(!a3_sent, "A-3 went past the unreadable A-2: {received:?}");
    assert_eq!(a3.as_deref(), Some("blocked"), "A-3 parked behind A-2");
    assert_eq!(received, ["A-1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_row_mid_group_lets_the_rest_pass_under_on_poison_skip() {
    let (a3_sent, a3, received) = unreadable_mid_group("skip").await;
    assert!(a3_sent && a3.is_none(), "A-3: {a3:?}");
    assert_eq!(received, ["A-1", "A-3"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quarantined_group_holds_no_group_of_the_same_key_on_another_destination() {
    let db = migrated_db().await;
    let client = db.client().await;
    let b = create_queue("b.fifo", &[]).await;
    let o = create_queue("o.fifo", &[]).await;
    let route = format!("order={o}");
    let relay = RelayProcess::spawn(
        &run_args(&db, &b, sqs().endpoint(), &["--route", &route]),
        &[],
    );
    // A header name SQS reserves: refused before sending.
    client
        .batch_execute(
            "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload, headers)
             VALUES ('o-17', 'order', '17', 'order.paid', '{}', '{\"AWS.trace\": \"x\"}')",
        )
        .await
        .unwrap();
    let (_, o17) = settled(&client, "o-17").await;
    assert_eq!(o17.as_deref(), Some("invalid"));
    // Written after o-17 was quarantined, so in a later claim; bound for b.fifo, the same key.
    client
        .batch_execute(
            "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload)
             VALUES ('c-17', 'customer', '17', 'customer.updated', '{}')",
        )
        .await
        .unwrap();
    let (sent, reason) = settled(&client, "c-17").await;
    assert!(sent, "c-17 {reason:?}: {}", relay.output());
    let received = receive_all(&b, 1, Duration::from_secs(30)).await;
    assert_eq!(attr(&received[0], "event_id"), Some("c-17"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_claiming_on_a_fifo_queue_reaches_a_quiet_tenant_behind_a_backlog_of_many_groups() {
    let db = crate::support::fresh_db().await;
    migrate_with(&db, &["--fair-by", "aggregate_type"]).await;
    let client = db.client().await;
    // Many more groups than a claim takes, each of its rows a group's head in its turn.
    let (backlog, groups) = (20_000, 2_000);
    client
        .execute(
            "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload)
             SELECT 'bulk-' || g, 'import', (g % $2::int)::text, 'row.imported', jsonb_build_object('n', g)
             FROM generate_series(1, $1::int) g",
            &[&backlog, &groups],
        )
        .await
        .unwrap();
    client
        .batch_execute(
            "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload)
             VALUES ('quiet-1', 'order', 'q', 'order.paid', '{}')",
        )
        .await
        .unwrap();
    let queue = create_queue("fair-many.fifo", &[]).await;
    let batch = 100;
    // One claim at a time, so the rows sent before the quiet one count the claims before it.
    let relay = RelayProcess::spawn(
        &run_args(
            &db,
            &queue,
            sqs().endpoint(),
            &[
                "--fair-by",
                "aggregate_type",
                "--batch-size",
                "100",
                "--max-in-flight",
                "1",
            ],
        ),
        &[],
    );
    let (sent, reason) = settled(&client, "quiet-1").await;
    assert!(sent, "quiet-1 {reason:?}: {}", relay.output());
    relay.sigterm();
    relay.wait_exit(Duration::from_secs(30)).await;
    let ahead: i64 = client
        .query_one(
            "SELECT count(*) FROM outbox WHERE aggregate_type = 'import'
             AND sent_at <= (SELECT sent_at FROM outbox WHERE event_id = 'quiet-1')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        ahead < 4 * batch,
        "{ahead} backlog rows went before the quiet tenant's (more than 3 claims and the one settled beside them)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_numbers_arrive_as_the_database_holds_them() {
    let db = migrated_db().await;
    let client = db.client().await;
    client
        .batch_execute(
            "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload, headers)
             VALUES ('n-1', 'order', '1', 'order.paid', '{}',
                     '{\"big\": 12345678901234567890123, \"exact\": 0.1000000000000000055511151231257827, \"small\": 7}')",
        )
        .await
        .unwrap();
    let queue = create_queue("numbers", &[]).await;
    let _relay = RelayProcess::spawn(&run_args(&db, &queue, sqs().endpoint(), &[]), &[]);
    let received = receive_all(&queue, 1, Duration::from_secs(60)).await;
    assert_eq!(received.len(), 1);
    let m = &received[0];
    assert_eq!(attr(m, "big"), Some("12345678901234567890123"));
    assert_eq!(
        attr(m, "exact"),
        Some("0.1000000000000000055511151231257827")
    );
    assert_eq!(attr(m, "small"), Some("7"));
}
