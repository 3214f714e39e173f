//! A topic in another region than the relay: SNS answers PublishBatch (and GetTopicAttributes)
//! `InvalidParameter` "Invalid parameter: TopicArn" whatever the entries hold. That is
//! configuration, not bad input: the batch is not split and no row is quarantined `rejected`;
//! the topic is parked, `/readyz` names it and what to set, and `check` says what to fix.

use std::time::Duration;

use crate::scenario::{copies, count, events, insert, migrated_db, run_args, wait_count};
use crate::support::{
    create_queue, create_topic, receive_all, run_to_end, sqs, subscribe_queue, wait_until,
    FaultProxy, Mode, RelayProcess,
};

const ROWS: usize = 20;
/// Generous for a loaded 2-core machine; a bound on waiting only, never a measured time.
const WAIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_in_another_region_is_parked_as_configuration_not_its_rows_rejected() {
    let db = migrated_db().await;
    let client = db.client().await;
    let topic = create_topic("tr-region").await;
    let queue = create_queue("tr-region", &[]).await;
    subscribe_queue(&topic, &queue, true).await;
    let proxy = FaultProxy::start(sqs().endpoint());
    proxy.set_mode(Mode::WrongRegion);
    insert(&client, &events("tr-region", ROWS, 5), Duration::ZERO).await;
    let relay = RelayProcess::spawn(
        &run_args(
            &db,
            &topic,
            sqs().endpoint(),
            &["--sns-endpoint-url", proxy.endpoint()],
        ),
        &[],
    );
    wait_count(
        &client,
        "quarantine_reason = 'destination' AND last_error LIKE '%Invalid parameter: TopicArn%'",
        ROWS as i64,
        WAIT,
    )
    .await;
    assert_eq!(count(&client, "sent_at IS NOT NULL").await, 0);
    assert_eq!(
        count(
            &client,
            "quarantine_reason IS DISTINCT FROM 'destination' AND quarantined_at IS NOT NULL"
        )
        .await,
        0,
        "no row is rejected for the topic's region"
    );
    let (ready, why) = relay.http_get("/readyz").await;
    assert_eq!(ready, 503, "{why}");
    assert!(
        why.contains(&topic) && why.contains("AWS_REGION"),
        "/readyz names the topic and what to set: {why}"
    );
    assert!(
        relay
            .metric("outbox_send_failures_total{kind=\"config\"}")
            .await
            >= Some(1.0)
    );
    assert_eq!(
        relay
            .metric("outbox_send_failures_total{kind=\"permanent\"}")
            .await
            .unwrap_or(0.0),
        0.0,
        "not counted as bad input"
    );
    let check: Vec<String> = [
        "check",
        "--database-url",
        &db.url,
        "--queue-url",
        &topic,
        "--sqs-endpoint-url",
        sqs().endpoint(),
        "--sns-endpoint-url",
        proxy.endpoint(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let (status, output) = run_to_end(&check, &[], WAIT).await;
    assert!(!status.success(), "{output}");
    assert!(
        output.contains("the topic is not in the relay's region: set AWS_REGION"),
        "{output}"
    );

    proxy.set_mode(Mode::Pass);
    wait_count(&client, "sent_at IS NOT NULL", ROWS as i64, WAIT).await;
    assert_eq!(
        count(&client, "attempts <> 1").await,
        0,
        "a park costs no attempt"
    );
    let got = receive_all(&queue, ROWS, WAIT).await;
    assert_eq!(copies(&got).len(), ROWS);
    wait_until("ready again", WAIT, || async {
        relay.http_status("/readyz").await == 200
    })
    .await;
}
