//! `outbox-relay replay`: sent rows kept by --retention go out again with their event_id, by
//! event id, type and time range, after a dry run that changes nothing; on a FIFO queue a
//! replay inside the deduplication window arrives only with a fresh deduplication ID. And the
//! warning of `quarantine retry` for rows SQS may have accepted a copy of.

use std::time::Duration;

use crate::scenario::{
    args, attr, count, events, insert, message_group, migrate_with, migrated_db, relay_command,
    run_args, wait_count,
};
use crate::support::{create_queue, receive_all, run_to_end, sqs, RelayProcess};

fn event_ids(messages: &[aws_sdk_sqs::types::Message]) -> Vec<String> {
    let mut ids: Vec<String> = messages
        .iter()
        .map(|m| attr(m, "event_id").unwrap().to_string())
        .collect();
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_rows_are_sent_again_with_their_event_id_by_type_time_and_id_after_a_dry_run_that_changes_nothing(
) {
    let db = migrated_db().await;
    let client = db.client().await;
    let queue = create_queue("replay", &[]).await;
    let written = events("rp", 6, 3);
    insert(&client, &written, Duration::ZERO).await;
    let _relay = RelayProcess::spawn(&run_args(&db, &queue, sqs().endpoint(), &[]), &[]);
    wait_count(&client, "sent_at IS NOT NULL", 6, Duration::from_secs(60)).await;
    assert_eq!(
        receive_all(&queue, 6, Duration::from_secs(30)).await.len(),
        6
    );

    let dry = relay_command(&[
        "replay",
        "--database-url",
        &db.url,
        "--event-type",
        "order.paid",
        "--dry-run",
    ])
    .await;
    assert!(dry.contains("would replay 3 sent row(s)"), "{dry}");
    assert_eq!(
        count(&client, "sent_at IS NOT NULL").await,
        6,
        "a dry run changes nothing"
    );

    let done = relay_command(&[
        "replay",
        "--database-url",
        &db.url,
        "--event-type",
        "order.paid",
    ])
    .await;
    assert!(done.contains("replayed 3 sent row(s)"), "{done}");
    wait_count(&client, "sent_at IS NOT NULL", 6, Duration::from_secs(60)).await;
    let again = receive_all(&queue, 3, Duration::from_secs(30)).await;
    let paid: Vec<String> = written
        .iter()
        .filter(|e| e.event_type == "order.paid")
        .map(|e| e.event_id.clone())
        .collect();
    assert_eq!(event_ids(&again), paid, "the same event_ids, once each");

    // Selectors combine: one event id within a time range that holds every row.
    let one = relay_command(&[
        "replay",
        "--database-url",
        &db.url,
        "--event-id",
        &written[0].event_id,
        "--since",
        "1h",
        "--until",
        "0s",
    ])
    .await;
    assert!(one.contains("replayed 1 sent row(s)"), "{one}");
    let none = relay_command(&[
        "replay",
        "--database-url",
        &db.url,
        "--event-id",
        &written[1].event_id,
        "--until",
        "1h",
    ])
    .await;
    assert!(none.contains("no sent rows match"), "{none}");
    wait_count(&client, "sent_at IS NOT NULL", 6, Duration::from_secs(60)).await;
    let last = receive_all(&queue, 1, Duration::from_secs(30)).await;
    assert_eq!(event_ids(&last), [written[0].event_id.clone()]);

    // No selection, or a time that is not one: one line, nothing changed.
    for bad in [
        args(&["replay", "--database-url", &db.url]),
        args(&["replay", "--database-url", &db.url, "--since", "yesterday"]),
    ] {
        let (status, output) = run_to_end(&bad, &[], Duration::from_secs(30)).await;
        assert!(!status.success(), "{bad:?}: {output}");
        assert!(
            output.contains("--event-id, --event-type, --since or --until")
                || output.contains("is not a time"),
            "{output}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_replay_inside_the_deduplication_window_arrives_only_with_a_new_dedup_id() {
    let db = migrated_db().await;
    let client = db.client().await;
    let queue = create_queue("replay.fifo", &[]).await;
    let written = events("rf", 3, 3);
    insert(&client, &written, Duration::ZERO).await;
    let _relay = RelayProcess::spawn(&run_args(&db, &queue, sqs().endpoint(), &[]), &[]);
    wait_count(&client, "sent_at IS NOT NULL", 3, Duration::from_secs(60)).await;
    assert_eq!(
        receive_all(&queue, 3, Duration::from_secs(30)).await.len(),
        3
    );
    let target = &written[1].event_id;

    // Same deduplication ID within 5 minutes: SQS accepts the send and drops the copy.
    let (status, warned) = run_to_end(
        &args(&["replay", "--database-url", &db.url, "--event-id", target]),
        &[],
        Duration::from_secs(30),
    )
    .await;
    assert!(status.success(), "{warned}");
    assert!(
        warned.contains("1 of them were sent less than 5 minutes ago"),
        "{warned}"
    );
    wait_count(&client, "sent_at IS NOT NULL", 3, Duration::from_secs(60)).await;
    let dropped = receive_all(&queue, 0, Duration::from_secs(5)).await;
    assert!(dropped.is_empty(), "{} copies arrived", dropped.len());

    let (status, fresh) = run_to_end(
        &args(&[
            "replay",
            "--database-url",
            &db.url,
            "--event-id",
            target,
            "--new-dedup-id",
        ]),
        &[],
        Duration::from_secs(30),
    )
    .await;
    assert!(status.success(), "{fresh}");
    assert!(!fresh.contains("warning"), "{fresh}");
    wait_count(&client, "sent_at IS NOT NULL", 3, Duration::from_secs(60)).await;
    let arrived = receive_all(&queue, 1, Duration::from_secs(30)).await;
    assert_eq!(
        event_ids(&arrived),
        std::slice::from_ref(target),
        "the same event_id"
    );
    assert_eq!(
        message_group(&arrived[0]),
        Some(written[1].aggregate_id.as_str())
    );
    let dedup: String = client
        .query_one("SELECT dedup_id FROM outbox WHERE event_id = $1", &[target])
        .await
        .unwrap()
        .get(0);
    assert!(dedup.starts_with(&format!("{target}:replay:")), "{dedup}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quarantine_retry_warns_about_rows_whose_accepted_copy_a_fifo_queue_would_still_deduplicate(
) {
    let db = migrated_db().await;
    let client = db.client().await;
    insert(&client, &events("qw", 3, 3), Duration::ZERO).await;
    // As the claim leaves them: out of attempts just now, an hour ago, and bad input just now.
    client
        .batch_execute(
            "UPDATE outbox SET quarantined_at = now(), quarantine_reason = 'max_attempts' WHERE event_id = 'qw-0';
             UPDATE outbox SET quarantined_at = now() - interval '1 hour', quarantine_reason = 'max_attempts' WHERE event_id = 'qw-1';
             UPDATE outbox SET quarantined_at = now(), quarantine_reason = 'invalid' WHERE event_id = 'qw-2';",
        )
        .await
        .unwrap();
    let out = relay_command(&["quarantine", "retry", "--all", "--database-url", &db.url]).await;
    assert!(out.contains("moved 3 quarantined row(s)"), "{out}");
    assert!(out.contains("warning: 1 of them"), "{out}");
    assert_eq!(count(&client, "quarantined_at IS NOT NULL").await, 0);
}

/// A replayed row between sent ones is its group's head, and so is a new row behind the sent
/// ones: two heads of one group in one claim (fair claims probe a value's first pending rows,
/// each a head), each of which goes out once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_event_of_an_ordered_group_goes_out_once_beside_a_new_one() {
    let db = migrated_db().await;
    migrate_with(&db, &["--fair-by", "aggregate_type"]).await;
    let client = db.client().await;
    let queue = create_queue("replay-heads.fifo", &[]).await;
    let mut written = events("rh", 4, 1);
    let late = written.pop().unwrap();
    insert(&client, &written, Duration::ZERO).await;
    let run = run_args(
        &db,
        &queue,
        sqs().endpoint(),
        &["--fair-by", "aggregate_type"],
    );
    let relay = RelayProcess::spawn(&run, &[]);
    wait_count(&client, "sent_at IS NOT NULL", 3, Duration::from_secs(60)).await;
    assert_eq!(
        receive_all(&queue, 3, Duration::from_secs(30)).await.len(),
        3
    );
    relay.sigterm();
    relay.wait_exit(Duration::from_secs(30)).await;

    // With no relay running: the middle event replayed, a new one written behind the group.
    let done = relay_command(&[
        "replay",
        "--database-url",
        &db.url,
        "--event-id",
        &written[1].event_id,
        "--new-dedup-id",
    ])
    .await;
    assert!(done.contains("replayed 1 sent row(s)"), "{done}");
    insert(&client, std::slice::from_ref(&late), Duration::ZERO).await;
    let _relay = RelayProcess::spawn(&run, &[]);
    wait_count(&client, "sent_at IS NOT NULL", 4, Duration::from_secs(60)).await;
    let arrived = receive_all(&queue, 2, Duration::from_secs(30)).await;
    let mut expected = vec![written[1].event_id.clone(), late.event_id.clone()];
    expected.sort();
    assert_eq!(event_ids(&arrived), expected, "each once");
    assert_eq!(count(&client, "quarantined_at IS NOT NULL").await, 0);
    assert_eq!(count(&client, "attempts > 1").await, 0, "no failed send");
}

/// Through an adopted table's view: the replay reaches the application's table, and the
/// replayed rows' new deduplication IDs reach a FIFO queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adopted_tables_rows_are_replayed_through_its_view() {
    use crate::support::DEBEZIUM_COLUMNS;

    let db = crate::support::fresh_db().await;
    let client = db.client().await;
    client
        .batch_execute(crate::support::DEBEZIUM_OUTBOX_DDL)
        .await
        .unwrap();
    client
        .batch_execute(
            "INSERT INTO outboxevent (id, aggregatetype, aggregateid, type, payload)
             SELECT gen_random_uuid(), 'order', (g % 2)::text, 'OrderCreated', jsonb_build_object('order', g)
             FROM generate_series(1, 4) g",
        )
        .await
        .unwrap();
    let with_columns = |parts: &[&str]| {
        let mut a = args(parts);
        a.extend(DEBEZIUM_COLUMNS.iter().map(|s| s.to_string()));
        a
    };
    let (status, output) = run_to_end(
        &with_columns(&[
            "migrate",
            "--adopt",
            "--database-url",
            &db.url,
            "--table",
            "outboxevent",
        ]),
        &[],
        Duration::from_secs(30),
    )
    .await;
    assert!(status.success(), "{output}");
    let queue = create_queue("replay-adopted.fifo", &[]).await;
    let mut run = run_args(&db, &queue, sqs().endpoint(), &["--table", "outboxevent"]);
    run.extend(DEBEZIUM_COLUMNS.iter().map(|s| s.to_string()));
    let _relay = RelayProcess::spawn(&run, &[]);
    let sent = "SELECT count(*) FROM outboxevent WHERE sent_at IS NOT NULL";
    let wait_sent = || async {
        crate::support::wait_until("4 rows sent", Duration::from_secs(60), || async {
            client.query_one(sent, &[]).await.unwrap().get::<_, i64>(0) == 4
        })
        .await
    };
    wait_sent().await;
    let first = receive_all(&queue, 4, Duration::from_secs(30)).await;
    assert_eq!(first.len(), 4);

    let (status, done) = run_to_end(
        &with_columns(&[
            "replay",
            "--database-url",
            &db.url,
            "--table",
            "outboxevent",
            "--event-type",
            "OrderCreated",
            "--new-dedup-id",
        ]),
        &[],
        Duration::from_secs(30),
    )
    .await;
    assert!(status.success(), "{done}");
    assert!(done.contains("replayed 4 sent row(s)"), "{done}");
    wait_sent().await;
    let again = receive_all(&queue, 4, Duration::from_secs(30)).await;
    assert_eq!(
        event_ids(&again),
        event_ids(&first),
        "the same event_ids again"
    );
}
