//! The SQL of `outbox.rs` against the real PostgreSQL: claim rules and fenced settlement.

use std::time::Duration;

use outbox_relay::outbox::{ClaimRequest, ClaimStrategy, OrderScope, Ordered, Outbox, Session};
use outbox_relay::row::KeyColumn;
use outbox_relay::row::{QuarantineReason, QuarantinedRow, RescheduledRow, SentRow, Settlement};

use crate::scenario::{count, events, insert, migrated_db};
use crate::support::{count_claims, wait_until, TestDb};

fn request(owner: &str, lease: Duration, limit: i64) -> ClaimRequest {
    ClaimRequest {
        limit,
        owner: owner.into(),
        lease,
        budget_bytes: i64::MAX,
        cursor: None,
        catching_up: false,
    }
}

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

    let first = s
        .claim(&request("a", Duration::from_secs(30), 3))
        .await
        .unwrap()
        .rows;
    let ids: Vec<i64> = first.iter().map(|r| r.id).collect();
    assert_eq!(ids, vec![1, 2, 3]);
    assert!(first.iter().all(|r| r.attempts == 1 && r.lease_token == 1));
    assert_eq!(first[0].event_id, "order-0");
    let second = s
        .claim(&request("b", Duration::from_secs(30), 10))
        .await
        .unwrap()
        .rows;
    let ids: Vec<i64> = second.iter().map(|r| r.id).collect();
    assert_eq!(
        ids,
        vec![4, 5],
        "leased rows and rows waiting for later are skipped"
    );
    assert!(s
        .claim(&request("c", Duration::from_secs(30), 10))
        .await
        .unwrap()
        .rows
        .is_empty());
}

/// Every row as a settlement could change it.
async fn snapshot(client: &tokio_postgres::Client) -> Vec<String> {
    client
        .query(
            "SELECT concat_ws('|', id, attempts, available_at, last_error, sent_at, message_id, \
                              quarantined_at, quarantine_reason) \
             FROM outbox ORDER BY id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// The fence end to end: A's claim ends, B's claim takes its rows over (removing A's claim), so
/// A's late settlement of any kind changes nothing and counts its rows lost, while B's lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settlement_after_the_lease_was_taken_over_changes_nothing() {
    let db = migrated_db().await;
    let client = db.client().await;
    insert(&client, &events("fence", 4, 2), Duration::ZERO).await;
    let a = session(&db, "outbox").await;
    let b = session(&db, "outbox").await;

    let a_rows = a
        .claim(&request("a", Duration::from_millis(200), 10))
        .await
        .unwrap()
        .rows;
    assert_eq!(a_rows.len(), 4);
    assert!(a_rows.iter().all(|r| r.lease_token == 1 && r.attempts == 1));
    wait_until("A's lease expires", Duration::from_secs(10), || async {
        count_claims(&client, "owner = 'a' AND until < now()").await == 1
    })
    .await;
    let finding = b
        .claim(&request("b", Duration::from_secs(30), 10))
        .await
        .unwrap();
    assert_eq!(
        (finding.rows.len(), finding.freed),
        (0, 4),
        "the claim that finds A's ended claim takes it over after it"
    );
    let b_rows = b
        .claim(&request("b", Duration::from_secs(30), 10))
        .await
        .unwrap()
        .rows;
    assert_eq!(b_rows.len(), 4, "expired leases are taken over");
    assert!(b_rows.iter().all(|r| r.lease_token == 2 && r.attempts == 2));
    assert_eq!(
        count_claims(&client, "true").await,
        1,
        "the takeover removed A's claim"
    );
    assert_eq!(
        count(&client, "attempts = 1").await,
        4,
        "A's attempt, ended without an outcome, is counted by the takeover"
    );
    let before = snapshot(&client).await;

    // Every kind of late settlement by A is refused and reported as lost.
    let late = a
        .write_settlement("a", &sent(&a_rows), false)
        .await
        .unwrap();
    assert_eq!((late.sent, late.lost), (0, 4));
    let late = a
        .write_settlement(
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
            false,
        )
        .await
        .unwrap();
    assert_eq!((late.rescheduled, late.lost), (0, 2));
    assert!(late.quarantined_reasons.is_empty());
    // All three kinds at once, as the relay settles a claim.
    let late = a
        .write_settlement("a", &mixed(&a_rows), false)
        .await
        .unwrap();
    assert_eq!(
        (
            late.sent,
            late.rescheduled,
            late.quarantined_reasons.len(),
            late.lost
        ),
        (0, 0, 0, 3)
    );
    assert_eq!(
        snapshot(&client).await,
        before,
        "A's late settlements changed nothing"
    );
    assert_eq!(
        count(
            &client,
            "id IN (SELECT unnest(ids) FROM outbox_claims WHERE owner = 'b' AND until > now())"
        )
        .await,
        4,
        "B still holds every row"
    );

    // The owner's settlement lands, and ends its claim.
    let done = b
        .write_settlement("b", &sent(&b_rows), false)
        .await
        .unwrap();
    assert_eq!((done.sent, done.lost), (4, 0));
    assert_eq!(
        count(
            &client,
            "sent_at IS NOT NULL AND message_id LIKE 'm-%' AND attempts = 2"
        )
        .await,
        4
    );
    assert_eq!(count_claims(&client, "true").await, 0, "no lease left");
    // Settling again (as the relay does when the first answer was lost) does not count twice,
    // nor as lost: the rows are B's own outcome.
    let again = b.write_settlement("b", &sent(&b_rows), true).await.unwrap();
    assert_eq!((again.sent, again.lost), (0, 0));
}

/// One of each outcome for `rows[0..3]`: sent, released, quarantined.
fn mixed(rows: &[outbox_relay::row::ClaimedRow]) -> Settlement {
    Settlement {
        sent: sent(&rows[..1]).sent,
        reschedule: vec![RescheduledRow {
            id: rows[1].id,
            lease_token: rows[1].lease_token,
            delay: Duration::from_secs(3600),
            error: Some("retry later".into()),
            refund: false,
        }],
        quarantine: vec![QuarantinedRow {
            id: rows[2].id,
            lease_token: rows[2].lease_token,
            reason: QuarantineReason::SenderFault,
            error: "bad".into(),
            retry_in: None,
        }],
        server: None,
        lease: Duration::ZERO,
    }
}

/// The relay retries a settlement whose statement may have committed before the connection
/// dropped: the rows the first try settled are not lost leases the second time, whether
/// marked or deleted; a row another owner claimed meanwhile still is. (A settlement that is not
/// a retry and finds its claim gone counts every row lost: only a takeover removes a claim.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_settlement_counts_only_rows_another_owner_took_as_lost() {
    for delete_on_ack in [false, true] {
        let db = migrated_db().await;
        let client = db.client().await;
        insert(&client, &events("twice", 4, 4), Duration::ZERO).await;
        let a = Outbox::new(&db.url, "outbox".parse().unwrap(), Duration::from_secs(5))
            .unwrap()
            .delete_on_ack(delete_on_ack)
            .connect()
            .await
            .unwrap();
        // Two claims: the first three rows, settled; the fourth, whose lease B takes over.
        let mut rows = a
            .claim(&request("a", Duration::from_secs(30), 3))
            .await
            .unwrap()
            .rows;
        rows.extend(
            a.claim(&request("a", Duration::from_millis(300), 10))
                .await
                .unwrap()
                .rows,
        );
        assert_eq!(rows.len(), 4);
        assert_eq!(rows[3].lease_token, 2, "delete_on_ack={delete_on_ack}");

        let settlement = mixed(&rows);
        let first = a.write_settlement("a", &settlement, false).await.unwrap();
        assert_eq!(
            (
                first.sent,
                first.rescheduled,
                first.quarantined_reasons.len(),
                first.lost
            ),
            (1, 1, 1, 0),
            "delete_on_ack={delete_on_ack}"
        );
        let settled = snapshot(&client).await;
        let again = a.write_settlement("a", &settlement, true).await.unwrap();
        assert_eq!(
            (
                again.sent,
                again.rescheduled,
                again.quarantined_reasons.len(),
                again.lost
            ),
            (0, 0, 0, 0),
            "delete_on_ack={delete_on_ack}: applied by the first try, not lost"
        );
        let unretried = a.write_settlement("a", &settlement, false).await.unwrap();
        assert_eq!(
            (unretried.sent, unretried.lost),
            (0, 3),
            "delete_on_ack={delete_on_ack}"
        );
        assert_eq!(
            snapshot(&client).await,
            settled,
            "delete_on_ack={delete_on_ack}: applied once"
        );

        // The fourth row's lease expires and B takes it over: A's late outcome is lost,
        // counted once, next to rows A had settled already.
        wait_until("A's lease expires", Duration::from_secs(10), || async {
            count_claims(&client, "owner = 'a' AND until < now()").await == 1
        })
        .await;
        let b = session(&db, "outbox").await;
        let taken =
            crate::support::claim_taking_over(&b, &request("b", Duration::from_secs(30), 10))
                .await
                .rows;
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].id, rows[3].id);
        let mut late = mixed(&rows);
        late.sent.extend(sent(&rows[3..]).sent);
        let settled = a.write_settlement("a", &late, true).await.unwrap();
        assert_eq!(
            (settled.sent, settled.lost),
            (0, 1),
            "delete_on_ack={delete_on_ack}: only B's row is lost"
        );
        assert_eq!(
            count(
                &client,
                "sent_at IS NULL AND id IN (SELECT unnest(ids) FROM outbox_claims WHERE owner = 'b')"
            )
            .await,
            1
        );
        assert_eq!(count_claims(&client, "owner = 'a'").await, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_gives_the_attempt_back_and_a_retry_spends_it() {
    let db = migrated_db().await;
    let client = db.client().await;
    insert(&client, &events("refund", 2, 1), Duration::ZERO).await;
    let s = session(&db, "outbox").await;
    let rows = s
        .claim(&request("r", Duration::from_secs(30), 10))
        .await
        .unwrap()
        .rows;
    let settled = s
        .write_settlement(
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
            false,
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
        count_claims(&client, "true").await,
        0,
        "released: the claim is gone"
    );
    assert_eq!(
        s.claim(&request("r", Duration::from_secs(30), 10))
            .await
            .unwrap()
            .rows
            .iter()
            .map(|r| (r.id, r.attempts))
            .collect::<Vec<_>>(),
        vec![(1, 1)],
        "the refunded row is claimable at once, this attempt still its first"
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

/// Rows parked in quarantine (`destination`: their queue refused them; `blocked`: behind a
/// quarantined row of their group) are waiting, not refused: the unsent gauges count them and
/// age with them. Rows quarantined as bad input are not unsent; every quarantined row ages the
/// quarantine gauge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_count_rows_parked_in_quarantine_as_unsent_and_age_the_quarantine() {
    let db = migrated_db().await;
    let client = db.client().await;
    let s = session(&db, "outbox").await;
    insert(&client, &events("parked", 6, 2), Duration::ZERO).await;
    // Ids 1-2 parked for their destination (the oldest rows, an hour old), 3 parked behind a
    // quarantined head, 4 bad input quarantined 10 minutes ago, 5-6 claimable and a minute old.
    client
        .batch_execute(
            "UPDATE outbox SET created_at = now() - interval '1 hour',
                               quarantined_at = now() - interval '2 minutes',
                               quarantine_reason = 'destination'
             WHERE id IN (1, 2);
             UPDATE outbox SET created_at = now() - interval '2 minutes',
                               quarantined_at = now(), quarantine_reason = 'blocked'
             WHERE id = 3;
             UPDATE outbox SET created_at = now() - interval '1 day',
                               quarantined_at = now() - interval '10 minutes',
                               quarantine_reason = 'invalid'
             WHERE id = 4;
             UPDATE outbox SET created_at = now() - interval '1 minute' WHERE id IN (5, 6)",
        )
        .await
        .unwrap();
    let st = s.stats().await.unwrap();
    assert_eq!((st.unsent, st.quarantined, st.blocked), (5, 4, 1));
    assert!(
        (3600.0..3700.0).contains(&st.oldest_unsent_age_seconds),
        "the parked rows are the oldest unsent ones: {}",
        st.oldest_unsent_age_seconds
    );
    assert!(
        (600.0..700.0).contains(&st.oldest_quarantined_age_seconds),
        "id 4 has been in quarantine longest: {}",
        st.oldest_quarantined_age_seconds
    );
    assert_eq!(st.claim_floor, 5, "parked rows are not claimable");

    // With nothing claimable left, the parked rows still hold the age up.
    client
        .batch_execute("UPDATE outbox SET sent_at = now() WHERE id IN (5, 6)")
        .await
        .unwrap();
    let st = s.stats().await.unwrap();
    assert_eq!((st.unsent, st.claim_floor), (3, 0));
    assert!(st.oldest_unsent_age_seconds >= 3600.0);

    // Re-driven and sent: every gauge back to 0.
    client
        .batch_execute(
            "UPDATE outbox SET quarantined_at = NULL, quarantine_reason = NULL, sent_at = now()",
        )
        .await
        .unwrap();
    let st = s.stats().await.unwrap();
    assert_eq!(
        (
            st.unsent,
            st.quarantined,
            st.oldest_unsent_age_seconds,
            st.oldest_quarantined_age_seconds
        ),
        (0, 0, 0.0, 0.0)
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
        .claim(&request("odd", Duration::from_secs(30), 10))
        .await
        .unwrap()
        .rows;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].payload, "{\"ok\": true}");
    let done = s
        .write_settlement("odd", &sent(&rows), false)
        .await
        .unwrap();
    assert_eq!(done.sent, 1);
}

async fn ordered_session(db: &TestDb, skip_poison: bool) -> Session {
    Outbox::new(&db.url, "outbox".parse().unwrap(), Duration::from_secs(5))
        .unwrap()
        .claim_strategy(ClaimStrategy::Ordered(Ordered {
            key: KeyColumn::AggregateId,
            routing: Default::default(),
            skip_poison,
            scope: OrderScope::Every,
            by: Default::default(),
        }))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordered_claim_takes_a_run_per_group_and_reaches_a_group_behind_a_long_backlog() {
    let db = migrated_db().await;
    let client = db.client().await;
    // 3,000 rows of one group, then one row of another: beyond the window of the oldest rows.
    insert(&client, &events("long", 3000, 1), Duration::ZERO).await;
    let mut late = events("late", 1, 1);
    late[0].aggregate_id = "other".into();
    insert(&client, &late, Duration::ZERO).await;
    let s = ordered_session(&db, false).await;
    let mut cursor = None;
    let mut claimed = Vec::new();
    for _ in 0..5 {
        let mut r = request("o", Duration::from_secs(30), 100);
        r.cursor = cursor.take();
        let c = s.claim(&r).await.unwrap();
        cursor = c.cursor;
        claimed.extend(c.rows);
        if claimed.iter().any(|r| r.aggregate_id == "other") {
            break;
        }
    }
    let long: Vec<i64> = claimed
        .iter()
        .filter(|r| r.aggregate_id != "other")
        .map(|r| r.id)
        .collect();
    assert_eq!(
        long,
        (1..=30).collect::<Vec<_>>(),
        "the long group's head and, with few heads found, the 29 rows after it, once"
    );
    assert!(
        claimed.iter().any(|r| r.aggregate_id == "other"),
        "the group behind the backlog is reached"
    );
    // Nothing more of the long group while its run is leased.
    let again = s
        .claim(&request("o", Duration::from_secs(30), 100))
        .await
        .unwrap();
    assert!(again.rows.is_empty(), "{:?}", again.rows);
    // Settled, the next run follows.
    let settled = s
        .write_settlement("o", &sent(&claimed), false)
        .await
        .unwrap();
    assert_eq!(settled.sent, claimed.len() as u64);
    let next = s
        .claim(&request("o", Duration::from_secs(30), 100))
        .await
        .unwrap()
        .rows;
    let ids: Vec<i64> = next.iter().map(|r| r.id).collect();
    assert_eq!(ids, (31..=60).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_parked_for_its_queue_keeps_its_attempt_and_comes_back_when_its_time_has_come() {
    let db = migrated_db().await;
    let client = db.client().await;
    insert(&client, &events("park", 2, 1), Duration::ZERO).await;
    let s = session(&db, "outbox").await;
    let rows = s
        .claim(&request("a", Duration::from_secs(30), 10))
        .await
        .unwrap()
        .rows;
    assert_eq!(rows.len(), 2);
    let park = |row: &outbox_relay::row::ClaimedRow, retry_in: Duration| QuarantinedRow {
        id: row.id,
        lease_token: row.lease_token,
        reason: QuarantineReason::Destination,
        error: "queue q: QueueDoesNotExist".into(),
        retry_in: Some(retry_in),
    };
    let settled = s
        .write_settlement(
            "a",
            &Settlement {
                quarantine: vec![
                    park(&rows[0], Duration::ZERO),
                    park(&rows[1], Duration::from_secs(3600)),
                ],
                ..Settlement::default()
            },
            false,
        )
        .await
        .unwrap();
    assert_eq!(settled.quarantined_reasons.len(), 2);
    assert_eq!(
        count(
            &client,
            "quarantine_reason = 'destination' AND attempts = 0 \
             AND id NOT IN (SELECT unnest(ids) FROM outbox_claims)"
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
    let again = s
        .claim(&request("a", Duration::from_secs(30), 10))
        .await
        .unwrap()
        .rows;
    assert_eq!(again.len(), 1);
    assert_eq!((again[0].id, again[0].attempts), (rows[0].id, 1));
    assert_eq!(s.unpark_destinations().await.unwrap(), 0);
}

/// Claims stop at the byte budget (the first row always goes), in every strategy: memory is
/// bounded by bytes, not rows. Before, a claim took its rows whatever their size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_stop_at_the_byte_budget() {
    let db = migrated_db().await;
    let client = db.client().await;
    let mut written = events("big", 10, 10);
    for e in &mut written {
        // About 100 KB of JSON text each; compressible, so the stored size is far smaller.
        e.payload = serde_json::json!({"blob": "x".repeat(100_000)});
    }
    insert(&client, &written, Duration::ZERO).await;
    let budget = |bytes: i64| {
        let mut r = request("b", Duration::from_secs(30), 100);
        r.budget_bytes = bytes;
        r
    };
    let plain = session(&db, "outbox").await;
    let rows = plain.claim(&budget(250_000)).await.unwrap().rows;
    assert_eq!(rows.len(), 3, "0 + 100 KB + 200 KB started below 250 KB");
    let rows = plain.claim(&budget(1)).await.unwrap().rows;
    assert_eq!(rows.len(), 1, "the first row goes whatever its size");
    let ordered = ordered_session(&db, false).await;
    let rows = ordered.claim(&budget(150_000)).await.unwrap().rows;
    assert_eq!(rows.len(), 2);
}

/// A group's unsent rows need not be one stretch: a replayed row between sent ones and a new
/// row behind them are both heads (fair claims probe a value's first pending rows, each a
/// head). Each is claimed once, and the run behind the first stops at the second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_heads_of_one_group_are_each_claimed_once() {
    let db = migrated_db().await;
    crate::scenario::migrate_with(&db, &["--fair-by", "aggregate_type"]).await;
    let client = db.client().await;
    insert(&client, &events("gap", 4, 1), Duration::ZERO).await;
    client
        .batch_execute(
            "UPDATE outbox SET sent_at = now() WHERE event_id IN ('gap-0', 'gap-1', 'gap-2');
             UPDATE outbox SET sent_at = NULL WHERE event_id = 'gap-1';",
        )
        .await
        .unwrap();
    let s = Outbox::new(&db.url, "outbox".parse().unwrap(), Duration::from_secs(5))
        .unwrap()
        .claim_strategy(ClaimStrategy::OrderedFair {
            ordered: Ordered {
                key: KeyColumn::AggregateId,
                routing: Default::default(),
                skip_poison: false,
                scope: OrderScope::Every,
                by: Default::default(),
            },
            fair: KeyColumn::AggregateType,
        })
        .unwrap()
        .connect()
        .await
        .unwrap();
    let rows = s
        .claim(&request("gap", Duration::from_secs(30), 100))
        .await
        .unwrap()
        .rows;
    let ids: Vec<&str> = rows.iter().map(|r| r.event_id.as_str()).collect();
    assert_eq!(ids, ["gap-1", "gap-3"], "each head once");
}

/// Under `--on-poison skip` a quarantined row no longer holds its group, but a row the relay
/// parked is not poison: one parked `blocked` (behind a quarantined head, by a relay that ran
/// with `--on-poison block`) or `destination` (its queue refused the relay) still holds the rows
/// behind it. Every ordered strategy's skip-poison claim, run on a table with three groups whose
/// heads are parked `blocked`, parked `destination` and quarantined `invalid`: only the
/// poisoned group's next row is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skipping_poison_never_skips_rows_the_relay_parked() {
    let mut wrong = Vec::new();
    for (name, strategy) in crate::claim_races::ordered_strategies(true) {
        let db = crate::claim_races::table_for_every_strategy().await;
        let client = db.client().await;
        let mut rows = Vec::new();
        for group in ["blocked", "destination", "poison"] {
            for mut e in events(group, 2, 1) {
                e.aggregate_id = group.into();
                // Bound for a FIFO queue, so the strategies that order only such rows order them.
                e.queue_url = Some("https://sqs.example/000/g.fifo".into());
                rows.push(e);
            }
        }
        insert(&client, &rows, Duration::ZERO).await;
        client
            .batch_execute(
                "UPDATE outbox SET quarantined_at = now(), quarantine_reason = CASE event_id
                     WHEN 'blocked-0' THEN 'blocked'
                     WHEN 'destination-0' THEN 'destination'
                     ELSE 'invalid' END
                 WHERE event_id IN ('blocked-0', 'destination-0', 'poison-0')",
            )
            .await
            .unwrap();
        let s = Outbox::new(&db.url, "outbox".parse().unwrap(), Duration::from_secs(5))
            .unwrap()
            .claim_strategy(strategy)
            .unwrap()
            .connect()
            .await
            .unwrap();
        // With --order-by transaction a row is claimable once no older transaction of the
        // cluster runs (other tests hold some open): claimed again until the claim takes rows.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let claimed = loop {
            let rows = s
                .claim(&request("poison", Duration::from_secs(30), 10))
                .await
                .unwrap()
                .rows;
            if !rows.is_empty() || std::time::Instant::now() >= deadline {
                break rows;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let ids: Vec<&str> = claimed.iter().map(|r| r.event_id.as_str()).collect();
        if ids != ["poison-1"] {
            wrong.push(format!("{name}: {ids:?}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "claims that did not take exactly the row behind the poison: {wrong:#?}"
    );
}
