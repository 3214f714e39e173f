//! One fault at a time, through the fault proxy or on a PostgreSQL cluster of the test's own:
//! what the rows, the metrics and the probes look like during it and after it.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use aws_sdk_sqs::types::Message;
use tokio_postgres::Client;

use crate::scenario::{
    attr, copies, count, events, insert, migrate, migrated_db, run_args, set_arg, wait_count,
    Event, Producer,
};
use crate::support::pg::PrivatePg;
use crate::support::{
    create_queue, receive_all, sqs, wait_until, FaultProxy, Mode, RelayProcess, TestDb,
};

const ROWS: usize = 30;
/// Every `kind` of `outbox_send_failures_total`.
pub const KINDS: [&str; 5] = [
    "transient",
    "throttled",
    "permanent",
    "config",
    "destination",
];
/// Generous for a loaded 2-core machine; a bound on waiting only, never a measured time.
const WAIT: Duration = Duration::from_secs(60);

struct Setup {
    db: TestDb,
    client: Client,
    queue: String,
    proxy: FaultProxy,
    written: Vec<Event>,
}

/// A database holding `ROWS` unsent rows and a proxy already in `mode`, so the relay's very
/// first request meets the fault.
async fn setup(name: &str, mode: Mode) -> Setup {
    let db = migrated_db().await;
    let client = db.client().await;
    let queue = create_queue(name, &[]).await;
    let proxy = FaultProxy::start(sqs().endpoint());
    proxy.set_mode(mode);
    let written = events(name, ROWS, 5);
    insert(&client, &written, Duration::ZERO).await;
    Setup {
        db,
        client,
        queue,
        proxy,
        written,
    }
}

/// Rows a claim holds whose lease has not ended (sql/claims.sql), as a `count` condition.
const LEASED: &str = "id IN (SELECT unnest(l.ids) FROM outbox_claims AS l WHERE l.until > now())";

/// Claims not yet settled, ended or not.
async fn claims(client: &Client) -> i64 {
    client
        .query_one("SELECT count(*) FROM outbox_claims", &[])
        .await
        .expect("count claims")
        .get(0)
}

async fn failures(relay: &RelayProcess, kind: &str) -> f64 {
    relay
        .metric(&format!("outbox_send_failures_total{{kind=\"{kind}\"}}"))
        .await
        .unwrap_or_else(|| panic!("no outbox_send_failures_total{{kind=\"{kind}\"}} series"))
}

async fn sent_total(relay: &RelayProcess) -> f64 {
    relay
        .metric("outbox_events_sent_total")
        .await
        .expect("outbox_events_sent_total is exposed")
}

/// Receives everything and checks that each copy is the row it names: body is the payload,
/// attributes are the row's. Returns copies per event_id.
async fn receive_checked(
    queue: &str,
    written: &[Event],
    expected: usize,
) -> HashMap<String, usize> {
    let received = receive_all(queue, expected, WAIT).await;
    let by_id: HashMap<&str, &Event> = written.iter().map(|e| (e.event_id.as_str(), e)).collect();
    for m in &received {
        let id = attr(m, "event_id").expect("every message carries event_id");
        let e = by_id
            .get(id)
            .unwrap_or_else(|| panic!("a message for an event nobody wrote: {id}"));
        assert_copy_of(m, e);
    }
    copies(&received)
}

fn assert_copy_of(m: &Message, e: &Event) {
    let body: serde_json::Value =
        serde_json::from_str(m.body().expect("body")).expect("body is JSON");
    assert_eq!(body, e.payload, "{}: body is the payload", e.event_id);
    assert_eq!(attr(m, "event_type"), Some(e.event_type.as_str()));
    assert_eq!(attr(m, "aggregate_id"), Some(e.aggregate_id.as_str()));
}

/// Every written event arrived exactly once.
fn assert_once(by_id: &HashMap<String, usize>, written: &[Event]) {
    assert_eq!(by_id.len(), written.len(), "every event arrives: {by_id:?}");
    assert!(
        by_id.values().all(|&c| c == 1),
        "nothing was accepted by SQS before the fault was lifted, so nothing arrives twice: {by_id:?}"
    );
}

/// The common story of a fault that fails whole SendMessageBatch requests: while it lasts,
/// every row has been tried and given back with its attempt refunded, nothing is marked or
/// quarantined, readiness holds; once it is lifted every row is sent on its first counted
/// attempt. Returns the relay (for further checks) after recovery.
async fn whole_request_failure(
    s: &Setup,
    kind: &str,
    error_code: Option<&str>,
    extra: &[&str],
) -> RelayProcess {
    let relay = RelayProcess::spawn(&run_args(&s.db, &s.queue, s.proxy.endpoint(), extra), &[]);
    wait_count(&s.client, "last_error IS NOT NULL", ROWS as i64, WAIT).await;
    // A few rounds each, so that attempts kept by mistake would have piled up.
    wait_until("every row failed about three times", WAIT, || async {
        failures(&relay, kind).await >= 3.0 * ROWS as f64
    })
    .await;

    // While failing.
    assert_eq!(count(&s.client, "sent_at IS NOT NULL").await, 0);
    assert_eq!(count(&s.client, "quarantined_at IS NOT NULL").await, 0);
    // The stored count is of attempts that ended (the claim's own is not in it until its
    // settlement): refunded, every one of them leaves it at 0.
    assert_eq!(
        count(&s.client, "attempts > 0").await,
        0,
        "a failed request is not the rows' fault: no attempt is kept beyond the current claim"
    );
    if let Some(code) = error_code {
        let matching = format!("last_error LIKE '%{code}%'");
        assert_eq!(
            count(&s.client, &matching).await,
            ROWS as i64,
            "every row keeps SQS's error ({code})"
        );
    }
    for other in KINDS.iter().filter(|&&k| k != kind) {
        assert_eq!(failures(&relay, other).await, 0.0, "no {other} failure");
    }
    assert_eq!(sent_total(&relay).await, 0.0);
    assert_eq!(
        relay.http_status("/readyz").await,
        200,
        "a {kind} queue failure is no reason to take the relay out of service"
    );
    assert_eq!(relay.http_status("/healthz").await, 200);

    s.proxy.set_mode(Mode::Pass);
    wait_count(&s.client, "sent_at IS NOT NULL", ROWS as i64, WAIT).await;
    assert_eq!(
        count(&s.client, "attempts <> 1").await,
        0,
        "every failed attempt was refunded: only the successful one counts"
    );
    assert_eq!(count(&s.client, "quarantined_at IS NOT NULL").await, 0);
    // Every claim was settled (its lease row deleted with the outcome), and no claim wrote
    // the outbox rows' own lease columns.
    assert_eq!(claims(&s.client).await, 0, "no lease is left");
    assert_eq!(count(&s.client, "lease_until IS NOT NULL").await, 0);
    wait_until("every row counted as sent", WAIT, || async {
        sent_total(&relay).await == ROWS as f64
    })
    .await;
    assert_eq!(relay.http_status("/readyz").await, 200);
    relay
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delay_below_the_send_timeout_only_slows_sends_down() {
    let delay = Duration::from_millis(300);
    let s = setup("f-delay", Mode::Delay(delay)).await;
    // Far below the default send timeout (10 s).
    let relay = RelayProcess::spawn(&run_args(&s.db, &s.queue, s.proxy.endpoint(), &[]), &[]);
    wait_count(&s.client, "sent_at IS NOT NULL", ROWS as i64, WAIT).await;

    assert!(
        s.proxy.faulted() >= 1,
        "the requests went through the delay"
    );
    assert_eq!(
        s.proxy.forwarded(),
        s.proxy.requests(),
        "every delayed request reached SQS"
    );
    for kind in KINDS {
        assert_eq!(failures(&relay, kind).await, 0.0, "no {kind} failure");
    }
    assert_eq!(count(&s.client, "attempts <> 1").await, 0);
    assert_eq!(count(&s.client, "last_error IS NOT NULL").await, 0);
    wait_until("every row counted as sent", WAIT, || async {
        sent_total(&relay).await == ROWS as f64
    })
    .await;
    // The proxy holds every request for `delay`, so no call can have been faster than that.
    let exposition = relay.scrape().await;
    let fast = crate::support::metric_value(
        &exposition,
        "outbox_send_duration_seconds_bucket{le=\"0.25\"}",
    );
    let calls = crate::support::metric_value(&exposition, "outbox_send_duration_seconds_count");
    assert_eq!(fast, Some(0.0), "{exposition}");
    assert!(calls.unwrap_or(0.0) >= 3.0, "{exposition}");
    let by_id = receive_checked(&s.queue, &s.written, ROWS).await;
    assert_once(&by_id, &s.written);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_500_releases_rows_with_attempts_refunded_and_they_are_sent_after() {
    let s = setup("f-500", Mode::Error500).await;
    let _relay = whole_request_failure(&s, "transient", Some("InternalError"), &[]).await;
    let by_id = receive_checked(&s.queue, &s.written, ROWS).await;
    assert_once(&by_id, &s.written);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_is_pressure_not_the_rows_fault() {
    let s = setup("f-throttle", Mode::Throttle).await;
    let _relay = whole_request_failure(&s, "throttled", Some("ThrottlingException"), &[]).await;
    let by_id = receive_checked(&s.queue, &s.written, ROWS).await;
    assert_once(&by_id, &s.written);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_reset_releases_rows_with_attempts_refunded() {
    let s = setup("f-reset", Mode::Reset).await;
    let _relay = whole_request_failure(&s, "transient", None, &[]).await;
    let by_id = receive_checked(&s.queue, &s.written, ROWS).await;
    assert_once(&by_id, &s.written);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_hole_times_out_after_the_send_timeout_and_rows_are_released() {
    let s = setup("f-blackhole", Mode::BlackHole).await;
    // Every row's request meets the black hole at once: with the adaptive limit a destination
    // that does not answer gets one request at a time, and the rows waiting behind it would
    // outlast this short lease and go back untried (slow_destination covers that limit).
    let timing = [
        "--send-timeout",
        "1s",
        "--lease",
        "3s",
        "--settle-margin",
        "1s",
        "--request-concurrency",
        "fixed",
    ];
    let _relay = whole_request_failure(&s, "transient", None, &timing).await;
    let by_id = receive_checked(&s.queue, &s.written, ROWS).await;
    assert_once(&by_id, &s.written);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_response_is_resent_and_every_copy_carries_its_event_id() {
    let s = setup("f-drop", Mode::DropResponse).await;
    let _relay = whole_request_failure(&s, "transient", None, &[]).await;
    // Every row failed at least once, each time after SQS had accepted it, and was then sent
    // again with an answer: at least two copies each, all of them the same event.
    let by_id = receive_checked(&s.queue, &s.written, 2 * ROWS).await;
    assert_eq!(by_id.len(), ROWS, "every event arrives: {by_id:?}");
    assert!(
        by_id.values().all(|&c| c >= 2),
        "an unacknowledged send is repeated: {by_id:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_answers_keep_rows_unmarked_until_they_arrive_then_all_is_sent_once() {
    let s = setup("f-hold", Mode::Hold).await;
    // The default send timeout (10 s) outlasts the hold.
    let relay = RelayProcess::spawn(&run_args(&s.db, &s.queue, s.proxy.endpoint(), &[]), &[]);
    wait_until("an answer held", WAIT, || async { s.proxy.held() >= 1 }).await;
    assert_eq!(
        count(&s.client, "sent_at IS NOT NULL").await,
        0,
        "SQS has the messages, but no row is marked before its answer arrives"
    );
    assert_eq!(
        count(&s.client, LEASED).await,
        ROWS as i64,
        "the rows stay leased meanwhile"
    );
    assert_eq!(sent_total(&relay).await, 0.0);

    // Also releases the held answers.
    s.proxy.set_mode(Mode::Pass);
    wait_count(&s.client, "sent_at IS NOT NULL", ROWS as i64, WAIT).await;
    for kind in KINDS {
        assert_eq!(failures(&relay, kind).await, 0.0, "no {kind} failure");
    }
    assert_eq!(count(&s.client, "attempts <> 1").await, 0);
    assert_eq!(count(&s.client, "last_error IS NOT NULL").await, 0);
    wait_until("every row counted as sent", WAIT, || async {
        sent_total(&relay).await == ROWS as f64
    })
    .await;
    let by_id = receive_checked(&s.queue, &s.written, ROWS).await;
    assert_once(&by_id, &s.written);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgresql_restart_fails_readiness_meanwhile_and_the_relay_carries_on_losing_nothing() {
    let batches = 120;
    let cluster = PrivatePg::start().await;
    let db = cluster.create_db().await;
    migrate(&db, "outbox").await;
    let client = db.client().await;
    let queue = create_queue("f-pgrestart", &[]).await;
    // Polling is pushed beyond every wait below, so rows written after the restart are only
    // sent if the relay LISTENs again. The lease is short so that rows whose settlement was
    // cut off by the shutdown come back while the producer (and its NOTIFYs) still runs.
    let mut args = run_args(
        &db,
        &queue,
        sqs().endpoint(),
        &[
            "--lease",
            "4s",
            "--send-timeout",
            "2s",
            "--settle-margin",
            "1s",
        ],
    );
    set_arg(&mut args, "--poll-interval", "10m");
    let relay = RelayProcess::spawn(&args, &[]);
    let producer = Producer::start(
        &db.url,
        "f-pgrestart",
        batches,
        10,
        Duration::from_millis(100),
    );

    wait_until("rows flowing", WAIT, || async {
        producer.committed_batches() >= 15 && count(&client, "sent_at IS NOT NULL").await >= 100
    })
    .await;
    assert_eq!(relay.http_status("/readyz").await, 200);
    let sent_before = sent_total(&relay).await;
    drop(client);

    cluster.stop_fast().await;
    wait_until("/readyz fails while the database is down", WAIT, || async {
        relay.http_status("/readyz").await == 503
    })
    .await;
    assert_eq!(
        relay.http_status("/healthz").await,
        200,
        "the loop keeps running (backing off) while the database is down"
    );
    let written_before = producer.committed_batches();
    // Long enough for the relay and the producer to fail a few times over.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        relay.wait_exit(Duration::ZERO).await.is_none(),
        "the relay must not exit when its database goes away:\n{}",
        relay.output()
    );
    cluster.start_again().await;

    let client = db.client().await;
    let last_before_restart: i64 = client
        .query_one("SELECT coalesce(max(id), 0) FROM outbox", &[])
        .await
        .unwrap()
        .get(0);
    wait_until("/readyz passes again", WAIT, || async {
        relay.http_status("/readyz").await == 200
    })
    .await;
    let report = producer.finish().await;
    assert!(
        report.retries > 0 && written_before < batches,
        "the producer was still writing when the database went down"
    );
    let total = report.events.len() as i64;
    assert_eq!(
        count(&client, "true").await,
        total,
        "every batch is in the table once"
    );
    let after_restart = count(&client, &format!("id > {last_before_restart}")).await;
    assert!(after_restart > 0, "rows were written after the restart");
    wait_count(&client, "sent_at IS NOT NULL", total, WAIT).await;
    assert_eq!(count(&client, "quarantined_at IS NOT NULL").await, 0);

    assert!(
        relay.wait_exit(Duration::ZERO).await.is_none(),
        "the relay is still running:\n{}",
        relay.output()
    );
    let sent_after = sent_total(&relay).await;
    assert!(sent_after > sent_before, "{sent_after} > {sent_before}");
    // Fencing: no row is counted twice, even when a settlement is retried across the restart.
    let lost = relay.metric("outbox_lease_lost_total").await.unwrap_or(0.0);
    assert!(
        sent_after + lost <= total as f64,
        "{sent_after} + {lost} <= {total}"
    );
    let by_id = receive_checked(&queue, &report.events, report.events.len()).await;
    assert_eq!(by_id.len(), report.events.len(), "no row lost");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thirty_second_queue_outage_ages_the_oldest_row_spends_no_attempts_and_loses_nothing() {
    let outage = Duration::from_secs(30);
    let db = migrated_db().await;
    let client = db.client().await;
    let queue = create_queue("f-outage", &[]).await;
    let proxy = FaultProxy::start(sqs().endpoint());
    let relay = RelayProcess::spawn(&run_args(&db, &queue, proxy.endpoint(), &[]), &[]);
    let warm_up = events("f-outage-warm", 10, 2);
    insert(&client, &warm_up, Duration::ZERO).await;
    wait_count(&client, "sent_at IS NOT NULL", 10, WAIT).await;

    proxy.set_mode(Mode::Error500);
    let started = Instant::now();
    let producer = Producer::start(&db.url, "f-outage", 100, 10, Duration::from_millis(250));
    wait_until("the oldest unsent row is seen ageing", WAIT, || async {
        relay
            .metric("outbox_oldest_unsent_age_seconds")
            .await
            .unwrap_or(0.0)
            > 0.0
    })
    .await;
    let early_age = relay
        .metric("outbox_oldest_unsent_age_seconds")
        .await
        .unwrap();
    tokio::time::sleep(outage.saturating_sub(started.elapsed() + Duration::from_secs(2))).await;
    let late_age = relay
        .metric("outbox_oldest_unsent_age_seconds")
        .await
        .unwrap();
    assert!(
        late_age > early_age,
        "the oldest unsent age grows during the outage: {early_age} then {late_age}"
    );
    assert_eq!(
        count(&client, "sent_at IS NOT NULL").await,
        10,
        "only the warm-up is sent"
    );
    // Stored attempts count the attempts that ended (a claim's own is added by its
    // settlement): every one during the outage was refunded.
    assert_eq!(count(&client, "sent_at IS NULL AND attempts > 0").await, 0);
    assert!(failures(&relay, "transient").await > 0.0);
    assert_eq!(relay.http_status("/readyz").await, 200);
    tokio::time::sleep(outage.saturating_sub(started.elapsed())).await;

    proxy.set_mode(Mode::Pass);
    let report = producer.finish().await;
    let total = (report.events.len() + warm_up.len()) as i64;
    wait_count(
        &client,
        "sent_at IS NOT NULL",
        total,
        Duration::from_secs(90),
    )
    .await;
    assert_eq!(
        count(&client, "attempts <> 1").await,
        0,
        "the outage cost no row an attempt"
    );
    assert_eq!(count(&client, "quarantined_at IS NOT NULL").await, 0);
    wait_until("the oldest unsent age is back to 0", WAIT, || async {
        relay.metric("outbox_oldest_unsent_age_seconds").await == Some(0.0)
    })
    .await;
    let mut written = report.events;
    written.extend(warm_up);
    let by_id = receive_checked(&queue, &written, written.len()).await;
    assert_once(&by_id, &written);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_default_queue_fails_readiness_parks_its_rows_and_they_flow_once_it_exists() {
    let db = migrated_db().await;
    let client = db.client().await;
    // A URL in the server's own shape for a queue that does not exist yet.
    let sibling = create_queue("f-config-sibling", &[]).await;
    let name = format!("f-config-{}", crate::support::unique());
    let (base, _) = sibling.rsplit_once('/').expect("queue URL has a path");
    let queue = format!("{base}/{name}");
    let written = events("f-config", ROWS, 5);
    insert(&client, &written, Duration::ZERO).await;

    let relay = RelayProcess::spawn(&run_args(&db, &queue, sqs().endpoint(), &[]), &[]);
    wait_until("/readyz fails on the configuration error", WAIT, || async {
        let (status, why) = relay.http_get("/readyz").await;
        status == 503 && why.contains(&queue)
    })
    .await;
    let (_, why) = relay.http_get("/readyz").await;
    assert!(
        why.contains(&queue)
            && (why.contains("NonExistentQueue") || why.contains("QueueDoesNotExist")),
        "/readyz names the queue and SQS's error: {why}"
    );
    // Parked, not lost: visible in the quarantine with their queue's error, retried by
    // themselves. They come back for a moment at each try, hence the wait.
    wait_count(
        &client,
        "quarantine_reason = 'destination' AND last_error LIKE '%f-config-%'",
        ROWS as i64,
        WAIT,
    )
    .await;
    wait_until("several tries of the queue counted", WAIT, || async {
        failures(&relay, "config").await >= ROWS as f64
    })
    .await;
    for other in ["transient", "throttled", "permanent", "destination"] {
        assert_eq!(failures(&relay, other).await, 0.0, "no {other} failure");
    }
    assert_eq!(count(&client, "sent_at IS NOT NULL").await, 0);
    // Stored attempts count the attempts that ended: parking for the destination spends none.
    assert_eq!(count(&client, "attempts > 0").await, 0);
    assert_eq!(
        relay.http_status("/healthz").await,
        200,
        "alive: restarting the relay would not fix its configuration"
    );
    assert_eq!(relay.http_status("/readyz").await, 503);

    let created = crate::support::sqs_client()
        .await
        .create_queue()
        .queue_name(&name)
        .send()
        .await
        .expect("create the missing queue")
        .queue_url
        .expect("QueueUrl");
    assert_eq!(created, queue);
    wait_count(&client, "sent_at IS NOT NULL", ROWS as i64, WAIT).await;
    assert_eq!(count(&client, "quarantined_at IS NOT NULL").await, 0);
    assert_eq!(
        count(&client, "attempts <> 1").await,
        0,
        "the configuration error cost no row an attempt"
    );
    wait_until("/readyz passes again", WAIT, || async {
        relay.http_status("/readyz").await == 200
    })
    .await;
    let by_id = receive_checked(&queue, &written, ROWS).await;
    assert_once(&by_id, &written);
}
