//! One relay for many tables: every selected table flows on a few shared connections, tables
//! come and go without a restart, a backlog in one does not hold back another, a table the
//! relay cannot use is skipped while the others flow, and everything a table has (leases,
//! quarantine, re-drive, retention, parking) works on a table other than the first.

use std::collections::HashSet;
use std::time::Duration;

use crate::scenario::{events, relay_command, run_args, Event};
use crate::support::{create_queue, receive_all, sqs, wait_until, RelayProcess, TestDb};

/// Creates `schema.outbox` with the real `migrate`.
async fn tenant(db: &TestDb, schema: &str) {
    let client = db.client().await;
    client
        .batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))
        .await
        .unwrap();
    crate::scenario::migrate(db, &format!("{schema}.outbox")).await;
}

/// A client whose unqualified `outbox` is `schema.outbox`, as the tenant's application has.
async fn tenant_client(db: &TestDb, schema: &str) -> tokio_postgres::Client {
    let client = db.client().await;
    client
        .batch_execute(&format!("SET search_path = {schema}"))
        .await
        .unwrap();
    client
}

async fn write(db: &TestDb, schema: &str, events: &[Event]) {
    let client = tenant_client(db, schema).await;
    crate::scenario::insert(&client, events, Duration::ZERO).await;
}

async fn count_in(db: &TestDb, schema: &str, condition: &str) -> i64 {
    let client = db.client().await;
    client
        .query_one(
            &format!("SELECT count(*) FROM {schema}.outbox WHERE {condition}"),
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

async fn wait_in(db: &TestDb, schema: &str, condition: &str, n: i64, within: Duration) {
    wait_until(
        &format!("{n} rows of {schema}.outbox with {condition}"),
        within,
        || async { count_in(db, schema, condition).await == n },
    )
    .await;
}

fn many_args(db: &TestDb, queue: &str, extra: &[&str]) -> Vec<String> {
    // run_args names no table: the selection comes from `extra`.
    run_args(db, queue, sqs().endpoint(), extra)
}

fn ids(events: &[Event]) -> HashSet<String> {
    events.iter().map(|e| e.event_id.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_selected_table_flows_through_one_relay_on_a_few_connections() {
    let db = crate::support::fresh_db().await;
    let tenants: Vec<String> = (1..=12).map(|i| format!("tenant_{i}")).collect();
    for t in &tenants {
        tenant(&db, t).await;
    }
    // A table outside the pattern, named on its own, and one the pattern must not select.
    tenant(&db, "billing").await;
    tenant(&db, "archive").await;
    let queue = create_queue("many-flow", &[]).await;
    let relay = RelayProcess::spawn(
        &many_args(
            &db,
            &queue,
            &[
                "--tables",
                "tenant_*.outbox",
                "--table",
                "billing.outbox",
                "--active-tables",
                "2",
            ],
        ),
        &[],
    );
    let mut expected = HashSet::new();
    for t in tenants.iter().chain(["billing".to_string()].iter()) {
        let batch = events(&format!("{t}-e"), 25, 5);
        write(&db, t, &batch).await;
        expected.extend(ids(&batch));
    }
    let stray = events("archive-e", 3, 1);
    write(&db, "archive", &stray).await;

    let got = receive_all(&queue, expected.len(), Duration::from_secs(120)).await;
    let got_ids: HashSet<String> = got
        .iter()
        .map(|m| {
            crate::scenario::attr(m, "event_id")
                .unwrap_or("")
                .to_string()
        })
        .collect();
    assert_eq!(
        got_ids, expected,
        "exactly the selected tables' events arrive"
    );
    // Each table's rows are settled in that table, and the unselected table is untouched.
    for t in tenants.iter().chain(["billing".to_string()].iter()) {
        wait_in(&db, t, "sent_at IS NOT NULL", 25, Duration::from_secs(60)).await;
    }
    assert_eq!(count_in(&db, "archive", "sent_at IS NOT NULL").await, 0);

    // Thirteen tables, and the relay's backends are the few it always has: a claims and a
    // settlements connection per turn that may run at once (2), maintenance and the look.
    let client = db.client().await;
    let backends: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'outbox-relay%' AND datname = current_database()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        (1..=6).contains(&backends),
        "{backends} backends for 13 tables\n{}",
        relay.output()
    );

    // Per-table series with a `table` label, and how many tables.
    wait_until(
        "the table gauges are exported per table",
        Duration::from_secs(60),
        || async {
            let text = relay.scrape().await;
            text.contains("outbox_unsent_rows{table=\"tenant_7.outbox\"} 0")
                && text.contains("outbox_tables{state=\"serving\"} 13")
        },
    )
    .await;
    relay.sigterm();
    assert!(relay.wait_exit(Duration::from_secs(30)).await.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_added_later_is_served_and_a_dropped_one_is_let_go_while_the_others_flow() {
    let db = crate::support::fresh_db().await;
    for t in ["t_a", "t_b"] {
        tenant(&db, t).await;
    }
    let queue = create_queue("many-discover", &[]).await;
    let relay = RelayProcess::spawn(
        &many_args(
            &db,
            &queue,
            &["--tables", "t_*.outbox", "--discover-every", "1s"],
        ),
        &[],
    );
    let first = events("a-first", 5, 1);
    write(&db, "t_a", &first).await;
    wait_in(
        &db,
        "t_a",
        "sent_at IS NOT NULL",
        5,
        Duration::from_secs(30),
    )
    .await;

    // A tenant created while the relay runs: no restart.
    tenant(&db, "t_c").await;
    let late = events("c-late", 5, 1);
    write(&db, "t_c", &late).await;
    wait_in(
        &db,
        "t_c",
        "sent_at IS NOT NULL",
        5,
        Duration::from_secs(30),
    )
    .await;

    // A tenant dropped while the relay runs: let go, and the others keep flowing.
    db.client()
        .await
        .batch_execute("DROP SCHEMA t_b CASCADE")
        .await
        .unwrap();
    let after = events("a-after", 5, 1);
    write(&db, "t_a", &after).await;
    wait_in(
        &db,
        "t_a",
        "sent_at IS NOT NULL",
        10,
        Duration::from_secs(30),
    )
    .await;
    assert!(
        relay
            .wait_for_line("let go", Duration::from_secs(20))
            .await
            .is_some(),
        "the dropped table is let go:\n{}",
        relay.output()
    );
    let got = receive_all(&queue, 15, Duration::from_secs(30)).await;
    assert_eq!(got.len(), 15);
    assert!(
        relay.wait_exit(Duration::from_millis(10)).await.is_none(),
        "still running"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_in_one_table_does_not_hold_back_a_new_row_of_another() {
    let db = crate::support::fresh_db().await;
    for t in ["busy", "quiet"] {
        tenant(&db, t).await;
    }
    let backlog = 30_000;
    db.client()
        .await
        .batch_execute(&format!(
            "INSERT INTO busy.outbox (event_id, aggregate_type, aggregate_id, event_type, payload)
             SELECT 'busy-' || g, 'order', 'agg-' || (g % 50), 'order.placed', '{{}}'::jsonb
             FROM generate_series(1, {backlog}) AS g"
        ))
        .await
        .unwrap();
    let queue = create_queue("many-fair", &[]).await;
    // One table at a time: the quiet table's row can only go out if the busy table's turn
    // gives way to it.
    let relay = RelayProcess::spawn(
        &many_args(
            &db,
            &queue,
            &[
                "--table",
                "busy.outbox",
                "--table",
                "quiet.outbox",
                "--active-tables",
                "1",
                "--table-turn",
                "100ms",
            ],
        ),
        &[],
    );
    wait_until(
        "the backlog is draining",
        Duration::from_secs(60),
        || async { count_in(&db, "busy", "sent_at IS NOT NULL").await > 500 },
    )
    .await;
    write(&db, "quiet", &events("quiet", 1, 1)).await;
    wait_in(
        &db,
        "quiet",
        "sent_at IS NOT NULL",
        1,
        Duration::from_secs(30),
    )
    .await;
    let left = count_in(&db, "busy", "sent_at IS NULL").await;
    assert!(
        left > 0,
        "the quiet table's row went out while the backlog still had {left} rows: the test proves nothing if the backlog drained first"
    );
    drop(relay);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_the_relay_cannot_use_is_skipped_while_the_others_flow() {
    let db = crate::support::fresh_db().await;
    for t in ["ok_1", "ok_newer", "ok_locked"] {
        tenant(&db, t).await;
    }
    let admin = db.client().await;
    // A schema whose migrate no longer admits this relay.
    admin
        .batch_execute(
            "UPDATE ok_newer.outbox_relay_schema SET version = 5, relay_versions = '>=9.0.0'",
        )
        .await
        .unwrap();
    // A long migration holds the lock that blocks everything else on its table.
    let mut locker = db.client().await;
    let tx = locker.transaction().await.unwrap();
    tx.batch_execute("LOCK TABLE ok_locked.outbox IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let queue = create_queue("many-isolate", &[]).await;
    let relay = RelayProcess::spawn(
        &many_args(
            &db,
            &queue,
            &["--tables", "ok_*.outbox", "--db-timeout", "1s"],
        ),
        &[],
    );
    write(&db, "ok_newer", &events("newer", 3, 1)).await;
    let good = events("good", 10, 2);
    write(&db, "ok_1", &good).await;
    wait_in(
        &db,
        "ok_1",
        "sent_at IS NOT NULL",
        10,
        Duration::from_secs(30),
    )
    .await;
    for (what, needle) in [
        ("the newer schema", "ok_newer.outbox"),
        ("the locked table", "ok_locked.outbox"),
    ] {
        wait_until(
            &format!("{what} is reported"),
            Duration::from_secs(30),
            || async {
                relay
                    .output()
                    .lines()
                    .any(|l| l.contains("table skipped") && l.contains(needle))
            },
        )
        .await;
    }
    assert_eq!(count_in(&db, "ok_newer", "sent_at IS NOT NULL").await, 0);
    wait_until(
        "the skipped tables are exported",
        Duration::from_secs(20),
        || async {
            let text = relay.scrape().await;
            text.contains("outbox_table_skipped{table=\"ok_newer.outbox\"} 1")
                && text.contains("outbox_tables{state=\"skipped\"} 2")
        },
    )
    .await;
    // The others still flow while both are skipped.
    let more = events("good-more", 5, 1);
    write(&db, "ok_1", &more).await;
    wait_in(
        &db,
        "ok_1",
        "sent_at IS NOT NULL",
        15,
        Duration::from_secs(30),
    )
    .await;
    // The lock goes: the table is served again, with what was written meanwhile.
    tx.rollback().await.unwrap();
    write(&db, "ok_locked", &events("unlocked", 4, 1)).await;
    wait_in(
        &db,
        "ok_locked",
        "sent_at IS NOT NULL",
        4,
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(count_in(&db, "ok_newer", "sent_at IS NOT NULL").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_quarantine_redrive_parking_and_retention_work_on_a_table_other_than_the_first() {
    let db = crate::support::fresh_db().await;
    for t in ["first", "second"] {
        tenant(&db, t).await;
    }
    let queue = create_queue("many-each", &[]).await;
    let admin = db.client().await;
    // A claim of a relay that died holding two rows of the second table, its lease ending soon.
    let held = events("held", 2, 1);
    write(&db, "second", &held).await;
    admin
        .batch_execute(
            "INSERT INTO second.outbox_claims (owner, until, ids)
             SELECT 'dead-relay', now() + interval '2 seconds', array_agg(id) FROM second.outbox",
        )
        .await
        .unwrap();
    // A row SQS refuses (bad input): quarantined, then re-driven once fixed.
    let mut bad = events("bad", 1, 1);
    bad[0].headers = serde_json::json!({"bad": [1]});
    write(&db, "second", &bad).await;
    // A row for a queue that does not exist yet: parked, sent once the queue exists.
    let missing = format!("{queue}-later");
    let mut parked = events("parked", 1, 1);
    parked[0].queue_url = Some(missing.clone());
    write(&db, "second", &parked).await;
    write(&db, "first", &events("first", 3, 1)).await;

    let relay = RelayProcess::spawn(
        &many_args(
            &db,
            &queue,
            &[
                "--table",
                "first.outbox",
                "--table",
                "second.outbox",
                "--retention",
                "2s",
                "--retention-interval",
                "500ms",
            ],
        ),
        &[],
    );
    // The dead relay's lease ends: its rows are claimed and sent.
    let received = receive_all(&queue, 5, Duration::from_secs(60)).await;
    let got: HashSet<String> = received
        .iter()
        .map(|m| {
            crate::scenario::attr(m, "event_id")
                .unwrap_or("")
                .to_string()
        })
        .collect();
    assert!(got.contains("held-0") && got.contains("held-1"), "{got:?}");
    wait_in(
        &db,
        "second",
        "quarantine_reason = 'invalid'",
        1,
        Duration::from_secs(30),
    )
    .await;
    wait_in(
        &db,
        "second",
        "quarantine_reason = 'destination'",
        1,
        Duration::from_secs(30),
    )
    .await;

    // Re-drive the fixed row with the one-table command; the relay serving both sends it.
    admin
        .batch_execute("UPDATE second.outbox SET headers = '{}' WHERE event_id = 'bad-0'")
        .await
        .unwrap();
    let out = relay_command(&[
        "quarantine",
        "retry",
        "--event-id",
        "bad-0",
        "--database-url",
        &db.url,
        "--table",
        "second.outbox",
    ])
    .await;
    assert!(out.contains("moved 1 "), "{out}");
    // The parked row's queue appears: unparked and sent.
    let later = sqs_client_create(&missing).await;
    assert_eq!(later, missing);
    let redriven = receive_all(&queue, 1, Duration::from_secs(60)).await;
    assert_eq!(
        redriven
            .iter()
            .map(|m| crate::scenario::attr(m, "event_id").unwrap_or(""))
            .collect::<Vec<_>>(),
        ["bad-0"]
    );
    let unparked = receive_all(&missing, 1, Duration::from_secs(90)).await;
    assert_eq!(unparked.len(), 1);
    // Retention: every sent row of the second table is deleted two seconds after sending.
    wait_in(&db, "second", "true", 0, Duration::from_secs(60)).await;
    drop(relay);
}

/// Creates the queue whose URL is `url` on the test server; its URL back.
async fn sqs_client_create(url: &str) -> String {
    let name = url.rsplit('/').next().unwrap();
    crate::support::sqs_client()
        .await
        .create_queue()
        .queue_name(name)
        .send()
        .await
        .unwrap()
        .queue_url()
        .unwrap()
        .to_string()
}

/// Every event of `tables` with its id: event ids are unique across the tables of a test.
async fn ids_by_event(db: &TestDb, tables: &[&str]) -> std::collections::HashMap<String, i64> {
    let client = db.client().await;
    let mut ids = std::collections::HashMap::new();
    for t in tables {
        for row in client
            .query(&format!("SELECT event_id, id FROM {t}.outbox"), &[])
            .await
            .unwrap()
        {
            ids.insert(row.get(0), row.get(1));
        }
    }
    ids
}

/// `n` events of `schema`, over `groups` aggregates of its own (another table's `agg-1` is
/// another group).
fn tenant_events(schema: &str, n: usize, groups: usize) -> Vec<Event> {
    let mut written = events(schema, n, groups);
    for e in &mut written {
        e.aggregate_id = format!("{schema}-{}", e.aggregate_id);
    }
    written
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_of_several_tables_keep_each_groups_order_through_kill_9_and_lost_acknowledgements(
) {
    let db = crate::support::fresh_db().await;
    let tables = ["r_1", "r_2", "r_3", "r_4"];
    for t in tables {
        tenant(&db, t).await;
    }
    let (groups, per_group) = (10, 40);
    // Each table's events come in two waves, the second written after the first kill, so
    // that the second kill finds rows still to send however fast the first wave drains.
    let mut first_wave = 0;
    let mut second_waves = Vec::new();
    for t in tables {
        let mut written = tenant_events(t, groups * per_group, groups);
        let second = written.split_off(written.len() / 2);
        first_wave += written.len();
        write(&db, t, &written).await;
        second_waves.push((t, second));
    }
    let total = first_wave + second_waves.iter().map(|(_, w)| w.len()).sum::<usize>();
    let queue = create_queue("many-order.fifo", &[]).await;
    let proxy = crate::support::FaultProxy::start(sqs().endpoint());
    // Two batches reach SQS and their answers are lost: resent, deduplicated by event_id.
    proxy.fault_next(crate::support::Mode::DropResponse, 2);
    let replica = |name: String| {
        let mut a = crate::scenario::relay_args_for(&db, &queue, proxy.endpoint(), &name);
        a.extend(
            ["--tables", "r_*.outbox", "--batch-size", "20"]
                .iter()
                .map(|s| s.to_string()),
        );
        RelayProcess::spawn_named(&name, &a, &[])
    };
    let mut relays: Vec<RelayProcess> = (0..3).map(|i| replica(format!("m{i}"))).collect();
    let mut kills = 0;
    let started = std::time::Instant::now();
    loop {
        let mut sent = 0;
        for t in tables {
            sent += count_in(&db, t, "sent_at IS NOT NULL").await;
        }
        if sent == total as i64 && kills == 2 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "not drained in time: {sent} of {total}"
        );
        // The first kill once the first wave flows, the second once the second wave does.
        let due = match kills {
            0 => sent > 0,
            1 => sent > first_wave as i64,
            _ => false,
        };
        if due {
            let victim = kills % relays.len();
            relays[victim].kill9();
            kills += 1;
            relays[victim] = replica(format!("m{victim}-{kills}"));
            if kills == 1 {
                for (t, wave) in &second_waves {
                    write(&db, t, wave).await;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(relays);
    let received = receive_all(&queue, total, Duration::from_secs(60)).await;
    let by_id = crate::scenario::copies(&received);
    let (violations, by_group) =
        crate::fifo::order_violations(&received, &ids_by_event(&db, &tables).await);
    assert_eq!(by_id.len(), total, "every event of every table arrives");
    assert_eq!(
        by_id.values().filter(|&&c| c > 1).count(),
        0,
        "FIFO drops every resend"
    );
    assert_eq!(by_group.len(), groups * tables.len());
    assert_eq!(violations, 0, "each group's order is kept");
    assert_eq!(kills, 2);
    assert_eq!(proxy.faulted(), 2, "two acknowledgements were lost");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_tables_through_transaction_pooling_leave_nothing_on_the_applications_connections()
{
    use crate::support::{PgBouncer, PoolMode, Pooling};
    let db = crate::support::fresh_db().await;
    let tables = ["p_1", "p_2", "p_3"];
    for t in tables {
        tenant(&db, t).await;
    }
    let bouncer = PgBouncer::start(
        crate::support::pg().port(),
        crate::support::pg().password(),
        Pooling {
            mode: PoolMode::Transaction,
            size: 2,
            reset: false,
        },
    )
    .await;
    let pooled = TestDb {
        name: db.name.clone(),
        url: bouncer.url_for(&db.name),
    };
    let queue = create_queue("many-pooled", &[]).await;
    let relays: Vec<RelayProcess> = ["pa", "pb"]
        .iter()
        .map(|id| {
            RelayProcess::spawn_named(
                id,
                &run_args(
                    &pooled,
                    &queue,
                    sqs().endpoint(),
                    &["--relay-id", id, "--tables", "p_*.outbox"],
                ),
                &[],
            )
        })
        .collect();
    // The application's own session through the same pool: what it reads must be the
    // server's defaults in every sample, whatever the relays' transactions set.
    let app = bouncer.client(&db.name).await;
    let mut expected = HashSet::new();
    for round in 0..5 {
        for t in tables {
            let batch = tenant_events(&format!("{t}-{round}"), 20, 4);
            expected.extend(ids(&batch));
            write(&db, t, &batch).await;
        }
        let settings = app
            .simple_query(
                "SHOW synchronous_commit; SHOW lock_timeout; SHOW statement_timeout; \
                 SHOW default_transaction_isolation; SELECT count(*) FROM pg_prepared_statements",
            )
            .await
            .unwrap()
            .into_iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_string),
                _ => None,
            })
            .collect::<Vec<_>>();
        assert_eq!(settings, ["on", "0", "0", "read committed", "0"]);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let got = receive_all(&queue, expected.len(), Duration::from_secs(90)).await;
    let got_ids: HashSet<String> = got
        .iter()
        .map(|m| {
            crate::scenario::attr(m, "event_id")
                .unwrap_or("")
                .to_string()
        })
        .collect();
    assert_eq!(got_ids, expected);
    for t in tables {
        wait_in(&db, t, "sent_at IS NOT NULL", 100, Duration::from_secs(30)).await;
    }
    drop(relays);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_tables_flow_under_a_roles_serializable_read_only_short_timeouts_and_empty_search_path(
) {
    let db = crate::support::fresh_db().await;
    let tables = ["s_1", "s_2"];
    for t in tables {
        tenant(&db, t).await;
    }
    // The test's writers connect first and keep what they had; the relay connects after.
    let writers: Vec<tokio_postgres::Client> = {
        let mut w = Vec::new();
        for t in tables {
            w.push(tenant_client(&db, t).await);
        }
        w
    };
    for setting in [
        "default_transaction_isolation = 'serializable'",
        "statement_timeout = '50ms'",
        "lock_timeout = '10ms'",
        "idle_in_transaction_session_timeout = '100ms'",
        "search_path = nowhere",
        // Last: the sessions that impose the others would be read-only after it.
        "default_transaction_read_only = on",
    ] {
        crate::settings::impose(&db, setting).await;
    }
    let queue = create_queue("many-settings", &[]).await;
    let relay = RelayProcess::spawn(
        &many_args(
            &db,
            &queue,
            &["--tables", "s_*.outbox", "--retention", "1h"],
        ),
        &[],
    );
    let mut expected = HashSet::new();
    for (t, client) in tables.iter().zip(&writers) {
        let batch = tenant_events(t, 30, 3);
        expected.extend(ids(&batch));
        crate::scenario::insert(client, &batch, Duration::ZERO).await;
    }
    let got = receive_all(&queue, expected.len(), Duration::from_secs(60)).await;
    let by_id = crate::scenario::copies(&got);
    assert_eq!(
        by_id.keys().cloned().collect::<HashSet<_>>(),
        expected,
        "{}",
        relay.output()
    );
    assert!(by_id.values().all(|&c| c == 1), "each row once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_the_relays_role_may_not_read_is_skipped_and_served_once_granted() {
    let db = crate::support::fresh_db().await;
    for t in ["u_1", "u_2", "u_3"] {
        tenant(&db, t).await;
    }
    let n = crate::support::unique();
    let (relay_role, app_role) = (
        format!("mrelay_{n}_{}", std::process::id()),
        format!("mapp_{n}_{}", std::process::id()),
    );
    let password = crate::support::random_hex(12);
    // sql/roles.sql grants the relay's role what it needs on one table: u_1 and u_2, not u_3.
    let grant = |schema: &'static str| {
        crate::ops_check::apply_roles(
            &db,
            &[
                ("relay_role", &relay_role),
                ("app_role", &app_role),
                ("schema", schema),
            ],
            &[
                ("OUTBOX_RELAY_PASSWORD", &password),
                ("OUTBOX_APP_PASSWORD", &password),
            ],
        )
    };
    for schema in ["u_1", "u_2"] {
        let out = grant(schema);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let as_relay = TestDb {
        name: db.name.clone(),
        url: crate::ops_check::url_as(&db, &relay_role, &password),
    };
    let queue = create_queue("many-grants", &[]).await;
    let relay = RelayProcess::spawn(
        &many_args(&as_relay, &queue, &["--tables", "u_*.outbox"]),
        &[],
    );
    for t in ["u_1", "u_2", "u_3"] {
        write(&db, t, &tenant_events(t, 5, 1)).await;
    }
    wait_in(
        &db,
        "u_1",
        "sent_at IS NOT NULL",
        5,
        Duration::from_secs(30),
    )
    .await;
    wait_in(
        &db,
        "u_2",
        "sent_at IS NOT NULL",
        5,
        Duration::from_secs(30),
    )
    .await;
    wait_until(
        "the table without grants is skipped",
        Duration::from_secs(30),
        || async {
            relay.output().lines().any(|l| {
                l.contains("table skipped")
                    && l.contains("u_3.outbox")
                    && l.contains("permission denied")
            })
        },
    )
    .await;
    assert_eq!(count_in(&db, "u_3", "sent_at IS NOT NULL").await, 0);
    // Granted: served again without a restart.
    let out = grant("u_3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_in(
        &db,
        "u_3",
        "sent_at IS NOT NULL",
        5,
        Duration::from_secs(60),
    )
    .await;
    assert!(
        relay
            .wait_for_line("table served again", Duration::from_secs(10))
            .await
            .is_some(),
        "{}",
        relay.output()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_of_a_table_other_than_the_first_is_sent_again_by_the_relay_serving_both() {
    let db = crate::support::fresh_db().await;
    for t in ["rp_a", "rp_b"] {
        tenant(&db, t).await;
    }
    let queue = create_queue("many-replay", &[]).await;
    let _relay = RelayProcess::spawn(&many_args(&db, &queue, &["--tables", "rp_*.outbox"]), &[]);
    write(&db, "rp_a", &tenant_events("rp_a", 3, 1)).await;
    write(&db, "rp_b", &tenant_events("rp_b", 3, 1)).await;
    assert_eq!(
        receive_all(&queue, 6, Duration::from_secs(60)).await.len(),
        6
    );
    wait_in(
        &db,
        "rp_b",
        "sent_at IS NOT NULL",
        3,
        Duration::from_secs(30),
    )
    .await;
    let done = relay_command(&[
        "replay",
        "--database-url",
        &db.url,
        "--table",
        "rp_b.outbox",
        "--event-id",
        "rp_b-1",
    ])
    .await;
    assert!(done.contains("replayed 1 sent row(s)"), "{done}");
    let again = receive_all(&queue, 1, Duration::from_secs(60)).await;
    assert_eq!(
        again
            .iter()
            .map(|m| crate::scenario::attr(m, "event_id").unwrap_or(""))
            .collect::<Vec<_>>(),
        ["rp_b-1"],
        "the replayed event, with its event_id, and nothing of the other table"
    );
}

/// Settlements that change nothing on one table (a BEFORE UPDATE trigger that keeps its rows,
/// under the tests' --retention) stop claims on that table only: it is named, its gauge says
/// so, it is skipped, its rows wait unsent, and the other table keeps flowing
/// (docs/operations.md, "Triggers and rules").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_whose_settlements_change_nothing_is_skipped_while_the_others_flow() {
    let db = crate::support::fresh_db().await;
    for t in ["k_1", "k_2"] {
        tenant(&db, t).await;
    }
    db.client()
        .await
        .batch_execute(
            "CREATE FUNCTION k_2.keep_rows() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$; \
             CREATE TRIGGER keep_rows BEFORE UPDATE ON k_2.outbox FOR EACH ROW EXECUTE FUNCTION k_2.keep_rows()",
        )
        .await
        .unwrap();
    let queue = create_queue("many-undone", &[]).await;
    let relay = RelayProcess::spawn(&many_args(&db, &queue, &["--tables", "k_*.outbox"]), &[]);
    let kept = tenant_events("k_2", 10, 2);
    write(&db, "k_2", &kept).await;
    write(&db, "k_1", &tenant_events("k_1", 10, 2)).await;
    wait_until(
        "the table whose settlements change nothing is named",
        Duration::from_secs(30),
        || async {
            relay.output().lines().any(|l| {
                l.contains("settlements on") && l.contains("k_2") && l.contains("keep_rows")
            })
        },
    )
    .await;
    assert_eq!(
        relay
            .metric("outbox_table_blocked{table=\"k_2.outbox\"}")
            .await,
        Some(1.0)
    );
    // The other table flows, also with rows written after the stop.
    write(&db, "k_1", &tenant_events("k_1-later", 10, 2)).await;
    wait_in(
        &db,
        "k_1",
        "sent_at IS NOT NULL",
        20,
        Duration::from_secs(30),
    )
    .await;
    wait_until(
        "the blocked table is skipped",
        Duration::from_secs(30),
        || async {
            relay
                .metric("outbox_table_skipped{table=\"k_2.outbox\"}")
                .await
                == Some(1.0)
        },
    )
    .await;
    assert_eq!(count_in(&db, "k_2", "sent_at IS NULL").await, 10);
    let received = receive_all(&queue, 20, Duration::from_secs(10)).await;
    let kept = ids(&kept);
    let over: Vec<_> = crate::scenario::copies(&received)
        .into_iter()
        .filter(|(id, n)| kept.contains(id) && *n > 2)
        .collect();
    assert!(over.is_empty(), "events sent more than twice: {over:?}");
}
