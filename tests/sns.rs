//! SNS topic destinations: rows routed to a topic reach every subscribed queue, with raw message
//! delivery (the payload as the body, the attributes as message attributes) and without (the
//! SNS JSON envelope); a FIFO topic keeps each group's order in every FIFO queue subscribed; a
//! row a topic cannot take is quarantined, and a missing topic parks only its own rows.

mod faults;
mod region;
mod size;

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_sqs::types::Message;
use serde_json::Value;

use crate::scenario::{
    attr, count, events, insert, insert_to, message_group, migrate_with, migrated_db, run_args,
    wait_count, Event,
};
use crate::support::{
    create_queue, create_topic, create_topic_named, receive_all, run_to_end, sqs, subscribe_queue,
    topic_name, RelayProcess, DEBEZIUM_COLUMNS,
};

/// Generous for a loaded 2-core machine; a bound on waiting only, never a measured time.
const WAIT: Duration = Duration::from_secs(60);

/// The SNS envelope a non-raw subscription receives, parsed.
fn envelope(m: &Message) -> Value {
    serde_json::from_str(m.body().expect("a body")).expect("the SNS envelope is JSON")
}

/// An attribute as the envelope carries it (`MessageAttributes.NAME.Value`).
fn envelope_attr<'a>(envelope: &'a Value, name: &str) -> Option<&'a str> {
    envelope["MessageAttributes"][name]["Value"].as_str()
}

fn by_event_id(written: &[Event]) -> HashMap<&str, &Event> {
    written.iter().map(|e| (e.event_id.as_str(), e)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routed_topic_reaches_a_raw_and_an_enveloped_queue_with_body_and_attributes() {
    let db = migrated_db().await;
    let client = db.client().await;
    let topic = create_topic("t-fanout").await;
    let raw = create_queue("t-raw", &[]).await;
    let wrapped = create_queue("t-wrapped", &[]).await;
    subscribe_queue(&topic, &raw, true).await;
    subscribe_queue(&topic, &wrapped, false).await;
    // The default queue gets nothing: every row's aggregate_type routes it to the topic.
    let default = create_queue("t-default", &[]).await;
    let written = events("t-fanout", 30, 4);
    insert(&client, &written, Duration::ZERO).await;
    let route = format!("order={topic}");
    let relay = RelayProcess::spawn(
        &run_args(
            &db,
            &default,
            sqs().endpoint(),
            &["--route", &route, "--sns-endpoint-url", sqs().endpoint()],
        ),
        &[],
    );
    wait_count(
        &client,
        "sent_at IS NOT NULL AND message_id IS NOT NULL",
        30,
        WAIT,
    )
    .await;
    let expected = by_event_id(&written);

    let got = receive_all(&raw, 30, WAIT).await;
    assert_eq!(got.len(), 30, "each event once at the raw subscription");
    for m in &got {
        let id = attr(m, "event_id").expect("event_id as a message attribute");
        let e = expected[id];
        let body: Value = serde_json::from_str(m.body().unwrap()).expect("the payload");
        assert_eq!(body, e.payload, "raw delivery: the body is the payload");
        assert_eq!(attr(m, "event_type"), Some(e.event_type.as_str()));
        assert_eq!(attr(m, "aggregate_type"), Some("order"));
        assert_eq!(attr(m, "aggregate_id"), Some(e.aggregate_id.as_str()));
        assert_eq!(
            attr(m, "traceparent"),
            e.headers["traceparent"].as_str(),
            "headers travel as attributes"
        );
    }

    let got = receive_all(&wrapped, 30, WAIT).await;
    assert_eq!(
        got.len(),
        30,
        "each event once at the enveloped subscription"
    );
    for m in &got {
        let envelope = envelope(m);
        assert_eq!(envelope["Type"], "Notification");
        assert_eq!(envelope["TopicArn"], topic.as_str());
        let id = envelope_attr(&envelope, "event_id").expect("event_id in MessageAttributes");
        let e = expected[id];
        let message: Value =
            serde_json::from_str(envelope["Message"].as_str().expect("Message is text"))
                .expect("Message is the payload");
        assert_eq!(message, e.payload);
        assert_eq!(
            envelope_attr(&envelope, "event_type"),
            Some(e.event_type.as_str())
        );
        assert_eq!(
            envelope_attr(&envelope, "aggregate_id"),
            Some(e.aggregate_id.as_str())
        );
        assert_eq!(
            envelope_attr(&envelope, "traceparent"),
            e.headers["traceparent"].as_str()
        );
    }
    assert!(
        receive_all(&default, 0, Duration::from_secs(2))
            .await
            .is_empty(),
        "routed rows do not reach the default queue"
    );
    assert_eq!(
        relay.metric("outbox_events_sent_total").await,
        Some(30.0),
        "{}",
        relay.output()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_topic_keeps_each_groups_order_in_every_subscribed_fifo_queue() {
    let db = migrated_db().await;
    let client = db.client().await;
    let topic = create_topic("t-order.fifo").await;
    let raw = create_queue("t-raw.fifo", &[]).await;
    let wrapped = create_queue("t-wrapped.fifo", &[]).await;
    subscribe_queue(&topic, &raw, true).await;
    subscribe_queue(&topic, &wrapped, false).await;
    // Written in three transactions while the relay runs, so groups span claims and requests.
    let written = events("t-fifo", 120, 5);
    let relay = RelayProcess::spawn(
        &run_args(
            &db,
            &topic,
            sqs().endpoint(),
            &["--sns-endpoint-url", sqs().endpoint(), "--batch-size", "25"],
        ),
        &[],
    );
    for chunk in written.chunks(40) {
        insert(&client, chunk, Duration::ZERO).await;
    }
    wait_count(&client, "sent_at IS NOT NULL", 120, WAIT).await;
    let index = |event_id: &str| -> usize {
        event_id
            .rsplit('-')
            .next()
            .and_then(|i| i.parse().ok())
            .expect("t-fifo-N")
    };
    for (queue, is_raw) in [(&raw, true), (&wrapped, false)] {
        let got = receive_all(queue, 120, WAIT).await;
        assert_eq!(got.len(), 120, "{queue}: each event once");
        let mut by_group: HashMap<String, Vec<usize>> = HashMap::new();
        for m in &got {
            let group = message_group(m)
                .expect("a FIFO message has its group")
                .to_string();
            let event_id = if is_raw {
                attr(m, "event_id").expect("event_id").to_string()
            } else {
                envelope_attr(&envelope(m), "event_id")
                    .expect("event_id")
                    .to_string()
            };
            assert_eq!(
                group,
                format!("agg-{}", index(&event_id) % 5),
                "MessageGroupId is the aggregate"
            );
            by_group.entry(group).or_default().push(index(&event_id));
        }
        assert_eq!(by_group.len(), 5);
        for (group, seq) in &by_group {
            assert!(
                seq.windows(2).all(|w| w[0] < w[1]),
                "{queue}: group {group} out of order: {seq:?}"
            );
        }
    }
    assert_eq!(
        count(&client, "attempts > 1").await,
        0,
        "{}",
        relay.output()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_too_large_for_a_topic_is_quarantined_and_a_missing_topic_parks_only_its_rows() {
    let db = migrated_db().await;
    let client = db.client().await;
    let topic = create_topic("t-rows").await;
    let subscribed = create_queue("t-rows-sub", &[]).await;
    subscribe_queue(&topic, &subscribed, true).await;
    let default = create_queue("t-rows-default", &[]).await;
    let missing_name = topic_name("t-missing");
    let (prefix, _) = topic.rsplit_once(':').expect("an ARN");
    let missing = format!("{prefix}:{missing_name}");
    // Rows name their own destination: the topic, a topic not created yet, or none (the
    // default queue). Row 6 (to the topic) is 300 KiB: within SQS's 1 MiB, beyond SNS's 256 KiB.
    let mut written = events("t-rows", 30, 3);
    written[6].payload = serde_json::json!({ "blob": "b".repeat(300 * 1024) });
    let to: Vec<Option<String>> = (0..written.len())
        .map(|i| match i % 3 {
            0 => Some(topic.clone()),
            1 => Some(missing.clone()),
            _ => None,
        })
        .collect();
    insert_to(&client, &written, &to).await;
    let relay = RelayProcess::spawn(
        &run_args(
            &db,
            &default,
            sqs().endpoint(),
            &["--sns-endpoint-url", sqs().endpoint()],
        ),
        &[],
    );
    let too_large = format!("event_id = '{}'", written[6].event_id);
    wait_count(
        &client,
        &format!("{too_large} AND quarantine_reason = 'too_large' AND last_error LIKE '%262144%'"),
        1,
        WAIT,
    )
    .await;
    // 10 to the topic but the large one, 10 to the default queue.
    wait_count(&client, "sent_at IS NOT NULL", 19, WAIT).await;
    wait_count(&client, "quarantine_reason = 'destination'", 10, WAIT).await;
    assert_eq!(
        count(
            &client,
            &format!(
                "quarantine_reason = 'destination' AND last_error LIKE '%{missing_name}%NotFound%'"
            )
        )
        .await,
        10,
        "each parked row names its topic and SNS's error"
    );
    assert_eq!(
        count(&client, "attempts > 1").await,
        0,
        "neither a missing topic nor a row's size costs retries"
    );
    let got = receive_all(&subscribed, 9, WAIT).await;
    assert_eq!(got.len(), 9);
    assert_eq!(receive_all(&default, 10, WAIT).await.len(), 10);
    let (ready, why) = relay.http_get("/readyz").await;
    assert_eq!(ready, 200, "a row's own topic is not the relay's: {why}");

    // Once the topic exists its parked rows follow by themselves.
    let late = create_queue("t-rows-late", &[]).await;
    assert_eq!(create_topic_named(&missing_name).await, missing);
    subscribe_queue(&missing, &late, true).await;
    wait_count(&client, "sent_at IS NOT NULL", 29, WAIT).await;
    assert_eq!(receive_all(&late, 10, WAIT).await.len(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_verifies_each_topic_and_names_a_missing_one_with_its_fix() {
    let db = migrated_db().await;
    let topic = create_topic("t-check.fifo").await;
    let (prefix, _) = topic.rsplit_once(':').expect("an ARN");
    let missing = format!("{prefix}:{}", topic_name("t-check-missing"));
    let route = format!("billing={missing}");
    let check = |extra: Vec<String>| {
        let mut a = run_args(
            &db,
            &topic,
            sqs().endpoint(),
            &["--sns-endpoint-url", sqs().endpoint()],
        );
        a[0] = "check".to_string();
        a.extend(extra);
        async move { crate::support::run_to_end(&a, &[], WAIT).await }
    };
    let (status, output) = check(Vec::new()).await;
    assert!(status.success(), "{output}");
    assert!(
        output.contains(&format!("ok   topic {topic} reachable")) && output.contains("FIFO topic"),
        "{output}"
    );
    let (status, output) = check(vec!["--route".into(), route]).await;
    assert_eq!(status.code(), Some(1), "{output}");
    let failed: Vec<&str> = output.lines().filter(|l| l.starts_with("FAIL ")).collect();
    assert_eq!(failed.len(), 1, "{output}");
    assert!(
        failed[0].contains(&missing)
            && failed[0].contains("the topic does not exist")
            && failed[0].contains("--route billing=")
            && failed[0].contains("[NotFound]"),
        "{}",
        failed[0]
    );
}

/// A documented mode combined with a topic destination.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Combo {
    /// `--ordered on` with a standard topic as the default destination.
    OrderedStandardTopic,
    /// Rows name a FIFO topic in their own `queue_url`; the default queue is standard, so
    /// `--ordered auto` must order exactly those rows.
    RowsOwnFifoTopic,
    /// `--route-by event_type`: one event type to the topic, the other to the default queue.
    RouteByEventType,
    /// `--message-format cloudevents` to a topic.
    CloudEvents,
    /// `--retention 0`: rows deleted once SNS acknowledged them.
    DeleteOnAck,
    /// An adopted Debezium outbox table (`migrate --adopt`) relayed to a topic.
    AdoptedTable,
    /// Fair claiming (`--fair-by`, with `--fair-group-id`, which a FIFO topic accepts) to a
    /// FIFO topic: claims take turns across aggregates, each group stays in order.
    FairToFifoTopic,
}

const COMBOS: [Combo; 7] = [
    Combo::OrderedStandardTopic,
    Combo::RowsOwnFifoTopic,
    Combo::RouteByEventType,
    Combo::CloudEvents,
    Combo::DeleteOnAck,
    Combo::AdoptedTable,
    Combo::FairToFifoTopic,
];

/// Runs one combination end to end and checks what arrives at a raw subscription of the topic:
/// each expected event once, with its body (payload, or CloudEvents envelope) and attributes,
/// and per-group order where the topic is FIFO.
async fn deliver_through_topic(combo: Combo) {
    let fifo = matches!(combo, Combo::RowsOwnFifoTopic | Combo::FairToFifoTopic);
    let name = format!("{combo:?}").to_lowercase();
    let topic = create_topic(&format!("c-{name}{}", if fifo { ".fifo" } else { "" })).await;
    let subscribed = create_queue(
        &format!("c-{name}-sub{}", if fifo { ".fifo" } else { "" }),
        &[],
    )
    .await;
    subscribe_queue(&topic, &subscribed, true).await;
    let default = create_queue(&format!("c-{name}-default"), &[]).await;
    let sns = ["--sns-endpoint-url", sqs().endpoint()];
    let written = events(&format!("c-{name}"), 12, 3);

    // (database, table, flags, default destination, the events expected at the topic)
    let (db, table, mut flags, destination, expected): (
        _,
        _,
        Vec<String>,
        _,
        HashMap<String, Value>,
    ) = match combo {
        Combo::AdoptedTable => {
            let db = crate::support::fresh_db().await;
            let client = db.client().await;
            client
                .batch_execute(crate::support::DEBEZIUM_OUTBOX_DDL)
                .await
                .unwrap();
            let mut migrate = crate::scenario::args(&[
                "migrate",
                "--adopt",
                "--database-url",
                &db.url,
                "--table",
                "outboxevent",
            ]);
            migrate.extend(DEBEZIUM_COLUMNS.iter().map(|s| s.to_string()));
            let (status, output) = run_to_end(&migrate, &[], WAIT).await;
            assert!(status.success(), "{output}");
            client
                .execute(
                    "INSERT INTO outboxevent (id, aggregatetype, aggregateid, type, payload)
                         SELECT gen_random_uuid(), 'order', (g % 3)::text, 'OrderCreated',
                                jsonb_build_object('order', g)
                         FROM generate_series(1, 12) g",
                    &[],
                )
                .await
                .unwrap();
            let expected = client
                .query("SELECT id::text, payload::text FROM outboxevent", &[])
                .await
                .unwrap()
                .iter()
                .map(|r| {
                    let payload: String = r.get(1);
                    (r.get(0), serde_json::from_str(&payload).unwrap())
                })
                .collect();
            let mut flags = vec!["--table".to_string(), "outboxevent".to_string()];
            flags.extend(DEBEZIUM_COLUMNS.iter().map(|s| s.to_string()));
            (db, "outboxevent", flags, topic.clone(), expected)
        }
        _ => {
            let db = migrated_db().await;
            let client = db.client().await;
            let all = |events: &[Event]| {
                events
                    .iter()
                    .map(|e| (e.event_id.clone(), e.payload.clone()))
                    .collect()
            };
            let (flags, destination, expected): (Vec<String>, _, _) = match combo {
                Combo::OrderedStandardTopic => {
                    insert(&client, &written, Duration::ZERO).await;
                    (
                        vec!["--ordered".into(), "on".into()],
                        topic.clone(),
                        all(&written),
                    )
                }
                Combo::RowsOwnFifoTopic => {
                    let to = vec![Some(topic.clone()); written.len()];
                    insert_to(&client, &written, &to).await;
                    (Vec::new(), default.clone(), all(&written))
                }
                Combo::RouteByEventType => {
                    insert(&client, &written, Duration::ZERO).await;
                    let paid: Vec<Event> = written
                        .iter()
                        .filter(|e| e.event_type == "order.paid")
                        .cloned()
                        .collect();
                    (
                        vec![
                            "--route-by".into(),
                            "event_type".into(),
                            "--route".into(),
                            format!("order.paid={topic}"),
                        ],
                        default.clone(),
                        all(&paid),
                    )
                }
                Combo::CloudEvents => {
                    insert(&client, &written, Duration::ZERO).await;
                    let flags = [
                        "--message-format",
                        "cloudevents",
                        "--cloudevents-source",
                        "/shop/orders",
                    ];
                    (
                        flags.map(String::from).to_vec(),
                        topic.clone(),
                        all(&written),
                    )
                }
                Combo::DeleteOnAck => {
                    insert(&client, &written, Duration::ZERO).await;
                    (
                        vec!["--retention".into(), "0".into()],
                        topic.clone(),
                        all(&written),
                    )
                }
                Combo::FairToFifoTopic => {
                    migrate_with(&db, &["--fair-by", "aggregate_id"]).await;
                    insert(&client, &written, Duration::ZERO).await;
                    let flags = [
                        "--fair-by",
                        "aggregate_id",
                        "--fair-group-id",
                        "--batch-size",
                        "4",
                    ];
                    (
                        flags.map(String::from).to_vec(),
                        topic.clone(),
                        all(&written),
                    )
                }
                Combo::AdoptedTable => unreachable!(),
            };
            (db, "outbox", flags, destination, expected)
        }
    };
    flags.extend(sns.map(String::from));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let relay = RelayProcess::spawn(&run_args(&db, &destination, sqs().endpoint(), &flags), &[]);
    let client = db.client().await;
    let settled = if combo == Combo::DeleteOnAck {
        "true"
    } else {
        "sent_at IS NOT NULL"
    };
    let goal = if combo == Combo::DeleteOnAck { 0 } else { 12 };
    crate::support::wait_until(&format!("{combo:?}: rows settled"), WAIT, || async {
        client
            .query_one(
                &format!("SELECT count(*) FROM {table} WHERE {settled}"),
                &[],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
            == goal
    })
    .await;

    let got = receive_all(&subscribed, expected.len(), WAIT).await;
    let mut seen: Vec<String> = Vec::new();
    let mut by_group: HashMap<String, Vec<usize>> = HashMap::new();
    for m in &got {
        let id = attr(m, "event_id").expect("event_id").to_string();
        let payload = expected
            .get(&id)
            .unwrap_or_else(|| panic!("{combo:?}: {id} should not reach the topic"));
        let body: Value = serde_json::from_str(m.body().unwrap()).expect("a JSON body");
        if combo == Combo::CloudEvents {
            assert_eq!(body["specversion"], "1.0", "{combo:?}");
            assert_eq!(body["id"], id.as_str(), "{combo:?}");
            assert_eq!(body["source"], "/shop/orders", "{combo:?}");
            assert_eq!(&body["data"], payload, "{combo:?}");
        } else {
            assert_eq!(&body, payload, "{combo:?}: the body is the payload");
        }
        assert_eq!(attr(m, "aggregate_type"), Some("order"), "{combo:?}");
        if fifo {
            let group = message_group(m).expect("a FIFO message has its group");
            let index: usize = id.rsplit('-').next().unwrap().parse().unwrap();
            by_group.entry(group.to_string()).or_default().push(index);
        }
        seen.push(id);
    }
    seen.sort();
    let mut want: Vec<String> = expected.keys().cloned().collect();
    want.sort();
    assert_eq!(
        seen, want,
        "{combo:?}: each expected event once at the topic"
    );
    for (group, seq) in &by_group {
        assert!(
            seq.windows(2).all(|w| w[0] < w[1]),
            "{combo:?}: group {group} out of order: {seq:?}"
        );
    }
    if fifo {
        assert_eq!(by_group.len(), 3, "{combo:?}");
    }
    let elsewhere = receive_all(&default, 12 - expected.len(), Duration::from_secs(5)).await;
    assert_eq!(
        elsewhere.len(),
        12 - expected.len(),
        "{combo:?}: the default queue gets the rest"
    );
    assert_eq!(
        relay.metric("outbox_events_sent_total").await,
        Some(12.0),
        "{combo:?}: {}",
        relay.output()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_combine_with_ordering_row_destinations_routes_cloudevents_delete_on_ack_adopted_tables_and_fair_claims(
) {
    // Side by side: each combination has its own database, topic and queues.
    let results = futures_util::future::join_all(
        COMBOS.map(|combo| tokio::spawn(deliver_through_topic(combo))),
    )
    .await;
    let failed: Vec<String> = results
        .into_iter()
        .zip(COMBOS)
        .filter_map(|(result, combo)| {
            let panic = result.err()?.into_panic();
            let text = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Some(format!("{combo:?}: {text}"))
        })
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// What topics cannot do is refused before any data is touched: exit 2, one line naming the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn combinations_a_topic_cannot_take_are_refused_at_start_up_with_one_line() {
    let topic = "arn:aws:sns:us-east-1:000000000000:orders";
    let fifo_topic = "arn:aws:sns:us-east-1:000000000000:orders.fifo";
    let queue = "http://127.0.0.1:1/000000000000/q";
    let route = format!("order={topic}");
    let fair = ["--fair-by", "aggregate_type", "--fair-group-id"];
    for (destination, extra, fix) in [
        (
            topic,
            &fair[..],
            format!("--fair-group-id is for SQS fair queues; the standard topic {topic} takes no MessageGroupId"),
        ),
        (
            queue,
            &[&fair[..], &["--route", route.as_str()]].concat()[..],
            format!("the standard topic {topic} takes no MessageGroupId: route it without --fair-group-id, or use a FIFO topic"),
        ),
        (
            topic,
            &["--route", "x=arn:aws:sns:us-east-1:orders"][..],
            "not a topic ARN: expected arn:aws:sns:<region>:<account>:<name>".to_string(),
        ),
    ] {
        let mut command = crate::scenario::args(&[
            "run",
            "--database-url",
            "postgres://relay@127.0.0.1:1/app",
            "--queue-url",
            destination,
        ]);
        command.extend(extra.iter().map(|s| s.to_string()));
        let (status, output) = run_to_end(&command, &[], WAIT).await;
        assert_eq!(status.code(), Some(2), "{extra:?}: {output}");
        crate::startup::assert_one_clear_line(&output, &fix);
        assert_eq!(output.lines().count(), 1, "{extra:?}: {output}");
    }
    // A FIFO topic takes the fair key as its group: the same flags pass validation and the
    // relay goes on to wait for its (unreachable) database.
    let mut command = crate::scenario::args(&[
        "run",
        "--database-url",
        "postgres://relay@127.0.0.1:1/app",
        "--queue-url",
        fifo_topic,
        "--connect-timeout",
        "1s",
    ]);
    command.extend(fair.iter().map(|s| s.to_string()));
    crate::startup::waits_for_its_database(&command, &[]).await;
}
