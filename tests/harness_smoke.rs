//! Proves the harness itself: databases, queues and every fault-proxy mode.

use crate::scenario::message_group;
use crate::support::*;
use aws_sdk_sqs::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_sqs::types::MessageAttributeValue;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};
use tokio_postgres::error::SqlState;

const WAIT: Duration = Duration::from_secs(20);

fn string_attr(value: &str) -> MessageAttributeValue {
    MessageAttributeValue::builder()
        .data_type("String")
        .string_value(value)
        .build()
        .unwrap()
}

async fn send(client: &aws_sdk_sqs::Client, queue_url: &str, body: &str) -> Result<(), String> {
    client
        .send_message()
        .queue_url(queue_url)
        .message_body(body)
        .send()
        .await
        .map(drop)
        .map_err(|e| format!("{e:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_databases_are_separate_and_password_protected() {
    let (a, b) = (fresh_db().await, fresh_db().await);
    assert_ne!(a.name, b.name);
    let (ca, cb) = (a.client().await, b.client().await);

    let current: String = ca
        .query_one("SELECT current_database()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(current, a.name);
    ca.batch_execute("CREATE TABLE only_in_a (x int); INSERT INTO only_in_a VALUES (1)")
        .await
        .unwrap();
    let absent_in_b: bool = cb
        .query_one("SELECT to_regclass('only_in_a') IS NULL", &[])
        .await
        .unwrap()
        .get(0);
    assert!(absent_in_b);

    let wrong = a.url.replace(pg().password(), "not-the-password");
    let err = tokio_postgres::connect(&wrong, tokio_postgres::NoTls)
        .await
        .err()
        .expect("a wrong password must be refused");
    assert_eq!(err.code(), Some(&SqlState::INVALID_PASSWORD), "{err}");
}

/// scripts/test runs the suite once per PostgreSQL version by pointing `OUTBOX_TEST_PG_BINDIR` at
/// each version's binaries and names the version it expects; the cluster must really run those.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_runs_the_server_binaries_it_was_pointed_at() {
    let expected_dir = std::env::var_os("OUTBOX_TEST_PG_BINDIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| pg().bin_dir().to_path_buf());
    let out = Command::new(expected_dir.join("postgres"))
        .arg("--version")
        .output()
        .expect("run postgres --version");
    assert!(out.status.success(), "{out:?}");
    // "postgres (PostgreSQL) 18.4", or "... 15.14 (Debian 15.14-0+deb12u1)" on Debian.
    let binaries = String::from_utf8_lossy(&out.stdout).trim().to_string();

    let db = fresh_db().await;
    let server: String = db
        .client()
        .await
        .query_one("SHOW server_version", &[])
        .await
        .unwrap()
        .get(0);
    println!(
        "test cluster: PostgreSQL {server} from {}",
        expected_dir.display()
    );
    assert!(
        binaries.ends_with(&format!(") {server}")),
        "the cluster runs PostgreSQL {server}, but {} is {binaries:?}",
        expected_dir.display()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_round_trip_keeps_body_and_attributes() {
    let url = create_queue("smoke", &[]).await;
    let client = sqs_client().await;
    client
        .send_message()
        .queue_url(&url)
        .message_body(r#"{"order_id":17}"#)
        .message_attributes("event_id", string_attr("order-17:paid"))
        .message_attributes("traceparent", string_attr("00-abc-def-01"))
        .send()
        .await
        .unwrap();

    let got = receive_all(&url, 1, WAIT).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].body(), Some(r#"{"order_id":17}"#));
    let attrs = got[0].message_attributes().expect("message attributes");
    assert_eq!(attrs["event_id"].string_value(), Some("order-17:paid"));
    assert_eq!(attrs["traceparent"].string_value(), Some("00-abc-def-01"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_queue_deduplicates_and_keeps_group_order() {
    let url = create_queue("smoke.fifo", &[]).await;
    assert!(url.ends_with(".fifo"), "{url}");
    let client = sqs_client().await;
    for (event_id, body) in [("e1", "first"), ("e1", "first again"), ("e2", "second")] {
        client
            .send_message()
            .queue_url(&url)
            .message_body(body)
            .message_group_id("order-17")
            .message_deduplication_id(event_id)
            .send()
            .await
            .unwrap();
    }

    let got = receive_all(&url, 2, WAIT).await;
    let bodies: Vec<_> = got.iter().map(|m| m.body().unwrap()).collect();
    assert_eq!(bodies, ["first", "second"]);
    assert_eq!(message_group(&got[0]), Some("order-17"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receive_all_drains_more_than_one_batch() {
    let url = create_queue("smoke-many", &[]).await;
    let client = sqs_client().await;
    for i in 0..35 {
        send(&client, &url, &format!("m{i}")).await.unwrap();
    }
    let got = receive_all(&url, 35, WAIT).await;
    let mut bodies: Vec<_> = got.iter().map(|m| m.body().unwrap().to_string()).collect();
    bodies.sort();
    bodies.dedup();
    assert_eq!((got.len(), bodies.len()), (35, 35));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_pass_forwards_over_one_kept_alive_connection() {
    let url = create_queue("proxy-pass", &[]).await;
    let proxy = FaultProxy::start(sqs().endpoint());
    let client = sqs_client_at(proxy.endpoint());
    send(&client, &url, "one").await.unwrap();
    send(&client, &url, "two").await.unwrap();
    assert_eq!((proxy.forwarded(), proxy.faulted()), (2, 0));
    assert_eq!(proxy.actions(), ["AmazonSQS.SendMessage"; 2]);
    assert_eq!(receive_all(&url, 2, WAIT).await.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_error500_answers_internal_error_without_forwarding() {
    let url = create_queue("proxy-500", &[]).await;
    let proxy = FaultProxy::start(sqs().endpoint());
    let client = sqs_client_at(proxy.endpoint());
    proxy.set_mode(Mode::Error500);
    let err = client
        .send_message()
        .queue_url(&url)
        .message_body("x")
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.raw_response().map(|r| r.status().as_u16()), Some(500));
    assert_eq!(err.code(), Some("InternalError"), "{err:?}");
    assert_eq!((proxy.forwarded(), proxy.faulted()), (0, 1));

    // The connection survives an error answer, as it does with real SQS.
    proxy.set_mode(Mode::Pass);
    send(&client, &url, "y").await.unwrap();
    let got = receive_all(&url, 1, WAIT).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].body(), Some("y"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_throttle_is_seen_as_throttling_exception() {
    let url = create_queue("proxy-throttle", &[]).await;
    let proxy = FaultProxy::start(sqs().endpoint());
    let client = sqs_client_at(proxy.endpoint());
    proxy.set_mode(Mode::Throttle);
    let err = client
        .send_message_batch()
        .queue_url(&url)
        .entries(
            aws_sdk_sqs::types::SendMessageBatchRequestEntry::builder()
                .id("0")
                .message_body("x")
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap_err();
    assert!(matches!(err, SdkError::ServiceError(_)), "{err:?}");
    assert_eq!(err.code(), Some("ThrottlingException"), "{err:?}");
    assert_eq!(err.raw_response().map(|r| r.status().as_u16()), Some(400));
    assert_eq!(proxy.forwarded(), 0);
    assert!(receive_all(&url, 0, WAIT).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_drop_response_fails_the_call_but_sqs_has_the_message() {
    let url = create_queue("proxy-drop", &[]).await;
    let proxy = FaultProxy::start(sqs().endpoint());
    let client = sqs_client_at(proxy.endpoint());
    proxy.set_mode(Mode::DropResponse);
    let err = client
        .send_message()
        .queue_url(&url)
        .message_body("accepted but unacknowledged")
        .send()
        .await
        .unwrap_err();
    assert!(
        !matches!(err, SdkError::ServiceError(_)),
        "expected a transport error, got {err:?}"
    );
    assert_eq!(proxy.forwarded(), 1);
    let got = receive_all(&url, 1, WAIT).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].body(), Some("accepted but unacknowledged"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_fault_next_hits_only_the_next_requests() {
    let url = create_queue("proxy-next", &[]).await;
    let proxy = FaultProxy::start(sqs().endpoint());
    let client = sqs_client_at(proxy.endpoint());
    proxy.fault_next(Mode::Error500, 2);
    assert!(send(&client, &url, "a").await.is_err());
    assert!(send(&client, &url, "b").await.is_err());
    send(&client, &url, "c").await.unwrap();
    assert_eq!((proxy.forwarded(), proxy.faulted()), (1, 2));
    let got = receive_all(&url, 1, WAIT).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].body(), Some("c"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_hold_delivers_only_after_release() {
    let url = create_queue("proxy-hold", &[]).await;
    let proxy = FaultProxy::start(sqs().endpoint());
    let client = sqs_client_at(proxy.endpoint());
    proxy.set_mode(Mode::Hold);
    let call = tokio::spawn({
        let (client, url) = (client.clone(), url.clone());
        async move { send(&client, &url, "held").await }
    });
    wait_until("the response is held", WAIT, || async { proxy.held() == 1 }).await;
    // SQS already has it; only the answer is withheld.
    assert_eq!(receive_all(&url, 1, WAIT).await.len(), 1);
    assert!(!call.is_finished());

    proxy.release_held();
    tokio::time::timeout(WAIT, call)
        .await
        .expect("call completes after release")
        .unwrap()
        .unwrap();
    assert_eq!(proxy.held(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_delay_reset_and_black_hole() {
    let url = create_queue("proxy-misc", &[]).await;
    let proxy = FaultProxy::start(sqs().endpoint());
    let client = sqs_client_at(proxy.endpoint());

    proxy.set_mode(Mode::Delay(Duration::from_millis(400)));
    let started = Instant::now();
    send(&client, &url, "late").await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(400));

    proxy.set_mode(Mode::Reset);
    let err = send(&client, &url, "reset").await.unwrap_err();
    assert!(!err.contains("ServiceError"), "{err}");

    proxy.set_mode(Mode::BlackHole);
    let pending = tokio::time::timeout(Duration::from_secs(1), send(&client, &url, "void")).await;
    assert!(pending.is_err(), "a black-holed call must not complete");

    assert_eq!((proxy.forwarded(), proxy.faulted()), (1, 3));
    let got = receive_all(&url, 1, WAIT).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].body(), Some("late"));
}

#[test]
fn metric_value_matches_the_whole_series_name() {
    let text = "# TYPE outbox_send_failures_total counter\n\
                outbox_send_failures_total{kind=\"config\"} 3\n\
                outbox_send_failures_total{kind=\"throttled\"} 0\n\
                outbox_events_sent_total 42\n\
                outbox_events_sent_total_extra 7\n";
    assert_eq!(
        metric_value(text, "outbox_send_failures_total{kind=\"config\"}"),
        Some(3.0)
    );
    assert_eq!(metric_value(text, "outbox_events_sent_total"), Some(42.0));
    assert_eq!(metric_value(text, "outbox_send_failures_total"), None);
}

#[test]
fn metrics_addr_is_read_from_text_and_json_logs() {
    let text = "2026-01-01T00:00:00Z  INFO outbox_relay: metrics endpoint listening \
                metrics_addr=127.0.0.1:40123";
    let json = r#"{"level":"INFO","fields":{"metrics_addr":"127.0.0.1:40124","message":"x"}}"#;
    assert_eq!(parse_metrics_addr(text).as_deref(), Some("127.0.0.1:40123"));
    assert_eq!(parse_metrics_addr(json).as_deref(), Some("127.0.0.1:40124"));
}
