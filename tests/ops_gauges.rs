//! What the table gauges say while an ordered group is blocked: the rows parked behind a
//! quarantined head are undelivered, so they stay in the unsent count and the oldest-unsent
//! age, and the quarantine has an age of its own, until the group is re-driven and delivered.
//! And whose age the oldest-unsent gauges are when ids are not in `created_at` order.

use std::time::{Duration, Instant};

use crate::scenario::{count, events, insert, migrated_db, relay_command, run_args, wait_count};
use crate::support::{create_queue, metric_value, sqs, wait_until};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_parked_behind_a_quarantined_head_stay_in_the_unsent_gauges_until_delivered() {
    let db = migrated_db().await;
    let client = db.client().await;
    let queue = create_queue("gauges.fifo", &[("MaximumMessageSize", "1024")]).await;
    // One ordered group of four; its second event is too big for the queue (the relay reads the
    // queue's limit and refuses it before sending) and the two after it are parked behind it. One group only: once they are
    // parked nothing else is unsent, so the gauges can only count the parked rows.
    let mut written = events("gauges", 4, 1);
    written[1].payload = serde_json::json!({"blob": "z".repeat(3000)});
    insert(&client, &written, Duration::ZERO).await;
    // Written an hour ago: the age a blocked group reaches when nobody looks.
    client
        .batch_execute("UPDATE outbox SET created_at = now() - interval '1 hour'")
        .await
        .unwrap();
    let relay =
        crate::support::RelayProcess::spawn(&run_args(&db, &queue, sqs().endpoint(), &[]), &[]);

    wait_count(
        &client,
        "quarantine_reason = 'blocked'",
        2,
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(count(&client, "sent_at IS NOT NULL").await, 1);
    assert_eq!(count(&client, "quarantine_reason = 'too_large'").await, 1);
    // The refresh that reports the parked rows as blocked ran after they were parked, so its
    // unsent figures are the blocked group's; without parked rows counted they read 0.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let scrape = relay.scrape().await;
        let v = |name| metric_value(&scrape, name).unwrap_or(-1.0);
        if v("outbox_blocked_rows") == 2.0
            && v("outbox_unsent_rows") == 2.0
            && v("outbox_oldest_unsent_age_seconds") >= 3600.0
            && v("outbox_quarantined_rows") == 3.0
            && v("outbox_oldest_quarantined_age_seconds") > 0.0
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the parked rows are missing from the unsent gauges, or the quarantine has no age:\n{}",
            scrape
                .lines()
                .filter(|l| l.starts_with("outbox_") && !l.contains("_bucket"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // `status` counts them the same way, and says where they are.
    let status = relay_command(&["status", "--json", "--database-url", &db.url]).await;
    let json: serde_json::Value = status
        .lines()
        .find(|l| l.starts_with('{'))
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no JSON object in:\n{status}"));
    assert_eq!(json["unsent"], 2, "{json}");
    assert_eq!(json["parked"], 2, "{json}");
    assert_eq!(json["quarantined"], 3, "{json}");
    assert_eq!(json["quarantined_by_reason"]["blocked"], 2, "{json}");
    assert!(
        json["oldest_unsent_age_seconds"].as_f64().unwrap() >= 3600.0,
        "{json}"
    );
    assert!(
        json["oldest_quarantined_age_seconds"].as_f64().unwrap() > 0.0,
        "{json}"
    );

    // Fix the cause, re-drive the head: the group is delivered and every gauge returns to 0.
    crate::support::set_max_message_size(&queue, 262_144).await;
    let moved = relay_command(&[
        "quarantine",
        "retry",
        "--event-id",
        &written[1].event_id,
        "--database-url",
        &db.url,
    ])
    .await;
    assert!(moved.contains("moved 1 "), "{moved}");
    wait_count(&client, "sent_at IS NOT NULL", 4, Duration::from_secs(60)).await;
    wait_until(
        "the gauges return to 0 once the group is delivered",
        Duration::from_secs(20),
        || async {
            let scrape = relay.scrape().await;
            [
                "outbox_unsent_rows",
                "outbox_oldest_unsent_age_seconds",
                "outbox_quarantined_rows",
                "outbox_blocked_rows",
                "outbox_oldest_quarantined_age_seconds",
            ]
            .iter()
            .all(|name| metric_value(&scrape, name) == Some(0.0))
        },
    )
    .await;
}

/// A session that cached ids from the sequence inserts below rows older than its own row
/// (simulation seed 381): the oldest unsent row is the oldest `created_at`, not the lowest id's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_oldest_unsent_row_is_the_oldest_created_not_the_lowest_id() {
    let db = migrated_db().await;
    let client = db.client().await;
    let queue = create_queue("gauges-order", &[]).await;
    insert(&client, &events("gauges-order", 3, 3), Duration::ZERO).await;
    // Not due for an hour, so they stay unsent and the relay only reads them; the lowest id
    // written now, the two above it an hour ago.
    client
        .batch_execute(
            "UPDATE outbox SET available_at = now() + interval '1 hour', \
             created_at = CASE WHEN id = (SELECT min(id) FROM outbox) THEN now() \
                               ELSE now() - interval '1 hour' END",
        )
        .await
        .unwrap();
    let written = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let relay =
        crate::support::RelayProcess::spawn(&run_args(&db, &queue, sqs().endpoint(), &[]), &[]);
    wait_until(
        "the age and the oldest unsent time are the hour-old rows'",
        Duration::from_secs(20),
        || async {
            let scrape = relay.scrape().await;
            let v = |name| metric_value(&scrape, name).unwrap_or(-1.0);
            v("outbox_unsent_rows") == 3.0
                && v("outbox_oldest_unsent_age_seconds") >= 3600.0
                && (0.0..=written - 3600.0 + 1.0)
                    .contains(&v("outbox_oldest_unsent_timestamp_seconds"))
        },
    )
    .await;
}
