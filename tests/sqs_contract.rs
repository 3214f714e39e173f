//! What the relay promises about SQS, on whichever server `OUTBOX_TEST_SQS` names: scripts/test
//! runs this module on fauxqs and again on moto, which disagree on how they refuse bad input.

use std::collections::HashSet;
use std::time::Duration;

use crate::scenario::{attr, copies, count, events, insert, migrated_db, run_args, wait_count};
use crate::support::{create_queue, receive_all, sqs, FaultProxy, Mode, RelayProcess, SqsKind};

/// moto slows down sharply as a queue fills; it proves the same contract with fewer rows.
fn rows_for_server(fauxqs: usize, moto: usize) -> usize {
    match sqs().kind() {
        SqsKind::Fauxqs => fauxqs,
        SqsKind::Moto => moto,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_row_arrives_once_with_its_body_and_attributes_and_is_marked_sent() {
    let n = rows_for_server(1000, 200);
    let db = migrated_db().await;
    let client = db.client().await;
    let queue = create_queue("deliver", &[]).await;
    let written = events("deliver", n, 50);
    // Not yet available: the rows wait, so the age gauge can be seen above zero.
    insert(&client, &written, Duration::from_secs(2)).await;

    let relay = RelayProcess::spawn(&run_args(&db, &queue, sqs().endpoint(), &[]), &[]);
    crate::support::wait_until(
        "oldest unsent age above 0",
        Duration::from_secs(20),
        || async {
            relay
                .metric("outbox_oldest_unsent_age_seconds")
                .await
                .unwrap_or(0.0)
                > 0.0
        },
    )
    .await;
    assert_eq!(relay.metric("outbox_unsent_rows").await, Some(n as f64));

    wait_count(
        &client,
        "sent_at IS NOT NULL",
        n as i64,
        Duration::from_secs(120),
    )
    .await;
    let received = receive_all(&queue, n, Duration::from_secs(120)).await;

    let by_id = copies(&received);
    assert_eq!(by_id.len(), n, "each event_id arrives");
    assert!(
        by_id.values().all(|&c| c == 1),
        "no event arrives twice in a clean run"
    );
    let rows = client
        .query(
            "SELECT event_id, message_id FROM outbox WHERE sent_at IS NOT NULL",
            &[],
        )
        .await
        .unwrap();
    let message_ids: std::collections::HashMap<String, String> =
        rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    for e in &written {
        let m = received
            .iter()
            .find(|m| attr(m, "event_id") == Some(e.event_id.as_str()))
            .unwrap();
        let body: serde_json::Value = serde_json::from_str(m.body().unwrap()).unwrap();
        assert_eq!(body, e.payload, "body is the payload JSON");
        assert_eq!(attr(m, "event_type"), Some(e.event_type.as_str()));
        assert_eq!(attr(m, "aggregate_type"), Some(e.aggregate_type.as_str()));
        assert_eq!(attr(m, "aggregate_id"), Some(e.aggregate_id.as_str()));
        let expected_attrs = 4 + e.headers.as_object().unwrap().len();
        assert_eq!(m.message_attributes().unwrap().len(), expected_attrs);
        if let Some(tp) = e.headers.get("traceparent") {
            assert_eq!(attr(m, "traceparent"), tp.as_str());
        }
        assert_eq!(
            message_ids.get(&e.event_id).map(String::as_str),
            m.message_id(),
            "the row keeps SQS's MessageId"
        );
    }

    crate::support::wait_until(
        "oldest unsent age back to 0",
        Duration::from_secs(10),
        || async {
            relay.metric("outbox_oldest_unsent_age_seconds").await == Some(0.0)
                && relay.metric("outbox_unsent_rows").await == Some(0.0)
        },
    )
    .await;
    assert_eq!(
        relay.metric("outbox_events_sent_total").await,
        Some(n as f64)
    );
    relay.sigterm();
    let status = relay
        .wait_exit(Duration::from_secs(20))
        .await
        .expect("relay exits");
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_entry_is_quarantined_with_the_sqs_error_and_its_batch_mates_are_sent() {
    let db = migrated_db().await;
    let client = db.client().await;
    // The queue refuses bodies over 1 KiB; the relay's own limit (1 MiB) lets the row through
    // planning, so it is SQS that refuses it.
    let queue = create_queue("partial", &[("MaximumMessageSize", "1024")]).await;
    let mut written = events("partial", 10, 10);
    written[4].payload = serde_json::json!({"blob": "x".repeat(4000)});
    insert(&client, &written, Duration::ZERO).await;

    let relay = RelayProcess::spawn(&run_args(&db, &queue, sqs().endpoint(), &[]), &[]);
    wait_count(
        &client,
        "quarantined_at IS NOT NULL",
        1,
        Duration::from_secs(60),
    )
    .await;
    wait_count(&client, "sent_at IS NOT NULL", 9, Duration::from_secs(60)).await;

    let bad = client
        .query_one(
            "SELECT event_id, quarantine_reason, last_error, attempts FROM outbox WHERE quarantined_at IS NOT NULL",
            &[],
        )
        .await
        .unwrap();
    let (event_id, reason, last_error): (String, String, String) =
        (bad.get(0), bad.get(1), bad.get(2));
    assert_eq!(event_id, written[4].event_id);
    // fauxqs answers per entry with SenderFault, as AWS does; moto refuses the whole request,
    // and the relay narrows it down to the one entry.
    let expected_reason = match sqs().kind() {
        SqsKind::Fauxqs => "sender_fault",
        SqsKind::Moto => "rejected",
    };
    assert_eq!(reason, expected_reason);
    assert!(!last_error.is_empty(), "the SQS error is kept");
    assert_eq!(bad.get::<_, i32>(3), 1, "bad input is never retried");

    let received = receive_all(&queue, 9, Duration::from_secs(60)).await;
    let by_id = copies(&received);
    let expected: HashSet<String> = written
        .iter()
        .filter(|e| e.event_id != written[4].event_id)
        .map(|e| e.event_id.clone())
        .collect();
    assert_eq!(by_id.keys().cloned().collect::<HashSet<_>>(), expected);
    crate::support::wait_until("quarantine counted", Duration::from_secs(10), || async {
        relay
            .metric(&format!(
                "outbox_events_quarantined_total{{reason=\"{expected_reason}\"}}"
            ))
            .await
            == Some(1.0)
            && relay.metric("outbox_quarantined_rows").await == Some(1.0)
    })
    .await;
    // Every claim was settled, the quarantined row's too: its lease row went with the outcome.
    let claims: i64 = client
        .query_one("SELECT count(*) FROM outbox_claims", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(claims, 0, "no lease is left");
    assert_eq!(count(&client, "lease_until IS NOT NULL").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_acknowledgement_is_resent_with_the_same_event_id_and_nothing_is_lost() {
    let n = 30;
    let db = migrated_db().await;
    let client = db.client().await;
    let queue = create_queue("lostack", &[]).await;
    let proxy = FaultProxy::start(sqs().endpoint());
    // SQS accepts the first batch, but its answer never reaches the relay.
    proxy.fault_next(Mode::DropResponse, 1);
    let written = events("lostack", n, 5);
    insert(&client, &written, Duration::ZERO).await;

    let relay = RelayProcess::spawn(
        &run_args(
            &db,
            &queue,
            proxy.endpoint(),
            &["--batch-size", "10", "--max-in-flight", "1"],
        ),
        &[],
    );
    wait_count(
        &client,
        "sent_at IS NOT NULL",
        n as i64,
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(proxy.faulted(), 1);

    let received = receive_all(&queue, n + 10, Duration::from_secs(60)).await;
    let by_id = copies(&received);
    assert_eq!(by_id.len(), n, "nothing lost");
    let twice: Vec<_> = by_id
        .iter()
        .filter(|(_, &c)| c == 2)
        .map(|(id, _)| id.clone())
        .collect();
    assert_eq!(
        twice.len(),
        10,
        "the unacknowledged batch arrives again: {by_id:?}"
    );
    assert!(by_id.values().all(|&c| c <= 2));
    // The resend is not the rows' fault: no attempt is spent on it beyond the claims.
    assert_eq!(count(&client, "attempts > 1").await, 0);
    assert_eq!(
        relay
            .metric("outbox_send_failures_total{kind=\"transient\"}")
            .await,
        Some(10.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quarantined_rows_are_listed_with_reasons_and_sent_after_the_cause_is_fixed_and_retried() {
    use crate::scenario::relay_command;
    let db = migrated_db().await;
    let client = db.client().await;
    let queue = create_queue("redrive", &[("MaximumMessageSize", "1024")]).await;
    let mut written = events("redrive", 10, 3);
    for i in [1, 5, 8] {
        written[i].payload = serde_json::json!({"blob": "y".repeat(3000), "i": i});
    }
    for i in [2, 6] {
        written[i].headers = serde_json::json!({"tenant": {"id": 7}});
    }
    insert(&client, &written, Duration::ZERO).await;
    let relay = RelayProcess::spawn(&run_args(&db, &queue, sqs().endpoint(), &[]), &[]);
    wait_count(
        &client,
        "quarantined_at IS NOT NULL",
        5,
        Duration::from_secs(60),
    )
    .await;
    wait_count(&client, "sent_at IS NOT NULL", 5, Duration::from_secs(60)).await;

    let too_big_reason = match sqs().kind() {
        SqsKind::Fauxqs => "sender_fault",
        SqsKind::Moto => "rejected",
    };
    let listed = relay_command(&["quarantine", "list", "--json", "--database-url", &db.url]).await;
    let json_start = listed.find('[').expect("a JSON array");
    let entries: Vec<serde_json::Value> = serde_json::from_str(&listed[json_start..]).unwrap();
    assert_eq!(entries.len(), 5);
    for e in &entries {
        let i: usize = e["event_id"]
            .as_str()
            .unwrap()
            .trim_start_matches("redrive-")
            .parse()
            .unwrap();
        let expected = if [2, 6].contains(&i) {
            "invalid"
        } else {
            too_big_reason
        };
        assert_eq!(e["reason"], expected, "{e}");
        assert!(!e["last_error"].as_str().unwrap().is_empty());
        assert_eq!(e["attempts"], 1);
        assert!(e["quarantined_at"].is_string());
    }
    let invalid = relay_command(&[
        "quarantine",
        "list",
        "--reason",
        "invalid",
        "--database-url",
        &db.url,
    ])
    .await;
    assert!(
        invalid.contains("redrive-2")
            && invalid.contains("redrive-6")
            && !invalid.contains("redrive-1 ")
    );

    // Fix the causes: the queue takes larger messages now; the headers become strings.
    crate::support::set_max_message_size(&queue, 262_144).await;
    client
        .execute(
            "UPDATE outbox SET headers = '{\"tenant\": \"7\"}' WHERE quarantine_reason = 'invalid'",
            &[],
        )
        .await
        .unwrap();

    let moved = relay_command(&[
        "quarantine",
        "retry",
        "--all",
        "--reason",
        too_big_reason,
        "--database-url",
        &db.url,
    ])
    .await;
    assert!(moved.contains("moved 3 quarantined row(s)"), "{moved}");
    let id_of_6: i64 = client
        .query_one("SELECT id FROM outbox WHERE event_id = 'redrive-6'", &[])
        .await
        .unwrap()
        .get(0);
    let moved = relay_command(&[
        "quarantine",
        "retry",
        "--event-id",
        "redrive-2",
        "--database-url",
        &db.url,
    ])
    .await;
    assert!(moved.contains("moved 1 quarantined row(s)"), "{moved}");
    let moved = relay_command(&[
        "quarantine",
        "retry",
        "--id",
        &id_of_6.to_string(),
        "--database-url",
        &db.url,
    ])
    .await;
    assert!(moved.contains("moved 1 quarantined row(s)"), "{moved}");
    let moved = relay_command(&["quarantine", "retry", "--all", "--database-url", &db.url]).await;
    assert!(
        moved.contains("moved 0 quarantined row(s)"),
        "nothing left: {moved}"
    );

    wait_count(&client, "sent_at IS NOT NULL", 10, Duration::from_secs(60)).await;
    assert_eq!(count(&client, "quarantined_at IS NOT NULL").await, 0);
    let received = receive_all(&queue, 10, Duration::from_secs(60)).await;
    let by_id = copies(&received);
    assert_eq!(
        by_id.len(),
        10,
        "every event arrives, the re-driven ones with their event_id"
    );
    assert!(by_id.values().all(|&c| c == 1));
    let empty = relay_command(&["quarantine", "list", "--database-url", &db.url]).await;
    assert!(empty.contains("no quarantined rows"));
    drop(relay);
}
