//! Settings a database or a role can impose on the relay's sessions (issue 26, item 2), each
//! alone, each in a database of its own: set with `ALTER ROLE ... IN DATABASE ... SET` (the
//! role the relay logs in as, in that database only) after the table was made and the rows
//! written, or in the URL's `options`. Each either works unchanged (every row arrives exactly
//! once) or `run` refuses in one line naming the setting and the fix.

use std::collections::HashMap;
use std::time::Duration;

use crate::scenario::{args, attr, events, insert, migrated_db, run_args};
use crate::support::{create_queue, receive_all, run_to_end, sqs, RelayProcess, TestDb};

/// Imposes `setting` (`name = value`) on the role the relay uses, in `db` only. Connections
/// opened before keep what they had: the test's own writes are not affected.
pub(crate) async fn impose(db: &TestDb, setting: &str) {
    let admin = db.client().await;
    admin
        .batch_execute(&format!(
            "ALTER ROLE CURRENT_USER IN DATABASE {} SET {setting}",
            db.name
        ))
        .await
        .unwrap_or_else(|e| panic!("ALTER ROLE ... SET {setting}: {e}"));
}

/// `db` with `-c name=value` in the URL's `options`.
fn with_options(db: &TestDb, option: &str) -> TestDb {
    let separator = if db.url.contains('?') { '&' } else { '?' };
    TestDb {
        name: db.name.clone(),
        url: format!(
            "{}{separator}options={}",
            db.url,
            option
                .replace('\\', "%5C")
                .replace(' ', "%20")
                .replace('=', "%3D")
        ),
    }
}

/// `rows` rows written, `setting` imposed, `relays` relays with batches of 10: every row is
/// marked sent and arrives exactly once.
async fn delivered_once_under(setting: &str, relays: usize, rows: usize) {
    let db = migrated_db().await;
    let queue = create_queue("settings", &[]).await;
    let direct = db.client().await;
    let written = events("set", rows, 50);
    for chunk in written.chunks(500) {
        insert(&direct, chunk, Duration::ZERO).await;
    }
    impose(&db, setting).await;
    delivered_once(&db, &queue, &direct, &written, relays).await;
}

/// Runs `relays` relays on `db` until every row of `written` is marked sent; asserts each
/// arrived exactly once.
pub(crate) async fn delivered_once(
    db: &TestDb,
    queue: &str,
    direct: &tokio_postgres::Client,
    written: &[crate::scenario::Event],
    relays: usize,
) {
    let fleet: Vec<RelayProcess> = (0..relays)
        .map(|i| {
            let id = format!("r{i}");
            RelayProcess::spawn_named(
                &id,
                &run_args(
                    db,
                    queue,
                    sqs().endpoint(),
                    &["--relay-id", &id, "--batch-size", "10"],
                ),
                &[],
            )
        })
        .collect();
    let outputs = || {
        fleet
            .iter()
            .map(RelayProcess::output)
            .collect::<Vec<_>>()
            .join("\n---\n")
    };
    crate::support::wait_until("every row marked sent", Duration::from_secs(60), || async {
        crate::scenario::count(direct, "sent_at IS NOT NULL").await == written.len() as i64
    })
    .await;
    for relay in &fleet {
        relay.sigterm();
    }
    for relay in &fleet {
        assert!(relay.wait_exit(Duration::from_secs(30)).await.is_some());
    }
    let received = receive_all(queue, written.len(), Duration::from_secs(60)).await;
    let mut copies: HashMap<&str, usize> = HashMap::new();
    for m in &received {
        *copies
            .entry(attr(m, "event_id").unwrap_or("?"))
            .or_default() += 1;
    }
    let missing = written
        .iter()
        .filter(|e| !copies.contains_key(e.event_id.as_str()))
        .count();
    let extra: usize = copies.values().map(|n| n - 1).sum();
    assert_eq!(
        (missing, extra),
        (0, 0),
        "{} rows: {missing} missing, {extra} copies\n{}",
        written.len(),
        outputs()
    );
}

/// Defect 1: claims are serialized by a transaction advisory lock, which serializes only if a
/// claim's snapshot is taken after the lock (READ COMMITTED).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeatable_read_by_default_three_relays_deliver_each_row_once() {
    delivered_once_under("default_transaction_isolation = 'repeatable read'", 3, 1500).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serializable_by_default_three_relays_deliver_each_row_once() {
    delivered_once_under("default_transaction_isolation = 'serializable'", 3, 1500).await;
}

/// Defect 5 (a): a role that defaults to read-only transactions is not a standby.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_role_default_delivers() {
    delivered_once_under("default_transaction_read_only = on", 1, 300).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_statement_timeout_on_the_role_cuts_nothing() {
    delivered_once_under("statement_timeout = '50ms'", 2, 600).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_lock_timeout_on_the_role_cuts_nothing() {
    delivered_once_under("lock_timeout = '50ms'", 3, 600).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_idle_in_transaction_timeout_on_the_role_cuts_nothing() {
    delivered_once_under("idle_in_transaction_session_timeout = '100ms'", 2, 600).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unusual_time_zone_delivers() {
    delivered_once_under("TimeZone = 'Pacific/Chatham'", 1, 300).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unusual_date_style_delivers() {
    delivered_once_under("DateStyle = 'SQL, DMY'", 1, 300).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unusual_interval_style_delivers() {
    delivered_once_under("IntervalStyle = 'sql_standard'", 1, 300).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn few_float_digits_deliver() {
    delivered_once_under("extra_float_digits = -15", 1, 300).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escaped_bytea_output_delivers() {
    delivered_once_under("bytea_output = 'escape'", 1, 300).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_session_replication_role_delivers() {
    delivered_once_under("session_replication_role = 'replica'", 1, 300).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_latin1_client_encoding_on_the_role_delivers() {
    delivered_once_under("client_encoding = 'LATIN1'", 1, 300).await;
}

/// The URL's `options` are the client's own settings, applied after the role's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeatable_read_and_latin1_in_the_url_options_deliver_each_row_once() {
    for option in [
        "-c default_transaction_isolation=repeatable\\ read",
        "-c client_encoding=LATIN1",
    ] {
        let db = migrated_db().await;
        let queue = create_queue("settings-url", &[]).await;
        let direct = db.client().await;
        let written = events("url", 600, 50);
        insert(&direct, &written, Duration::ZERO).await;
        delivered_once(&with_options(&db, option), &queue, &direct, &written, 3).await;
    }
}

/// Defect 5 (b): a `search_path` without `public` hides the table; `run` says so, and where
/// the table is, instead of "does not exist: run migrate".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_path_without_public_is_named_with_the_table_it_hides() {
    let db = migrated_db().await;
    db.client()
        .await
        .batch_execute("CREATE SCHEMA app")
        .await
        .unwrap();
    impose(&db, "search_path = app").await;
    let (status, output) = run_to_end(
        &run_args(
            &db,
            "http://127.0.0.1:9/000000000000/never",
            sqs().endpoint(),
            &[],
        ),
        &[],
        Duration::from_secs(30),
    )
    .await;
    assert!(!status.success(), "{output}");
    let errors: Vec<&str> = output.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(errors.len(), 1, "{output}");
    let line = errors[0];
    assert!(
        line.contains("search_path") && line.contains("public.outbox") && !line.contains("migrate"),
        "{line}"
    );
    let (status, output) = run_to_end(
        &args(&["status", "--database-url", &db.url]),
        &[],
        Duration::from_secs(30),
    )
    .await;
    assert!(!status.success(), "{output}");
    assert!(output.contains("--table public.outbox"), "{output}");
}

/// A same-named table earlier in the `search_path`: the relay uses the one it resolved on
/// every connection, and `check` names it and the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_same_named_table_earlier_in_the_search_path_is_named_by_check() {
    let db = migrated_db().await;
    let queue = create_queue("settings-shadow", &[]).await;
    let direct = db.client().await;
    let written = events("shadow", 200, 20);
    insert(&direct, &written, Duration::ZERO).await;
    direct
        .batch_execute("CREATE SCHEMA shadow; CREATE TABLE shadow.outbox (id int)")
        .await
        .unwrap();
    impose(&db, "search_path = shadow, public").await;
    let (status, output) = run_to_end(
        &args(&[
            "check",
            "--database-url",
            &db.url,
            "--table",
            "public.outbox",
            "--queue-url",
            &queue,
            "--sqs-endpoint-url",
            sqs().endpoint(),
        ]),
        &[],
        Duration::from_secs(60),
    )
    .await;
    assert!(status.success(), "{output}");
    assert!(output.contains("\"public\".\"outbox\""), "{output}");
    let (status, output) = run_to_end(
        &args(&[
            "check",
            "--database-url",
            &db.url,
            "--queue-url",
            &queue,
            "--sqs-endpoint-url",
            sqs().endpoint(),
        ]),
        &[],
        Duration::from_secs(60),
    )
    .await;
    assert!(!status.success(), "{output}");
    assert!(
        output.contains("\"shadow\".\"outbox\"") && output.contains("public.outbox"),
        "{output}"
    );
}

/// `check` lists the server's value of every setting the relay relies on, a line each, with
/// where it came from, as the relay's role gets it (before the relay sets anything).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_lists_the_settings_the_relay_relies_on() {
    let db = migrated_db().await;
    let queue = create_queue("settings-check", &[]).await;
    impose(&db, "default_transaction_isolation = 'serializable'").await;
    impose(&db, "statement_timeout = '50ms'").await;
    let (status, output) = run_to_end(
        &args(&[
            "check",
            "--database-url",
            &db.url,
            "--queue-url",
            &queue,
            "--sqs-endpoint-url",
            sqs().endpoint(),
        ]),
        &[],
        Duration::from_secs(60),
    )
    .await;
    assert!(status.success(), "{output}");
    for line in [
        "ok   setting default_transaction_isolation = serializable (database user) (the relay states READ COMMITTED",
        "ok   setting statement_timeout = 50ms (database user) (the relay sets its own from --db-timeout)",
        "ok   setting default_transaction_read_only = off (default)",
        "ok   setting search_path = \"$user\", public (default)",
        "ok   setting client_encoding = UTF8 (client)",
    ] {
        assert!(output.contains(line), "{line} missing from:\n{output}");
    }
    assert_eq!(output.matches("ok   setting ").count(), 13, "{output}");
}

/// `migrate` on a role with short timeouts and a serializable default sets its own for every
/// step (and restores its own, not the role's, after a step run without them); the relay then
/// delivers on the table it made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_and_run_under_a_roles_short_timeouts_and_serializable_default() {
    let db = crate::support::fresh_db().await;
    impose(&db, "statement_timeout = '50ms'").await;
    impose(&db, "lock_timeout = '50ms'").await;
    impose(&db, "default_transaction_isolation = 'serializable'").await;
    crate::scenario::migrate_with(&db, &["--fair-by", "event_type"]).await;
    let queue = create_queue("settings-migrate", &[]).await;
    let direct = db.client().await;
    let written = events("migrated", 300, 10);
    insert(&direct, &written, Duration::ZERO).await;
    delivered_once(&db, &queue, &direct, &written, 2).await;
}
