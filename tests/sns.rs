//! SNS topic destinations: rows routed to a topic reach every subscribed queue, with raw message
//! delivery (the payload as the body, the attributes as message attributes) and without (the
//! SNS JSON envelope); a FIFO topic keeps each group's order in every FIFO queue subscribed; a
//! row a topic cannot take is quarantined, and a missing topic parks only its own rows.

mod faults;

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_sqs::types::{Message, MessageSystemAttributeName};
use serde_json::Value;

use crate::scenario::{
    attr, count, events, insert, insert_to, migrated_db, run_args, wait_count, Event,
};
use crate::support::{
    create_queue, create_topic, create_topic_named, receive_all, sqs, subscribe_queue, topic_name,
    RelayProcess,
};

/// Generous for a loaded 2-core machine; a bound on waiting only, never a measured time.
const WAIT: Duration = Duration::from_secs(60);

/// The SNS envelope a non-raw subscription receives, parsed.
fn envelope(m: &Message) -> Value {
    serde_json::from_str(m.body().expect("a body")).expect("the SNS envelope is JSON")
}

/// An attribute as the envelope carries it (`MessageAttributes.NAME.Value`).
fn envelope_attr<'a>(envelope: &'a Value, name: &str) -> Option<&'a str> {
    envelope["MessageAttributes"][name]["Value"].as_str()
}

fn by_event_id(written: &[Event]) -> HashMap<&str, &Event> {
    written.iter().map(|e| (e.event_id.as_str(), e)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routed_topic_reaches_a_raw_and_an_enveloped_queue_with_body_and_attributes() {
    let db = migrated_db().await;
    let client = db.client().await;
    let topic = create_topic("t-fanout").await;
    let raw = create_queue("t-raw", &[]).await;
    let wrapped = create_queue("t-wrapped", &[]).await;
    subscribe_queue(&topic, &raw, true).await;
    subscribe_queue(&topic, &wrapped, false).await;
    // The default queue gets nothing: every row's aggregate_type routes it to the topic.
    let default = create_queue("t-default", &[]).await;
    let written = events("t-fanout", 30, 4);
    insert(&client, &written, Duration::ZERO).await;
    let route = format!("order={topic}");
    let relay = RelayProcess::spawn(
        &run_args(
            &db,
            &default,
            sqs().endpoint(),
            &["--route", &route, "--sns-endpoint-url", sqs().endpoint()],
        ),
        &[],
    );
    wait_count(
        &client,
        "sent_at IS NOT NULL AND message_id IS NOT NULL",
        30,
        WAIT,
    )
    .await;
    let expected = by_event_id(&written);

    let got = receive_all(&raw, 30, WAIT).await;
    assert_eq!(got.len(), 30, "each event once at the raw subscription");
    for m in &got {
        let id = attr(m, "event_id").expect("event_id as a message attribute");
        let e = expected[id];
        let body: Value = serde_json::from_str(m.body().unwrap()).expect("the payload");
        assert_eq!(body, e.payload, "raw delivery: the body is the payload");
        assert_eq!(attr(m, "event_type"), Some(e.event_type.as_str()));
        assert_eq!(attr(m, "aggregate_type"), Some("order"));
        assert_eq!(attr(m, "aggregate_id"), Some(e.aggregate_id.as_str()));
        assert_eq!(
            attr(m, "traceparent"),
            e.headers["traceparent"].as_str(),
            "headers travel as attributes"
        );
    }

    let got = receive_all(&wrapped, 30, WAIT).await;
    assert_eq!(
        got.len(),
        30,
        "each event once at the enveloped subscription"
    );
    for m in &got {
        let envelope = envelope(m);
        assert_eq!(envelope["Type"], "Notification");
        assert_eq!(envelope["TopicArn"], topic.as_str());
        let id = envelope_attr(&envelope, "event_id").expect("event_id in MessageAttributes");
        let e = expected[id];
        let message: Value =
            serde_json::from_str(envelope["Message"].as_str().expect("Message is text"))
                .expect("Message is the payload");
        assert_eq!(message, e.payload);
        assert_eq!(
            envelope_attr(&envelope, "event_type"),
            Some(e.event_type.as_str())
        );
        assert_eq!(
            envelope_attr(&envelope, "aggregate_id"),
            Some(e.aggregate_id.as_str())
        );
        assert_eq!(
            envelope_attr(&envelope, "traceparent"),
            e.headers["traceparent"].as_str()
        );
    }
    assert!(
        receive_all(&default, 0, Duration::from_secs(2))
            .await
            .is_empty(),
        "routed rows do not reach the default queue"
    );
    assert_eq!(
        relay.metric("outbox_events_sent_total").await,
        Some(30.0),
        "{}",
        relay.output()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_topic_keeps_each_groups_order_in_every_subscribed_fifo_queue() {
    let db = migrated_db().await;
    let client = db.client().await;
    let topic = create_topic("t-order.fifo").await;
    let raw = create_queue("t-raw.fifo", &[]).await;
    let wrapped = create_queue("t-wrapped.fifo", &[]).await;
    subscribe_queue(&topic, &raw, true).await;
    subscribe_queue(&topic, &wrapped, false).await;
    // Written in three transactions while the relay runs, so groups span claims and requests.
    let written = events("t-fifo", 120, 5);
    let relay = RelayProcess::spawn(
        &run_args(
            &db,
            &topic,
            sqs().endpoint(),
            &["--sns-endpoint-url", sqs().endpoint(), "--batch-size", "25"],
        ),
        &[],
    );
    for chunk in written.chunks(40) {
        insert(&client, chunk, Duration::ZERO).await;
    }
    wait_count(&client, "sent_at IS NOT NULL", 120, WAIT).await;
    let index = |event_id: &str| -> usize {
        event_id
            .rsplit('-')
            .next()
            .and_then(|i| i.parse().ok())
            .expect("t-fifo-N")
    };
    for (queue, is_raw) in [(&raw, true), (&wrapped, false)] {
        let got = receive_all(queue, 120, WAIT).await;
        assert_eq!(got.len(), 120, "{queue}: each event once");
        let mut by_group: HashMap<String, Vec<usize>> = HashMap::new();
        for m in &got {
            let group = m
                .attributes()
                .and_then(|a| a.get(&MessageSystemAttributeName::MessageGroupId))
                .expect("a FIFO message has its group")
                .clone();
            let event_id = if is_raw {
                attr(m, "event_id").expect("event_id").to_string()
            } else {
                envelope_attr(&envelope(m), "event_id")
                    .expect("event_id")
                    .to_string()
            };
            assert_eq!(
                group,
                format!("agg-{}", index(&event_id) % 5),
                "MessageGroupId is the aggregate"
            );
            by_group.entry(group).or_default().push(index(&event_id));
        }
        assert_eq!(by_group.len(), 5);
        for (group, seq) in &by_group {
            assert!(
                seq.windows(2).all(|w| w[0] < w[1]),
                "{queue}: group {group} out of order: {seq:?}"
            );
        }
    }
    assert_eq!(
        count(&client, "attempts > 1").await,
        0,
        "{}",
        relay.output()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_too_large_for_a_topic_is_quarantined_and_a_missing_topic_parks_only_its_rows() {
    let db = migrated_db().await;
    let client = db.client().await;
    let topic = create_topic("t-rows").await;
    let subscribed = create_queue("t-rows-sub", &[]).await;
    subscribe_queue(&topic, &subscribed, true).await;
    let default = create_queue("t-rows-default", &[]).await;
    let missing_name = topic_name("t-missing");
    let (prefix, _) = topic.rsplit_once(':').expect("an ARN");
    let missing = format!("{prefix}:{missing_name}");
    // Rows name their own destination: the topic, a topic not created yet, or none (the
    // default queue). Row 6 (to the topic) is 300 KiB: within SQS's 1 MiB, beyond SNS's 256 KiB.
    let mut written = events("t-rows", 30, 3);
    written[6].payload = serde_json::json!({ "blob": "b".repeat(300 * 1024) });
    let to: Vec<Option<String>> = (0..written.len())
        .map(|i| match i % 3 {
            0 => Some(topic.clone()),
            1 => Some(missing.clone()),
            _ => None,
        })
        .collect();
    insert_to(&client, &written, &to).await;
    let relay = RelayProcess::spawn(
        &run_args(
            &db,
            &default,
            sqs().endpoint(),
            &["--sns-endpoint-url", sqs().endpoint()],
        ),
        &[],
    );
    let too_large = format!("event_id = '{}'", written[6].event_id);
    wait_count(
        &client,
        &format!("{too_large} AND quarantine_reason = 'too_large' AND last_error LIKE '%262144%'"),
        1,
        WAIT,
    )
    .await;
    // 10 to the topic but the large one, 10 to the default queue.
    wait_count(&client, "sent_at IS NOT NULL", 19, WAIT).await;
    wait_count(&client, "quarantine_reason = 'destination'", 10, WAIT).await;
    assert_eq!(
        count(
            &client,
            &format!(
                "quarantine_reason = 'destination' AND last_error LIKE '%{missing_name}%NotFound%'"
            )
        )
        .await,
        10,
        "each parked row names its topic and SNS's error"
    );
    assert_eq!(
        count(&client, "attempts > 1").await,
        0,
        "neither a missing topic nor a row's size costs retries"
    );
    let got = receive_all(&subscribed, 9, WAIT).await;
    assert_eq!(got.len(), 9);
    assert_eq!(receive_all(&default, 10, WAIT).await.len(), 10);
    let (ready, why) = relay.http_get("/readyz").await;
    assert_eq!(ready, 200, "a row's own topic is not the relay's: {why}");

    // Once the topic exists its parked rows follow by themselves.
    let late = create_queue("t-rows-late", &[]).await;
    assert_eq!(create_topic_named(&missing_name).await, missing);
    subscribe_queue(&missing, &late, true).await;
    wait_count(&client, "sent_at IS NOT NULL", 29, WAIT).await;
    assert_eq!(receive_all(&late, 10, WAIT).await.len(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_verifies_each_topic_and_names_a_missing_one_with_its_fix() {
    let db = migrated_db().await;
    let topic = create_topic("t-check.fifo").await;
    let (prefix, _) = topic.rsplit_once(':').expect("an ARN");
    let missing = format!("{prefix}:{}", topic_name("t-check-missing"));
    let route = format!("billing={missing}");
    let check = |extra: Vec<String>| {
        let mut a = run_args(
            &db,
            &topic,
            sqs().endpoint(),
            &["--sns-endpoint-url", sqs().endpoint()],
        );
        a[0] = "check".to_string();
        a.extend(extra);
        async move { crate::support::run_to_end(&a, &[], WAIT).await }
    };
    let (status, output) = check(Vec::new()).await;
    assert!(status.success(), "{output}");
    assert!(
        output.contains(&format!("ok   topic {topic} reachable")) && output.contains("FIFO topic"),
        "{output}"
    );
    let (status, output) = check(vec!["--route".into(), route]).await;
    assert_eq!(status.code(), Some(1), "{output}");
    let failed: Vec<&str> = output.lines().filter(|l| l.starts_with("FAIL ")).collect();
    assert_eq!(failed.len(), 1, "{output}");
    assert!(
        failed[0].contains(&missing)
            && failed[0].contains("the topic does not exist")
            && failed[0].contains("--route billing=")
            && failed[0].contains("[NotFound]"),
        "{}",
        failed[0]
    );
}
