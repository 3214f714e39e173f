//! Faults on the way to SNS: a fault proxy on `--sns-endpoint-url` only (SQS is reached
//! directly) answers PublishBatch the way SNS itself would refuse it (query-protocol XML), or
//! forwards it and loses the answer. What the rows, the metrics and the subscribed queue show
//! during the fault and after it.

use std::collections::HashMap;
use std::time::Duration;

use tokio_postgres::Client;

use crate::faults::KINDS;
use crate::scenario::{
    attr, copies, count, events, insert, message_group, migrated_db, run_args, wait_count,
};
use crate::support::{
    create_queue, create_topic, receive_all, sqs, subscribe_queue, wait_until, FaultProxy, Mode,
    RelayProcess, TestDb,
};

const ROWS: usize = 30;
/// Generous for a loaded 2-core machine; a bound on waiting only, never a measured time.
const WAIT: Duration = Duration::from_secs(60);

struct Setup {
    db: TestDb,
    client: Client,
    topic: String,
    /// Subscribed with raw message delivery, so `event_id` is a message attribute.
    queue: String,
    proxy: FaultProxy,
}

/// A topic (FIFO when `name` ends in `.fifo`) with a queue subscribed, `ROWS` unsent rows for
/// it, and a proxy in front of SNS already in `mode`, so the relay's first publish meets it.
async fn setup(name: &str, mode: Mode) -> Setup {
    let db = migrated_db().await;
    let client = db.client().await;
    let topic = create_topic(name).await;
    let queue = create_queue(name, &[]).await;
    subscribe_queue(&topic, &queue, true).await;
    let proxy = FaultProxy::start(sqs().endpoint());
    proxy.set_mode(mode);
    insert(&client, &events(name, ROWS, 5), Duration::ZERO).await;
    Setup {
        db,
        client,
        topic,
        queue,
        proxy,
    }
}

/// The relay publishing to the topic through the proxy; SQS, which the relay does not call
/// for a topic, stays addressed directly.
fn spawn_relay(s: &Setup) -> RelayProcess {
    RelayProcess::spawn(
        &run_args(
            &s.db,
            &s.topic,
            sqs().endpoint(),
            &["--sns-endpoint-url", s.proxy.endpoint()],
        ),
        &[],
    )
}

async fn failures(relay: &RelayProcess, kind: &str) -> f64 {
    relay
        .metric(&format!("outbox_send_failures_total{{kind=\"{kind}\"}}"))
        .await
        .unwrap_or(0.0)
}

/// Every event arrived at the subscribed queue exactly once.
async fn assert_each_arrives_once(s: &Setup) -> Vec<aws_sdk_sqs::types::Message> {
    let got = receive_all(&s.queue, ROWS, WAIT).await;
    let by_id = copies(&got);
    assert_eq!(by_id.len(), ROWS, "every event arrives: {by_id:?}");
    assert!(
        by_id.values().all(|&c| c == 1),
        "each event once: {by_id:?}"
    );
    got
}

/// While PublishBatch fails as a whole with `code` (counted as `kind`): every row has been
/// tried and given back a few times with its attempt refunded, nothing is marked or
/// quarantined, readiness holds. Then the fault is lifted and every row goes out on its first
/// counted attempt.
async fn whole_publish_failure(s: &Setup, kind: &str, code: &str) -> RelayProcess {
    let relay = spawn_relay(s);
    wait_count(
        &s.client,
        &format!("last_error LIKE '%{code}%'"),
        ROWS as i64,
        WAIT,
    )
    .await;
    wait_until("every row failed about three times", WAIT, || async {
        failures(&relay, kind).await >= 3.0 * ROWS as f64
    })
    .await;
    assert!(
        s.proxy
            .actions()
            .iter()
            .all(|a| a == "SNS.PublishBatch" || a == "SNS.GetTopicAttributes"),
        "only publishes and the topic's size reads went through the proxy: {:?}",
        s.proxy.actions()
    );
    assert_eq!(count(&s.client, "sent_at IS NOT NULL").await, 0);
    assert_eq!(count(&s.client, "quarantined_at IS NOT NULL").await, 0);
    assert_eq!(
        count(&s.client, "attempts > 1").await,
        0,
        "a refused publish is not the rows' fault: no attempt is kept"
    );
    for other in KINDS.iter().filter(|&&k| k != kind) {
        assert_eq!(failures(&relay, other).await, 0.0, "no {other} failure");
    }
    assert_eq!(relay.http_status("/readyz").await, 200);

    s.proxy.set_mode(Mode::Pass);
    wait_count(&s.client, "sent_at IS NOT NULL", ROWS as i64, WAIT).await;
    assert_eq!(
        count(&s.client, "attempts <> 1").await,
        0,
        "every refused attempt was refunded: only the successful one counts"
    );
    assert_eq!(count(&s.client, "quarantined_at IS NOT NULL").await, 0);
    relay
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_topic_slows_the_relay_keeps_attempts_and_each_event_arrives_once() {
    let s = setup("tf-throttle", Mode::Throttle).await;
    let relay = whole_publish_failure(&s, "throttled", "Throttling").await;
    assert!(
        relay.output().contains("relay backing off"),
        "throttling pauses the relay: {}",
        relay.output()
    );
    assert_each_arrives_once(&s).await;
    let exposition = relay.scrape().await;
    assert!(
        exposition.contains("outbox_send_failures_total{kind=\"throttled\"}"),
        "{exposition}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sns_500s_release_the_rows_and_nothing_is_lost_once_sns_recovers() {
    let s = setup("tf-500", Mode::Error500).await;
    let _relay = whole_publish_failure(&s, "transient", "InternalError").await;
    assert_each_arrives_once(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_publish_answer_is_resent_with_its_event_id_and_a_fifo_topic_drops_the_copy() {
    // The first publish reaches SNS (and the queue) but its answer is lost.
    let s = setup("tf-drop.fifo", Mode::Pass).await;
    s.proxy.fault_next(Mode::DropResponse, 1);
    let relay = spawn_relay(&s);
    wait_count(&s.client, "sent_at IS NOT NULL", ROWS as i64, WAIT).await;
    assert_eq!(s.proxy.faulted(), 1);
    assert_eq!(s.proxy.forwarded(), s.proxy.requests());
    assert!(
        failures(&relay, "transient").await >= 1.0,
        "the lost answer failed its request, so its rows were published again"
    );
    assert_eq!(count(&s.client, "attempts <> 1").await, 0);

    // SNS FIFO deduplicates on MessageDeduplicationId (the event_id): the resent copies are
    // dropped, and each group keeps its order.
    let got = assert_each_arrives_once(&s).await;
    let mut by_group: HashMap<String, Vec<usize>> = HashMap::new();
    for m in &got {
        let group = message_group(m)
            .expect("a FIFO message has its group")
            .to_string();
        let index: usize = attr(m, "event_id")
            .and_then(|id| id.rsplit('-').next())
            .and_then(|i| i.parse().ok())
            .expect("tf-drop-N");
        by_group.entry(group).or_default().push(index);
    }
    for (group, seq) in &by_group {
        assert!(
            seq.windows(2).all(|w| w[0] < w[1]),
            "group {group} out of order: {seq:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_standard_topic_a_lost_publish_answer_yields_copies_with_the_same_event_id() {
    // No deduplication on a standard topic: the published-again rows arrive twice, and each
    // copy is the same event, body and event_id alike.
    let s = setup("tf-drop-std", Mode::Pass).await;
    s.proxy.fault_next(Mode::DropResponse, 1);
    let written = events("tf-drop-std", ROWS, 5);
    let _relay = spawn_relay(&s);
    wait_count(&s.client, "sent_at IS NOT NULL", ROWS as i64, WAIT).await;
    assert_eq!(s.proxy.faulted(), 1);
    let got = receive_all(&s.queue, ROWS + 1, WAIT).await;
    let by_id = copies(&got);
    assert_eq!(by_id.len(), ROWS, "every event arrives: {by_id:?}");
    assert!(
        by_id.values().all(|&c| c <= 2) && by_id.values().any(|&c| c == 2),
        "the lost request's rows arrive twice, the others once: {by_id:?}"
    );
    let payloads: HashMap<&str, &serde_json::Value> = written
        .iter()
        .map(|e| (e.event_id.as_str(), &e.payload))
        .collect();
    for m in &got {
        let id = attr(m, "event_id").expect("every copy carries event_id");
        let body: serde_json::Value = serde_json::from_str(m.body().unwrap()).unwrap();
        assert_eq!(&&body, payloads.get(id).expect("a written event"), "{id}");
    }
}
