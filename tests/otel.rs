//! OpenTelemetry: a real relay with `OTEL_EXPORTER_OTLP_ENDPOINT` set exports one span per
//! event to an OTLP/HTTP receiver, parented on the row's `traceparent`, and the message on the
//! queue continues the trace from the relay's span.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_sqs::types::Message;
use serde_json::json;

use crate::scenario::{attr, count, insert, migrated_db, run_args, wait_count, Event};
use crate::support::{create_queue, receive_all, sqs, OtlpReceiver, ReceivedSpan, RelayProcess};

/// OTLP's SPAN_KIND_PRODUCER.
const PRODUCER: i32 = 4;
/// OTLP's STATUS_CODE_ERROR.
const ERROR: i32 = 2;
/// How long before the relay started the rows were written (their wait in the outbox).
const WAITED_SECONDS: f64 = 600.0;

fn traceparent(trace: &str, span: &str, flags: &str) -> String {
    format!("00-{trace}-{span}-{flags}")
}

fn event(prefix: &str, i: usize, group: &str, headers: serde_json::Value) -> Event {
    Event {
        event_id: format!("{prefix}-{i}"),
        aggregate_type: "order".into(),
        aggregate_id: group.into(),
        event_type: "order.paid".into(),
        payload: json!({ "n": i }),
        headers,
        queue_url: None,
    }
}

/// Each row's own trace and span id, sampled.
fn traced(prefix: &str, n: usize, group: &str) -> Vec<(Event, String, String)> {
    (0..n)
        .map(|i| {
            let trace = format!("{:032x}", 0xabc0_0000 + i);
            let span = format!("{:016x}", 0x5ee0 + i);
            let e = event(
                prefix,
                i,
                group,
                json!({ "traceparent": traceparent(&trace, &span, "01") }),
            );
            (e, trace, span)
        })
        .collect()
}

fn otel_env(endpoint: &str) -> Vec<(String, String)> {
    vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT".into(), endpoint.into()),
        // A credential the collector needs: it must arrive, and never be printed.
        (
            "OTEL_EXPORTER_OTLP_HEADERS".into(),
            "authorization=Bearer otel-secret-4711".into(),
        ),
        // Spans leave only with the flush at shutdown, which is what this proves.
        ("OTEL_BSP_SCHEDULE_DELAY".into(), "600000".into()),
    ]
}

async fn backdate(client: &tokio_postgres::Client) {
    client
        .execute(
            &format!("UPDATE outbox SET created_at = now() - interval '{WAITED_SECONDS} seconds'"),
            &[],
        )
        .await
        .unwrap();
}

/// Stops the relay with SIGTERM (the drain flushes the spans) and returns its output.
async fn stop(relay: RelayProcess) -> String {
    relay.sigterm();
    let status = relay
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("the relay exits after SIGTERM");
    assert!(status.success(), "{}", relay.output());
    relay.output()
}

fn span_of<'a>(spans: &'a [ReceivedSpan], event_id: &str) -> Vec<&'a ReceivedSpan> {
    spans
        .iter()
        .filter(|s| s.attr("outbox.event_id") == Some(event_id))
        .collect()
}

fn by_event(messages: &[Message]) -> HashMap<String, &Message> {
    messages
        .iter()
        .map(|m| (attr(m, "event_id").unwrap().to_string(), m))
        .collect()
}

/// One delivered event: its span continues the row's trace, carries the queue, SQS's message
/// id, the attempts and the wait, and the message carries the span's context on.
async fn assert_delivered(
    spans: &[ReceivedSpan],
    message: &Message,
    client: &tokio_postgres::Client,
    event_id: &str,
    row: Option<(&str, &str)>,
    queue_name: &str,
    service: &str,
) -> ReceivedSpan {
    let found = span_of(spans, event_id);
    assert_eq!(found.len(), 1, "one span for {event_id}: {spans:#?}");
    let span = found[0].clone();
    assert_eq!(span.kind, PRODUCER);
    assert_eq!(span.name, format!("send {queue_name}"));
    assert_eq!(span.service_name, service);
    assert_eq!(span.attr("messaging.system"), Some("aws_sqs"));
    assert_eq!(span.attr("messaging.destination.name"), Some(queue_name));
    assert_eq!(span.attr("messaging.operation.name"), Some("send"));
    assert_eq!(span.attr("outbox.attempts"), Some("1"));
    assert_eq!(span.attr("outbox.outcome"), Some("sent"));
    assert_ne!(span.status_code, ERROR);
    let wait: f64 = span.attr("outbox.wait_seconds").unwrap().parse().unwrap();
    assert!(wait >= WAITED_SECONDS, "waited {wait} s in the outbox");
    assert!(span.end_unix_nano >= span.start_unix_nano);
    // The message id SQS returned: recorded on the row, and the one the consumer receives.
    let recorded: String = client
        .query_one(
            "SELECT message_id FROM outbox WHERE event_id = $1",
            &[&event_id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(span.attr("messaging.message.id"), Some(recorded.as_str()));
    assert_eq!(message.message_id(), Some(recorded.as_str()));
    match row {
        Some((trace, parent)) => {
            assert_eq!(span.trace_id, trace, "the row's trace continues");
            assert_eq!(span.parent_span_id, parent, "parented on the row's span");
            assert_eq!(
                attr(message, "traceparent"),
                Some(traceparent(trace, &span.span_id, "01").as_str()),
                "the consumer continues from the relay's span"
            );
        }
        None => {
            assert!(span.parent_span_id.is_empty(), "a new root: {span:?}");
            assert_eq!(attr(message, "traceparent"), None, "no attribute is added");
        }
    }
    span
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_span_per_event_continues_the_rows_trace_to_the_consumer() {
    let db = migrated_db().await;
    let client = db.client().await;
    // Small enough that SQS itself refuses one message below.
    let queue = create_queue("otel", &[("MaximumMessageSize", "1024")]).await;
    let queue_name = queue.rsplit('/').next().unwrap().to_string();
    let rows = traced("tp", 4, "a");
    let mut written: Vec<Event> = rows.iter().map(|(e, _, _)| e.clone()).collect();
    // No traceparent: a trace of its own, the message as written.
    written.push(event("plain", 0, "b", json!({"tenant": "t1"})));
    // The application did not sample it: no span, but the consumer still gets the context.
    let unsampled_trace = format!("{:032x}", 0xdead_0001_u64);
    let unsampled = traceparent(&unsampled_trace, "00000000000000aa", "00");
    written.push(event(
        "unsampled",
        0,
        "c",
        json!({ "traceparent": unsampled }),
    ));
    // Eleven attributes: refused before sending, quarantined, its span an error in its trace.
    let bad_trace = format!("{:032x}", 0xbad0_0001_u64);
    let mut bad_headers =
        json!({ "traceparent": traceparent(&bad_trace, "00000000000000bb", "01") });
    for h in 0..6 {
        bad_headers[format!("h{h}")] = json!("x");
    }
    written.push(event("bad", 0, "d", bad_headers));
    // Too large for this queue, which only SQS knows on a standard queue: refused by SQS.
    let big_trace = format!("{:032x}", 0xb160_0001_u64);
    let mut big = event(
        "big",
        0,
        "e",
        json!({ "traceparent": traceparent(&big_trace, "00000000000000cc", "01") }),
    );
    big.payload = json!({ "filler": "x".repeat(2000) });
    written.push(big);
    insert(&client, &written, Duration::ZERO).await;
    backdate(&client).await;

    let receiver = OtlpReceiver::start();
    let relay = RelayProcess::spawn(
        &run_args(&db, &queue, sqs().endpoint(), &[]),
        &otel_env(receiver.endpoint()),
    );
    wait_count(&client, "sent_at IS NOT NULL", 6, Duration::from_secs(60)).await;
    wait_count(
        &client,
        "quarantined_at IS NOT NULL",
        2,
        Duration::from_secs(30),
    )
    .await;
    let messages = receive_all(&queue, 6, Duration::from_secs(60)).await;
    let output = stop(relay).await;
    let spans = receiver.spans();
    let messages = by_event(&messages);
    assert_eq!(messages.len(), 6);

    for (e, trace, span) in &rows {
        assert_delivered(
            &spans,
            messages[&e.event_id],
            &client,
            &e.event_id,
            Some((trace, span)),
            &queue_name,
            "outbox-relay",
        )
        .await;
    }
    let plain = assert_delivered(
        &spans,
        messages["plain-0"],
        &client,
        "plain-0",
        None,
        &queue_name,
        "outbox-relay",
    )
    .await;
    assert!(rows.iter().all(|(_, trace, _)| *trace != plain.trace_id));

    assert!(span_of(&spans, "unsampled-0").is_empty(), "{spans:#?}");
    let passed_on = attr(messages["unsampled-0"], "traceparent").unwrap();
    assert!(passed_on.starts_with(&format!("00-{unsampled_trace}-")));
    assert!(passed_on.ends_with("-00"), "still not sampled: {passed_on}");
    assert_ne!(passed_on, unsampled, "continued from the relay's span");

    let bad = span_of(&spans, "bad-0");
    assert_eq!(bad.len(), 1, "{spans:#?}");
    assert_eq!(bad[0].trace_id, bad_trace);
    assert_eq!(bad[0].parent_span_id, "00000000000000bb");
    assert_eq!(bad[0].status_code, ERROR);
    assert!(
        bad[0].status_message.contains("message attributes"),
        "{:?}",
        bad[0]
    );
    assert_eq!(bad[0].attr("outbox.outcome"), Some("quarantined"));
    assert_eq!(bad[0].attr("outbox.quarantine_reason"), Some("invalid"));
    assert_eq!(bad[0].attr("error.type"), Some("invalid"));

    let big = span_of(&spans, "big-0");
    assert_eq!(big.len(), 1, "{spans:#?}");
    assert_eq!(big[0].trace_id, big_trace);
    assert_eq!(big[0].parent_span_id, "00000000000000cc");
    assert_eq!(big[0].status_code, ERROR);
    assert_eq!(big[0].attr("outbox.outcome"), Some("quarantined"));
    let reason: String = client
        .query_one(
            "SELECT quarantine_reason FROM outbox WHERE event_id = 'big-0'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        big[0].attr("outbox.quarantine_reason"),
        Some(reason.as_str())
    );
    // SQS's own error code, not the relay's reason.
    let code = big[0].attr("error.type").unwrap();
    assert!(!code.is_empty() && code != reason, "{:?}", big[0]);
    assert!(big[0].status_message.contains(code), "{:?}", big[0]);

    assert_eq!(spans.len(), 7, "one span per sampled event: {spans:#?}");
    let headers = receiver.request_headers();
    assert!(!headers.is_empty());
    assert!(headers
        .iter()
        .all(|h| h.get("authorization").map(String::as_str) == Some("Bearer otel-secret-4711")));
    assert!(headers
        .iter()
        .all(|h| h.get("content-type").map(String::as_str) == Some("application/x-protobuf")));
    assert!(!output.contains("otel-secret-4711"), "{output}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_ordered_events_get_their_spans_and_the_consumer_the_context() {
    let db = migrated_db().await;
    let client = db.client().await;
    let queue = create_queue("otel.fifo", &[]).await;
    let queue_name = queue.rsplit('/').next().unwrap().to_string();
    let rows = traced("fifo", 5, "one-group");
    let written: Vec<Event> = rows.iter().map(|(e, _, _)| e.clone()).collect();
    insert(&client, &written, Duration::ZERO).await;
    backdate(&client).await;

    let receiver = OtlpReceiver::start();
    let mut env = otel_env(receiver.endpoint());
    env.push(("OTEL_SERVICE_NAME".into(), "orders-relay".into()));
    let relay = RelayProcess::spawn(&run_args(&db, &queue, sqs().endpoint(), &[]), &env);
    wait_count(&client, "sent_at IS NOT NULL", 5, Duration::from_secs(60)).await;
    let received = receive_all(&queue, 5, Duration::from_secs(60)).await;
    stop(relay).await;
    let spans = receiver.spans();
    // In order, as the group was written.
    let order: Vec<&str> = received
        .iter()
        .map(|m| attr(m, "event_id").unwrap())
        .collect();
    assert_eq!(
        order,
        written
            .iter()
            .map(|e| e.event_id.as_str())
            .collect::<Vec<_>>()
    );
    let messages = by_event(&received);
    for (e, trace, span) in &rows {
        assert_delivered(
            &spans,
            messages[&e.event_id],
            &client,
            &e.event_id,
            Some((trace, span)),
            &queue_name,
            "orders-relay",
        )
        .await;
    }
    assert_eq!(spans.len(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_is_down_or_silent_does_not_stall_delivery() {
    // Connections refused; and connections taken (by the kernel's backlog) but never answered.
    let refused = format!("http://127.0.0.1:{}", crate::support::pg::free_port());
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_endpoint = format!("http://{}", silent.local_addr().unwrap());
    for (name, endpoint) in [("refused", refused), ("silent", silent_endpoint)] {
        let db = migrated_db().await;
        let client = db.client().await;
        let queue = create_queue(&format!("otel-{name}"), &[]).await;
        let rows = traced(name, 20, "a");
        let written: Vec<Event> = rows.iter().map(|(e, _, _)| e.clone()).collect();
        insert(&client, &written, Duration::ZERO).await;

        // Spans are exported every 100 ms, and each export fails or times out.
        let env = vec![
            ("OTEL_EXPORTER_OTLP_ENDPOINT".to_string(), endpoint),
            ("OTEL_BSP_SCHEDULE_DELAY".to_string(), "100".to_string()),
            ("OTEL_EXPORTER_OTLP_TIMEOUT".to_string(), "2000".to_string()),
        ];
        let relay = RelayProcess::spawn(&run_args(&db, &queue, sqs().endpoint(), &[]), &env);
        wait_count(&client, "sent_at IS NOT NULL", 20, Duration::from_secs(60)).await;
        let received = receive_all(&queue, 20, Duration::from_secs(60)).await;
        // The flush at shutdown gives up after its bound; the relay still exits cleanly.
        stop(relay).await;
        let messages = by_event(&received);
        assert_eq!(messages.len(), 20, "{name}");
        // The spans were made (and dropped): each message continues its row's trace from a new
        // span.
        for (e, trace, span) in &rows {
            let sent = attr(messages[&e.event_id], "traceparent").unwrap();
            assert!(sent.starts_with(&format!("00-{trace}-")), "{sent}");
            assert!(!sent.contains(span.as_str()), "{sent}");
        }
        assert_eq!(count(&client, "quarantined_at IS NOT NULL").await, 0);
    }
    drop(silent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_otel_setting_stops_run_with_one_line_before_connecting() {
    let cases = [
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "https://user:otel-token-99@",
            "OTEL_EXPORTER_OTLP_ENDPOINT is not an http(s) URL",
        ),
        (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "collector:4318",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is not an http(s) URL",
        ),
        (
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            "grpc",
            "OTEL_EXPORTER_OTLP_PROTOCOL=grpc is not supported",
        ),
    ];
    for (name, value, expected) in cases {
        let mut env = vec![(name.to_string(), value.to_string())];
        if !name.ends_with("ENDPOINT") {
            env.push((
                "OTEL_EXPORTER_OTLP_ENDPOINT".into(),
                "http://127.0.0.1:4318".into(),
            ));
        }
        // Nothing listens at this database: the error must come first.
        let args = crate::scenario::args(&[
            "run",
            "--database-url",
            "postgres://relay:db-secret-1@127.0.0.1:1/app",
            "--queue-url",
            "http://127.0.0.1:1/000000000000/q",
        ]);
        let (status, output) =
            crate::support::run_to_end(&args, &env, Duration::from_secs(20)).await;
        assert_eq!(status.code(), Some(2), "{output}");
        assert_eq!(output.trim().lines().count(), 1, "{output}");
        assert!(output.contains(expected), "{output}");
        assert!(!output.contains("otel-token-99") && !output.contains("db-secret-1"));
        // `check` says the same, on its own line among the others.
        let mut check = args.clone();
        check[0] = "check".into();
        let (status, output) =
            crate::support::run_to_end(&check, &env, Duration::from_secs(30)).await;
        assert_eq!(status.code(), Some(1), "{output}");
        assert!(
            output.contains(&format!("FAIL tracing settings (OTEL_*): {expected}")),
            "{output}"
        );
        assert!(!output.contains("otel-token-99"), "{output}");
    }
}
