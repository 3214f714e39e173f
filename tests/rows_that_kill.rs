//! Rows that kill a relay: a payload larger than the relay can hold, and a row whose relays keep
//! dying while they hold it. The claim itself quarantines both (`too_large` from the size
//! measured in SQL, `max_attempts` once its attempts reached `--max-attempts`), in every claim
//! strategy, without reading the payload; the rows around them flow.

use std::time::Duration;

use outbox_relay::outbox::Session;
use outbox_relay::outbox::{
    ClaimLimits, ClaimRequest, ClaimStrategy, Maintenance, OrderScope, Ordered, Outbox,
};
use outbox_relay::row::{KeyColumn, QuarantineReason, SentRow, Settlement};

use crate::scenario::{
    copies, count, events, insert, migrate_with, migrated_db, run_args, wait_count,
};
use crate::support::{
    count_claims, create_queue, fresh_db, receive_all, sqs, wait_until, FaultProxy, Mode,
    RelayProcess, TestDb,
};

/// Generous for a loaded 2-core machine; a bound on waiting only, never a measured time.
const WAIT: Duration = Duration::from_secs(60);

fn request(lease: Duration) -> ClaimRequest {
    ClaimRequest {
        limit: 100,
        owner: "r".into(),
        lease,
        budget_bytes: i64::MAX,
        cursor: None,
        catching_up: false,
    }
}

async fn session(db: &TestDb, strategy: ClaimStrategy, limits: ClaimLimits) -> Session {
    Outbox::new(&db.url, "outbox".parse().unwrap(), Duration::from_secs(5))
        .unwrap()
        .claim_limits(limits)
        .claim_strategy(strategy)
        .unwrap()
        .connect()
        .await
        .unwrap()
}

fn ordered(skip_poison: bool) -> Ordered {
    Ordered {
        key: KeyColumn::AggregateId,
        routing: Default::default(),
        skip_poison,
        scope: OrderScope::Every,
        by: Default::default(),
    }
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

/// Event ids of the rows a claim leased, in id order.
fn leased(claimed: &outbox_relay::row::Claimed) -> Vec<String> {
    claimed.rows.iter().map(|r| r.event_id.clone()).collect()
}

/// In every strategy, one claim quarantines both oversized payloads (one compressed by
/// PostgreSQL, one not: their stored sizes say nothing of the text the relay would hold, which
/// the claim measures exactly), leases the rest, and in ordered modes stops each group's run at
/// the quarantined row: under `--on-poison block` the rows behind it stay and are parked
/// `blocked`, under `skip` they follow in the next claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_claim_quarantines_a_payload_too_large_to_hold_unread_and_ordered_groups_wait_behind_it(
) {
    const LIMIT: i64 = 16 * 1024;
    let strategies = [
        ("plain", ClaimStrategy::Plain, None),
        (
            "fair",
            ClaimStrategy::Fair {
                key: KeyColumn::AggregateType,
            },
            None,
        ),
        (
            "ordered-block",
            ClaimStrategy::Ordered(ordered(false)),
            Some(false),
        ),
        (
            "ordered-skip",
            ClaimStrategy::Ordered(ordered(true)),
            Some(true),
        ),
        (
            "ordered-fair",
            ClaimStrategy::OrderedFair {
                ordered: ordered(false),
                fair: KeyColumn::AggregateType,
            },
            Some(false),
        ),
    ];
    for (name, strategy, skip_poison) in strategies {
        let db = fresh_db().await;
        migrate_with(&db, &["--fair-by", "aggregate_type"]).await;
        let client = db.client().await;
        // Groups agg-0 .. agg-2: g0 = small, BIG (random hex, stored uncompressed), small;
        // g1 = BIG (one repeated letter, stored compressed), small; g2 = small.
        let mut rows = Vec::new();
        for (id, group, big) in [
            ("g0-a", 0, None),
            ("g0-big", 0, Some(false)),
            ("g0-c", 0, None),
            ("g1-big", 1, Some(true)),
            ("g1-b", 1, None),
            ("g2-a", 2, None),
        ] {
            let mut e = events(id, 1, 1).remove(0);
            e.event_id = id.to_string();
            e.aggregate_id = format!("agg-{group}");
            e.aggregate_type = format!("type-{}", group % 2);
            match big {
                Some(true) => e.payload = serde_json::json!({"blob": "x".repeat(200_000)}),
                Some(false) => {
                    e.payload = serde_json::json!({"blob": crate::support::random_hex(50_000)})
                }
                None => {}
            }
            rows.push(e);
        }
        insert(&client, &rows, Duration::ZERO).await;
        let compressed: Vec<String> = client
            .query(
                "SELECT event_id FROM outbox WHERE pg_column_compression(payload) IS NOT NULL",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(compressed, vec!["g1-big"], "{name}: one of each kind");

        let limits = ClaimLimits {
            max_payload_bytes: LIMIT,
            ..ClaimLimits::default()
        };
        let s = session(&db, strategy, limits).await;
        let first = s.claim(&request(Duration::from_secs(30))).await.unwrap();
        let mut quarantined: Vec<(String, QuarantineReason)> = first
            .quarantined
            .iter()
            .map(|q| (q.event_id.clone().unwrap(), q.reason))
            .collect();
        quarantined.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            quarantined,
            vec![
                ("g0-big".to_string(), QuarantineReason::TooLarge),
                ("g1-big".to_string(), QuarantineReason::TooLarge)
            ],
            "{name}"
        );
        let expected: Vec<&str> = match skip_poison {
            None => vec!["g0-a", "g0-c", "g1-b", "g2-a"],
            // A group's run ends at its quarantined row.
            Some(_) => vec!["g0-a", "g2-a"],
        };
        assert_eq!(leased(&first), expected, "{name}");
        // Quarantined by the claim: no lease, no attempt spent, the exact text size named.
        for big in ["g0-big", "g1-big"] {
            let row = client
                .query_one(
                    "SELECT quarantine_reason, attempts, \
                            id NOT IN (SELECT unnest(ids) FROM outbox_claims), last_error, \
                            octet_length(payload::text) FROM outbox WHERE event_id = $1",
                    &[&big],
                )
                .await
                .unwrap();
            let (reason, attempts, unleased, error, text_bytes): (String, i32, bool, String, i32) =
                (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
            assert_eq!(
                (reason.as_str(), attempts, unleased),
                ("too_large", 0, true),
                "{name} {big}"
            );
            assert!(
                error.starts_with(&format!(
                    "payload of {text_bytes} bytes is larger than the relay can hold ({LIMIT} bytes"
                )),
                "{name} {big}: {error}"
            );
            let said = &first
                .quarantined
                .iter()
                .find(|q| q.event_id.as_deref() == Some(big));
            assert_eq!(
                said.unwrap().error,
                error,
                "{name}: the claim says what it wrote"
            );
        }
        s.write_settlement("r", &sent(&first.rows), false)
            .await
            .unwrap();

        let second = s.claim(&request(Duration::from_secs(30))).await.unwrap();
        assert!(second.quarantined.is_empty(), "{name}");
        match skip_poison {
            None => assert!(second.rows.is_empty(), "{name}: {:?}", leased(&second)),
            Some(true) => assert_eq!(leased(&second), vec!["g0-c", "g1-b"], "{name}"),
            Some(false) => {
                assert!(
                    second.rows.is_empty(),
                    "{name}: the quarantined rows hold their groups"
                );
                // The parking sees a row quarantined by the claim like any quarantined head.
                let outbox =
                    Outbox::new(&db.url, "outbox".parse().unwrap(), Duration::from_secs(5))
                        .unwrap()
                        .claim_strategy(ClaimStrategy::Ordered(ordered(false)))
                        .unwrap();
                let maintenance =
                    Maintenance::new(std::sync::Arc::new(outbox), Duration::from_secs(5));
                let parked = maintenance.maintain_blocked_groups().await.unwrap().parked;
                assert_eq!(parked, 2, "{name}");
                assert_eq!(
                    count(
                        &client,
                        "quarantine_reason = 'blocked' AND event_id IN ('g0-c', 'g1-b')"
                    )
                    .await,
                    2,
                    "{name}"
                );
            }
        }
    }
}

/// The crash-loop breaker in SQL: a row whose claims keep ending without a settlement (as
/// when every relay that claims it dies) spends an attempt per claim, counted by the claim that
/// takes it over; the claim after the `max_attempts`-th quarantines it instead of leasing it
/// again, and spends nothing more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_whose_claims_keep_ending_without_an_outcome_is_quarantined_by_the_next_claim() {
    let db = migrated_db().await;
    let client = db.client().await;
    // loop-1 first: a settlement ends its whole claim, so the neighbour is claimed and settled
    // on its own before loop-0's claims, which all end without an outcome.
    let mut written = events("loop", 2, 2);
    written.reverse();
    insert(&client, &written, Duration::ZERO).await;
    let limits = ClaimLimits {
        max_attempts: 3,
        ..ClaimLimits::default()
    };
    let s = session(&db, ClaimStrategy::Plain, limits).await;
    let mut neighbour = request(Duration::from_secs(30));
    neighbour.limit = 1;
    let settled = s.claim(&neighbour).await.unwrap();
    assert_eq!(leased(&settled), vec!["loop-1"]);
    s.write_settlement("r", &sent(&settled.rows), false)
        .await
        .unwrap();
    for attempt in 1..=3 {
        let claimed =
            crate::support::claim_taking_over(&s, &request(Duration::from_millis(300))).await;
        assert!(claimed.quarantined.is_empty(), "claim {attempt}");
        assert_eq!(leased(&claimed), vec!["loop-0"], "claim {attempt}");
        assert_eq!(claimed.rows[0].attempts, attempt);
        assert_eq!(
            count(
                &client,
                &format!("event_id = 'loop-0' AND attempts = {}", attempt - 1)
            )
            .await,
            1,
            "claim {attempt}: the attempts before it that ended are counted, this one not yet"
        );
        assert_eq!(
            count_claims(&client, "true").await,
            1,
            "claim {attempt} removed the claim it took the row over from"
        );
        wait_until("the lease expires", WAIT, || async {
            count_claims(&client, "until < now()").await == 1
        })
        .await;
    }
    insert(&client, &events("after", 1, 1), Duration::ZERO).await;
    let claimed = crate::support::claim_taking_over(&s, &request(Duration::from_secs(30))).await;
    assert_eq!(
        leased(&claimed),
        vec!["after-0"],
        "its neighbours are claimed as ever"
    );
    assert_eq!(claimed.quarantined.len(), 1);
    assert_eq!(claimed.quarantined[0].reason, QuarantineReason::MaxAttempts);
    let row = client
        .query_one(
            "SELECT quarantine_reason, attempts, \
                    id NOT IN (SELECT unnest(ids) FROM outbox_claims), last_error \
             FROM outbox WHERE event_id = 'loop-0'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "max_attempts");
    assert_eq!(
        row.get::<_, i32>(1),
        3,
        "the breaking claim spends no attempt"
    );
    assert!(row.get::<_, bool>(2), "not leased");
    assert!(
        row.get::<_, String>(3).starts_with(
            "claimed 3 times (--max-attempts 3) and the last claim ended without an outcome"
        ),
        "{}",
        row.get::<_, String>(3)
    );
    assert_eq!(
        count_claims(&client, "true").await,
        1,
        "the last ended claim is gone; only after-0's remains"
    );
}

/// Peak resident memory of a live process (`VmHWM`), in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .expect("VmHWM");
    kib * 1024
}

/// A 64 MiB payload between small rows, with the relay's budget at 4 MiB (so, by default, the
/// largest payload it reads): the claim quarantines it `too_large` and the neighbours are
/// delivered. What proves it was never read is the relay's own peak memory: holding the text
/// would take at least its 64 MiB (tokio-postgres's read buffer, then the string), and the
/// relay's high-water mark stays below that. Before this, the claim read it as the first row of
/// a claim whatever its size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payload_larger_than_the_relay_holds_is_quarantined_unread_while_its_neighbours_flow() {
    const HUGE: i64 = 64 * 1024 * 1024;
    let db = migrated_db().await;
    let client = db.client().await;
    let queue = create_queue("rk-huge", &[]).await;
    insert(&client, &events("before", 5, 5), Duration::ZERO).await;
    // Written by the server itself, so the test process never holds it either: 32 hex digits
    // per md5, so HUGE / 32 of them, random enough that PostgreSQL stores it uncompressed.
    client
        .execute(
            "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload) \
             SELECT 'huge', 'order', 'agg-huge', 'order.huge', \
                    jsonb_build_object('blob', string_agg(md5(i::text), '')) \
             FROM generate_series(1, $1::int) AS i",
            &[&((HUGE / 32) as i32)],
        )
        .await
        .unwrap();
    insert(&client, &events("after", 5, 5), Duration::ZERO).await;
    let relay = RelayProcess::spawn(
        &run_args(
            &db,
            &queue,
            sqs().endpoint(),
            &["--max-bytes-in-flight", "4MiB"],
        ),
        &[],
    );
    wait_count(&client, "sent_at IS NOT NULL", 10, WAIT).await;
    wait_count(
        &client,
        "event_id = 'huge' AND quarantine_reason = 'too_large' AND attempts = 0",
        1,
        WAIT,
    )
    .await;
    let error: String = client
        .query_one("SELECT last_error FROM outbox WHERE event_id = 'huge'", &[])
        .await
        .unwrap()
        .get(0);
    assert!(
        error.contains("is larger than the relay can hold (4194304 bytes"),
        "{error}"
    );
    wait_until("the quarantine is counted", WAIT, || async {
        relay
            .metric("outbox_events_quarantined_total{reason=\"too_large\"}")
            .await
            == Some(1.0)
    })
    .await;
    let peak = peak_rss(relay.pid());
    assert!(
        peak < HUGE as u64,
        "the relay's peak memory ({peak} bytes) would hold the {HUGE}-byte payload if it had read it"
    );
    assert!(relay.output().contains("row quarantined at claim"));
    let got = receive_all(&queue, 10, WAIT).await;
    let by_id = copies(&got);
    assert_eq!(by_id.len(), 10, "{by_id:?}");
    assert!(!by_id.contains_key("huge"));
}

/// The crash-loop breaker with real crashes: the queue's endpoint (a fault proxy) never answers,
/// so each relay holds the row's lease in its send, and is killed with `kill -9` there, three
/// times. The fourth relay's claim quarantines the row (`max_attempts`) instead of sending it a
/// fourth time, and goes on delivering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_killed_while_holding_a_row_again_and_again_end_with_the_row_quarantined_at_claim() {
    let db = migrated_db().await;
    let client = db.client().await;
    let queue = create_queue("rk-crash", &[]).await;
    let proxy = FaultProxy::start(sqs().endpoint());
    proxy.set_mode(Mode::BlackHole);
    insert(&client, &events("doomed", 1, 1), Duration::ZERO).await;
    let args = run_args(
        &db,
        &queue,
        proxy.endpoint(),
        &[
            "--max-attempts",
            "3",
            "--lease",
            "4s",
            "--send-timeout",
            "2s",
            "--settle-margin",
            "1s",
        ],
    );
    for attempt in 1..=3u64 {
        let relay = RelayProcess::spawn(&args, &[]);
        wait_until("the relay is sending the row", WAIT, || async {
            proxy.requests() == attempt
        })
        .await;
        relay.kill9();
        // This relay's claim took the row over from the last one's, counting that attempt;
        // its own is counted by the claim after it.
        assert_eq!(
            count(
                &client,
                &format!(
                    "event_id = 'doomed-0' AND attempts = {} AND quarantined_at IS NULL \
                     AND id IN (SELECT unnest(ids) FROM outbox_claims)",
                    attempt - 1
                )
            )
            .await,
            1,
            "relay {attempt}"
        );
        assert_eq!(count_claims(&client, "true").await, 1, "relay {attempt}");
    }
    let relay = RelayProcess::spawn(&args, &[]);
    wait_count(
        &client,
        "event_id = 'doomed-0' AND quarantine_reason = 'max_attempts' AND attempts = 3",
        1,
        WAIT,
    )
    .await;
    assert_eq!(
        proxy.requests(),
        3,
        "quarantined at claim: not sent a fourth time"
    );
    let error: String = client
        .query_one(
            "SELECT last_error FROM outbox WHERE event_id = 'doomed-0'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        error.starts_with(
            "claimed 3 times (--max-attempts 3) and the last claim ended without an outcome"
        ),
        "{error}"
    );
    wait_until("the quarantine is counted", WAIT, || async {
        relay
            .metric("outbox_events_quarantined_total{reason=\"max_attempts\"}")
            .await
            == Some(1.0)
    })
    .await;
    assert!(relay.output().contains("row quarantined at claim"));
    // The relay is well: the next row goes out once the queue answers.
    proxy.set_mode(Mode::Pass);
    insert(&client, &events("next", 1, 1), Duration::ZERO).await;
    wait_count(
        &client,
        "event_id = 'next-0' AND sent_at IS NOT NULL",
        1,
        WAIT,
    )
    .await;
    assert_eq!(count(&client, "quarantined_at IS NOT NULL").await, 1);
}
