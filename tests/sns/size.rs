//! A topic's own size limit. Since September 2026 SNS takes messages up to a topic's
//! `MaximumMessageSize` (1 MiB at most); the relay reads it with GetTopicAttributes, sends the
//! topic whole what fits it, and keeps SNS's former 256 KiB for a topic that reports none.
//!
//! What the emulators give to test it with: fauxqs keeps a `MaximumMessageSize` given to
//! CreateTopic and reports it (its SetTopicAttributes refuses the name), but refuses any SNS
//! message over 256 KiB whatever the topic says; so there a 300 KiB event reaches PublishBatch
//! whole and is refused as the sender's fault, which is how the test sees that it was neither
//! offloaded nor held back by the relay. moto accepts the attribute and never reports it, so
//! every topic there is one that reports nothing.

use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::large_events::{create_bucket, keys, large_event};
use crate::scenario::{count, events, insert, migrated_db, run_args, wait_count};
use crate::support::{
    create_queue, create_topic, create_topic_with, receive_all, run_to_end, sqs, subscribe_queue,
    topic_name, FaultProxy, Mode, RelayProcess, SqsKind,
};

/// Generous for a loaded 2-core machine; a bound on waiting only, never a measured time.
const WAIT: Duration = Duration::from_secs(60);
const PREFIX: &str = "events/";

/// The object key the relay stores an offloaded body under.
fn offload_key(event_id: &str) -> String {
    let digest = Sha256::digest(event_id.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("{PREFIX}{hex}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_reporting_1_mib_is_sent_a_300_kib_event_whole_one_reporting_nothing_gets_it_through_s3_and_check_names_each_size(
) {
    let db = migrated_db().await;
    let client = db.client().await;
    let large = create_topic_with(
        &topic_name("size-1mib"),
        &[("MaximumMessageSize", "1048576")],
    )
    .await;
    let plain = create_topic("size-plain").await;
    let large_sub = create_queue("size-1mib-sub", &[]).await;
    let plain_sub = create_queue("size-plain-sub", &[]).await;
    subscribe_queue(&large, &large_sub, true).await;
    subscribe_queue(&plain, &plain_sub, true).await;
    let default = create_queue("size-default", &[]).await;
    let bucket = create_bucket("size").await;
    let reported = match sqs().kind() {
        SqsKind::Fauxqs => true,
        SqsKind::Moto => false,
    };
    let endpoint = sqs().endpoint();
    let (large_route, plain_route) = (format!("large={large}"), format!("plain={plain}"));
    let args = run_args(
        &db,
        &default,
        endpoint,
        &[
            "--route",
            &large_route,
            "--route",
            &plain_route,
            "--sns-endpoint-url",
            endpoint,
            "--offload-bucket",
            &bucket,
            "--offload-prefix",
            PREFIX,
            "--s3-endpoint-url",
            endpoint,
        ],
    );

    let mut check = args.clone();
    check[0] = "check".to_string();
    let (status, output) = run_to_end(&check, &[], WAIT).await;
    assert!(status.success(), "{output}");
    let size_line = |topic: &str| {
        let what = format!("ok   topic {topic} message size (");
        let lines: Vec<&str> = output.lines().filter(|l| l.starts_with(&what)).collect();
        assert_eq!(lines.len(), 1, "one size line for {topic}: {output}");
        lines[0].to_string()
    };
    let unreported = "(the topic does not report MaximumMessageSize (created before SNS took 1 MiB, or an emulator): 262144 assumed: the relay sends it messages of up to 262144 bytes, larger ones through S3 (--offload-bucket))";
    assert!(size_line(&plain).ends_with(unreported), "{output}");
    if reported {
        assert!(
            size_line(&large).ends_with("(MaximumMessageSize 1048576: the relay sends it messages of up to 1048576 bytes, larger ones through S3 (--offload-bucket))"),
            "{output}"
        );
    } else {
        assert!(size_line(&large).ends_with(unreported), "{output}");
    }

    // 300 KiB: more than 256 KiB, well within 1 MiB, attributes included.
    let mut to_large = large_event("size-large", 300 * 1024);
    to_large.aggregate_type = "large".into();
    let mut to_plain = large_event("size-plain", 300 * 1024);
    to_plain.aggregate_type = "plain".into();
    insert(&client, &[to_large, to_plain], Duration::ZERO).await;
    let relay = RelayProcess::spawn(&args, &[]);

    // The topic that reports nothing takes the event as a pointer, its body in S3.
    wait_count(
        &client,
        "event_id = 'size-plain' AND sent_at IS NOT NULL",
        1,
        WAIT,
    )
    .await;
    let got = receive_all(&plain_sub, 1, WAIT).await;
    assert_eq!(got.len(), 1);
    assert!(
        got[0]
            .message_attributes()
            .is_some_and(|a| a.contains_key("ExtendedPayloadSize")),
        "a pointer: {:?}",
        got[0].message_attributes()
    );
    if reported {
        // Sent whole: fauxqs, which caps SNS at 256 KiB whatever the topic reports, refuses
        // it as the sender's fault. Real SNS takes it (up to the topic's 1 MiB).
        wait_count(
            &client,
            "event_id = 'size-large' AND quarantine_reason = 'sender_fault' AND last_error LIKE '%Message too long%'",
            1,
            WAIT,
        )
        .await;
        assert_eq!(
            relay.metric("outbox_offloaded_total").await,
            Some(1.0),
            "only the event for the topic that reports nothing went through S3"
        );
        let stored = keys(&bucket).await;
        assert!(
            stored.contains(&offload_key("size-plain"))
                && !stored.contains(&offload_key("size-large")),
            "{stored:?}"
        );
    } else {
        wait_count(
            &client,
            "event_id = 'size-large' AND sent_at IS NOT NULL",
            1,
            WAIT,
        )
        .await;
        assert_eq!(relay.metric("outbox_offloaded_total").await, Some(2.0));
        let stored = keys(&bucket).await;
        assert!(
            stored.contains(&offload_key("size-plain"))
                && stored.contains(&offload_key("size-large")),
            "{stored:?}"
        );
        assert_eq!(receive_all(&large_sub, 1, WAIT).await.len(), 1);
    }
    assert_eq!(
        count(&client, "quarantine_reason = 'too_large'").await,
        0,
        "neither was too large for the relay"
    );
    assert!(
        !relay
            .output()
            .contains("cannot read the topic's MaximumMessageSize"),
        "both topics were read: {}",
        relay.output()
    );
}

/// Credentials that may publish to a topic but not read it (a policy written before the relay
/// read topics): the relay keeps 256 KiB for the topic, so a 300 KiB event goes through S3 and
/// every other event as before; one warning says what to allow, and the topic is asked again
/// once per `--stats-interval`, not at every claim. `check` fails on the same refusal, naming
/// the permission.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_the_relay_may_not_read_keeps_256_kib_with_one_warning_and_is_not_asked_at_every_claim(
) {
    let db = migrated_db().await;
    let client = db.client().await;
    let topic = create_topic_with(
        &topic_name("size-denied"),
        &[("MaximumMessageSize", "1048576")],
    )
    .await;
    let sub = create_queue("size-denied-sub", &[]).await;
    subscribe_queue(&topic, &sub, true).await;
    let bucket = create_bucket("size-denied").await;
    let proxy = FaultProxy::start(sqs().endpoint());
    proxy.set_mode(Mode::DenyTopicAttributes);
    let endpoint = sqs().endpoint();
    let mut args = run_args(
        &db,
        &topic,
        endpoint,
        &[
            "--sns-endpoint-url",
            proxy.endpoint(),
            "--offload-bucket",
            &bucket,
            "--offload-prefix",
            PREFIX,
            "--s3-endpoint-url",
            endpoint,
        ],
    );
    // Longer than the test: every read after the first would be one per claim.
    let at = args
        .iter()
        .position(|a| a == "--stats-interval")
        .expect("run_args sets --stats-interval");
    args[at + 1] = "10m".to_string();

    let mut check = args.clone();
    check[0] = "check".to_string();
    let (status, output) = run_to_end(&check, &[], WAIT).await;
    assert_eq!(status.code(), Some(1), "{output}");
    let failed: Vec<&str> = output.lines().filter(|l| l.starts_with("FAIL ")).collect();
    assert_eq!(failed.len(), 1, "{output}");
    assert!(
        failed[0].starts_with(&format!("FAIL topic {topic} reachable: access denied: allow sns:Publish and sns:GetTopicAttributes"))
            && failed[0].ends_with("[AuthorizationError]"),
        "{output}"
    );

    let relay = RelayProcess::spawn(&args, &[]);
    let mut first = vec![large_event("denied-large", 300 * 1024)];
    first.extend(events("denied-a", 3, 3));
    // Three waves, each claimed after the one before was sent: three claims or more.
    for (wave, rows) in [first, events("denied-b", 3, 3), events("denied-c", 3, 3)]
        .into_iter()
        .enumerate()
    {
        insert(&client, &rows, Duration::ZERO).await;
        let sent = 4 + 3 * wave as i64;
        wait_count(&client, "sent_at IS NOT NULL", sent, WAIT).await;
    }
    assert_eq!(receive_all(&sub, 10, WAIT).await.len(), 10);
    assert!(
        keys(&bucket).await.contains(&offload_key("denied-large")),
        "through S3: the topic's 1 MiB could not be read"
    );
    assert_eq!(relay.metric("outbox_offloaded_total").await, Some(1.0));
    let actions = proxy.actions();
    let reads = actions
        .iter()
        .filter(|a| *a == "SNS.GetTopicAttributes")
        .count();
    let publishes = actions.iter().filter(|a| *a == "SNS.PublishBatch").count();
    assert!(
        reads == 2 && publishes >= 3,
        "check's read, then the relay's one read for {publishes} publishes: {actions:?}"
    );
    let output = relay.output();
    let warnings: Vec<&str> = output
        .lines()
        .filter(|l| l.contains("cannot read the topic's MaximumMessageSize"))
        .collect();
    assert_eq!(warnings.len(), 1, "{output}");
    assert!(
        warnings[0].contains("AuthorizationError")
            && warnings[0].contains("limit=262144")
            && warnings[0].contains("allow sns:GetTopicAttributes"),
        "{}",
        warnings[0]
    );
}
