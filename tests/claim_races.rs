//! Interleavings of claims with each other, with parking and with the relay's own deadline,
//! each held open by a test transaction rather than left to timing (issue 26, items 2, 3, 6).

use std::sync::Arc;
use std::time::Duration;

use outbox_relay::outbox::{
    ClaimLimits, ClaimRequest, ClaimStrategy, Maintenance, OrderBy, OrderScope, Ordered, Outbox,
};
use outbox_relay::row::{KeyColumn, SentRow, Settlement};

use crate::scenario::{count, events, insert, migrate_with, migrated_db, run_args};
use crate::support::{count_claims, create_queue, sqs, wait_until, RelayProcess, TestDb};

/// The claim lock of the default table, as sql/claim_lock.sql takes it.
const CLAIM_LOCK: &str =
    "SELECT pg_advisory_xact_lock(1869968482, '\"outbox_claims\"'::regclass::oid::int)";

const WAIT: Duration = Duration::from_secs(60);

fn request(limit: i64) -> ClaimRequest {
    ClaimRequest {
        limit,
        owner: "races".into(),
        lease: Duration::from_secs(300),
        budget_bytes: i64::MAX,
        cursor: None,
        catching_up: false,
    }
}

/// Every ordered strategy, with `--on-poison skip` where a quarantined row lets its group on.
pub(crate) fn ordered_strategies(skip_poison: bool) -> Vec<(&'static str, ClaimStrategy)> {
    let ordered = |scope: OrderScope, by: OrderBy| Ordered {
        key: KeyColumn::AggregateId,
        routing: Default::default(),
        skip_poison,
        scope,
        by,
    };
    let fifo_rows = || OrderScope::FifoDestinations {
        route_by: KeyColumn::AggregateType,
        fifo_routes: Vec::new(),
    };
    let mut all = Vec::new();
    for (by, name) in [(OrderBy::Id, "id"), (OrderBy::Transaction, "transaction")] {
        let label = |what: &str| -> &'static str { Box::leak(format!("{what}, by {name}").into()) };
        all.push((
            label("ordered"),
            ClaimStrategy::Ordered(ordered(OrderScope::Every, by)),
        ));
        all.push((
            label("ordered + fair"),
            ClaimStrategy::OrderedFair {
                ordered: ordered(OrderScope::Every, by),
                fair: KeyColumn::AggregateType,
            },
        ));
        all.push((
            label("FIFO rows ordered"),
            ClaimStrategy::Ordered(ordered(fifo_rows(), by)),
        ));
        all.push((
            label("FIFO rows ordered + fair"),
            ClaimStrategy::OrderedFair {
                ordered: ordered(fifo_rows(), by),
                fair: KeyColumn::AggregateType,
            },
        ));
    }
    all
}

/// A table with what every strategy needs: the fair key's index and the writing transaction.
pub(crate) async fn table_for_every_strategy() -> TestDb {
    let db = migrated_db().await;
    migrate_with(
        &db,
        &["--fair-by", "aggregate_type", "--order-by", "transaction"],
    )
    .await;
    db
}

/// Group G = A, B, C (bound for a FIFO queue), B too large to hold. Claim 1 leases A (and, where
/// the claim reaches it, quarantines B at claim; elsewhere B is quarantined as a sender fault
/// would). Claim 2, before claim 1 is settled, must take nothing of G: A is in flight, and
/// under --on-poison skip the poison B between them does not make C a head.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_ordered_strategy_takes_a_group_mate_of_a_leased_row() {
    let mut taken = Vec::new();
    for (name, strategy) in ordered_strategies(true) {
        let db = table_for_every_strategy().await;
        let client = db.client().await;
        let mut g = events("g", 3, 1);
        for e in &mut g {
            e.queue_url = Some("https://sqs.example/000/g.fifo".into());
        }
        g[1].payload = serde_json::json!({ "blob": "x".repeat(4000) });
        insert(&client, &g, Duration::ZERO).await;
        let s = Outbox::new(&db.url, "outbox".parse().unwrap(), Duration::from_secs(5))
            .unwrap()
            .claim_strategy(strategy)
            .unwrap()
            .claim_limits(ClaimLimits {
                max_payload_bytes: 1024,
                max_attempts: 10,
            })
            .connect()
            .await
            .unwrap();
        // With --order-by transaction a row is claimable once no older transaction of the
        // cluster runs (other tests hold some open): claim 1 is retried until it finds the head.
        let deadline = std::time::Instant::now() + WAIT;
        let first = loop {
            let claimed = s.claim(&request(10)).await.unwrap();
            if !claimed.rows.is_empty() || std::time::Instant::now() >= deadline {
                break claimed;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let ids: Vec<&str> = first.rows.iter().map(|r| r.event_id.as_str()).collect();
        assert_eq!(ids, ["g-0"], "{name}: claim 1 leases the head alone");
        client
            .batch_execute(
                "UPDATE outbox SET quarantined_at = now(), quarantine_reason = 'too_large'
                 WHERE event_id = 'g-1' AND quarantined_at IS NULL",
            )
            .await
            .unwrap();
        let second = s.claim(&request(10)).await.unwrap();
        let ids: Vec<String> = second.rows.iter().map(|r| r.event_id.clone()).collect();
        if !ids.is_empty() {
            taken.push(format!("{name}: {ids:?}"));
        }
    }
    assert!(
        taken.is_empty(),
        "claim 2 took a group-mate of the leased g-0: {taken:#?}"
    );
}

/// Parking (--on-poison block) while a claim holds the claim lock with its lease written but
/// not committed: parking waits for the lock, and once the claim commits it must see that
/// lease and leave the leased row alone, whatever isolation the database defaults to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parking_waits_for_a_claim_and_never_parks_the_row_it_leased() {
    for isolation in ["read committed", "repeatable read", "serializable"] {
        let db = table_for_every_strategy().await;
        let admin = db.client().await;
        admin
            .batch_execute(&format!(
                "ALTER DATABASE \"{}\" SET default_transaction_isolation = '{isolation}'",
                db.name
            ))
            .await
            .unwrap();
        // G = A (quarantined, poison), B: parking parks B behind A unless B is in flight.
        let client = db.client().await;
        insert(&client, &events("p", 2, 1), Duration::ZERO).await;
        client
            .batch_execute(
                "UPDATE outbox SET quarantined_at = now(), quarantine_reason = 'too_large'
                 WHERE event_id = 'p-0'",
            )
            .await
            .unwrap();
        let blocking = ClaimStrategy::Ordered(Ordered {
            key: KeyColumn::AggregateId,
            routing: Default::default(),
            skip_poison: false,
            scope: OrderScope::Every,
            by: OrderBy::Id,
        });
        {
            let outbox = Arc::new(
                Outbox::new(&db.url, "outbox".parse().unwrap(), Duration::from_secs(5))
                    .unwrap()
                    .claim_strategy(blocking)
                    .unwrap(),
            );
            let claim = db.client().await;
            claim.batch_execute("BEGIN").await.unwrap();
            claim.batch_execute(CLAIM_LOCK).await.unwrap();
            claim
                .batch_execute(
                    "INSERT INTO outbox_claims (owner, until, ids)
                     SELECT 'claimer', now() + interval '1 hour', array_agg(id)
                     FROM outbox WHERE event_id = 'p-1'",
                )
                .await
                .unwrap();
            let maintenance = Maintenance::new(outbox, Duration::from_secs(30));
            let parking = tokio::spawn(async move { maintenance.maintain_blocked_groups().await });
            wait_until(
                &format!("{isolation}: parking waits for the claim lock"),
                WAIT,
                || async {
                    admin
                        .query_one(
                            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
                             WHERE l.locktype = 'advisory' AND NOT l.granted
                               AND a.datname = current_database()",
                            &[],
                        )
                        .await
                        .unwrap()
                        .get::<_, i64>(0)
                        == 1
                },
            )
            .await;
            claim.batch_execute("COMMIT").await.unwrap();
            parking.await.unwrap().unwrap();
            assert_eq!(
                count(&client, "event_id = 'p-1' AND quarantined_at IS NOT NULL").await,
                0,
                "{isolation}: the row the claim leased was parked"
            );
        }
    }
}

/// A claim whose lock wait W and claim statement T are each under --db-timeout but together
/// over it: the relay would give it up at its deadline while its COMMIT was already sent, and
/// the lease committed behind its back would hold the rows a whole --lease (the takeover
/// spending an attempt). The server's budget (sql/claim_deadline.sql) ends it first. A test
/// transaction holds the claim lock for W, another holds `outbox_claims` (SHARE, which a claim's
/// INSERT waits for) for T after that. Afterwards the relay has logged the server's cancel of
/// its claim and has given no claim up itself; every row was sent once within its first lease,
/// spent only its own attempt, and no lease is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_over_its_deadline_is_ended_by_the_server_first_and_holds_no_lease_nor_attempt() {
    let db = migrated_db().await;
    let client = db.client().await;
    let queue = create_queue("giveup", &[]).await;
    let started: f64 = client
        .query_one("SELECT extract(epoch FROM now())::float8", &[])
        .await
        .unwrap()
        .get(0);
    let relay = RelayProcess::spawn(
        &run_args(
            &db,
            &queue,
            sqs().endpoint(),
            &["--db-timeout", "2s", "--lease", "120s"],
        ),
        &[],
    );
    // Its statements are prepared (the claim's locks the lease table) before the table is held.
    wait_until("the relay is ready", WAIT, || async {
        relay.http_status("/readyz").await == 200
    })
    .await;
    let lock_holder = db.client().await;
    let claims_holder = db.client().await;
    claims_holder
        .batch_execute("BEGIN; LOCK TABLE outbox_claims IN SHARE MODE")
        .await
        .unwrap();
    lock_holder.batch_execute("BEGIN").await.unwrap();
    lock_holder.batch_execute(CLAIM_LOCK).await.unwrap();
    insert(&client, &events("giveup", 5, 5), Duration::ZERO).await;
    wait_until(
        "the relay's claim waits for the claim lock",
        WAIT,
        || async {
            client
                .query_one(
                    "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
                 WHERE l.locktype = 'advisory' AND NOT l.granted
                   AND a.datname = current_database()",
                    &[],
                )
                .await
                .unwrap()
                .get::<_, i64>(0)
                >= 1
        },
    )
    .await;
    // W: 1.2 s of the 2 s, on the server's clock; then T: 1.2 s more on the lease table.
    lock_holder
        .batch_execute("SELECT pg_sleep(1.2); COMMIT")
        .await
        .unwrap();
    claims_holder
        .batch_execute("SELECT pg_sleep(1.2); COMMIT")
        .await
        .unwrap();
    wait_until("every row is sent", WAIT, || async {
        count(&client, "sent_at IS NOT NULL").await == 5
    })
    .await;
    let late = count(
        &client,
        &format!("sent_at >= to_timestamp({started}) + interval '120 seconds'"),
    )
    .await;
    assert_eq!(late, 0, "rows waited out a lease");
    assert_eq!(
        count(&client, "attempts <> 1").await,
        0,
        "a row spent an attempt it did not make"
    );
    assert_eq!(count_claims(&client, "true").await, 0, "a lease was left");
    // The path this test is about was taken: the server cancelled the claim at its budget (a
    // statement or lock timeout, as W and T fall), rather than answering it late or the relay
    // giving it up. A relay that gives a claim up drops its connection with a WARN naming the
    // claim; then the release (sql/release_orphans.sql) would pass every check above as well.
    let output = relay.output();
    assert!(
        output.lines().any(|l| l.contains("claim failed")
            && l.contains("claiming rows: canceling statement due to")),
        "the server did not end the claim:\n{output}"
    );
    assert!(
        !output.contains("(claiming rows; --db-timeout)"),
        "the relay gave a claim up instead of the server ending it:\n{output}"
    );
    drop(relay);
}

/// A claim carries the settlements of earlier claims (src/relay/carry.rs): they apply in the
/// claim's own transaction, before the claim, so that it sees the rows they freed (the next
/// row of an ordered group), and not at all when the claim fails (here its lock wait runs past
/// the server's budget while a test transaction holds the claim lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_applies_the_settlements_it_carries_with_itself_or_not_at_all() {
    let db = table_for_every_strategy().await;
    let client = db.client().await;
    insert(&client, &events("carried", 3, 1), Duration::ZERO).await;
    let (_, strategy) = ordered_strategies(false)
        .into_iter()
        .find(|(name, _)| *name == "ordered, by id")
        .expect("the plain ordered strategy");
    let s = Outbox::new(&db.url, "outbox".parse().unwrap(), Duration::from_secs(5))
        .unwrap()
        .round_trip_deadline(Duration::from_millis(600))
        .claim_strategy(strategy)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let first = s.claim(&request(1)).await.unwrap();
    assert_eq!(
        first.rows.iter().map(|r| r.id).collect::<Vec<_>>(),
        [1],
        "one row, the group's head"
    );
    let settlement = Settlement {
        sent: vec![SentRow {
            id: 1,
            lease_token: first.rows[0].lease_token,
            message_id: "m1".into(),
        }],
        ..Settlement::default()
    };

    // The claim lock held past the claim's budget: the claim fails, and its settlement with it.
    let holder = db.client().await;
    holder.batch_execute("BEGIN").await.unwrap();
    holder.batch_execute(CLAIM_LOCK).await.unwrap();
    let failed = s.lease_settling(&request(1), "races", &[&settlement]).await;
    assert!(
        failed.is_err(),
        "the claim waited past its budget: {failed:?}"
    );
    assert_eq!(
        count(&client, "sent_at IS NULL").await,
        3,
        "nothing settled"
    );
    assert_eq!(
        count_claims(&client, "true").await,
        1,
        "the first claim still holds row 1"
    );
    holder.batch_execute("COMMIT").await.unwrap();

    let (claimed, _, settled) = s
        .lease_settling(&request(1), "races", &[&settlement])
        .await
        .unwrap();
    assert_eq!(settled.len(), 1);
    assert_eq!((settled[0].sent, settled[0].lost), (1, 0));
    assert!(settled[0].suspect.is_empty());
    assert_eq!(count(&client, "sent_at IS NULL").await, 2, "row 1 settled");
    assert_eq!(
        claimed.rows.iter().map(|r| r.id).collect::<Vec<_>>(),
        [2],
        "the same claim took the next row of the group, which the settlement freed"
    );
}
