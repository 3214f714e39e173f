//! Faults on the way to S3: a fault proxy on `--s3-endpoint-url` only (SQS is reached
//! directly) refuses the uploads of large bodies the way S3 itself would (REST XML:
//! `SlowDown`, `InternalError`), or stores the object and loses the answer. The large rows
//! wait, the failures are counted by kind, and the events arrive with their objects intact.

use std::time::Duration;

use tokio_postgres::Client;

use super::{
    assert_no_send_failure, create_bucket, keys, large_event, object, payload_text, pointer,
};
use crate::scenario::{
    attr, copies, count, events, insert, migrated_db, relay_command, run_args, wait_count,
};
use crate::support::{
    create_queue, receive_all, sqs, wait_until, FaultProxy, Mode, RelayProcess, TestDb,
};

/// Generous for a loaded 2-core machine; a bound on waiting only, never a measured time.
const WAIT: Duration = Duration::from_secs(60);

struct Setup {
    db: TestDb,
    client: Client,
    queue: String,
    bucket: String,
    proxy: FaultProxy,
    /// The large events' ids; every other row is small.
    large: Vec<String>,
    rows: usize,
}

/// A queue, a bucket, `large` events of about 1.5 MiB and three small ones unsent, and a proxy
/// in front of S3 already in `mode`, so the relay's first upload meets it.
async fn setup(name: &str, large: usize, mode: Mode) -> Setup {
    let db = migrated_db().await;
    let client = db.client().await;
    let queue = create_queue(name, &[]).await;
    let bucket = create_bucket(name).await;
    let proxy = FaultProxy::start(sqs().endpoint());
    proxy.set_mode(mode);
    let mut rows: Vec<_> = (0..large)
        .map(|i| large_event(&format!("{name}-big-{i}"), 1536 * 1024))
        .collect();
    rows.extend(events(&format!("{name}-small"), 3, 1));
    insert(&client, &rows, Duration::ZERO).await;
    Setup {
        db,
        client,
        queue,
        bucket,
        proxy,
        large: rows[..large].iter().map(|e| e.event_id.clone()).collect(),
        rows: rows.len(),
    }
}

fn spawn_relay(s: &Setup) -> RelayProcess {
    let extra = [
        "--offload-bucket",
        &s.bucket,
        "--offload-prefix",
        "events/",
        "--s3-endpoint-url",
        s.proxy.endpoint(),
    ];
    RelayProcess::spawn(&run_args(&s.db, &s.queue, sqs().endpoint(), &extra), &[])
}

async fn offload_failures(relay: &RelayProcess, kind: &str) -> f64 {
    relay
        .metric(&format!("outbox_offload_failures_total{{kind=\"{kind}\"}}"))
        .await
        .unwrap_or(0.0)
}

/// Every event arrived once; each large one as a pointer to an object holding its exact
/// payload, under one key per event, and nothing else in the bucket.
async fn assert_arrived_intact(s: &Setup) {
    let got = receive_all(&s.queue, s.rows, WAIT).await;
    let by_id = copies(&got);
    assert_eq!(by_id.len(), s.rows, "every event arrives: {by_id:?}");
    assert!(by_id.values().all(|&c| c == 1), "each once: {by_id:?}");
    let mut pointed = Vec::new();
    for m in &got {
        let id = attr(m, "event_id").unwrap();
        let expected = payload_text(&s.client, id).await;
        if s.large.iter().any(|l| l == id) {
            let (bucket, key) = pointer(m);
            assert_eq!(bucket, s.bucket);
            assert!(
                object(&bucket, &key).await == expected.as_bytes(),
                "{id}: the object is the payload"
            );
            pointed.push(key);
        } else {
            assert_eq!(m.body().unwrap(), expected, "{id} inline");
        }
    }
    pointed.sort();
    let mut stored = keys(&s.bucket).await;
    stored.sort();
    assert_eq!(stored, pointed, "one object per large event, no other");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_throttling_then_500s_hold_the_large_rows_count_each_kind_and_they_arrive_intact() {
    let s = setup("lf-refused", 2, Mode::Throttle).await;
    let relay = spawn_relay(&s);
    let large = format!(
        "event_id IN ({})",
        s.large
            .iter()
            .map(|id| format!("'{id}'"))
            .collect::<Vec<_>>()
            .join(", ")
    );

    // S3 asks for less traffic (503 SlowDown): the large rows are given back, a few rounds.
    wait_count(
        &s.client,
        &format!("{large} AND last_error LIKE '%SlowDown%'"),
        s.large.len() as i64,
        WAIT,
    )
    .await;
    wait_until("uploads refused a few times", WAIT, || async {
        offload_failures(&relay, "throttled").await >= 3.0
    })
    .await;
    assert_eq!(offload_failures(&relay, "transient").await, 0.0);
    assert_eq!(
        count(&s.client, &format!("{large} AND sent_at IS NOT NULL")).await,
        0
    );
    assert_eq!(count(&s.client, "quarantined_at IS NOT NULL").await, 0);
    assert_eq!(
        count(&s.client, "attempts > 1").await,
        0,
        "a refused upload is not the rows' fault: no attempt is kept"
    );
    assert!(
        s.proxy
            .actions()
            .iter()
            .all(|a| a.starts_with("S3.PutObject /")),
        "only uploads went through the proxy: {:?}",
        s.proxy.actions()
    );
    assert!(
        keys(&s.bucket).await.is_empty(),
        "nothing was stored meanwhile"
    );
    // The small rows, batch-mates of the large ones, do not wait for S3.
    wait_count(
        &s.client,
        &format!("NOT ({large}) AND sent_at IS NOT NULL"),
        (s.rows - s.large.len()) as i64,
        WAIT,
    )
    .await;
    assert_no_send_failure(&relay).await;

    // S3 fails (500 InternalError): the same, counted as transient.
    s.proxy.set_mode(Mode::Error500);
    wait_count(
        &s.client,
        &format!("{large} AND last_error LIKE '%InternalError%'"),
        s.large.len() as i64,
        WAIT,
    )
    .await;
    wait_until("uploads failed a few times", WAIT, || async {
        offload_failures(&relay, "transient").await >= 3.0
    })
    .await;
    assert_eq!(
        count(&s.client, &format!("{large} AND sent_at IS NOT NULL")).await,
        0
    );
    assert_eq!(count(&s.client, "attempts > 1").await, 0);
    assert_eq!(relay.http_status("/readyz").await, 200);

    s.proxy.set_mode(Mode::Pass);
    wait_count(&s.client, "sent_at IS NOT NULL", s.rows as i64, WAIT).await;
    assert_eq!(count(&s.client, "attempts <> 1").await, 0);
    assert_eq!(count(&s.client, "quarantined_at IS NOT NULL").await, 0);
    assert_arrived_intact(&s).await;
    assert_eq!(
        relay.metric("outbox_offloaded_total").await,
        Some(s.large.len() as f64)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_upload_answer_is_uploaded_again_under_the_same_key_and_the_event_arrives_once() {
    // The first upload stores its object, but its answer is lost.
    let s = setup("lf-drop", 1, Mode::Pass).await;
    s.proxy.fault_next(Mode::DropResponse, 1);
    let relay = spawn_relay(&s);
    wait_count(&s.client, "sent_at IS NOT NULL", s.rows as i64, WAIT).await;
    assert_eq!(s.proxy.faulted(), 1);
    let uploads = s.proxy.actions();
    assert!(
        uploads.len() >= 2 && uploads.iter().all(|a| a == &uploads[0]),
        "the same object written again: {uploads:?}"
    );
    assert!(offload_failures(&relay, "transient").await >= 1.0);
    assert_eq!(count(&s.client, "attempts <> 1").await, 0);
    assert_arrived_intact(&s).await;
}

/// S3 refuses one body as bad input: only that row is quarantined (`rejected`, S3's code in
/// `last_error`), never retried by itself; the other large row and the small ones are sent.
/// An operator's re-drive sends it, under the key it would always have had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_s3_refuses_as_bad_input_is_quarantined_alone_and_a_redrive_sends_it() {
    let s = setup("lf-bad", 2, Mode::Pass).await;
    s.proxy.fault_next(Mode::BadInput, 1);
    let relay = spawn_relay(&s);
    let others = s.rows as i64 - 1;
    wait_count(&s.client, "sent_at IS NOT NULL", others, WAIT).await;
    wait_count(
        &s.client,
        "quarantine_reason = 'rejected' AND last_error LIKE '%InvalidArgument%'",
        1,
        WAIT,
    )
    .await;
    let refused: String = s
        .client
        .query_one(
            "SELECT event_id FROM outbox WHERE quarantined_at IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(s.large.contains(&refused), "{refused} is a large row");
    assert_eq!(offload_failures(&relay, "permanent").await, 1.0);
    assert_no_send_failure(&relay).await;
    assert_eq!(
        keys(&s.bucket).await.len(),
        1,
        "only the other body is stored"
    );
    // Quarantined means not retried: the fault was one-shot, yet the row stays put.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        count(&s.client, "quarantined_at IS NOT NULL AND sent_at IS NULL").await,
        1
    );

    relay_command(&[
        "quarantine",
        "retry",
        "--all",
        "--reason",
        "rejected",
        "--database-url",
        &s.db.url,
    ])
    .await;
    wait_count(&s.client, "sent_at IS NOT NULL", s.rows as i64, WAIT).await;
    assert_arrived_intact(&s).await;
}
