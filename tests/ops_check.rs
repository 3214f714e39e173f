//! `outbox-relay check`: one `FAIL` line naming each problem and its fix, exit 0 only when all
//! pass; and sql/roles.sql gives the relay and the application exactly what they need.

use std::time::Duration;

use tokio_postgres::error::SqlState;

use crate::scenario::{args, events, insert, migrated_db, run_args, wait_count};
use crate::support::{
    create_queue, pg, receive_all, run_to_end, sqs, unique, RelayProcess, TestDb,
    TEST_SECRET_ACCESS_KEY,
};

/// The verdict lines of `check`'s output (log lines and anything else left out).
fn verdicts(output: &str) -> Vec<&str> {
    output
        .lines()
        .filter(|l| l.starts_with("ok   ") || l.starts_with("FAIL "))
        .collect()
}

/// `check` with `extra` flags against `db`, reaching the test SQS server.
async fn check(url: &str, queue_url: &str, extra: &[&str]) -> (Option<i32>, String) {
    let mut a = args(&[
        "check",
        "--database-url",
        url,
        "--queue-url",
        queue_url,
        "--sqs-endpoint-url",
        sqs().endpoint(),
        "--connect-timeout",
        "5s",
    ]);
    a.extend(extra.iter().map(|s| s.to_string()));
    let (status, output) = run_to_end(&a, &[], Duration::from_secs(60)).await;
    assert!(
        !output.contains(pg().password()) && !output.contains(TEST_SECRET_ACCESS_KEY),
        "a secret leaked:\n{output}"
    );
    (status.code(), output)
}

/// Exit 1 with exactly one FAIL line, which contains every needle; everything else ok.
fn assert_fails_once(code: Option<i32>, output: &str, needles: &[&str]) {
    assert_eq!(code, Some(1), "{output}");
    let lines = verdicts(output);
    let failed: Vec<&&str> = lines.iter().filter(|l| l.starts_with("FAIL ")).collect();
    assert_eq!(failed.len(), 1, "one FAIL line expected:\n{output}");
    for needle in needles {
        assert!(
            failed[0].contains(needle),
            "{:?} should say {needle:?}",
            failed[0]
        );
    }
    assert!(lines.len() > 1, "the other checks still ran:\n{output}");
}

/// A queue whose MaximumMessageSize equals the `--max-request-bytes` the tests pass.
const SIZE: &str = "262144";

pub(crate) use crate::support::roles::apply_roles;

/// `db.url` for another role.
pub(crate) fn url_as(db: &TestDb, role: &str, password: &str) -> String {
    format!(
        "postgres://{role}:{password}@127.0.0.1:{}/{}",
        pg().port(),
        db.name
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_passes_for_the_roles_sql_relay_role_which_can_relay_what_the_app_role_inserts() {
    let db = migrated_db().await;
    let n = unique();
    let (relay_role, app_role) = (
        format!("relay_{n}_{}", std::process::id()),
        format!("app_{n}_{}", std::process::id()),
    );
    let (relay_pw, app_pw) = (
        crate::support::random_hex(12),
        crate::support::random_hex(12),
    );
    let out = apply_roles(
        &db,
        &[("relay_role", &relay_role), ("app_role", &app_role)],
        &[
            ("OUTBOX_RELAY_PASSWORD", &relay_pw),
            ("OUTBOX_APP_PASSWORD", &app_pw),
        ],
    );
    assert!(
        out.status.success(),
        "roles.sql: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Idempotent: a second run (passwords kept) changes nothing and does not fail.
    let out = apply_roles(
        &db,
        &[("relay_role", &relay_role), ("app_role", &app_role)],
        &[],
    );
    assert!(
        out.status.success(),
        "roles.sql again: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let queue = create_queue("check-ok", &[("MaximumMessageSize", SIZE)]).await;
    let fifo = create_queue("check-ok.fifo", &[("MaximumMessageSize", SIZE)]).await;
    let relay_url = url_as(&db, &relay_role, &relay_pw);
    let route = format!("invoice={fifo}");
    let (code, output) = check(
        &relay_url,
        &queue,
        &["--max-request-bytes", SIZE, "--route", &route],
    )
    .await;
    assert_eq!(code, Some(0), "{output}");
    let lines = verdicts(&output);
    // configuration, reachable, connections (--pooler), exists, columns, privileges,
    // triggers and rules, statements, wake-up; the settings a role can impose; 3 per queue.
    assert_eq!(lines.len(), 9 + 13 + 3 * 2, "{output}");
    assert!(lines.iter().all(|l| l.starts_with("ok   ")), "{output}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains(&format!("role {relay_role} has the privileges"))),
        "{output}"
    );
    assert!(
        !output.contains("never uses"),
        "roles.sql grants nothing more than needed:\n{output}"
    );
    assert!(!output.contains(&relay_pw) && !output.contains(&app_pw));

    // The application's role writes; the relay's role delivers; neither can do the other's job.
    let app = connect(&url_as(&db, &app_role, &app_pw)).await;
    insert(&app, &events("roles", 3, 2), Duration::ZERO).await;
    let err = app
        .execute("UPDATE outbox SET attempts = 0", &[])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE));
    let err = app
        .query("SELECT event_id FROM outbox", &[])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE));
    let relay_client = connect(&relay_url).await;
    let err = relay_client
        .execute(
            "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload) \
             VALUES ('x', 'a', '1', 't', '{}')",
            &[],
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE));

    let relay = RelayProcess::spawn(
        &run_args(
            &TestDb {
                name: db.name.clone(),
                url: relay_url.clone(),
            },
            &queue,
            sqs().endpoint(),
            &[
                "--max-request-bytes",
                SIZE,
                "--retention",
                "1s",
                "--retention-interval",
                "200ms",
            ],
        ),
        &[],
    );
    let received = receive_all(&queue, 3, Duration::from_secs(30)).await;
    assert_eq!(received.len(), 3, "{}", relay.output());
    // Retention deletes as the relay role too.
    let admin = db.client().await;
    crate::support::wait_until(
        "retention deleted the sent rows",
        Duration::from_secs(20),
        || async { crate::scenario::count(&admin, "true").await == 0 },
    )
    .await;
    relay.sigterm();
    relay
        .wait_exit(Duration::from_secs(20))
        .await
        .expect("relay stops");
    assert!(!relay.output().contains("ERROR"), "{}", relay.output());
}

async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    tokio::spawn(connection);
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_fails_on_a_missing_table() {
    let db = migrated_db().await;
    let queue = create_queue("check-table", &[("MaximumMessageSize", SIZE)]).await;
    let (code, output) = check(
        &db.url,
        &queue,
        &["--max-request-bytes", SIZE, "--table", "app.orders_outbox"],
    )
    .await;
    assert_fails_once(
        code,
        &output,
        &[
            "FAIL table \"app\".\"orders_outbox\" exists:",
            "run `outbox-relay migrate` with the same --table, or fix --table",
        ],
    );
    // The queue was still checked.
    assert!(
        output.contains(&format!("ok   queue {queue} reachable")),
        "{output}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_fails_on_a_role_without_update() {
    let db = migrated_db().await;
    let role = format!("readonly_{}_{}", unique(), std::process::id());
    let password = crate::support::random_hex(12);
    let admin = db.client().await;
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN PASSWORD '{password}'; GRANT SELECT ON outbox TO {role};"
        ))
        .await
        .unwrap();
    let queue = create_queue("check-priv", &[("MaximumMessageSize", SIZE)]).await;
    let (code, output) = check(
        &url_as(&db, &role, &password),
        &queue,
        &["--max-request-bytes", SIZE],
    )
    .await;
    assert_fails_once(
        code,
        &output,
        &[
            &format!("FAIL role {role} has the privileges the relay needs on \"outbox\":"),
            "missing UPDATE on available_at, attempts, sent_at",
            &format!("GRANT UPDATE, DELETE ON \"outbox\" TO \"{role}\";"),
            &format!("GRANT SELECT, INSERT, DELETE ON \"outbox_claims\" TO \"{role}\";"),
        ],
    );
    assert!(!output.contains(&password), "{output}");

    // What an older sql/roles.sql granted: all the relay needs on the table, nothing on the
    // lease table of schema version 2 nor on the registry and version table of version 4. The
    // one line names only their GRANTs.
    admin
        .batch_execute(&format!("GRANT UPDATE, DELETE ON outbox TO {role};"))
        .await
        .unwrap();
    let (code, output) = check(
        &url_as(&db, &role, &password),
        &queue,
        &["--max-request-bytes", SIZE],
    )
    .await;
    assert_fails_once(
        code,
        &output,
        &[
            &format!("FAIL role {role} has the privileges the relay needs on \"outbox\":"),
            "missing SELECT, INSERT, DELETE on the lease table \"outbox_claims\"",
            "SELECT, INSERT, UPDATE, DELETE on the relay registry \"outbox_relays\"",
            "SELECT on the schema version table \"outbox_relay_schema\"",
            &format!("GRANT SELECT, INSERT, DELETE ON \"outbox_claims\" TO \"{role}\";"),
            &format!("GRANT SELECT, INSERT, UPDATE, DELETE ON \"outbox_relays\" TO \"{role}\";"),
            &format!("GRANT SELECT ON \"outbox_relay_schema\" TO \"{role}\";"),
        ],
    );
    assert!(!output.contains("ON \"outbox\" TO"), "{output}");

    // Those GRANTs are all it takes.
    admin
        .batch_execute(&format!(
            "GRANT SELECT, INSERT, DELETE ON outbox_claims TO {role};
             GRANT SELECT, INSERT, UPDATE, DELETE ON outbox_relays TO {role};
             GRANT SELECT ON outbox_relay_schema TO {role};"
        ))
        .await
        .unwrap();
    let (code, output) = check(
        &url_as(&db, &role, &password),
        &queue,
        &["--max-request-bytes", SIZE],
    )
    .await;
    assert_eq!(code, Some(0), "{output}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_fails_on_a_missing_queue() {
    let db = migrated_db().await;
    let missing = format!(
        "{}/000000000000/never-created-{}",
        sqs().endpoint(),
        unique()
    );
    let (code, output) = check(&db.url, &missing, &["--max-request-bytes", SIZE]).await;
    assert_fails_once(
        code,
        &output,
        &[
            &format!("FAIL queue {missing} reachable:"),
            "the queue does not exist: create it, or fix --queue-url",
        ],
    );
    // Nothing more is asked of a queue that is not there.
    assert!(!output.contains("FIFO settings"), "{output}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_fails_on_a_queue_that_takes_smaller_messages_than_we_send() {
    let db = migrated_db().await;
    let small = create_queue("check-small", &[("MaximumMessageSize", "1024")]).await;
    let (code, output) = check(&db.url, &small, &[]).await;
    assert_fails_once(
        code,
        &output,
        &[
            &format!("FAIL queue {small} accepts messages of --max-request-bytes:"),
            "MaximumMessageSize is 1024 bytes, below --max-request-bytes 1048576",
            "set --max-request-bytes 1024",
        ],
    );
    // A route is checked the same way as the default queue.
    let fine = create_queue("check-fine", &[("MaximumMessageSize", SIZE)]).await;
    let route = format!("invoice={small}");
    let (code, output) = check(
        &db.url,
        &fine,
        &["--max-request-bytes", SIZE, "--route", &route],
    )
    .await;
    assert_fails_once(code, &output, &[&format!("FAIL queue {small} accepts")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_and_status_read_an_adopted_table_through_its_view() {
    let db = crate::support::fresh_db().await;
    let client = db.client().await;
    client
        .batch_execute(
            &format!(
                "{};
                 INSERT INTO outboxevent VALUES (gen_random_uuid(), 'order', '1', 'OrderCreated', '{{}}')",
                crate::support::DEBEZIUM_OUTBOX_DDL
            ),
        )
        .await
        .unwrap();
    let columns: Vec<&str> = ["--table", "outboxevent"]
        .into_iter()
        .chain(crate::support::DEBEZIUM_COLUMNS)
        .collect();
    let queue = create_queue("check-adopted", &[("MaximumMessageSize", SIZE)]).await;
    let mut flags = vec!["--max-request-bytes", SIZE];
    flags.extend(&columns);

    // Not adopted yet: the view is missing, and the fix says how to make it.
    let (code, output) = check(&db.url, &queue, &flags).await;
    assert_fails_once(
        code,
        &output,
        &["FAIL table \"outboxevent_relay\" exists: run `outbox-relay migrate --adopt`"],
    );

    let mut migrate = args(&["migrate", "--adopt", "--database-url", &db.url]);
    migrate.extend(columns.iter().map(|s| s.to_string()));
    let (status, output) = run_to_end(&migrate, &[], Duration::from_secs(30)).await;
    assert!(status.success(), "{output}");

    let (code, output) = check(&db.url, &queue, &flags).await;
    assert_eq!(code, Some(0), "{output}");
    assert!(
        verdicts(&output).iter().all(|l| l.starts_with("ok   ")),
        "{output}"
    );

    let mut status_args = args(&["status", "--json", "--database-url", &db.url]);
    status_args.extend(columns.iter().map(|s| s.to_string()));
    let (status, output) = run_to_end(&status_args, &[], Duration::from_secs(30)).await;
    assert!(status.success(), "{output}");
    assert!(output.contains("\"unsent\":1"), "{output}");
    assert!(
        output.contains("\"table\":\"\\\"outboxevent_relay\\\"\""),
        "{output}"
    );
}

/// The relay's and the application's roles from sql/roles.sql, named with `prefix` and unique
/// to this test: (relay role, application role, the relay role's password).
async fn rls_roles(db: &TestDb, prefix: &str) -> (String, String, String) {
    let n = unique();
    let relay_role = format!("{prefix}_relay_{n}_{}", std::process::id());
    let app_role = format!("{prefix}_app_{n}_{}", std::process::id());
    let relay_pw = crate::support::roles::make_roles(db, &relay_role, &app_role);
    (relay_role, app_role, relay_pw)
}

/// Row-level security on the outbox (a tenant policy, as multi-tenant applications turn on for
/// every table) hid every row from the relay's role: 0 sent, `check` exit 0, an oldest-unsent
/// age of 0. Now `check` and `run` refuse in one line naming the policy and the fix, and
/// sql/roles.sql, run again, gives the relay the policy it needs; then the rows flow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_level_security_that_hides_rows_is_refused_and_roles_sql_gives_the_relay_its_policy() {
    let db = migrated_db().await;
    let (relay_role, app_role, relay_pw) = rls_roles(&db, "rls").await;
    let vars = [
        ("relay_role", relay_role.as_str()),
        ("app_role", app_role.as_str()),
    ];
    let admin = db.client().await;
    admin
        .batch_execute(
            "ALTER TABLE outbox ENABLE ROW LEVEL SECURITY; \
             CREATE POLICY tenant_isolation ON outbox \
                 USING (aggregate_type = current_setting('app.tenant', true))",
        )
        .await
        .unwrap();
    insert(&admin, &events("rls", 5, 1), Duration::ZERO).await;
    let relay_url = url_as(&db, &relay_role, &relay_pw);
    let queue = create_queue("rls", &[("MaximumMessageSize", SIZE)]).await;

    let (code, output) = check(&relay_url, &queue, &["--max-request-bytes", SIZE]).await;
    assert_ne!(code, Some(0), "{output}");
    assert!(
        output.contains("row-level security") && output.contains("tenant_isolation"),
        "{output}"
    );
    let relay_db = TestDb {
        name: db.name.clone(),
        url: relay_url.clone(),
    };
    let run = run_args(
        &relay_db,
        &queue,
        sqs().endpoint(),
        &["--max-request-bytes", SIZE],
    );
    let (status, output) = run_to_end(&run, &[], Duration::from_secs(30)).await;
    assert_eq!(status.code(), Some(1), "{output}");
    crate::startup::assert_one_clear_line(&output, "CREATE POLICY outbox_relay");
    // `status` as the relay's role sees none of the 5 rows, and says that its numbers leave
    // rows out rather than reading as an empty backlog.
    let hidden = |output: &str| -> serde_json::Value {
        let json = output.lines().find(|l| l.starts_with('{')).unwrap_or("");
        serde_json::from_str::<serde_json::Value>(json)
            .unwrap_or_else(|e| panic!("status --json is not JSON ({e}): {output}"))["hidden"]
            .clone()
    };
    let status_as_relay = ["status", "--json", "--database-url", &relay_url];
    let output = crate::scenario::relay_command(&status_as_relay).await;
    let said = hidden(&output);
    assert!(
        said.as_str()
            .is_some_and(|h| h.contains("row-level security") && h.contains("tenant_isolation")),
        "{output}"
    );

    // sql/roles.sql again: the relay's policy, and nothing else changes.
    let out = apply_roles(&db, &vars, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (code, output) = check(&relay_url, &queue, &["--max-request-bytes", SIZE]).await;
    assert_eq!(code, Some(0), "{output}");
    let output = crate::scenario::relay_command(&status_as_relay).await;
    assert!(hidden(&output).is_null(), "{output}");
    let relay = RelayProcess::spawn(&run, &[]);
    let received = receive_all(&queue, 5, Duration::from_secs(30)).await;
    assert_eq!(received.len(), 5, "{}", relay.output());
}

/// Row-level security turned on while the relay runs, with a policy that hides the rows from
/// its role: the next statistics pass sees it, claims stop with one ERROR line naming the
/// policy, and `outbox_table_blocked` says so rather than an oldest-unsent age of 0 while rows
/// wait. sql/roles.sql then gives the relay its policy, and claims resume by themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_level_security_turned_on_while_running_stops_claims_until_the_relay_has_its_policy() {
    let db = migrated_db().await;
    let (relay_role, app_role, relay_pw) = rls_roles(&db, "rls_live").await;
    let vars = [
        ("relay_role", relay_role.as_str()),
        ("app_role", app_role.as_str()),
    ];
    let admin = db.client().await;
    let relay_db = TestDb {
        name: db.name.clone(),
        url: url_as(&db, &relay_role, &relay_pw),
    };
    let queue = create_queue("rls-live", &[]).await;
    let relay = RelayProcess::spawn(&run_args(&relay_db, &queue, sqs().endpoint(), &[]), &[]);
    insert(&admin, &events("rls-before", 5, 1), Duration::ZERO).await;
    assert_eq!(
        receive_all(&queue, 5, Duration::from_secs(30)).await.len(),
        5
    );
    // Received is not settled: a settlement that ran after the policy appeared would change
    // nothing, and the five would be sent again once the policy is back (correct at least
    // once, not what this test counts). The policy comes once they are marked sent.
    wait_count(&admin, "sent_at IS NOT NULL", 5, Duration::from_secs(30)).await;

    admin
        .batch_execute(
            "ALTER TABLE outbox ENABLE ROW LEVEL SECURITY; \
             CREATE POLICY tenant_isolation ON outbox \
                 USING (aggregate_type = current_setting('app.tenant', true))",
        )
        .await
        .unwrap();
    insert(&admin, &events("rls-hidden", 5, 1), Duration::ZERO).await;
    let line = relay
        .wait_for_line("claims on it stopped", Duration::from_secs(30))
        .await
        .unwrap_or_else(|| panic!("row-level security not caught:\n{}", relay.output()));
    assert!(
        line.contains("tenant_isolation") && line.contains(&relay_role),
        "{line}"
    );
    assert_eq!(
        relay.metric("outbox_table_blocked{table=\"outbox\"}").await,
        Some(1.0)
    );
    assert_eq!(relay.http_status("/readyz").await, 503);

    // sql/roles.sql again creates the relay's policy: claims resume without a restart.
    let out = apply_roles(&db, &vars, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    relay
        .wait_for_line("no longer hides rows", Duration::from_secs(30))
        .await
        .unwrap_or_else(|| panic!("claims did not resume:\n{}", relay.output()));
    assert_eq!(
        receive_all(&queue, 5, Duration::from_secs(30)).await.len(),
        5
    );
    assert_eq!(
        relay.metric("outbox_table_blocked{table=\"outbox\"}").await,
        Some(0.0)
    );
    // Arrived is not settled either: the ten are marked sent once their settlements commit.
    wait_count(&admin, "sent_at IS NULL", 0, Duration::from_secs(30)).await;
}
