//! Retention and delete-on-ack: the table keeps only what it must, and stays small.

use std::time::Duration;

use crate::scenario::{count, events, insert, migrated_db, run_args, wait_count};
use crate::support::{create_queue, receive_all, sqs, RelayProcess};

async fn table_bytes(client: &tokio_postgres::Client) -> i64 {
    client
        .query_one("SELECT pg_total_relation_size('outbox')", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_many_cycles_only_unsent_quarantined_and_retained_rows_remain_and_the_size_is_bounded(
) {
    // A cluster of its own: VACUUM can only reuse pages no transaction of any database still
    // needs, and the rest of the suite runs long transactions on the shared cluster.
    let cluster = crate::support::pg::PrivatePg::start().await;
    let db = cluster.create_db().await;
    crate::scenario::migrate(&db, "outbox").await;
    let client = db.client().await;
    let queue = create_queue("retention", &[]).await;
    let relay = RelayProcess::spawn(
        &run_args(
            &db,
            &queue,
            sqs().endpoint(),
            &["--retention", "1s", "--retention-interval", "200ms"],
        ),
        &[],
    );
    let cycles = 8;
    let per_cycle = 2000;
    let mut sizes = Vec::new();
    for cycle in 0..cycles {
        let mut batch = events(&format!("ret{cycle}"), per_cycle, 20);
        if cycle == 0 {
            // Two bad rows: quarantined, and kept however old they get. (Each kept row also
            // pins an index page, so the bound is measured on cycles of good rows.)
            batch[0].headers = serde_json::json!({"bad": [1]});
            batch[1].headers = serde_json::json!({"bad": {"x": 1}});
        }
        insert(&client, &batch, Duration::ZERO).await;
        wait_count(
            &client,
            "quarantined_at IS NOT NULL",
            2,
            Duration::from_secs(60),
        )
        .await;
        // Every good row is sent, then deleted once it is a second old.
        wait_count(
            &client,
            "quarantined_at IS NULL",
            0,
            Duration::from_secs(60),
        )
        .await;
        assert_eq!(
            count(&client, "true").await,
            2,
            "only the quarantined rows remain"
        );
        // What autovacuum does in production (per-table settings from migrate); a test cannot
        // wait for its naptime. A VACUUM may find the deleted rows still visible to a snapshot
        // of the relay's (a claim or statistics query in flight) and leave them for the next
        // one, as autovacuum would: a later cycle's size is read after a VACUUM that could
        // clean, tried a few times. A table that really grows stays large however often.
        let mut size = 0;
        for _ in 0..5 {
            client.batch_execute("VACUUM outbox").await.unwrap();
            size = table_bytes(&client).await;
            match sizes.get(2) {
                Some(&settled) if size > settled + settled / 10 => {
                    tokio::time::sleep(Duration::from_millis(500)).await
                }
                _ => break,
            }
        }
        sizes.push(size);
    }
    println!("pg_total_relation_size per cycle: {sizes:?}");
    // After the first cycles have sized the free space, later cycles reuse it.
    let settled = sizes[2];
    assert!(
        sizes[3..].iter().all(|&s| s <= settled + settled / 10),
        "the table keeps growing across cycles: {sizes:?}"
    );
    let sent = cycles * per_cycle - 2;
    let received = receive_all(&queue, sent, Duration::from_secs(120)).await;
    assert_eq!(received.len(), sent, "deleting sent rows lost no message");
    drop(relay);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_on_ack_removes_rows_once_sqs_has_them_and_keeps_quarantined_ones() {
    let db = migrated_db().await;
    let client = db.client().await;
    let queue = create_queue("deleteonack", &[]).await;
    let mut written = events("doa", 300, 10);
    written[7].headers = serde_json::json!({"bad": null});
    insert(&client, &written, Duration::ZERO).await;
    let relay = RelayProcess::spawn(
        &run_args(&db, &queue, sqs().endpoint(), &["--delete-on-ack"]),
        &[],
    );
    wait_count(&client, "true", 1, Duration::from_secs(60)).await;
    assert_eq!(
        count(&client, "quarantined_at IS NOT NULL AND event_id = 'doa-7'").await,
        1
    );
    let received = receive_all(&queue, 299, Duration::from_secs(60)).await;
    assert_eq!(crate::scenario::copies(&received).len(), 299);
    crate::support::wait_until("sent counter", Duration::from_secs(10), || async {
        relay.metric("outbox_events_sent_total").await == Some(299.0)
    })
    .await;
}
