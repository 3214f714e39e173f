//! Large events through S3 (`--offload-bucket`): the body goes to the bucket, the message
//! carries the SQS Extended Client's pointer, and a real Extended Client library reads the
//! event back whole, from a queue or from a topic's raw subscription. The local SQS server
//! serves S3 (and SNS) on the same endpoint (path-style).

mod faults;
mod region;

use std::time::Duration;

use aws_sdk_sqs::types::Message;
use sha2::{Digest, Sha256};

use crate::scenario::{count, events, insert, migrated_db, run_args, wait_count, Event};
use crate::support::{
    create_queue, create_topic, receive_all, repo_root, run_to_end, sqs, subscribe_queue,
    test_sdk_config, unique, RelayProcess, TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY,
};

const POINTER_CLASS: &str = "software.amazon.payloadoffloading.PayloadS3Pointer";

fn s3_client() -> aws_sdk_s3::Client {
    let config = aws_sdk_s3::config::Builder::from(&test_sdk_config(sqs().endpoint()))
        .force_path_style(true)
        .build();
    aws_sdk_s3::Client::from_conf(config)
}

pub(crate) async fn create_bucket(prefix: &str) -> String {
    let name = bucket_name(prefix);
    create_named_bucket(&name).await;
    name
}

/// A bucket name no other test uses, for a bucket created later (or never).
fn bucket_name(prefix: &str) -> String {
    format!("{prefix}-{}-{}", unique(), std::process::id())
}

async fn create_named_bucket(name: &str) {
    s3_client()
        .create_bucket()
        .bucket(name)
        .send()
        .await
        .unwrap_or_else(|e| panic!("CreateBucket {name}: {e:?}"));
}

/// A payload of about `bytes` bytes.
pub(crate) fn large_event(id: &str, bytes: usize) -> Event {
    let mut e = events(id, 1, 1).remove(0);
    e.event_id = id.to_string();
    // Not one repeated character: a body cut or shifted anywhere would not compare equal.
    let blob: String = (0..bytes)
        .map(|i| (b'a' + (i % 23) as u8) as char)
        .collect();
    e.payload = serde_json::json!({"document": blob, "note": "caf\u{e9} \u{1F600}"});
    e
}

/// The payload as the relay reads it (PostgreSQL's text of the jsonb).
async fn payload_text(client: &tokio_postgres::Client, event_id: &str) -> String {
    client
        .query_one(
            "SELECT payload::text FROM outbox WHERE event_id = $1",
            &[&event_id],
        )
        .await
        .expect("payload")
        .get(0)
}

fn attr<'a>(m: &'a Message, name: &str) -> Option<(&'a str, &'a str)> {
    let a = m.message_attributes()?.get(name)?;
    Some((a.data_type(), a.string_value()?))
}

/// The pointer's (bucket, key).
fn pointer(m: &Message) -> (String, String) {
    let body: serde_json::Value = serde_json::from_str(m.body().unwrap()).expect("JSON pointer");
    assert_eq!(body[0], POINTER_CLASS, "{body}");
    (
        body[1]["s3BucketName"].as_str().unwrap().to_string(),
        body[1]["s3Key"].as_str().unwrap().to_string(),
    )
}

async fn object(bucket: &str, key: &str) -> Vec<u8> {
    let out = s3_client()
        .get_object()
        .bucket(bucket)
        .key(key)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GetObject {bucket}/{key}: {e:?}"));
    out.body.collect().await.expect("object body").to_vec()
}

pub(crate) async fn keys(bucket: &str) -> Vec<String> {
    let out = s3_client()
        .list_objects_v2()
        .bucket(bucket)
        .send()
        .await
        .expect("ListObjectsV2");
    out.contents()
        .iter()
        .filter_map(|o| o.key().map(str::to_string))
        .collect()
}

fn offload_args(bucket: &str) -> Vec<String> {
    [
        "--offload-bucket",
        bucket,
        "--offload-prefix",
        "events/",
        "--s3-endpoint-url",
        sqs().endpoint(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_3_mib_event_arrives_as_a_pointer_to_its_exact_bytes_and_small_ones_inline() {
    let db = migrated_db().await;
    let client = db.client().await;
    let queue = create_queue("large", &[]).await;
    let bucket = create_bucket("large").await;
    let big = large_event("big-1", 3 * 1024 * 1024);
    let mut small = events("small", 3, 1);
    small[0].headers = serde_json::json!({"tenant": "t1"});
    let mut rows = vec![big.clone()];
    rows.extend(small.clone());
    rows[0].headers = serde_json::json!({"tenant": "t1"});
    insert(&client, &rows, Duration::ZERO).await;
    let extra = offload_args(&bucket);
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let relay = RelayProcess::spawn(&run_args(&db, &queue, sqs().endpoint(), &extra), &[]);
    wait_count(&client, "sent_at IS NOT NULL", 4, Duration::from_secs(60)).await;

    let messages = receive_all(&queue, 4, Duration::from_secs(30)).await;
    assert_eq!(messages.len(), 4);
    let expected = payload_text(&client, "big-1").await;
    let large: Vec<&Message> = messages
        .iter()
        .filter(|m| attr(m, "event_id").map(|a| a.1) == Some("big-1"))
        .collect();
    assert_eq!(large.len(), 1);
    let m = large[0];
    let size = expected.len().to_string();
    assert_eq!(
        attr(m, "ExtendedPayloadSize"),
        Some(("Number", size.as_str()))
    );
    assert_eq!(attr(m, "tenant"), Some(("String", "t1")));
    assert_eq!(attr(m, "event_type").map(|a| a.1), Some("order.placed"));
    let (in_bucket, key) = pointer(m);
    assert_eq!(in_bucket, bucket);
    assert!(key.starts_with("events/"), "{key}");
    assert!(
        object(&bucket, &key).await == expected.as_bytes(),
        "object differs from the payload"
    );
    for m in messages
        .iter()
        .filter(|m| attr(m, "event_id").map(|a| a.1) != Some("big-1"))
    {
        assert_eq!(attr(m, "ExtendedPayloadSize"), None);
        let id = attr(m, "event_id").unwrap().1;
        assert_eq!(m.body().unwrap(), payload_text(&client, id).await);
    }
    assert_eq!(keys(&bucket).await, vec![key.clone()]);
    let offloaded = relay.metric("outbox_offloaded_total").await;
    assert_eq!(offloaded, Some(1.0));

    // A resend (a re-drive, or a crash between the ack and the settlement) writes the same
    // object again: one object per event, never a leaked copy.
    client
        .execute(
            "UPDATE outbox SET sent_at = NULL, attempts = 0 WHERE event_id = 'big-1'",
            &[],
        )
        .await
        .unwrap();
    wait_count(&client, "sent_at IS NOT NULL", 4, Duration::from_secs(60)).await;
    let again = receive_all(&queue, 1, Duration::from_secs(30)).await;
    assert_eq!(again.len(), 1);
    assert_eq!(pointer(&again[0]), (bucket.clone(), key.clone()));
    assert_eq!(keys(&bucket).await, vec![key]);
    drop(relay);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_aws_extended_client_library_reads_a_3_mib_event_back_whole() {
    let db = migrated_db().await;
    let client = db.client().await;
    let queue = create_queue("extended", &[]).await;
    let bucket = create_bucket("extended").await;
    let rows = vec![
        large_event("xl-1", 3 * 1024 * 1024),
        events("xs", 1, 1).remove(0),
    ];
    insert(&client, &rows, Duration::ZERO).await;
    let extra = offload_args(&bucket);
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let relay = RelayProcess::spawn(&run_args(&db, &queue, sqs().endpoint(), &extra), &[]);
    wait_count(&client, "sent_at IS NOT NULL", 2, Duration::from_secs(60)).await;
    drop(relay);

    let (received, stdout) = extended_client_receive(&queue, 2).await;
    assert_eq!(received.len(), 2, "{stdout}");
    for id in ["xl-1", "xs-0"] {
        let got = read_back_whole(&client, &received, &stdout, id, id == "xl-1").await;
        // The library hides its reserved attribute; the relay's own stay.
        let names: Vec<&str> = got["attributes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert!(names.contains(&"event_id"), "{names:?}");
        assert!(!names.contains(&"ExtendedPayloadSize"), "{names:?}");
    }
}

/// What the real Extended Client library (tests/consumers/extended_client_receive.py) resolves
/// from `queue`: one JSON object per message, and the consumer's whole output for messages.
async fn extended_client_receive(queue: &str, count: usize) -> (Vec<serde_json::Value>, String) {
    let python = repo_root().join(".tools/venv/bin/python");
    let script = repo_root().join("tests/consumers/extended_client_receive.py");
    let mut consumer = std::process::Command::new(&python);
    consumer
        .arg(&script)
        .args([queue, &count.to_string(), "60"])
        .env("AWS_ENDPOINT_URL_SQS", sqs().endpoint())
        .env("AWS_ENDPOINT_URL_S3", sqs().endpoint())
        .env("AWS_REGION", "us-east-1")
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", TEST_ACCESS_KEY_ID)
        .env("AWS_SECRET_ACCESS_KEY", TEST_SECRET_ACCESS_KEY)
        .env("AWS_CONFIG_FILE", "/dev/null")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
        .env("AWS_EC2_METADATA_DISABLED", "true");
    // std's Command on a blocking thread: tokio's `process` feature, for the tests alone, would
    // make the test build compile tokio and everything above it a second time.
    let output = tokio::task::spawn_blocking(move || consumer.output())
        .await
        .expect("the consumer's thread")
        .unwrap_or_else(|e| {
            panic!(
                "{} (scripts/test installs amazon-sqs-extended-client into .tools/venv): {e}",
                python.display()
            )
        });
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "consumer failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let received: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON line per message"))
        .collect();
    (received, stdout.into_owned())
}

/// A missing bucket holds only the rows that need it: the large rows are parked on the
/// bucket's own back-off (quarantine reason `destination`, the bucket named), the small rows of
/// the same queue and the same claims flow, the failure is S3's alone in the metrics, and the
/// relay is not ready until the bucket exists; then the large rows follow by themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_bucket_parks_only_the_large_rows_and_they_follow_once_it_exists() {
    let db = migrated_db().await;
    let client = db.client().await;
    let queue = create_queue("nobucket", &[]).await;
    let bucket = bucket_name("created-later");
    let mut rows = vec![
        large_event("later-1", 2 * 1024 * 1024),
        large_event("later-2", 1536 * 1024),
    ];
    rows.extend(events("small", 30, 5));
    insert(&client, &rows, Duration::ZERO).await;
    let extra = offload_args(&bucket);
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let relay = RelayProcess::spawn(&run_args(&db, &queue, sqs().endpoint(), &extra), &[]);
    wait_count(&client, "sent_at IS NOT NULL", 30, Duration::from_secs(60)).await;
    wait_count(
        &client,
        &format!("quarantine_reason = 'destination' AND last_error LIKE '%bucket s3://{bucket}%'"),
        2,
        Duration::from_secs(60),
    )
    .await;
    let small = receive_all(&queue, 30, Duration::from_secs(30)).await;
    assert_eq!(
        small.len(),
        30,
        "the small rows went while the bucket was missing"
    );
    assert!(small
        .iter()
        .all(|m| !m.body().unwrap().contains("PayloadS3Pointer")));
    // NoSuchBucket is classified like a missing queue, and counted once, as S3's.
    let failures = relay
        .metric("outbox_offload_failures_total{kind=\"destination\"}")
        .await;
    assert!(failures >= Some(1.0), "{failures:?}");
    assert_no_send_failure(&relay).await;
    let (ready, why) = relay.http_get("/readyz").await;
    assert_eq!(ready, 503, "the relay's own bucket refuses it: {why}");
    assert!(why.contains(&bucket), "{why}");
    assert_eq!(keys_or_none(&bucket).await, None);
    create_named_bucket(&bucket).await;
    wait_count(&client, "sent_at IS NOT NULL", 32, Duration::from_secs(90)).await;
    assert_eq!(
        count(&client, "attempts <> 1").await,
        0,
        "a park costs no attempt"
    );
    let messages = receive_all(&queue, 2, Duration::from_secs(30)).await;
    assert_eq!(messages.len(), 2);
    for m in &messages {
        let (_, key) = pointer(m);
        let event_id = attr(m, "event_id").expect("event_id").1;
        let expected = payload_text(&client, event_id).await;
        assert!(object(&bucket, &key).await == expected.as_bytes());
    }
    assert_eq!(relay.http_status("/readyz").await, 200);
    drop(relay);
}

/// What the Extended Client read for `id` (of `received`, its output `stdout`): the row's
/// payload, byte for byte (length and SHA-256), from S3 or not as `from_s3` says.
async fn read_back_whole<'a>(
    client: &tokio_postgres::Client,
    received: &'a [serde_json::Value],
    stdout: &str,
    id: &str,
    from_s3: bool,
) -> &'a serde_json::Value {
    let expected = payload_text(client, id).await;
    let got = received
        .iter()
        .find(|r| r["event_id"] == id)
        .unwrap_or_else(|| panic!("{id} not received: {stdout}"));
    assert_eq!(got["bytes"], expected.len(), "{id}");
    assert_eq!(
        got["sha256"],
        format!("{:x}", Sha256::digest(expected.as_bytes())),
        "{id}"
    );
    assert_eq!(got["from_s3"], from_s3, "{id}");
    got
}

/// An S3 failure is counted in `outbox_offload_failures_total` only: nothing was sent.
async fn assert_no_send_failure(relay: &RelayProcess) {
    let scrape = relay.scrape().await;
    let send_failures: f64 = scrape
        .lines()
        .filter(|l| l.starts_with("outbox_send_failures_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(
        send_failures, 0.0,
        "an S3 failure is not a send failure:\n{scrape}"
    );
}

async fn keys_or_none(bucket: &str) -> Option<Vec<String>> {
    match s3_client().list_objects_v2().bucket(bucket).send().await {
        Ok(out) => Some(
            out.contents()
                .iter()
                .filter_map(|o| o.key().map(str::to_string))
                .collect(),
        ),
        Err(_) => None,
    }
}

async fn check_with(db_url: &str, queue: &str, bucket: &str) -> (Option<i32>, String) {
    let mut a: Vec<String> = [
        "check",
        "--database-url",
        db_url,
        "--queue-url",
        queue,
        "--sqs-endpoint-url",
        sqs().endpoint(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.extend(offload_args(bucket));
    let (status, output) = run_to_end(&a, &[], Duration::from_secs(60)).await;
    assert!(!output.contains(TEST_SECRET_ACCESS_KEY), "{output}");
    (status.code(), output)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_writes_a_probe_object_to_the_bucket_and_names_a_missing_one() {
    let db = migrated_db().await;
    let queue = create_queue("check-offload", &[]).await;
    let bucket = create_bucket("check-offload").await;
    let (code, output) = check_with(&db.url, &queue, &bucket).await;
    assert_eq!(code, Some(0), "{output}");
    assert!(
        output.contains(&format!(
            "ok   bucket {bucket} takes objects under \"events/\""
        )),
        "{output}"
    );
    assert_eq!(keys(&bucket).await, vec!["events/outbox-relay-check"]);

    let missing = format!("never-created-{}", unique());
    let (code, output) = check_with(&db.url, &queue, &missing).await;
    assert_eq!(code, Some(1), "{output}");
    let failed: Vec<&str> = output.lines().filter(|l| l.starts_with("FAIL ")).collect();
    assert_eq!(failed.len(), 1, "{output}");
    assert!(
        failed[0].contains("the bucket does not exist") && failed[0].contains("NoSuchBucket"),
        "{output}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_fifo_queue_a_large_event_keeps_its_place_in_its_group() {
    let db = migrated_db().await;
    let client = db.client().await;
    let queue = create_queue("large.fifo", &[]).await;
    let bucket = create_bucket("large-fifo").await;
    let mut rows = events("fifo", 5, 1);
    rows[2] = large_event("fifo-2", 2 * 1024 * 1024);
    for e in &mut rows {
        e.aggregate_id = "one-group".into();
    }
    insert(&client, &rows, Duration::ZERO).await;
    let extra = offload_args(&bucket);
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let relay = RelayProcess::spawn(&run_args(&db, &queue, sqs().endpoint(), &extra), &[]);
    wait_count(&client, "sent_at IS NOT NULL", 5, Duration::from_secs(60)).await;
    let messages = receive_all(&queue, 5, Duration::from_secs(30)).await;
    let order: Vec<&str> = messages
        .iter()
        .map(|m| attr(m, "event_id").unwrap().1)
        .collect();
    assert_eq!(order, ["fifo-0", "fifo-1", "fifo-2", "fifo-3", "fifo-4"]);
    let (_, key) = pointer(&messages[2]);
    let expected = payload_text(&client, "fifo-2").await;
    assert!(object(&bucket, &key).await == expected.as_bytes());
    drop(relay);
}

/// Ordered delivery with the bucket missing: the large event's group stops at it (nothing of
/// the group overtakes it), other groups flow, and once the bucket exists the group resumes in
/// order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_fifo_queue_a_missing_bucket_holds_only_the_large_events_group_in_order() {
    let db = migrated_db().await;
    let client = db.client().await;
    let queue = create_queue("held.fifo", &[]).await;
    let bucket = bucket_name("fifo-later");
    let mut rows = events("held", 5, 1);
    rows[2] = large_event("held-2", 2 * 1024 * 1024);
    for e in &mut rows {
        e.aggregate_id = "held-group".into();
    }
    let mut free = events("free", 6, 1);
    for e in &mut free {
        e.aggregate_id = "free-group".into();
    }
    // Interleaved, so the groups share claims and requests.
    let mut all = Vec::new();
    for (i, f) in free.iter().enumerate() {
        all.extend(rows.get(i).cloned());
        all.push(f.clone());
    }
    insert(&client, &all, Duration::ZERO).await;
    let extra = offload_args(&bucket);
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let relay = RelayProcess::spawn(&run_args(&db, &queue, sqs().endpoint(), &extra), &[]);
    wait_count(
        &client,
        "event_id LIKE 'free-%' AND sent_at IS NOT NULL",
        6,
        Duration::from_secs(60),
    )
    .await;
    wait_count(
        &client,
        "event_id = 'held-2' AND quarantine_reason = 'destination'",
        1,
        Duration::from_secs(60),
    )
    .await;
    let first = receive_all(&queue, 8, Duration::from_secs(30)).await;
    let ids = |ms: &[Message]| -> Vec<String> {
        ms.iter()
            .map(|m| attr(m, "event_id").unwrap().1.to_string())
            .collect()
    };
    let first_ids = ids(&first);
    let held: Vec<&String> = first_ids.iter().filter(|i| i.starts_with("held")).collect();
    assert_eq!(
        held,
        ["held-0", "held-1"],
        "nothing overtakes the held event"
    );
    assert_eq!(
        first_ids.iter().filter(|i| i.starts_with("free")).count(),
        6,
        "the other group flowed: {first_ids:?}"
    );
    create_named_bucket(&bucket).await;
    wait_count(&client, "sent_at IS NOT NULL", 11, Duration::from_secs(90)).await;
    let rest = receive_all(&queue, 3, Duration::from_secs(30)).await;
    assert_eq!(ids(&rest), ["held-2", "held-3", "held-4"]);
    let (_, key) = pointer(&rest[0]);
    let expected = payload_text(&client, "held-2").await;
    assert!(object(&bucket, &key).await == expected.as_bytes());
    drop(relay);
}

/// The relay's flags for a topic destination with offloading on.
fn topic_offload_args(bucket: &str) -> Vec<String> {
    let mut a = offload_args(bucket);
    a.extend([
        "--sns-endpoint-url".to_string(),
        sqs().endpoint().to_string(),
    ]);
    a
}

/// The SNS envelope a subscription without raw message delivery receives.
fn envelope(m: &Message) -> serde_json::Value {
    serde_json::from_str(m.body().expect("a body")).expect("the SNS envelope is JSON")
}

/// An attribute as the envelope carries it: (`Type`, `Value`).
fn envelope_attr<'a>(envelope: &'a serde_json::Value, name: &str) -> Option<(&'a str, &'a str)> {
    let a = &envelope["MessageAttributes"][name];
    Some((a["Type"].as_str()?, a["Value"].as_str()?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_a_topic_the_extended_client_reads_a_raw_subscription_whole_and_an_enveloped_one_gets_the_pointer(
) {
    let db = migrated_db().await;
    let client = db.client().await;
    let topic = create_topic("xl-topic").await;
    let raw = create_queue("xl-topic-raw", &[]).await;
    let wrapped = create_queue("xl-topic-wrapped", &[]).await;
    subscribe_queue(&topic, &raw, true).await;
    subscribe_queue(&topic, &wrapped, false).await;
    let bucket = create_bucket("xl-topic").await;
    // 3 MiB is beyond SQS too; 300 KiB fits SQS's 1 MiB but not SNS's 256 KiB, so it goes
    // through S3 only because its destination is a topic; the small one goes inline.
    let rows = vec![
        large_event("xlt-big", 3 * 1024 * 1024),
        large_event("xlt-mid", 300 * 1024),
        events("xlt-small", 1, 1).remove(0),
    ];
    insert(&client, &rows, Duration::ZERO).await;
    let extra = topic_offload_args(&bucket);
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let relay = RelayProcess::spawn(&run_args(&db, &topic, sqs().endpoint(), &extra), &[]);
    wait_count(&client, "sent_at IS NOT NULL", 3, Duration::from_secs(60)).await;
    assert_eq!(relay.metric("outbox_offloaded_total").await, Some(2.0));
    drop(relay);
    let offloaded = |id: &str| id != "xlt-small-0";

    let (received, stdout) = extended_client_receive(&raw, 3).await;
    assert_eq!(received.len(), 3, "{stdout}");
    for id in ["xlt-big", "xlt-mid", "xlt-small-0"] {
        read_back_whole(&client, &received, &stdout, id, offloaded(id)).await;
    }

    // Without raw delivery the library cannot see the pointer (it is inside the envelope):
    // the envelope's Message is the pointer, its MessageAttributes carry the size as a Number.
    let got = receive_all(&wrapped, 3, Duration::from_secs(30)).await;
    assert_eq!(got.len(), 3);
    for m in &got {
        let envelope = envelope(m);
        assert_eq!(envelope["TopicArn"], topic.as_str());
        let id = envelope_attr(&envelope, "event_id").expect("event_id").1;
        let expected = payload_text(&client, id).await;
        let message = envelope["Message"].as_str().expect("Message is text");
        if !offloaded(id) {
            assert_eq!(message, expected);
            assert_eq!(envelope_attr(&envelope, "ExtendedPayloadSize"), None);
            continue;
        }
        let size = expected.len().to_string();
        assert_eq!(
            envelope_attr(&envelope, "ExtendedPayloadSize"),
            Some(("Number", size.as_str())),
            "{id}"
        );
        let pointer: serde_json::Value = serde_json::from_str(message).expect("a JSON pointer");
        assert_eq!(pointer[0], POINTER_CLASS, "{pointer}");
        assert_eq!(pointer[1]["s3BucketName"], bucket.as_str());
        let key = pointer[1]["s3Key"].as_str().expect("s3Key");
        assert!(
            object(&bucket, key).await == expected.as_bytes(),
            "{id}: object differs from the payload"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_a_fifo_topic_a_large_event_keeps_its_place_in_its_group() {
    let db = migrated_db().await;
    let client = db.client().await;
    let topic = create_topic("xl-order.fifo").await;
    let queue = create_queue("xl-order-sub.fifo", &[]).await;
    subscribe_queue(&topic, &queue, true).await;
    let bucket = create_bucket("xl-order").await;
    let mut rows = events("tfifo", 5, 1);
    rows[2] = large_event("tfifo-2", 1024 * 1024);
    for e in &mut rows {
        e.aggregate_id = "one-group".into();
    }
    insert(&client, &rows, Duration::ZERO).await;
    let extra = topic_offload_args(&bucket);
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let relay = RelayProcess::spawn(&run_args(&db, &topic, sqs().endpoint(), &extra), &[]);
    wait_count(&client, "sent_at IS NOT NULL", 5, Duration::from_secs(60)).await;
    drop(relay);
    let messages = receive_all(&queue, 5, Duration::from_secs(30)).await;
    let order: Vec<&str> = messages
        .iter()
        .map(|m| attr(m, "event_id").unwrap().1)
        .collect();
    assert_eq!(
        order,
        ["tfifo-0", "tfifo-1", "tfifo-2", "tfifo-3", "tfifo-4"]
    );
    let expected = payload_text(&client, "tfifo-2").await;
    let size = expected.len().to_string();
    assert_eq!(
        attr(&messages[2], "ExtendedPayloadSize"),
        Some(("Number", size.as_str()))
    );
    let (_, key) = pointer(&messages[2]);
    assert!(object(&bucket, &key).await == expected.as_bytes());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_verifies_the_bucket_and_a_routed_topic_each_on_its_own_line() {
    let db = migrated_db().await;
    let queue = create_queue("check-xl-topic", &[]).await;
    let topic = create_topic("check-xl-topic").await;
    let bucket = create_bucket("check-xl-topic").await;
    let check = |bucket: String| {
        let mut a: Vec<String> = [
            "check",
            "--database-url",
            &db.url,
            "--queue-url",
            &queue,
            "--sqs-endpoint-url",
            sqs().endpoint(),
            "--route",
            &format!("order={topic}"),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        a.extend(topic_offload_args(&bucket));
        async move { run_to_end(&a, &[], Duration::from_secs(60)).await }
    };
    let (status, output) = check(bucket.clone()).await;
    assert_eq!(status.code(), Some(0), "{output}");
    assert!(
        output.contains(&format!("ok   topic {topic} reachable")),
        "{output}"
    );
    assert!(
        output.contains(&format!("ok   bucket {bucket} takes objects")),
        "{output}"
    );

    // A missing bucket fails on its own line; the topic's line stays ok.
    let (status, output) = check(format!("never-created-{}", unique())).await;
    assert_eq!(status.code(), Some(1), "{output}");
    let failed: Vec<&str> = output.lines().filter(|l| l.starts_with("FAIL ")).collect();
    assert_eq!(failed.len(), 1, "{output}");
    assert!(failed[0].contains("the bucket does not exist"), "{output}");
    assert!(
        output.contains(&format!("ok   topic {topic} reachable")),
        "{output}"
    );
}
