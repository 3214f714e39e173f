//! The SQL of `outbox.rs` against the real PostgreSQL: claim rules and fenced settlement.

use std::time::Duration;

use outbox_relay::outbox::{Outbox, Session};
use outbox_relay::row::{QuarantineReason, QuarantinedRow, RescheduledRow, SentRow, Settlement};

use crate::scenario::{count, events, insert, migrated_db};
use crate::support::{wait_until, TestDb};

async fn session(db: &TestDb, table: &str) -> Session {
    Outbox::new(&db.url, table.parse().unwrap(), Duration::from_secs(5))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

fn sent(rows: &[outbox_relay::row::ClaimedRow]) -> Settlement {
    Settlement {
        sent: rows
            .iter()
            .map(|r| SentRow {
                id: r.id,
                lease_token: r.lease_token,
                message_id: format!("m-{}", r.id),
            })
            .collect(),
        ..Settlement::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_take_rows_in_id_order_and_skip_leased_and_future_rows() {
    let db = migrated_db().await;
    let client = db.client().await;
    insert(&client, &events("order", 5, 1), Duration::ZERO).await;
    insert(&client, &events("later", 3, 1), Duration::from_secs(3600)).await;
    let s = session(&db, "outbox").await;

    let first = s.claim("a", Duration::from_secs(30), 3, 0).await.unwrap();
    let ids: Vec<i64> = first.iter().map(|r| r.id).collect();
    assert_eq!(ids, vec![1, 2, 3]);
    assert!(first.iter().all(|r| r.attempts == 1 && r.lease_token == 1));
    assert_eq!(first[0].event_id, "order-0");
    let second = s.claim("b", Duration::from_secs(30), 10, 0).await.unwrap();
    let ids: Vec<i64> = second.iter().map(|r| r.id).collect();
    assert_eq!(
        ids,
        vec![4, 5],
        "leased rows and rows waiting for later are skipped"
    );
    assert!(s
        .claim("c", Duration::from_secs(30), 10, 0)
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settlement_after_the_lease_was_taken_over_changes_nothing() {
    let db = migrated_db().await;
    let client = db.client().await;
    insert(&client, &events("fence", 4, 2), Duration::ZERO).await;
    let a = session(&db, "outbox").await;
    let b = session(&db, "outbox").await;

    let a_rows = a
        .claim("a", Duration::from_millis(200), 10, 0)
        .await
        .unwrap();
    assert_eq!(a_rows.len(), 4);
    wait_until("A's lease expires", Duration::from_secs(10), || async {
        count(&client, "lease_until < now()").await == 4
    })
    .await;
    let b_rows = b.claim("b", Duration::from_secs(30), 10, 0).await.unwrap();
    assert_eq!(b_rows.len(), 4, "expired leases are taken over");
    assert!(b_rows.iter().all(|r| r.lease_token == 2 && r.attempts == 2));

    // Every kind of late settlement by A is refused and reported as lost.
    let late = a.settle("a", &sent(&a_rows)).await.unwrap();
    assert_eq!((late.sent, late.lost), (0, 4));
    let late = a
        .settle(
            "a",
            &Settlement {
                reschedule: vec![RescheduledRow {
                    id: a_rows[0].id,
                    lease_token: a_rows[0].lease_token,
                    delay: Duration::ZERO,
                    error: Some("late".into()),
                    refund: true,
                }],
                quarantine: vec![QuarantinedRow {
                    id: a_rows[1].id,
                    lease_token: a_rows[1].lease_token,
                    reason: QuarantineReason::SenderFault,
                    error: "late".into(),
                    retry_in: None,
                }],
                ..Settlement::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(late.lost, 2);
    assert!(late.quarantined_reasons.is_empty());
    assert_eq!(
        count(&client, "sent_at IS NOT NULL OR quarantined_at IS NOT NULL").await,
        0
    );
    assert_eq!(count(&client, "lease_owner = 'b'").await, 4);

    // The owner's settlement lands.
    let done = b.settle("b", &sent(&b_rows)).await.unwrap();
    assert_eq!((done.sent, done.lost), (4, 0));
    assert_eq!(
        count(
            &client,
            "sent_at IS NOT NULL AND message_id LIKE 'm-%' AND lease_until IS NULL"
        )
        .await,
        4
    );
    // Settling twice does not count twice.
    let again = b.settle("b", &sent(&b_rows)).await.unwrap();
    assert_eq!((again.sent, again.lost), (0, 4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_gives_the_attempt_back_and_a_retry_spends_it() {
    let db = migrated_db().await;
    let client = db.client().await;
    insert(&client, &events("refund", 2, 1), Duration::ZERO).await;
    let s = session(&db, "outbox").await;
    let rows = s.claim("r", Duration::from_secs(30), 10, 0).await.unwrap();
    let settled = s
        .settle(
            "r",
            &Settlement {
                reschedule: rows
                    .iter()
                    .map(|r| RescheduledRow {
                        id: r.id,
                        lease_token: r.lease_token,
                        delay: Duration::from_secs(if r.id == 1 { 0 } else { 3600 }),
                        error: Some(format!("err-{}", r.id)),
                        refund: r.id == 1,
                    })
                    .collect(),
                ..Settlement::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(settled.rescheduled, 2);
    let r: Vec<(i64, i32, bool, String)> = client
        .query(
            "SELECT id, attempts, available_at > now() + interval '1 minute', last_error FROM outbox ORDER BY id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    assert_eq!(
        r,
        vec![
            (1, 0, false, "err-1".to_string()),
            (2, 1, true, "err-2".to_string())
        ]
    );
    assert_eq!(
        count(&client, "lease_owner IS NULL AND lease_until IS NULL").await,
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_report_age_and_counts_from_the_partial_indexes() {
    let db = migrated_db().await;
    let client = db.client().await;
    let s = session(&db, "outbox").await;
    let empty = s.stats().await.unwrap();
    assert_eq!(
        (
            empty.oldest_unsent_age_seconds,
            empty.unsent,
            empty.quarantined
        ),
        (0.0, 0, 0)
    );
    insert(&client, &events("stats", 3, 1), Duration::ZERO).await;
    client
        .batch_execute(
            "UPDATE outbox SET created_at = now() - interval '90 seconds' WHERE id = 1;
             UPDATE outbox SET quarantined_at = now(), quarantine_reason = 'invalid' WHERE id = 3",
        )
        .await
        .unwrap();
    let st = s.stats().await.unwrap();
    assert!(st.oldest_unsent_age_seconds >= 90.0 && st.oldest_unsent_age_seconds < 120.0);
    assert_eq!((st.unsent, st.quarantined), (2, 1));
    let plan: Vec<String> = client
        .query("EXPLAIN SELECT created_at FROM outbox WHERE sent_at IS NULL AND quarantined_at IS NULL ORDER BY id LIMIT 1", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        plan.iter().any(|l| l.contains("outbox_unsent_idx")),
        "{plan:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_qualified_table_with_odd_names_is_claimed_through_quoted_identifiers() {
    let db = crate::support::fresh_db().await;
    let table = "\"sch.ema\".\"out\"\"box\"";
    crate::scenario::migrate(&db, table).await;
    let client = db.client().await;
    client
        .execute(
            "INSERT INTO \"sch.ema\".\"out\"\"box\" (event_id, aggregate_type, aggregate_id, event_type, payload)
             VALUES ('odd-1', 'order', '1', 'order.paid', '{\"ok\":true}')",
            &[],
        )
        .await
        .unwrap();
    let s = session(&db, table).await;
    let rows = s
        .claim("odd", Duration::from_secs(30), 10, 0)
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].payload, "{\"ok\": true}");
    let done = s.settle("odd", &sent(&rows)).await.unwrap();
    assert_eq!(done.sent, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_parked_for_its_queue_keeps_its_attempt_and_comes_back_when_its_time_has_come() {
    let db = migrated_db().await;
    let client = db.client().await;
    insert(&client, &events("park", 2, 1), Duration::ZERO).await;
    let s = session(&db, "outbox").await;
    let rows = s.claim("a", Duration::from_secs(30), 10, 0).await.unwrap();
    assert_eq!(rows.len(), 2);
    let park = |row: &outbox_relay::row::ClaimedRow, retry_in: Duration| QuarantinedRow {
        id: row.id,
        lease_token: row.lease_token,
        reason: QuarantineReason::Destination,
        error: "queue q: QueueDoesNotExist".into(),
        retry_in: Some(retry_in),
    };
    let settled = s
        .settle(
            "a",
            &Settlement {
                quarantine: vec![
                    park(&rows[0], Duration::ZERO),
                    park(&rows[1], Duration::from_secs(3600)),
                ],
                ..Settlement::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(settled.quarantined_reasons.len(), 2);
    assert_eq!(
        count(
            &client,
            "quarantine_reason = 'destination' AND attempts = 0 AND lease_until IS NULL"
        )
        .await,
        2,
        "parked, not failed: the claim's attempt is given back"
    );
    assert_eq!(
        count(&client, "available_at > now() + interval '30 minutes'").await,
        1
    );

    assert_eq!(
        s.unpark_destinations().await.unwrap(),
        1,
        "only the one due"
    );
    assert_eq!(
        count(
            &client,
            "quarantined_at IS NULL AND quarantine_reason IS NULL AND last_error LIKE '%QueueDoesNotExist%'"
        )
        .await,
        1,
        "unsent again, its error kept for the record"
    );
    let again = s.claim("a", Duration::from_secs(30), 10, 0).await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!((again[0].id, again[0].attempts), (rows[0].id, 1));
    assert_eq!(s.unpark_destinations().await.unwrap(), 0);
}
