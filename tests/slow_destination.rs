//! A destination that slows down under load gets fewer requests, not timeouts and copies
//! (adaptive request concurrency, docs/operations.md "Slow destinations").
//!
//! scripts/test runs `slow_destination::a_backlog` again on moto, the slow destination itself.

use std::time::Duration;

use crate::scenario::{count, events, insert, migrated_db, run_args, wait_count};
use crate::support::{
    create_queue, sqs, sqs_client, wait_until, FaultProxy, Mode, RelayProcess, SqsKind,
};

/// Messages on the queue, visible or not: with every row sent once, exactly the rows.
async fn messages_on(queue_url: &str) -> i64 {
    use aws_sdk_sqs::types::QueueAttributeName as A;
    let attrs = sqs_client()
        .await
        .get_queue_attributes()
        .queue_url(queue_url)
        .attribute_names(A::ApproximateNumberOfMessages)
        .attribute_names(A::ApproximateNumberOfMessagesNotVisible)
        .send()
        .await
        .expect("GetQueueAttributes");
    let attrs = attrs.attributes().expect("attributes");
    [
        A::ApproximateNumberOfMessages,
        A::ApproximateNumberOfMessagesNotVisible,
    ]
    .iter()
    .map(|a| attrs.get(a).map_or(0, |v| v.parse::<i64>().unwrap()))
    .sum()
}

fn limit_series(queue_url: &str) -> String {
    format!("outbox_request_concurrency_limit{{destination=\"{queue_url}\"}}")
}

/// moto answers one request at a time on one Python core, more slowly the fuller its queue
/// (shared/MEASURED.md): 32 requests in flight wait there for seconds and met the 10 s send
/// timeout, were sent again (copies) and backed the relay off. With the relay's defaults the
/// backlog must arrive without a single send timeout and without a copy. On fauxqs the same
/// server shape is a proxy serving one request at a time, with a send timeout that 32 queued
/// requests outlast.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_is_delivered_without_send_timeouts() {
    let n = 1000;
    let db = migrated_db().await;
    let client = db.client().await;
    let queue = create_queue("slow", &[]).await;
    insert(&client, &events("slow", n, 50), Duration::ZERO).await;

    let proxy;
    let (endpoint, extra): (&str, &[&str]) = match sqs().kind() {
        SqsKind::Moto => (sqs().endpoint(), &[]),
        SqsKind::Fauxqs => {
            proxy = FaultProxy::start(sqs().endpoint());
            proxy.set_mode(Mode::Serial(Duration::from_millis(100)));
            (proxy.endpoint(), &["--send-timeout", "2s"])
        }
    };
    let relay = RelayProcess::spawn(&run_args(&db, &queue, endpoint, extra), &[]);
    wait_count(
        &client,
        "sent_at IS NOT NULL",
        n as i64,
        Duration::from_secs(600),
    )
    .await;

    assert_eq!(
        relay
            .metric("outbox_send_failures_total{kind=\"transient\"}")
            .await,
        Some(0.0),
        "no send timed out:\n{}",
        relay.output()
    );
    assert!(
        !relay.output().contains("SendMessageBatch failed"),
        "no request failed:\n{}",
        relay.output()
    );
    assert_eq!(
        count(&client, "attempts > 1").await,
        0,
        "no row was tried twice"
    );
    assert_eq!(
        messages_on(&queue).await,
        n as i64,
        "every row arrived once: no copies"
    );
    let limit = relay.metric(&limit_series(&queue)).await.expect("gauge");
    assert!(
        (1.0..=32.0).contains(&limit),
        "the limit stays within 1 and --max-in-flight: {limit}"
    );
}

/// Behind a proxy, the destination first answers in a constant 50 ms however many requests
/// wait (the limit rises to the ceiling), then one request at a time (each waits for all before
/// it): the limit falls, and the gauge shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limit_falls_when_latency_rises_with_load() {
    let ceiling = 8;
    let db = migrated_db().await;
    let client = db.client().await;
    let queue = create_queue("latency", &[]).await;
    let proxy = FaultProxy::start(sqs().endpoint());
    proxy.set_mode(Mode::Delay(Duration::from_millis(50)));
    let n = 3000;
    insert(&client, &events("latency", n, 50), Duration::ZERO).await;
    let ceiling_arg = ceiling.to_string();
    let relay = RelayProcess::spawn(
        &run_args(
            &db,
            &queue,
            proxy.endpoint(),
            &["--max-in-flight", &ceiling_arg],
        ),
        &[],
    );
    let series = limit_series(&queue);
    wait_until(
        "the limit reaches --max-in-flight",
        Duration::from_secs(60),
        || async { relay.metric(&series).await == Some(ceiling as f64) },
    )
    .await;

    proxy.set_mode(Mode::Serial(Duration::from_millis(50)));
    wait_until(
        "the limit falls below --max-in-flight",
        Duration::from_secs(60),
        || async {
            relay
                .metric(&series)
                .await
                .is_some_and(|l| l < ceiling as f64)
        },
    )
    .await;

    wait_count(
        &client,
        "sent_at IS NOT NULL",
        n as i64,
        Duration::from_secs(300),
    )
    .await;
    assert_eq!(
        relay
            .metric("outbox_send_failures_total{kind=\"transient\"}")
            .await,
        Some(0.0),
        "{}",
        relay.output()
    );
    assert_eq!(messages_on(&queue).await, n as i64, "no copies");
}
