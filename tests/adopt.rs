//! Adopting a Debezium outbox-router table: the relay's columns and a view are added, the
//! application's columns and INSERTs stay exactly as they were.

use std::collections::HashSet;
use std::time::Duration;

use crate::scenario::{args, attr, copies, relay_command};
use crate::support::{create_queue, receive_all, run_to_end, sqs, wait_until, RelayProcess};

const COLUMNS: [&str; 8] = [
    "--column",
    "event_id=id",
    "--column",
    "aggregate_type=aggregatetype",
    "--column",
    "aggregate_id=aggregateid",
    "--column",
    "event_type=type",
];

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
