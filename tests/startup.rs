//! Bad configuration: a non-zero exit, one line that says what to fix, and no secret in it.

use std::time::Duration;

use crate::scenario::{args, migrated_db};
use crate::support::{pg, run_to_end, sqs, TEST_SECRET_ACCESS_KEY};

/// Lines the process printed that are not log lines: its verdict.
fn error_lines(output: &str) -> Vec<&str> {
    output.lines().filter(|l| l.starts_with("error:")).collect()
}

/// `run` with `command`'s flags passed validation and waits for its database (which is not
/// there): it says so, and a SIGTERM ends it.
pub async fn waits_for_its_database(command: &[String], env: &[(String, String)]) {
    let mut command = command.to_vec();
    command.extend(args(&["--metrics-addr", "127.0.0.1:0"]));
    let relay = crate::support::RelayProcess::spawn(&command, env);
    let line = relay
        .wait_for_line("waiting for the database", Duration::from_secs(20))
        .await;
    assert!(
        line.is_some_and(|l| l.contains("cannot connect to PostgreSQL")),
        "{command:?}: {}",
        relay.output()
    );
    relay.sigterm();
    let status = relay
        .wait_exit(Duration::from_secs(20))
        .await
        .unwrap_or_else(|| panic!("{command:?}: no exit on SIGTERM:\n{}", relay.output()));
    // Stopped before it ever had its database: exit 1, with the reason as its one error line.
    assert_eq!(status.code(), Some(1), "{command:?}: {}", relay.output());
    assert_one_clear_line(&relay.output(), "cannot connect to PostgreSQL");
}

pub fn assert_one_clear_line(output: &str, needle: &str) {
    let errors = error_lines(output);
    assert_eq!(errors.len(), 1, "one error line expected:\n{output}");
    assert!(
        errors[0].contains(needle),
        "{:?} should mention {needle:?}",
        errors[0]
    );
    assert!(
        !output.contains(pg().password()),
        "the database password leaked:\n{output}"
    );
    assert!(
        !output.contains(TEST_SECRET_ACCESS_KEY),
        "the AWS secret leaked:\n{output}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_queue_url_is_a_usage_error_with_one_line() {
    let db = migrated_db().await;
    let (status, output) = run_to_end(
        &args(&[
            "run",
            "--database-url",
            &db.url,
            "--metrics-addr",
            "127.0.0.1:0",
        ]),
        &[],
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(status.code(), Some(2), "{output}");
    assert_one_clear_line(&output, "--queue-url (or OUTBOX_QUEUE_URL) is required");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_shorter_than_a_send_is_refused_before_touching_data() {
    let db = migrated_db().await;
    let (status, output) = run_to_end(
        &args(&[
            "run",
            "--database-url",
            &db.url,
            "--queue-url",
            "http://127.0.0.1:1/000000000000/q",
            "--lease",
            "5s",
            "--send-timeout",
            "10s",
        ]),
        &[],
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(status.code(), Some(2), "{output}");
    assert_one_clear_line(
        &output,
        "--lease (5s) must be longer than --send-timeout (10s)",
    );
}

/// `run` waits for a database that does not answer yet: one line per try, `/readyz` says why,
/// `/healthz` stays alive, no password anywhere; a SIGTERM ends the wait. A one-shot command
/// (`migrate`) still fails at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_database_is_waited_for_by_run_and_fails_a_one_shot_command() {
    // A server that accepts connections and never answers: only the relay's own timeout ends
    // each try.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let url = format!(
        "postgres://postgres:{}@127.0.0.1:{port}/app",
        pg().password()
    );
    let relay = crate::support::RelayProcess::spawn(
        &args(&[
            "run",
            "--database-url",
            &url,
            "--queue-url",
            "http://127.0.0.1:1/000000000000/q",
            "--connect-timeout",
            "1s",
            "--metrics-addr",
            "127.0.0.1:0",
        ]),
        &[],
    );
    relay.metrics_addr(Duration::from_secs(30)).await;
    crate::support::wait_until("two tries, one line each", Duration::from_secs(30), || {
        let tries = relay
            .output()
            .lines()
            .filter(|l| l.contains("waiting for the database") && l.contains("no answer within 1s"))
            .count();
        async move { tries >= 2 }
    })
    .await;
    let (ready, why) = relay.http_get("/readyz").await;
    assert_eq!(ready, 503, "{why}");
    assert!(why.contains("waiting for the database"), "{why}");
    assert_eq!(relay.http_status("/healthz").await, 200);
    assert!(relay.wait_exit(Duration::from_millis(100)).await.is_none());
    relay.sigterm();
    let status = relay
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("a SIGTERM ends the wait");
    assert_eq!(status.code(), Some(1), "{}", relay.output());
    assert!(!relay.output().contains(pg().password()));
    drop(silent);

    // Nobody listening at all: a one-shot command is refused at once.
    let closed = crate::support::pg::free_port();
    let url = format!(
        "postgres://postgres:{}@127.0.0.1:{closed}/app",
        pg().password()
    );
    let (status, output) = run_to_end(
        &args(&["migrate", "--database-url", &url]),
        &[],
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(status.code(), Some(1), "{output}");
    assert_one_clear_line(&output, "cannot connect to PostgreSQL at 127.0.0.1");
}

/// A relay started while its database is down comes up by itself once the database does, and
/// delivers: no exit, so no restart loop whose back-off outlasts the database's return.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_started_before_its_database_delivers_once_it_is_up() {
    started_before_its_database(&[]).await;
}

/// The same for a relay serving several tables, whose first look (discovery) is its first
/// connection: before this, it exited at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_for_several_tables_started_before_its_database_delivers_once_it_is_up() {
    started_before_its_database(&["--tables", "public.outbox"]).await;
}

async fn started_before_its_database(extra: &[&str]) {
    let private = crate::support::pg::PrivatePg::start().await;
    let db = private.create_db().await;
    crate::scenario::migrate(&db, "outbox").await;
    private.stop_fast().await;
    let queue = crate::support::create_queue("before-db", &[]).await;
    let relay = crate::support::RelayProcess::spawn(
        &crate::scenario::run_args(&db, &queue, sqs().endpoint(), extra),
        &[],
    );
    relay
        .wait_for_line("waiting for the database", Duration::from_secs(30))
        .await
        .unwrap_or_else(|| panic!("no waiting line:\n{}", relay.output()));
    assert_eq!(relay.http_status("/readyz").await, 503);
    private.start_again().await;
    let client = db.client().await;
    crate::scenario::insert(
        &client,
        &crate::scenario::events("late-db", 5, 1),
        Duration::ZERO,
    )
    .await;
    crate::scenario::wait_count(&client, "sent_at IS NOT NULL", 5, Duration::from_secs(30)).await;
    assert!(relay.wait_exit(Duration::from_millis(100)).await.is_none());
}

/// What no retry fixes still ends `run` at once: a database that does not exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_database_ends_run_at_once() {
    let url = format!(
        "postgres://postgres:{}@127.0.0.1:{}/no_such_database_here",
        pg().password(),
        pg().port()
    );
    let (status, output) = run_to_end(
        &args(&[
            "run",
            "--database-url",
            &url,
            "--queue-url",
            "http://127.0.0.1:1/000000000000/q",
            "--metrics-addr",
            "127.0.0.1:0",
        ]),
        &[],
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(status.code(), Some(1), "{output}");
    assert_one_clear_line(&output, "does not exist");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_table_says_to_run_migrate() {
    let db = crate::support::fresh_db().await;
    let (status, output) = run_to_end(
        &args(&[
            "run",
            "--database-url",
            &db.url,
            "--queue-url",
            "http://127.0.0.1:1/000000000000/q",
            "--table",
            "app.orders_outbox",
            "--metrics-addr",
            "127.0.0.1:0",
            "--sqs-endpoint-url",
            sqs().endpoint(),
        ]),
        &[],
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(status.code(), Some(1), "{output}");
    assert_one_clear_line(
        &output,
        "table \"app\".\"orders_outbox\" does not exist: run `outbox-relay migrate`",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_reported_without_echoing_it() {
    let db = migrated_db().await;
    let wrong = db
        .url
        .replace(pg().password(), "definitely-not-the-password-42");
    let (status, output) = run_to_end(
        &args(&["migrate", "--database-url", &wrong]),
        &[],
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(status.code(), Some(1), "{output}");
    assert_one_clear_line(&output, "password authentication failed");
    assert!(!output.contains("definitely-not-the-password-42"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_is_idempotent_and_quotes_odd_table_names() {
    let db = crate::support::fresh_db().await;
    // A schema with a quote in its name and a table with a dot in its name.
    let table = "\"we\"\"ird\".\"my.outbox\"";
    let current = outbox_relay::version::NEEDS_SCHEMA;
    for expected in [
        format!("from schema version 0 to {current}"),
        format!("is up to date (schema version {current})"),
    ] {
        let (status, output) = run_to_end(
            &args(&["migrate", "--database-url", &db.url, "--table", table]),
            &[],
            Duration::from_secs(20),
        )
        .await;
        assert!(status.success(), "{output}");
        assert!(output.contains(&expected), "{output}");
    }
    let client = db.client().await;
    let row = client
        .query_one(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = 'we\"ird' AND c.relname = 'my.outbox'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        row.get::<_, i64>(0),
        1,
        "the table exists under its exact name"
    );
    let version: i32 = client
        .query_one(
            "SELECT version FROM \"we\"\"ird\".outbox_relay_schema WHERE table_name = 'my.outbox'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(version, current);
    // The lease table beside it, under its exact name too.
    let leases: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = 'we\"ird' AND c.relname = 'my.outbox_claims'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(leases, 1, "the lease table exists beside it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigterm_during_start_up_is_handled_not_fatal() {
    // The relay is still connecting (to a server that never answers) when SIGTERM arrives: the
    // signal must reach the relay's handler, so it ends on its own terms (here: the connect
    // timeout, exit 1) instead of being killed by the signal's default action.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    silent.set_nonblocking(true).unwrap();
    let port = silent.local_addr().unwrap().port();
    let url = format!(
        "postgres://postgres:{}@127.0.0.1:{port}/app",
        pg().password()
    );
    let relay = crate::support::RelayProcess::spawn(
        &args(&[
            "run",
            "--database-url",
            &url,
            "--queue-url",
            "http://127.0.0.1:1/000000000000/q",
            "--connect-timeout",
            "3s",
            "--metrics-addr",
            "127.0.0.1:0",
        ]),
        &[],
    );
    let mut held = Vec::new();
    crate::support::wait_until(
        "the relay connecting to the database",
        Duration::from_secs(20),
        || {
            if let Ok((stream, _)) = silent.accept() {
                held.push(stream);
            }
            let connecting = !held.is_empty();
            async move { connecting }
        },
    )
    .await;
    relay.sigterm();
    let status = relay
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("the relay ends after its connect timeout, without trying again");
    assert_eq!(status.code(), Some(1), "{status}: {}", relay.output());
}

/// Boolean variables read as a shell or a manifest writes them: before, `1` was a usage error.
/// The flags' own validation shows which value arrived, before any connection is tried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boolean_environment_variables_take_1_yes_and_on() {
    let base = args(&[
        "run",
        "--database-url",
        "postgres://relay@127.0.0.1:1/app",
        "--queue-url",
        "http://127.0.0.1:1/000000000000/q",
    ]);
    let env = |name: &str, value: &str| vec![(name.to_string(), value.to_string())];
    let with = |extra: &[&str]| [base.clone(), args(extra)].concat();

    let (status, output) = run_to_end(
        &with(&["--retention", "1h"]),
        &env("OUTBOX_DELETE_ON_ACK", "1"),
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(status.code(), Some(2), "{output}");
    assert_one_clear_line(&output, "--delete-on-ack deletes rows when sent");

    let (status, output) = run_to_end(
        &with(&[]),
        &env("OUTBOX_FAIR_GROUP_ID", "yes"),
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(status.code(), Some(2), "{output}");
    assert_one_clear_line(&output, "--fair-group-id sends the --fair-by key");

    // Off: validation passes and the relay goes on to wait for its (unreachable) database.
    for (name, value) in [
        ("OUTBOX_DELETE_ON_ACK", "0"),
        ("OUTBOX_FAIR_GROUP_ID", "off"),
    ] {
        waits_for_its_database(
            &with(&["--retention", "1h", "--connect-timeout", "1s"]),
            &env(name, value),
        )
        .await;
    }
}
