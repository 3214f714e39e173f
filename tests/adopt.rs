//! Adopting a Debezium outbox-router table: the relay's columns and a view are added, the
//! application's columns and INSERTs stay exactly as they were.

use std::collections::HashSet;
use std::time::Duration;

use crate::scenario::{args, attr, copies, relay_command};
use crate::support::{create_queue, receive_all, run_to_end, sqs, wait_until, RelayProcess};

use crate::support::DEBEZIUM_COLUMNS as COLUMNS;

/// The application's write, unchanged by the adoption.
const APP_INSERT: &str = "INSERT INTO outboxevent (id, aggregatetype, aggregateid, type, payload)
     SELECT gen_random_uuid(), 'order', (g % 7)::text, 'OrderCreated', jsonb_build_object('order', g)
     FROM generate_series($1::int, $2::int) g";

async fn app_columns(client: &tokio_postgres::Client) -> Vec<String> {
    client
        .query(
            "SELECT id::text || '|' || aggregatetype || '|' || aggregateid || '|' || type || '|' || payload::text
             FROM outboxevent ORDER BY id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debezium_outbox_table_is_adopted_and_relayed_without_touching_the_applications_rows() {
    let db = crate::support::fresh_db().await;
    let client = db.client().await;
    client
        .batch_execute(crate::support::DEBEZIUM_OUTBOX_DDL)
        .await
        .unwrap();
    client.execute(APP_INSERT, &[&1i32, &40i32]).await.unwrap();
    let before = app_columns(&client).await;

    let mut migrate = args(&[
        "migrate",
        "--adopt",
        "--database-url",
        &db.url,
        "--table",
        "outboxevent",
    ]);
    migrate.extend(COLUMNS.iter().map(|s| s.to_string()));
    for _ in 0..2 {
        let (status, output) = run_to_end(&migrate, &[], Duration::from_secs(30)).await;
        assert!(status.success(), "adopt is idempotent: {output}");
    }
    assert_eq!(
        app_columns(&client).await,
        before,
        "adoption changed no application value"
    );
    let (status, output) = run_to_end(
        &args(&[
            "migrate",
            "--database-url",
            &db.url,
            "--table",
            "outboxevent",
            "--column",
            "event_id=id",
        ]),
        &[],
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(status.code(), Some(2));
    assert!(output.contains("add --adopt"), "{output}");

    // The application goes on writing exactly as before.
    client.execute(APP_INSERT, &[&41i32, &60i32]).await.unwrap();
    let queue = create_queue("adopted", &[]).await;
    let mut run =
        crate::scenario::run_args(&db, &queue, sqs().endpoint(), &["--table", "outboxevent"]);
    run.extend(COLUMNS.iter().map(|s| s.to_string()));
    let relay = RelayProcess::spawn(&run, &[]);
    wait_until(
        "all 60 adopted rows sent",
        Duration::from_secs(60),
        || async {
            client
                .query_one(
                    "SELECT count(*) FROM outboxevent WHERE sent_at IS NOT NULL",
                    &[],
                )
                .await
                .unwrap()
                .get::<_, i64>(0)
                == 60
        },
    )
    .await;
    let received = receive_all(&queue, 60, Duration::from_secs(60)).await;
    let by_id = copies(&received);
    let uuids: HashSet<String> = client
        .query("SELECT id::text FROM outboxevent", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        by_id.keys().cloned().collect::<HashSet<_>>(),
        uuids,
        "event_id is Debezium's id"
    );
    for m in &received {
        assert_eq!(attr(m, "aggregate_type"), Some("order"));
        assert_eq!(attr(m, "event_type"), Some("OrderCreated"));
        let body: serde_json::Value = serde_json::from_str(m.body().unwrap()).unwrap();
        assert!(body["order"].is_i64());
    }
    let after = app_columns(&client).await;
    assert_eq!(after.len(), 60);
    assert_eq!(
        &after.iter().filter(|r| before.contains(r)).count(),
        &40,
        "the first 40 rows kept their values"
    );
    // Operator commands work on the adopted table too.
    let mut status_args = vec![
        "quarantine",
        "list",
        "--database-url",
        &db.url,
        "--table",
        "outboxevent",
    ];
    status_args.extend(COLUMNS);
    assert!(relay_command(&status_args)
        .await
        .contains("no quarantined rows"));
    drop(relay);
}

/// Debezium's table with a `text` headers column, as applications add for trace context.
async fn debezium_table_with_text_headers(db: &crate::support::TestDb) -> tokio_postgres::Client {
    let client = db.client().await;
    client
        .batch_execute(crate::support::DEBEZIUM_OUTBOX_DDL)
        .await
        .unwrap();
    client
        .batch_execute("ALTER TABLE outboxevent ADD COLUMN headers text")
        .await
        .unwrap();
    client
}

/// `migrate --adopt` of the Debezium table, with `extra` flags (e.g. `--fair-by`).
pub async fn adopt(db: &crate::support::TestDb, extra: &[&str]) {
    let mut migrate = args(&[
        "migrate",
        "--adopt",
        "--database-url",
        &db.url,
        "--table",
        "outboxevent",
    ]);
    migrate.extend(COLUMNS.iter().chain(extra).map(|s| s.to_string()));
    let (status, output) = run_to_end(&migrate, &[], Duration::from_secs(30)).await;
    assert!(status.success(), "adopt: {output}");
}

/// The rows quarantined as `invalid`, as `quarantine list --json` shows them, by event_id.
async fn invalid_rows(db: &crate::support::TestDb) -> Vec<serde_json::Value> {
    let mut list = vec![
        "quarantine",
        "list",
        "--json",
        "--reason",
        "invalid",
        "--database-url",
        &db.url,
        "--table",
        "outboxevent",
    ];
    list.extend(COLUMNS);
    let output = relay_command(&list).await;
    let json = &output[output.find('[').expect("a JSON list")..];
    let mut rows: Vec<serde_json::Value> = serde_json::from_str(json).unwrap();
    rows.sort_by_key(|r| r["event_id"].as_str().map(str::to_string));
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_rows_of_an_adopted_table_are_quarantined_invalid_while_their_claim_mates_flow()
{
    let db = crate::support::fresh_db().await;
    let client = debezium_table_with_text_headers(&db).await;
    client
        .batch_execute("ALTER TABLE outboxevent ALTER COLUMN aggregateid DROP NOT NULL")
        .await
        .unwrap();
    adopt(&db, &[]).await;
    // One claim (the default batch is 100): six good rows around a tombstone (NULL payload),
    // a headers value that is not JSON and a NULL aggregate id.
    client
        .batch_execute(
            "INSERT INTO outboxevent (id, aggregatetype, aggregateid, type, payload, headers)
             SELECT ('00000000-0000-4000-8000-' || lpad(g::text, 12, '0'))::uuid, 'order',
                    CASE WHEN g <> 9 THEN g::text END,
                    'OrderCreated',
                    CASE WHEN g <> 3 THEN jsonb_build_object('order', g) END,
                    CASE WHEN g = 5 THEN 'traceparent=00-abc-def-01'
                         WHEN g % 2 = 0 THEN '{\"traceparent\": \"00-' || g || '-def-01\"}' END
             FROM generate_series(1, 9) g",
        )
        .await
        .unwrap();
    let event_id = |g: u32| format!("00000000-0000-4000-8000-{g:012}");

    let queue = create_queue("adopted-unreadable", &[]).await;
    let mut run =
        crate::scenario::run_args(&db, &queue, sqs().endpoint(), &["--table", "outboxevent"]);
    run.extend(COLUMNS.iter().map(|s| s.to_string()));
    let relay = RelayProcess::spawn(&run, &[]);
    wait_until(
        "6 rows sent and 3 quarantined",
        Duration::from_secs(60),
        || async {
            let row = client
                .query_one(
                    "SELECT count(*) FILTER (WHERE sent_at IS NOT NULL),
                            count(*) FILTER (WHERE quarantined_at IS NOT NULL)
                     FROM outboxevent",
                    &[],
                )
                .await
                .unwrap();
            (row.get::<_, i64>(0), row.get::<_, i64>(1)) == (6, 3)
        },
    )
    .await;
    let received = receive_all(&queue, 6, Duration::from_secs(60)).await;
    let good: HashSet<String> = [1, 2, 4, 6, 7, 8].into_iter().map(event_id).collect();
    assert_eq!(
        copies(&received).keys().cloned().collect::<HashSet<_>>(),
        good
    );
    for m in &received {
        let id = attr(m, "event_id").unwrap();
        let g: u32 = id.rsplit('-').next().unwrap().parse().unwrap();
        let expected = (g % 2 == 0).then(|| format!("00-{g}-def-01"));
        assert_eq!(
            attr(m, "traceparent"),
            expected.as_deref(),
            "headers read from text"
        );
    }

    let invalid = invalid_rows(&db).await;
    let listed: Vec<(&str, &str)> = invalid
        .iter()
        .map(|r| {
            assert_eq!(r["reason"], "invalid");
            (
                r["event_id"].as_str().unwrap(),
                r["last_error"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(listed.len(), 3, "{invalid:?}");
    let expected = [
        (3, "column \"payload\" is NULL"),
        (5, "column \"headers\" is not a JSON object"),
        (9, "column \"aggregate_id\" is NULL"),
    ];
    for ((id, error), (g, says)) in listed.iter().zip(expected) {
        assert_eq!(*id, event_id(g));
        assert!(error.starts_with(says), "{id}: {error}");
        assert!(
            !error.contains("traceparent"),
            "no value in the error: {error}"
        );
    }
    assert_eq!(
        invalid[2]["aggregate_id"],
        serde_json::Value::Null,
        "listed although unreadable"
    );
    assert_eq!(
        relay.wait_exit(Duration::ZERO).await,
        None,
        "the relay is still running: {}",
        relay.output()
    );
    wait_until(
        "the invalid counter at 3",
        Duration::from_secs(10),
        || async {
            relay
                .metric("outbox_events_quarantined_total{reason=\"invalid\"}")
                .await
                == Some(3.0)
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_key_over_adopted_text_headers_keeps_working_when_a_value_is_not_json() {
    let db = crate::support::fresh_db().await;
    let client = debezium_table_with_text_headers(&db).await;
    adopt(&db, &["--fair-by", "header:tenant"]).await;
    // Written after the adoption: the application's INSERT must not meet the relay's
    // header-key index failing on its value.
    client
        .batch_execute(
            "INSERT INTO outboxevent (id, aggregatetype, aggregateid, type, payload, headers)
             SELECT gen_random_uuid(), 'order', g::text, 'OrderCreated', jsonb_build_object('order', g),
                    CASE WHEN g = 4 THEN '{\"tenant\": oops' ELSE '{\"tenant\": \"t' || g % 3 || '\"}' END
             FROM generate_series(1, 9) g",
        )
        .await
        .unwrap();
    let queue = create_queue("adopted-fair-text", &[]).await;
    let mut run = crate::scenario::run_args(
        &db,
        &queue,
        sqs().endpoint(),
        &["--table", "outboxevent", "--fair-by", "header:tenant"],
    );
    run.extend(COLUMNS.iter().map(|s| s.to_string()));
    let relay = RelayProcess::spawn(&run, &[]);
    let received = receive_all(&queue, 8, Duration::from_secs(60)).await;
    assert_eq!(copies(&received).len(), 8);
    let tenants: HashSet<&str> = received
        .iter()
        .map(|m| attr(m, "tenant").unwrap())
        .collect();
    assert_eq!(tenants, HashSet::from(["t0", "t1", "t2"]));
    wait_until(
        "the bad row quarantined",
        Duration::from_secs(30),
        || async {
            client
                .query_one(
                    "SELECT count(*) FROM outboxevent WHERE quarantine_reason = 'invalid'
                 AND aggregateid = '4' AND last_error LIKE '%\"headers\"%'",
                    &[],
                )
                .await
                .unwrap()
                .get::<_, i64>(0)
                == 1
        },
    )
    .await;
    assert_eq!(relay.wait_exit(Duration::ZERO).await, None);
    // Queries through the view can use the header-key index (a small table would be scanned).
    client
        .batch_execute("SET enable_seqscan = off")
        .await
        .unwrap();
    let plan: String = client
        .query(
            "EXPLAIN SELECT id FROM outboxevent_relay
             WHERE coalesce(headers ->> 'tenant', '') = 't1' AND sent_at IS NULL
               AND quarantined_at IS NULL ORDER BY id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(plan.contains("unsent_h_tenant_idx"), "{plan}");
}

/// A tombstone (NULL payload) mid-group on a FIFO queue holds the rows behind it like any
/// quarantined row under `--on-poison block`: it is quarantined `invalid` in its place in its
/// group, not split off before planning while its group-mates went past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_null_payload_mid_group_of_an_adopted_table_holds_the_rows_behind_it() {
    let db = crate::support::fresh_db().await;
    let client = db.client().await;
    client
        .batch_execute(crate::support::DEBEZIUM_OUTBOX_DDL)
        .await
        .unwrap();
    adopt(&db, &[]).await;
    client
        .batch_execute(
            "INSERT INTO outboxevent (id, aggregatetype, aggregateid, type, payload)
             SELECT ('00000000-0000-4000-8000-' || lpad(g::text, 12, '0'))::uuid, 'order', 'A',
                    'OrderCreated', CASE WHEN g <> 2 THEN jsonb_build_object('order', g) END
             FROM generate_series(1, 3) g",
        )
        .await
        .unwrap();
    let event_id = |g: u32| format!("00000000-0000-4000-8000-{g:012}");
    let queue = create_queue("adopted-tombstone.fifo", &[]).await;
    let mut run =
        crate::scenario::run_args(&db, &queue, sqs().endpoint(), &["--table", "outboxevent"]);
    run.extend(COLUMNS.iter().map(|s| s.to_string()));
    let relay = RelayProcess::spawn(&run, &[]);
    let state = |g: u32| {
        let client = &client;
        let id = event_id(g);
        async move {
            let row = client
                .query_one(
                    "SELECT sent_at IS NOT NULL, quarantine_reason FROM outboxevent
                     WHERE id::text = $1",
                    &[&id],
                )
                .await
                .unwrap();
            (row.get::<_, bool>(0), row.get::<_, Option<String>>(1))
        }
    };
    wait_until(
        "the third row sent or parked",
        Duration::from_secs(60),
        || async {
            let (sent, reason) = state(3).await;
            sent || reason.is_some()
        },
    )
    .await;
    assert_eq!(state(1).await, (true, None), "{}", relay.output());
    assert_eq!(state(2).await, (false, Some("invalid".to_string())));
    assert_eq!(
        state(3).await,
        (false, Some("blocked".to_string())),
        "held behind the tombstone"
    );
    let received = receive_all(&queue, 1, Duration::from_secs(30)).await;
    assert_eq!(attr(&received[0], "event_id"), Some(event_id(1).as_str()));
}
