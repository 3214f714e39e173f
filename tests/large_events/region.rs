//! Large bodies and S3 mistakes that are configuration or the body's own size, through a fault
//! proxy on `--s3-endpoint-url` (SQS is reached directly):
//! - a bucket in another region (S3 `PermanentRedirect`, `AuthorizationHeaderMalformed`): the
//!   bucket is parked, `/readyz` names it and what to set, `check` says which region; the large
//!   rows wait (never `rejected`) and follow once the bucket answers;
//! - an upload's deadline grows with its body, and an upload that always outlasts it spends
//!   the row's attempts until it is quarantined, instead of being given back for ever.

use std::time::Duration;

use super::{create_bucket, keys, large_event, offload_args};
use crate::scenario::{count, events, insert, migrated_db, run_args, wait_count};
use crate::support::{
    create_queue, receive_all, run_to_end, sqs, wait_until, FaultProxy, Mode, RelayProcess,
};

/// Generous for a loaded 2-core machine; a bound on waiting only, never a measured time.
const WAIT: Duration = Duration::from_secs(60);

/// `offload_args` with S3 reached through `proxy`.
fn through(bucket: &str, proxy: &FaultProxy) -> Vec<String> {
    let mut a = offload_args(bucket);
    let at = a.iter().position(|x| x == "--s3-endpoint-url").unwrap();
    a[at + 1] = proxy.endpoint().to_string();
    a
}

async fn a_bucket_in_another_region_parks_its_rows_and_readiness_names_it(
    name: &str,
    mode: Mode,
    code: &str,
) {
    let db = migrated_db().await;
    let client = db.client().await;
    let queue = create_queue(name, &[]).await;
    let bucket = create_bucket(name).await;
    let proxy = FaultProxy::start(sqs().endpoint());
    proxy.set_mode(mode);
    let mut rows = vec![
        large_event(&format!("{name}-big-0"), 1536 * 1024),
        large_event(&format!("{name}-big-1"), 1536 * 1024),
    ];
    rows.extend(events(&format!("{name}-small"), 5, 5));
    insert(&client, &rows, Duration::ZERO).await;
    let extra = through(&bucket, &proxy);
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let relay = RelayProcess::spawn(&run_args(&db, &queue, sqs().endpoint(), &extra), &[]);

    wait_count(&client, "sent_at IS NOT NULL", 5, WAIT).await;
    wait_count(
        &client,
        &format!("quarantine_reason = 'destination' AND last_error LIKE '%{code}%'"),
        2,
        WAIT,
    )
    .await;
    let (ready, why) = relay.http_get("/readyz").await;
    assert_eq!(ready, 503, "{why}");
    assert!(
        why.contains(&format!("s3://{bucket}")) && why.contains(code) && why.contains("AWS_REGION"),
        "/readyz names the bucket, S3's code and what to set: {why}"
    );
    assert!(
        relay
            .metric("outbox_offload_failures_total{kind=\"destination\"}")
            .await
            >= Some(1.0)
    );
    assert_eq!(
        count(&client, "quarantine_reason NOT IN ('destination')").await,
        0,
        "nothing is rejected or spent for the region"
    );
    assert!(keys(&bucket).await.is_empty());

    // `check` says which region the bucket is in.
    let check: Vec<String> = [
        "check",
        "--database-url",
        &db.url,
        "--queue-url",
        &queue,
        "--sqs-endpoint-url",
        sqs().endpoint(),
    ]
    .iter()
    .map(|s| s.to_string())
    .chain(through(&bucket, &proxy))
    .collect();
    let (status, output) = run_to_end(&check, &[], WAIT).await;
    assert!(!status.success(), "{output}");
    assert!(
        output.contains(
            "the bucket is in another region than the relay: set AWS_REGION to eu-west-1"
        ),
        "{output}"
    );

    // The bucket answers again (the region was fixed): the parked rows follow by themselves.
    proxy.set_mode(Mode::Pass);
    wait_count(&client, "sent_at IS NOT NULL", 7, WAIT).await;
    assert_eq!(
        count(&client, "attempts <> 1").await,
        0,
        "a park costs no attempt"
    );
    assert_eq!(keys(&bucket).await.len(), 2);
    assert_eq!(receive_all(&queue, 7, WAIT).await.len(), 7);
    wait_until("ready again", WAIT, || async {
        relay.http_status("/readyz").await == 200
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_that_redirects_to_another_region_is_parked_as_configuration() {
    a_bucket_in_another_region_parks_its_rows_and_readiness_names_it(
        "lr-redirect",
        Mode::WrongRegion,
        "PermanentRedirect",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_refusing_a_signature_for_another_region_is_parked_as_configuration() {
    a_bucket_in_another_region_parks_its_rows_and_readiness_names_it(
        "lr-signed",
        Mode::WrongSigningRegion,
        "AuthorizationHeaderMalformed",
    )
    .await;
}

/// With `--send-timeout 1s`, a 3 MiB body gets 4 s (1 s and 1 s per MiB): an upload that takes
/// 2 s goes through. One that never ends times out at its deadline each time, spends an attempt
/// each time, and after `--max-attempts 3` the row is quarantined `max_attempts`; the small rows
/// and the first large one were delivered meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_get_time_by_size_and_an_upload_that_never_finishes_ends_in_quarantine() {
    let db = migrated_db().await;
    let client = db.client().await;
    let queue = create_queue("lr-deadline", &[]).await;
    let bucket = create_bucket("lr-deadline").await;
    let proxy = FaultProxy::start(sqs().endpoint());
    proxy.set_mode(Mode::Delay(Duration::from_secs(2)));
    let mut rows = vec![large_event("slow-ok", 3 * 1024 * 1024)];
    rows.extend(events("small", 3, 3));
    insert(&client, &rows, Duration::ZERO).await;
    let mut extra = through(&bucket, &proxy);
    extra.extend(
        [
            "--send-timeout",
            "1s",
            "--settle-margin",
            "1s",
            "--lease",
            "10s",
            "--max-attempts",
            "3",
        ]
        .map(String::from),
    );
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let relay = RelayProcess::spawn(&run_args(&db, &queue, sqs().endpoint(), &extra), &[]);
    wait_count(&client, "sent_at IS NOT NULL", 4, WAIT).await;
    assert_eq!(
        count(&client, "event_id = 'slow-ok' AND attempts = 1").await,
        1,
        "a 2 s upload fits a 3 MiB body's deadline"
    );
    assert_eq!(proxy.requests(), 1);

    proxy.set_mode(Mode::BlackHole);
    insert(
        &client,
        &[large_event("never", 3 * 1024 * 1024)],
        Duration::ZERO,
    )
    .await;
    wait_count(
        &client,
        "event_id = 'never' AND quarantine_reason = 'max_attempts' AND attempts = 3",
        1,
        WAIT,
    )
    .await;
    let error: String = client
        .query_one(
            "SELECT last_error FROM outbox WHERE event_id = 'never'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        error.starts_with("3 attempts; last: ") && error.contains("1 s per MiB"),
        "{error}"
    );
    assert_eq!(proxy.requests(), 4, "one upload per attempt");
    assert!(
        relay
            .metric("outbox_offload_failures_total{kind=\"transient\"}")
            .await
            >= Some(3.0)
    );
    assert_eq!(
        relay
            .metric("outbox_events_quarantined_total{reason=\"max_attempts\"}")
            .await,
        Some(1.0)
    );
}
