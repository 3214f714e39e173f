//! Wake-up modes: each delivers a row inserted while the relay is idle; `migrate --wakeup`
//! installs what a mode needs and removes what it does not (an earlier install's NOTIFY
//! trigger included); a relay refuses to start on a mode the database is not set up for.

use std::time::Duration;

use crate::scenario::{count, events, insert, migrated_db, relay_command, run_args, set_arg};
use crate::support::{create_queue, receive_all, run_to_end, sqs, RelayProcess, TestDb};

/// The trigger and publication present for table `outbox`: (trigger, its function, publication).
async fn installed(client: &tokio_postgres::Client) -> (bool, bool, bool) {
    let row = client
        .query_one(
            "SELECT
                 EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = 'outbox'::regclass
                         AND tgname = 'outbox_relay_notify'),
                 EXISTS (SELECT 1 FROM pg_proc WHERE proname LIKE 'outbox%notify%'),
                 EXISTS (SELECT 1 FROM pg_publication_tables WHERE tablename = 'outbox')",
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1), row.get(2))
}

fn migrate_args<'a>(db: &'a TestDb, wakeup: &'a str) -> Vec<&'a str> {
    vec!["migrate", "--database-url", &db.url, "--wakeup", wakeup]
}

/// The relay's defaults, but for test timings: no `--retention` (the default deletes each row
/// once SQS acknowledged it).
fn default_run_args(db: &TestDb, queue: &str, extra: &[&str]) -> Vec<String> {
    let mut a = run_args(db, queue, sqs().endpoint(), extra);
    if let Some(i) = a.iter().position(|x| x == "--retention") {
        a.drain(i..i + 2);
    }
    a
}

/// Starts a relay, lets it go idle, inserts one row and waits for it on the queue.
async fn delivers_while_idle(db: &TestDb, queue: &str, relay: &RelayProcess) {
    relay.metrics_addr(Duration::from_secs(30)).await;
    // Long enough for the polling schedule to stretch past its fast phase.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let client = db.client().await;
    insert(&client, &events("idle", 1, 1), Duration::ZERO).await;
    let received = receive_all(queue, 1, Duration::from_secs(30)).await;
    assert_eq!(received.len(), 1, "{}", relay.output());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_is_the_default_installs_nothing_and_deletes_rows_once_sent() {
    let db = migrated_db().await;
    let client = db.client().await;
    assert_eq!(installed(&client).await, (false, false, false));
    let queue = create_queue("wake-poll", &[]).await;
    let relay = RelayProcess::spawn(&default_run_args(&db, &queue, &[]), &[]);
    delivers_while_idle(&db, &queue, &relay).await;
    crate::support::wait_until("the sent row deleted", Duration::from_secs(10), || async {
        count(&client, "true").await == 0
    })
    .await;
    assert!(relay.output().contains("wakeup=poll"), "{}", relay.output());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_wakes_an_idle_relay_that_would_not_poll_for_an_hour() {
    let db = migrated_db().await;
    relay_command(&migrate_args(&db, "notify")).await;
    let client = db.client().await;
    assert_eq!(installed(&client).await, (true, true, false));
    let queue = create_queue("wake-notify", &[]).await;
    let mut args = default_run_args(&db, &queue, &["--wakeup", "notify"]);
    set_arg(&mut args, "--poll-interval", "1h");
    let relay = RelayProcess::spawn(&args, &[]);
    delivers_while_idle(&db, &queue, &relay).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_switches_modes_and_leaves_nothing_of_the_old_one() {
    let db = migrated_db().await;
    let client = db.client().await;
    // An install from before --wakeup: a trigger NOTIFYing on the table's own channel.
    client
        .batch_execute(
            "CREATE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN PERFORM pg_notify('outbox_relay_' || left(md5(TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME), 16), '');
             RETURN NULL; END $$;
             CREATE TRIGGER outbox_relay_notify AFTER INSERT ON outbox
                 FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();",
        )
        .await
        .unwrap();
    assert_eq!(installed(&client).await, (true, true, false));
    let out = relay_command(&["migrate", "--database-url", &db.url]).await;
    assert!(out.contains("wake-up mode poll"), "{out}");
    assert_eq!(installed(&client).await, (false, false, false), "{out}");

    relay_command(&migrate_args(&db, "notify")).await;
    assert_eq!(installed(&client).await, (true, true, false));
    // Idempotent.
    relay_command(&migrate_args(&db, "notify")).await;
    assert_eq!(installed(&client).await, (true, true, false));

    // The publication needs no wal_level=logical to exist (streaming it does).
    relay_command(&migrate_args(&db, "logical")).await;
    assert_eq!(installed(&client).await, (false, false, true));
    relay_command(&migrate_args(&db, "logical")).await;
    assert_eq!(installed(&client).await, (false, false, true));

    relay_command(&migrate_args(&db, "poll")).await;
    assert_eq!(installed(&client).await, (false, false, false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mode_the_database_is_not_set_up_for_is_refused_or_reported() {
    let db = migrated_db().await;
    let queue = create_queue("wake-refused", &[]).await;
    let notify = default_run_args(&db, &queue, &["--wakeup", "notify"]);
    let (status, output) = run_to_end(&notify, &[], Duration::from_secs(30)).await;
    assert_eq!(status.code(), Some(1), "{output}");
    let errors: Vec<&str> = output.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{output}");
    assert!(
        errors[0].contains("--wakeup notify needs the NOTIFY trigger")
            && errors[0].contains("outbox-relay migrate --wakeup notify"),
        "{output}"
    );

    // A leftover trigger under polling: the relay runs (and says what it costs); check fails.
    relay_command(&migrate_args(&db, "notify")).await;
    let mut check = default_run_args(&db, &queue, &[]);
    check[0] = "check".to_string();
    let (status, output) = run_to_end(&check, &[], Duration::from_secs(30)).await;
    assert_eq!(status.code(), Some(1), "{output}");
    let fail: Vec<&str> = output.lines().filter(|l| l.starts_with("FAIL")).collect();
    assert_eq!(fail.len(), 1, "{output}");
    assert!(
        fail[0].contains("wake-up mode poll") && fail[0].contains("migrate --wakeup poll"),
        "{output}"
    );
    let relay = RelayProcess::spawn(&default_run_args(&db, &queue, &[]), &[]);
    delivers_while_idle(&db, &queue, &relay).await;
    assert!(
        relay
            .output()
            .contains("serializes the application's commits"),
        "{}",
        relay.output()
    );

    relay_command(&migrate_args(&db, "poll")).await;
    let (status, output) = run_to_end(&check, &[], Duration::from_secs(30)).await;
    assert!(status.success(), "{output}");
    assert!(
        output.contains("ok   wake-up mode poll is set up"),
        "{output}"
    );
}
