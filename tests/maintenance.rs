//! Statistics and maintenance on their own connection (`outbox::Maintenance`), against the real
//! PostgreSQL: counts exact up to the bound and extrapolated past it, every statement under
//! `--maintenance-timeout`, and unparking in batches.

use std::sync::Arc;
use std::time::Duration;

use outbox_relay::outbox::{Maintenance, Outbox, STATS_EXACT_UP_TO};

use crate::scenario::{count, migrated_db};
use crate::support::TestDb;

fn maintenance(db: &TestDb, timeout: Duration) -> Maintenance {
    let outbox = Outbox::new(&db.url, "outbox".parse().unwrap(), Duration::from_secs(5)).unwrap();
    Maintenance::new(Arc::new(outbox), timeout)
}

/// `rows` small events in one statement, ids 1..=rows.
async fn fill(client: &tokio_postgres::Client, rows: i64) {
    client
        .execute(
            "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload)
             SELECT 'big-' || n, 'order', (n % 10)::text, 'order.paid', '{}'::jsonb
             FROM generate_series(1, $1::bigint) AS n",
            &[&rows],
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_past_the_bound_are_estimated_from_the_id_span() {
    let db = migrated_db().await;
    let client = db.client().await;
    let rows = STATS_EXACT_UP_TO * 5 / 2;
    fill(&client, rows).await;
    let maintenance = maintenance(&db, Duration::from_secs(10));

    let all = maintenance.stats().await.unwrap();
    assert!(all.estimated);
    // Consecutive ids: the estimate is the count.
    assert_eq!((all.unsent, all.quarantined, all.claim_floor), (rows, 0, 1));

    // Every even id sent, and some odd ones quarantined (fewer than the bound: exact).
    client
        .batch_execute(
            "UPDATE outbox SET sent_at = now() WHERE id % 2 = 0;
             UPDATE outbox SET quarantined_at = now(), quarantine_reason = 'invalid'
             WHERE id % 2 = 1 AND id <= 2001",
        )
        .await
        .unwrap();
    let unsent = count(&client, "sent_at IS NULL AND quarantined_at IS NULL").await;
    let quarantined = count(&client, "quarantined_at IS NOT NULL").await;
    let half = maintenance.stats().await.unwrap();
    assert!(half.estimated);
    assert_eq!(half.quarantined, quarantined);
    assert!(
        (half.unsent - unsent).abs() * 100 <= unsent,
        "estimated {} unsent rows, there are {unsent}",
        half.unsent
    );
    assert_eq!(half.claim_floor, 2003);

    // Below the bound everything is counted.
    client
        .execute("DELETE FROM outbox WHERE id > 1000", &[])
        .await
        .unwrap();
    let small = maintenance.stats().await.unwrap();
    assert!(!small.estimated);
    assert_eq!(
        (small.unsent, small.quarantined),
        (
            count(&client, "sent_at IS NULL AND quarantined_at IS NULL").await,
            count(&client, "quarantined_at IS NOT NULL").await
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_past_the_maintenance_timeout_is_cancelled_and_the_next_pass_works() {
    let db = migrated_db().await;
    let mut client = db.client().await;
    fill(&client, 10).await;
    let maintenance = maintenance(&db, Duration::from_millis(300));
    assert_eq!(maintenance.stats().await.unwrap().unsent, 10);

    // A migration (or anything else) holding the table: the statistics wait for its lock.
    let lock = client.transaction().await.unwrap();
    lock.batch_execute("LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let err = maintenance.stats().await.unwrap_err();
    assert!(err.timed_out(), "{err}");
    let err = maintenance
        .delete_expired(Duration::from_secs(1), 100, None)
        .await
        .unwrap_err();
    assert!(err.timed_out(), "{err}");
    lock.rollback().await.unwrap();

    assert_eq!(maintenance.stats().await.unwrap().unsent, 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_parked_for_their_destination_are_unparked_in_batches_until_none_is_due() {
    let db = migrated_db().await;
    let client = db.client().await;
    fill(&client, 2_500).await;
    client
        .batch_execute(
            "UPDATE outbox SET quarantined_at = now(), quarantine_reason = 'destination',
                               available_at = now() - interval '1 second';
             UPDATE outbox SET available_at = now() + interval '1 hour' WHERE id <= 10",
        )
        .await
        .unwrap();
    let maintenance = maintenance(&db, Duration::from_secs(10));
    assert_eq!(maintenance.unpark_destinations().await.unwrap(), 2_490);
    assert_eq!(count(&client, "quarantined_at IS NOT NULL").await, 10);
    assert_eq!(maintenance.unpark_destinations().await.unwrap(), 0);
}
