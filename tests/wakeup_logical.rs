//! The logical wake-up (`--wakeup logical`) against real PostgreSQL clusters started
//! with `wal_level=logical`: what rings it, the temporary slot's life, the start-up verdict of
//! `check_logical`, authentication and TLS on the replication connection; then real relay
//! processes with `--wakeup logical`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_relay::outbox::{quote_ident, Outbox, OutboxError, Wakeup};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::scenario::{copies, events, insert, migrated_db, relay_command, run_args, set_arg};
use crate::support::pg::PrivatePg;
use crate::support::{
    create_queue, fresh_db, receive_all, run_to_end, sqs, wait_until, RelayProcess, TestDb,
};

const LOGICAL: &str = "wal_level=logical";

fn outbox(url: &str) -> Arc<Outbox> {
    Arc::new(Outbox::new(url, "outbox".parse().unwrap(), Duration::from_secs(10)).unwrap())
}

/// A database on `cluster` with the outbox table and, if `publish`, the logical wake-up's
/// publication as `migrate --wakeup logical` creates it.
async fn outbox_db(
    cluster: &PrivatePg,
    publish: bool,
) -> (TestDb, Arc<Outbox>, tokio_postgres::Client) {
    let db = cluster.create_db().await;
    let outbox = outbox(&db.url);
    outbox.migrate(&[]).await.expect("migrate");
    let client = db.client().await;
    if publish {
        create_publication(&outbox).await;
    }
    (db, outbox, client)
}

/// The publication as `migrate --wakeup logical` creates it.
async fn create_publication(outbox: &Outbox) {
    outbox
        .set_up_wakeup(Wakeup::Logical)
        .await
        .expect("set up --wakeup logical");
}

/// A running logical wake-up and what it rang.
struct Bell {
    /// When each wake happened.
    wakes: mpsc::UnboundedReceiver<Instant>,
    task: JoinHandle<Result<(), OutboxError>>,
}

impl Bell {
    /// Starts the logical wake-up and returns once it is streaming.
    async fn start(outbox: Arc<Outbox>) -> Bell {
        let (wake, wakes) = mpsc::unbounded_channel();
        let (ready, is_ready) = oneshot::channel();
        let task = tokio::spawn(async move {
            outbox
                .logical_wakeup(
                    move || {
                        let _ = wake.send(Instant::now());
                    },
                    move || {
                        let _ = ready.send(());
                    },
                )
                .await
        });
        match tokio::time::timeout(Duration::from_secs(30), is_ready).await {
            Ok(Ok(())) => Bell { wakes, task },
            Ok(Err(_)) => panic!(
                "the logical wake-up ended before streaming: {:?}",
                task.await
            ),
            Err(_) => panic!("the logical wake-up was not streaming after 30 s"),
        }
    }

    async fn next(&mut self) -> Instant {
        tokio::time::timeout(Duration::from_secs(30), self.wakes.recv())
            .await
            .expect("the logical wake-up rang within 30 s")
            .expect("the logical wake-up is running")
    }

    /// Wakes received and not yet taken.
    fn drain(&mut self) -> usize {
        let mut n = 0;
        while self.wakes.try_recv().is_ok() {
            n += 1;
        }
        n
    }
}

/// The logical wake-ups' slots on the cluster: (name, temporary, active).
async fn slots(client: &tokio_postgres::Client) -> Vec<(String, bool, bool)> {
    client
        .query(
            "SELECT slot_name::text, temporary, active FROM pg_replication_slots \
             WHERE slot_name LIKE 'outbox\\_relay\\_%' ORDER BY slot_name",
            &[],
        )
        .await
        .expect("read pg_replication_slots")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

/// Returns once every logical wake-up slot has confirmed the WAL written so far: the logical wake-up then
/// has read, and rung for, every transaction committed before this call.
async fn fence(client: &tokio_postgres::Client) {
    let lsn: String = client
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .unwrap()
        .get(0);
    wait_until(
        &format!("the logical wake-up confirmed {lsn}"),
        Duration::from_secs(60),
        || async {
            client
                .query_one(
                    "SELECT coalesce(bool_and(confirmed_flush_lsn >= $1::text::pg_lsn), false) \
                     FROM pg_replication_slots WHERE slot_name LIKE 'outbox\\_relay\\_%'",
                    &[&lsn],
                )
                .await
                .unwrap()
                .get::<_, bool>(0)
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rings_once_per_committed_inserting_transaction_only() {
    let cluster = PrivatePg::start_with(&[LOGICAL]).await;
    let (_db, outbox, client) = outbox_db(&cluster, true).await;
    insert(&client, &events("before", 1, 1), Duration::ZERO).await;
    let mut bell = Bell::start(outbox).await;

    client
        .batch_execute(
            "BEGIN; \
             INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload) \
             VALUES ('rolled-back', 'order', '1', 'order.placed', '{}'); \
             ROLLBACK",
        )
        .await
        .unwrap();
    client
        .execute(
            "UPDATE outbox SET available_at = now() WHERE event_id = 'before-0'",
            &[],
        )
        .await
        .unwrap();
    client
        .batch_execute("CREATE TABLE unrelated (x int); INSERT INTO unrelated VALUES (1)")
        .await
        .unwrap();
    insert(&client, &events("one", 1, 1), Duration::ZERO).await;
    insert(&client, &events("three", 3, 2), Duration::ZERO).await;
    fence(&client).await;
    assert_eq!(
        bell.drain(),
        2,
        "one wake for each of the two inserting transactions; none for the rollback, the \
         update, the other table, or the rows inserted before streaming"
    );
    assert!(!bell.task.is_finished());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_temporary_slot_lives_exactly_as_long_as_the_connection() {
    let cluster = PrivatePg::start_with(&[LOGICAL]).await;
    let (_db, outbox, client) = outbox_db(&cluster, true).await;
    let publication = outbox.publication_name(&client).await.unwrap();
    assert!(slots(&client).await.is_empty());

    let mut bell = Bell::start(Arc::clone(&outbox)).await;
    let found = slots(&client).await;
    assert_eq!(found.len(), 1, "{found:?}");
    let (name, temporary, active) = &found[0];
    assert!(*temporary && *active, "{found:?}");
    assert!(
        name.starts_with(&format!("{publication}_{}_", std::process::id())),
        "{name}"
    );
    // While it runs it confirms what it received, so the slot holds back no WAL.
    insert(&client, &events("kept-up", 2, 1), Duration::ZERO).await;
    bell.next().await;
    fence(&client).await;

    // The server ends the connection: the logical wake-up returns an error for the caller to
    // reconnect, and PostgreSQL drops the slot.
    client
        .execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1",
            &[name],
        )
        .await
        .unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(30), bell.task)
        .await
        .expect("the logical wake-up returned within 30 s")
        .unwrap();
    assert!(ended.is_err(), "{ended:?}");
    wait_until("the slot is dropped", Duration::from_secs(30), || async {
        slots(&client).await.is_empty()
    })
    .await;

    // The relay drops the logical wake-up (shutdown, or the task aborted): the slot goes too.
    let bell = Bell::start(outbox).await;
    assert_eq!(slots(&client).await.len(), 1);
    bell.task.abort();
    wait_until(
        "the slot is dropped after the logical wake-up was",
        Duration::from_secs(30),
        || async { slots(&client).await.is_empty() },
    )
    .await;
}

/// One line, no line breaks, no password.
fn assert_one_line(e: &OutboxError, needle: &str, password: &str) {
    let text = e.to_string();
    assert!(text.contains(needle), "{text:?} should mention {needle:?}");
    assert!(!text.contains('\n'), "{text:?}");
    assert!(!text.contains(password), "{text:?} holds the password");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_logical_refuses_a_server_without_logical_wal() {
    // The shared cluster runs with the default wal_level=replica.
    let db = fresh_db().await;
    let outbox = outbox(&db.url);
    outbox.migrate(&[]).await.unwrap();
    let password = crate::support::pg().password();
    let e = outbox.check_logical().await.unwrap_err();
    assert!(matches!(e, OutboxError::Wakeup(_)), "{e:?}");
    assert_one_line(&e, "wal_level=replica", password);
    assert_one_line(&e, "ALTER SYSTEM SET wal_level = logical", password);
    // The logical wake-up itself fails the same way rather than streaming nothing.
    create_publication(&outbox).await;
    let e = outbox.logical_wakeup(|| {}, || {}).await.unwrap_err();
    assert_one_line(&e, "ALTER SYSTEM SET wal_level = logical", password);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_logical_names_the_missing_publication_and_replication_attribute() {
    let cluster = PrivatePg::start_with(&[LOGICAL]).await;
    let (db, outbox, client) = outbox_db(&cluster, false).await;
    let password = cluster.password();

    let e = outbox.check_logical().await.unwrap_err();
    assert_one_line(&e, "outbox-relay migrate --wakeup logical", password);
    let e = outbox.logical_wakeup(|| {}, || {}).await.unwrap_err();
    assert_one_line(&e, "outbox-relay migrate --wakeup logical", password);

    create_publication(&outbox).await;
    outbox
        .check_logical()
        .await
        .expect("ready for --wakeup logical");
    wait_until(
        "check's trial slot is gone",
        Duration::from_secs(30),
        || async { slots(&client).await.is_empty() },
    )
    .await;

    let role_password = "n0-repl-s3cret";
    client
        .batch_execute(&format!(
            "CREATE ROLE relay_norepl LOGIN PASSWORD '{role_password}'"
        ))
        .await
        .unwrap();
    let url = format!(
        "postgres://relay_norepl:{role_password}@127.0.0.1:{}/{}",
        cluster.port(),
        db.name
    );
    let as_role = self::outbox(&url);
    let e = as_role.check_logical().await.unwrap_err();
    assert!(matches!(e, OutboxError::Wakeup(_)), "{e:?}");
    assert_one_line(&e, "ALTER ROLE \"relay_norepl\" REPLICATION", role_password);
    let e = as_role.logical_wakeup(|| {}, || {}).await.unwrap_err();
    assert_one_line(&e, "ALTER ROLE \"relay_norepl\" REPLICATION", role_password);

    client
        .batch_execute("ALTER ROLE relay_norepl REPLICATION")
        .await
        .unwrap();
    as_role
        .check_logical()
        .await
        .expect("the role may replicate now");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_logical_names_exhausted_slots_and_wal_senders() {
    let cluster = PrivatePg::start_with(&[LOGICAL, "max_replication_slots=1"]).await;
    let (_db, outbox, _client) = outbox_db(&cluster, true).await;
    let password = cluster.password();
    let _bell = Bell::start(Arc::clone(&outbox)).await;
    let e = outbox.check_logical().await.unwrap_err();
    assert_one_line(&e, "max_replication_slots", password);
    drop(cluster);

    let cluster = PrivatePg::start_with(&[LOGICAL, "max_wal_senders=0"]).await;
    let (_db, outbox, _client) = outbox_db(&cluster, true).await;
    let e = outbox.check_logical().await.unwrap_err();
    assert_one_line(&e, "max_wal_senders", cluster.password());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authenticates_with_scram_over_tcp_and_unix_sockets() {
    let cluster = PrivatePg::start_with(&[LOGICAL]).await;
    let (db, outbox, client) = outbox_db(&cluster, true).await;
    // initdb --auth=scram-sha-256: every rule, replication and local ones included, asks
    // for SCRAM, so the logical wake-ups below authenticated with it.
    let methods: Vec<String> = client
        .query("SELECT DISTINCT auth_method FROM pg_hba_file_rules", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(methods, vec!["scram-sha-256".to_string()]);

    let mut bell = Bell::start(Arc::clone(&outbox)).await;
    insert(&client, &events("tcp", 1, 1), Duration::ZERO).await;
    bell.next().await;
    bell.task.abort();

    let unix = self::outbox(&format!(
        "host={} port={} user=postgres password={} dbname={}",
        cluster.socket_dir().display(),
        cluster.port(),
        cluster.password(),
        db.name
    ));
    let mut bell = Bell::start(unix).await;
    insert(&client, &events("unix", 1, 1), Duration::ZERO).await;
    bell.next().await;
    bell.task.abort();

    let wrong = "wr0ng-pa55word";
    let url = format!(
        "postgres://postgres:{wrong}@127.0.0.1:{}/{}",
        cluster.port(),
        db.name
    );
    let e = self::outbox(&url)
        .logical_wakeup(|| {}, || {})
        .await
        .unwrap_err();
    assert_one_line(&e, "password authentication failed", wrong);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_over_tls_with_the_relays_sslmode_rules() {
    let pg = crate::ops_tls::TlsPg::start_with(&[LOGICAL]).await;
    let ca = pg.ca.display().to_string();
    // The test database takes TCP clients over TLS only; a Unix socket sets things up.
    let admin_url = format!(
        "host={} port={} user=postgres password={} dbname={}",
        pg.cluster.socket_dir().display(),
        pg.cluster.port(),
        pg.password(),
        pg.db.name
    );
    let (client, connection) = tokio_postgres::connect(&admin_url, tokio_postgres::NoTls)
        .await
        .expect("connect over the Unix socket");
    tokio::spawn(connection);

    let verified = outbox(&pg.url(
        "localhost",
        &format!("?sslmode=verify-full&sslrootcert={ca}"),
    ));
    verified.migrate(&[]).await.expect("migrate over TLS");
    create_publication(&verified).await;
    verified.check_logical().await.expect("check over TLS");
    let mut bell = Bell::start(verified).await;
    insert(&client, &events("tls", 1, 1), Duration::ZERO).await;
    bell.next().await;
    bell.task.abort();

    // Without TLS pg_hba.conf turns the replication connection away, so the one above was
    // encrypted; with the wrong CA the certificate check refuses the server.
    let plain = outbox(&pg.url("localhost", "?sslmode=disable"));
    assert!(plain.check_logical().await.is_err());
    let other_ca = pg.other_ca.display().to_string();
    let wrong_ca = outbox(&pg.url(
        "localhost",
        &format!("?sslmode=verify-ca&sslrootcert={other_ca}"),
    ));
    let e = wrong_ca.check_logical().await.unwrap_err();
    assert_one_line(&e, "not signed by", pg.password());

    // A role pg_hba.conf admits by client certificate only: the replication connection
    // presents the certificate too.
    let (cert, key) = pg.client_files("relay");
    let by_certificate = outbox(&pg.url_as(
        crate::ops_tls::CERT_ROLE,
        &format!("?sslmode=verify-full&sslrootcert={ca}&sslcert={cert}&sslkey={key}"),
    ));
    by_certificate
        .check_logical()
        .await
        .expect("check with a client certificate");
    let mut bell = Bell::start(by_certificate).await;
    insert(&client, &events("cert", 1, 1), Duration::ZERO).await;
    bell.next().await;
    bell.task.abort();
}

/// Commit -> wake latency on a durable cluster (fsync and synchronous_commit on), printed
/// (`--nocapture`), not asserted: speed belongs to the benchmark. What is asserted is that
/// each of the single-row commits rings exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_durable_single_row_commit_rings_once_and_the_latency_is_printed() {
    const COMMITS: usize = 300;
    let cluster = PrivatePg::start_with(&[LOGICAL, "fsync=on", "synchronous_commit=on"]).await;
    let (_db, outbox, mut client) = outbox_db(&cluster, true).await;
    let mut bell = Bell::start(outbox).await;
    let mut from_sent = Vec::with_capacity(COMMITS);
    let mut from_acked = Vec::with_capacity(COMMITS);
    for (i, event) in events("lat", COMMITS, 7).into_iter().enumerate() {
        let tx = client.transaction().await.unwrap();
        tx.execute(
            "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload) \
             VALUES ($1, $2, $3, $4, $5::text::jsonb)",
            &[
                &event.event_id,
                &event.aggregate_type,
                &event.aggregate_id,
                &event.event_type,
                &event.payload.to_string(),
            ],
        )
        .await
        .unwrap();
        let sent = Instant::now();
        tx.commit().await.unwrap();
        let acked = Instant::now();
        let rang = bell.next().await;
        assert_eq!(bell.drain(), 0, "commit {i} rang more than once");
        from_sent.push(rang.saturating_duration_since(sent));
        from_acked.push(rang.checked_duration_since(acked));
    }
    fence(&client).await;
    assert_eq!(bell.drain(), 0, "no wake beyond one per commit");

    from_sent.sort();
    let before_ack = from_acked.iter().filter(|d| d.is_none()).count();
    let mut after_ack: Vec<Duration> = from_acked.into_iter().flatten().collect();
    after_ack.sort();
    let pct = |v: &[Duration], p: f64| {
        v.get(((v.len() as f64 * p).ceil() as usize).saturating_sub(1))
            .map(|d| format!("{:.3} ms", d.as_secs_f64() * 1000.0))
            .unwrap_or_else(|| "-".into())
    };
    println!(
        "logical wake-up latency, {COMMITS} durable single-row commits: commit sent -> wake p50 {} p99 {}; \
         commit acknowledged -> wake p50 {} p99 {} ({before_ack} wakes came before the acknowledgement)",
        pct(&from_sent, 0.50),
        pct(&from_sent, 0.99),
        pct(&after_ack, 0.50),
        pct(&after_ack, 0.99),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adopted_tables_view_is_served_by_the_publication_of_its_base_table() {
    let cluster = PrivatePg::start_with(&[LOGICAL]).await;
    let (db, _base, client) = outbox_db(&cluster, false).await;
    // The shape `migrate --adopt` leaves: the relay reads a view over the application's table.
    client
        .batch_execute("CREATE VIEW outbox_relay AS SELECT * FROM outbox")
        .await
        .unwrap();
    let view = Arc::new(
        Outbox::new(
            &db.url,
            "outbox_relay".parse().unwrap(),
            Duration::from_secs(10),
        )
        .unwrap()
        .adopted_from(Some("outbox".parse().unwrap())),
    );
    let name = quote_ident(&view.publication_name(&client).await.unwrap());

    // A publication of that name that does not cover the base table is refused.
    client
        .batch_execute(&format!(
            "CREATE TABLE unrelated (x int); CREATE PUBLICATION {name} FOR TABLE unrelated"
        ))
        .await
        .unwrap();
    let e = view.check_logical().await.unwrap_err();
    assert_one_line(&e, "does not publish inserts", cluster.password());

    client
        .batch_execute(&format!("DROP PUBLICATION {name}"))
        .await
        .unwrap();
    create_publication(&view).await;
    view.check_logical()
        .await
        .expect("the base table is published");
    let mut bell = Bell::start(view).await;
    insert(&client, &events("adopted", 1, 1), Duration::ZERO).await;
    bell.next().await;
}

/// pg_hba.conf rules ahead of the harness's SCRAM ones send two roles through md5 (with an md5
/// password hash) and cleartext `password` authentication.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authenticates_with_md5_and_cleartext_passwords() {
    let cluster = PrivatePg::start_with(&[LOGICAL]).await;
    let (db, _outbox, client) = outbox_db(&cluster, true).await;
    let hba_file: String = client.query_one("SHOW hba_file", &[]).await.unwrap().get(0);
    let rules = std::fs::read_to_string(&hba_file).unwrap();
    std::fs::write(
        &hba_file,
        format!(
            "host all relay_md5 127.0.0.1/32 md5\nhost all relay_plain 127.0.0.1/32 password\n{rules}"
        ),
    )
    .unwrap();
    client
        .batch_execute(
            "SET password_encryption = 'md5'; \
             CREATE ROLE relay_md5 LOGIN REPLICATION PASSWORD 'md5-s3cret'; \
             CREATE ROLE relay_plain LOGIN REPLICATION PASSWORD 'plain-s3cret'; \
             SELECT pg_reload_conf()",
        )
        .await
        .unwrap();
    wait_until(
        "pg_hba.conf is reloaded",
        Duration::from_secs(20),
        || async {
            client
            .query_one(
                "SELECT count(*) FROM pg_hba_file_rules WHERE auth_method IN ('md5', 'password')",
                &[],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
            == 2
        },
    )
    .await;
    for (role, password, method) in [
        ("relay_md5", "md5-s3cret", "md5"),
        ("relay_plain", "plain-s3cret", "password"),
    ] {
        let url = format!(
            "postgres://{role}:{password}@127.0.0.1:{}/{}",
            cluster.port(),
            db.name
        );
        let outbox = self::outbox(&url);
        outbox
            .check_logical()
            .await
            .unwrap_or_else(|e| panic!("{method}: {e}"));
        let mut bell = Bell::start(outbox).await;
        insert(&client, &events(role, 1, 1), Duration::ZERO).await;
        bell.next().await;
        bell.task.abort();
        let wrong = self::outbox(&format!(
            "postgres://{role}:wr0ng@127.0.0.1:{}/{}",
            cluster.port(),
            db.name
        ));
        let e = wrong.check_logical().await.unwrap_err();
        assert_one_line(&e, "password authentication failed", "wr0ng");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_waiting_for_an_open_transaction_is_bounded_by_the_connect_timeout() {
    let cluster = PrivatePg::start_with(&[LOGICAL]).await;
    let (db, _outbox, client) = outbox_db(&cluster, true).await;
    // A transaction holding a transaction id: PostgreSQL creates a logical slot only once the
    // transactions running at that moment have ended.
    let mut holder = db.client().await;
    let open = holder.transaction().await.unwrap();
    open.execute("SELECT pg_current_xact_id()", &[])
        .await
        .unwrap();

    let impatient =
        Arc::new(Outbox::new(&db.url, "outbox".parse().unwrap(), Duration::from_secs(2)).unwrap());
    let e = impatient.logical_wakeup(|| {}, || {}).await.unwrap_err();
    assert_one_line(&e, "transactions open", cluster.password());
    assert!(e.is_transient(), "{e:?}");
    wait_until(
        "the abandoned slot is dropped",
        Duration::from_secs(30),
        || async { slots(&client).await.is_empty() },
    )
    .await;

    open.commit().await.unwrap();
    let mut bell = Bell::start(impatient).await;
    insert(&client, &events("after-wait", 1, 1), Duration::ZERO).await;
    bell.next().await;
}

/// The relay's own lines starting with `error:`.
fn error_lines(output: &str) -> Vec<&str> {
    output.lines().filter(|l| l.starts_with("error:")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_logical_relay_delivers_a_row_inserted_while_idle_and_leaves_no_slot_when_killed() {
    let cluster = PrivatePg::start_with(&[LOGICAL]).await;
    let db = cluster.create_db().await;
    relay_command(&["migrate", "--database-url", &db.url, "--wakeup", "logical"]).await;
    let client = db.client().await;
    let queue = create_queue("logical-idle", &[]).await;
    let mut run = run_args(&db, &queue, sqs().endpoint(), &["--wakeup", "logical"]);
    // Only the logical wake-up can deliver within the test's time: polling waits an hour.
    set_arg(&mut run, "--poll-interval", "1h");
    let relay = RelayProcess::spawn(&run, &[]);
    wait_until(
        "the relay streams from its slot",
        Duration::from_secs(30),
        || async {
            slots(&client)
                .await
                .iter()
                .any(|(_, temporary, active)| *temporary && *active)
        },
    )
    .await;
    // Idle now: whatever it polled at start-up found nothing.
    let written = events("idle-logical", 1, 1);
    insert(&client, &written, Duration::ZERO).await;
    let received = receive_all(&queue, 1, Duration::from_secs(30)).await;
    assert_eq!(
        copies(&received).get("idle-logical-0"),
        Some(&1),
        "{}",
        relay.output()
    );

    relay.kill9();
    relay
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("killed");
    wait_until(
        "PostgreSQL dropped the killed relay's slot",
        Duration::from_secs(60),
        || async { slots(&client).await.is_empty() },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_with_logical_wakeup_on_a_server_without_logical_wal_exits_with_one_line() {
    // The shared cluster runs with wal_level=replica; the publication can exist all the same.
    let db = migrated_db().await;
    relay_command(&["migrate", "--database-url", &db.url, "--wakeup", "logical"]).await;
    let queue = create_queue("logical-refused", &[]).await;
    let (status, output) = run_to_end(
        &run_args(&db, &queue, sqs().endpoint(), &["--wakeup", "logical"]),
        &[],
        Duration::from_secs(30),
    )
    .await;
    assert!(!status.success(), "{output}");
    let errors = error_lines(&output);
    assert_eq!(errors.len(), 1, "one error line expected:\n{output}");
    assert!(errors[0].contains("wal_level"), "{output}");
    assert!(
        !output.contains(crate::support::pg().password()),
        "{output}"
    );
}
