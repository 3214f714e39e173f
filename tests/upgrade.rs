//! Upgrading without stopping the fleet: a schema newer than the running relays stops their
//! claims and a relay of the new version resumes; two versions deliver side by side while
//! `migrate` runs; a rolling replacement of three replicas under a steady durable load loses
//! nothing and keeps each FIFO group in order; `migrate --contract` waits for the last relay of
//! an older version.
//!
//! Relays of another version are this debug build with `OUTBOX_RELAY_TEST_VERSION`, which it
//! takes as its version everywhere the version matters (the contract, the registry, the
//! metric); what differs between versions is their place in the contract, not their code.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::fifo::{ids_by_event, order_violations};
use crate::scenario::{
    args, copies, count, events, insert, migrate, migrated_db, run_args, set_arg, wait_count,
    Producer,
};
use crate::support::pg::PrivatePg;
use crate::support::{
    create_queue, fresh_db, receive_all, run_to_end, sqs, wait_until, FaultProxy, RelayProcess,
    TestDb,
};

/// Makes a debug build of the relay act as another version.
const VERSION_ENV: &str = "OUTBOX_RELAY_TEST_VERSION";

/// The line a relay logs when the schema no longer admits it.
const REFUSAL: &str = "may not claim";

fn as_version(version: &str) -> Vec<(String, String)> {
    vec![(VERSION_ENV.to_string(), version.to_string())]
}

/// A replica with an id of its own, gauges and registry checks every second or so: with a 3 s
/// lease, a relay reads the schema's contract every second (a third of its lease).
fn replica_args(db: &TestDb, queue: &str, endpoint: &str, relay_id: &str) -> Vec<String> {
    let mut a = run_args(db, queue, endpoint, &["--relay-id", relay_id]);
    for (flag, value) in [
        ("--lease", "3s"),
        ("--send-timeout", "1s"),
        ("--settle-margin", "1s"),
        ("--stats-interval", "1s"),
    ] {
        set_arg(&mut a, flag, value);
    }
    a
}

async fn sent_total(relay: &RelayProcess) -> f64 {
    relay
        .metric("outbox_events_sent_total")
        .await
        .unwrap_or(0.0)
}

async fn scalar(client: &tokio_postgres::Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).await.expect(sql).get(0)
}

/// The database's clock now, to compare with what triggers and settlements record.
async fn db_now(client: &tokio_postgres::Client) -> std::time::SystemTime {
    client
        .query_one("SELECT clock_timestamp()", &[])
        .await
        .unwrap()
        .get(0)
}

/// Records the owner and time of every claim a relay inserts into `outbox_claims`.
async fn record_claims(client: &tokio_postgres::Client) {
    client
        .batch_execute(
            "CREATE TABLE claim_log (owner text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
             CREATE FUNCTION record_claim() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 INSERT INTO claim_log (owner) VALUES (NEW.owner);
                 RETURN NEW;
             END $$;
             CREATE TRIGGER record_claim AFTER INSERT ON outbox_claims
                 FOR EACH ROW EXECUTE FUNCTION record_claim();",
        )
        .await
        .unwrap();
}

/// Claims `owners` made after `since`, by the database's clock.
async fn claims_since(
    client: &tokio_postgres::Client,
    owners: &[&str],
    since: std::time::SystemTime,
) -> i64 {
    let owners: Vec<String> = owners.iter().map(|s| s.to_string()).collect();
    client
        .query_one(
            "SELECT count(*) FROM claim_log WHERE owner = ANY ($1) AND at > $2",
            &[&owners, &since],
        )
        .await
        .unwrap()
        .get(0)
}

/// `(relay_id, version, claiming)` of the relays `status --json` lists as live.
async fn listed_relays(db: &TestDb) -> Vec<(String, String, bool)> {
    let (status, output) = run_to_end(
        &args(&["status", "--json", "--database-url", &db.url]),
        &[],
        Duration::from_secs(30),
    )
    .await;
    assert!(status.success(), "status --json failed: {output}");
    let json: serde_json::Value = output
        .lines()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no JSON in: {output}"));
    let mut relays: Vec<(String, String, bool)> = json["relays"]
        .as_array()
        .unwrap_or_else(|| panic!("no relays in {json}"))
        .iter()
        .map(|r| {
            (
                r["relay_id"].as_str().unwrap().to_string(),
                r["version"].as_str().unwrap().to_string(),
                r["claiming"].as_bool().unwrap(),
            )
        })
        .collect();
    relays.sort();
    relays
}

/// How many times each event_id went to SQS, from the requests the proxy forwarded.
fn sends(proxy: &FaultProxy) -> HashMap<String, usize> {
    let mut by_id = HashMap::new();
    for id in proxy.sent_event_ids() {
        *by_id.entry(id).or_insert(0) += 1;
    }
    by_id
}

fn sorted(ids: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut ids: Vec<String> = ids.into_iter().collect();
    ids.sort();
    ids
}

/// Writers that commit one event per transaction on a schedule of `per_second` events in all,
/// each on its own connection and its own aggregates (`w{writer}-agg-{n}`): a group is written
/// by one writer, one commit after the other, so its `id` order is its commit order. (Two
/// writers sharing a group could commit its ids out of order, which no relay can put right.)
/// A writer that falls behind its schedule writes without pausing until it has caught up.
struct PacedWriters {
    committed: Arc<AtomicUsize>,
    tasks: Vec<tokio::task::JoinHandle<Vec<String>>>,
    started: Instant,
}

impl PacedWriters {
    fn start(
        db: &TestDb,
        prefix: &str,
        writers: usize,
        groups_per_writer: usize,
        per_second: f64,
        total: usize,
    ) -> PacedWriters {
        let committed = Arc::new(AtomicUsize::new(0));
        let started = Instant::now();
        let tasks = (0..writers)
            .map(|w| {
                let (url, done) = (db.url.clone(), committed.clone());
                // Event k of all is due at k / per_second; writer w writes k = w, w + writers, ...
                let own = (total + writers - 1 - w) / writers;
                let mut batch = events(&format!("{prefix}-w{w}"), own, groups_per_writer);
                for e in &mut batch {
                    e.aggregate_id = format!("w{w}-{}", e.aggregate_id);
                }
                tokio::spawn(async move {
                    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                        .await
                        .expect("writer connects");
                    tokio::spawn(async move {
                        let _ = connection.await;
                    });
                    let mut written = Vec::with_capacity(batch.len());
                    for (j, event) in batch.iter().enumerate() {
                        let due = started
                            + Duration::from_secs_f64((j * writers + w) as f64 / per_second);
                        tokio::time::sleep_until(due.into()).await;
                        insert(&client, std::slice::from_ref(event), Duration::ZERO).await;
                        written.push(event.event_id.clone());
                        done.fetch_add(1, Ordering::SeqCst);
                    }
                    written
                })
            })
            .collect();
        PacedWriters {
            committed,
            tasks,
            started,
        }
    }

    fn committed(&self) -> usize {
        self.committed.load(Ordering::SeqCst)
    }

    /// Waits for every writer; returns the event_ids committed and the rate they achieved.
    async fn finish(self) -> (Vec<String>, f64) {
        let mut all = Vec::new();
        for task in self.tasks {
            all.extend(task.await.expect("writer task"));
        }
        let rate = all.len() as f64 / self.started.elapsed().as_secs_f64();
        (all, rate)
    }
}

/// Samples the oldest unsent row's age (as `outbox_oldest_unsent_age_seconds` defines it) from
/// the table every 100 ms, keeping the peak since the last `take_peak`.
struct AgeSampler {
    peak_ms: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl AgeSampler {
    async fn start(db: &TestDb) -> AgeSampler {
        let client = db.client().await;
        let peak_ms = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (peak, stopped) = (peak_ms.clone(), stop.clone());
        let task = tokio::spawn(async move {
            while !stopped.load(Ordering::SeqCst) {
                let age: f64 = client
                    .query_one(
                        "SELECT coalesce(extract(epoch FROM clock_timestamp() - min(created_at)), 0)::float8
                         FROM outbox WHERE sent_at IS NULL AND quarantined_at IS NULL",
                        &[],
                    )
                    .await
                    .expect("oldest unsent age")
                    .get(0);
                peak.fetch_max((age * 1000.0) as usize, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        AgeSampler {
            peak_ms,
            stop,
            task,
        }
    }

    /// The peak age in seconds since the start or the last call, and a fresh start.
    fn take_peak(&self) -> f64 {
        self.peak_ms.swap(0, Ordering::SeqCst) as f64 / 1000.0
    }

    async fn stop(self) -> f64 {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.expect("age sampler");
        self.peak_ms.load(Ordering::SeqCst) as f64 / 1000.0
    }
}

/// A schema migrated past what the running relays may claim on, as a future `migrate` records
/// it: every relay stops claiming within a few seconds, releases what it held, answers not
/// ready and says why in one line, and keeps out while the application goes on writing; a relay
/// of the version the schema admits then delivers every row. Sends are counted at a proxy in
/// front of SQS, before the FIFO queue's deduplication could hide a second one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_newer_than_the_relays_stops_their_claims_and_a_newer_relay_resumes() {
    let db = migrated_db().await;
    let client = db.client().await;
    record_claims(&client).await;
    let queue = create_queue("newer-schema.fifo", &[]).await;
    let proxy = FaultProxy::start(sqs().endpoint());
    let old: Vec<RelayProcess> = ["old-a", "old-b"]
        .iter()
        .map(|id| {
            RelayProcess::spawn_named(id, &replica_args(&db, &queue, proxy.endpoint(), id), &[])
        })
        .collect();
    for relay in &old {
        wait_until("the relay is ready", Duration::from_secs(30), || async {
            relay.http_status("/readyz").await == 200
        })
        .await;
    }
    let producer = Producer::start(&db.url, "steady", 400, 2, Duration::from_millis(30));
    wait_until("both relays sent rows", Duration::from_secs(30), || async {
        sent_total(&old[0]).await > 0.0 && sent_total(&old[1]).await > 0.0
    })
    .await;

    client
        .batch_execute(
            "UPDATE outbox_relay_schema SET version = 5, relay_versions = '>=0.3.0'
             WHERE table_name = 'outbox'",
        )
        .await
        .unwrap();
    let migrated_at = db_now(&client).await;
    for relay in &old {
        let line = relay
            .wait_for_line(REFUSAL, Duration::from_secs(15))
            .await
            .unwrap_or_else(|| {
                panic!(
                    "{} did not stop claiming on schema 5:\n{}",
                    relay.name(),
                    relay.output()
                )
            });
        for part in [
            "outbox-relay 0.2.0 may not claim on \"outbox\"",
            "its schema (version 5) admits relays >=0.3.0",
            "deploy a relay that matches >=0.3.0",
        ] {
            assert!(line.contains(part), "{part:?} in {line}");
        }
        wait_until(
            "the relay answers not ready",
            Duration::from_secs(10),
            || async { relay.http_status("/readyz").await == 503 },
        )
        .await;
    }
    wait_until(
        "the old relays released their claims",
        Duration::from_secs(10),
        || async {
            crate::support::count_claims(&client, "owner IN ('old-a', 'old-b')").await == 0
        },
    )
    .await;
    wait_until(
        "the fleet's view counts both old relays refused",
        Duration::from_secs(10),
        || async {
            old[0]
                .metric("outbox_relays{version=\"0.2.0\",state=\"refused\"}")
                .await
                == Some(2.0)
        },
    )
    .await;
    let stopped_at = db_now(&client).await;
    let claims_after_refusal = claims_since(&client, &["old-a", "old-b"], migrated_at).await;

    // The application goes on writing for a few of the relays' contract checks.
    let written_before = count(&client, "true").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        claims_since(&client, &["old-a", "old-b"], stopped_at).await,
        0,
        "no claim after the relays said they stopped"
    );
    let sent_after: i64 = client
        .query_one(
            "SELECT count(*) FROM outbox WHERE sent_at > $1",
            &[&stopped_at],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(sent_after, 0, "nothing was sent after the relays stopped");
    let waiting = count(&client, "sent_at IS NULL").await;
    assert!(
        count(&client, "true").await > written_before && waiting > 0,
        "the application kept writing and its rows wait ({waiting} unsent)"
    );
    for relay in &old {
        assert!(
            relay.wait_exit(Duration::ZERO).await.is_none(),
            "{} keeps running, registered and refused:\n{}",
            relay.name(),
            relay.output()
        );
    }

    let newer = RelayProcess::spawn_named(
        "new-c",
        &replica_args(&db, &queue, proxy.endpoint(), "new-c"),
        &as_version("0.3.0"),
    );
    let report = producer.finish().await;
    let committed = sorted(report.events.iter().map(|e| e.event_id.clone()));
    let total = committed.len();
    wait_count(
        &client,
        "sent_at IS NOT NULL",
        total as i64,
        Duration::from_secs(60),
    )
    .await;
    let received = receive_all(&queue, total, Duration::from_secs(60)).await;
    let by_id = copies(&received);
    assert_eq!(
        sorted(by_id.keys().cloned()),
        committed,
        "exactly the committed events arrive"
    );
    let sent = sends(&proxy);
    let twice: Vec<_> = sent.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "events sent to SQS more than once: {twice:?}"
    );
    assert_eq!(sent.len(), total);
    let (violations, _) = order_violations(&received, &ids_by_event(&client).await);
    assert_eq!(violations, 0, "each group in order");

    let (a, b, c) = (
        sent_total(&old[0]).await,
        sent_total(&old[1]).await,
        sent_total(&newer).await,
    );
    assert_eq!(
        (a + b + c) as usize,
        total,
        "each row was settled once: old-a {a}, old-b {b}, new-c {c}"
    );
    assert!(c > 0.0, "the new relay resumed delivery");
    assert_eq!(
        claims_since(&client, &["old-a", "old-b"], stopped_at).await,
        0,
        "the old relays stayed out after the new one came"
    );
    assert_eq!(
        listed_relays(&db).await,
        vec![
            ("new-c".to_string(), "0.3.0".to_string(), true),
            ("old-a".to_string(), "0.2.0".to_string(), false),
            ("old-b".to_string(), "0.2.0".to_string(), false),
        ]
    );
    for relay in &old {
        assert_eq!(
            relay.output().matches(REFUSAL).count(),
            1,
            "one line says why:\n{}",
            relay.output()
        );
    }
    println!(
        "newer schema: {total} events, old relays sent {a} + {b}, claims they made between the \
         schema change and their refusal: {claims_after_refusal}, the new relay sent {c}"
    );
}

/// A build of the previous release, where `OUTBOX_TEST_PREVIOUS_RELAY` names one (a relay of
/// 0.1.x, which neither registers nor reads the contract).
fn previous_release() -> Option<PathBuf> {
    std::env::var_os("OUTBOX_TEST_PREVIOUS_RELAY")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
}

/// A relay of the previous version and one of this version share a FIFO queue while the
/// application writes on forty aggregates and `migrate` runs under them: both keep claiming
/// after it, nothing is lost, no row is settled twice, every group arrives in order, and
/// `migrate --contract` refuses while the previous version runs.
///
/// The previous version is this build acting as 0.1.5 on a table of this build's schema, both
/// relays running through the migrate; or, where `OUTBOX_TEST_PREVIOUS_RELAY` names a build of
/// the previous release, that build on the table its own `migrate` made (schema version 3),
/// which this `migrate` expands under it before this version's relay starts (a relay of this
/// version refuses a schema 3 table), as a Kubernetes migrate Job runs before the rollout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_versions_side_by_side_during_a_migrate_deliver_everything_in_order() {
    let previous_build = previous_release();
    let db = fresh_db().await;
    let queue = create_queue("side-by-side.fifo", &[]).await;
    let previous_args = replica_args(&db, &queue, sqs().endpoint(), "relay-previous");
    let current_args = replica_args(&db, &queue, sqs().endpoint(), "relay-current");
    let (previous, mut current) = match &previous_build {
        Some(binary) => {
            let migrate = RelayProcess::spawn_binary(
                binary,
                "previous-migrate",
                &args(&["migrate", "--database-url", &db.url]),
                &[],
            );
            let status = migrate.wait_exit(Duration::from_secs(60)).await;
            assert!(
                status.is_some_and(|s| s.success()),
                "the previous release's migrate: {}",
                migrate.output()
            );
            let previous = RelayProcess::spawn_binary(binary, "previous", &previous_args, &[]);
            (previous, None)
        }
        None => {
            migrate(&db, "outbox").await;
            let previous =
                RelayProcess::spawn_named("previous", &previous_args, &as_version("0.1.5"));
            let current = RelayProcess::spawn_named("current", &current_args, &[]);
            (previous, Some(current))
        }
    };
    let client = db.client().await;
    let total = 3_000;
    let writers = PacedWriters::start(&db, "side", 4, 10, 200.0, total);
    wait_until("the relays sent rows", Duration::from_secs(30), || async {
        sent_total(&previous).await > 0.0
            && match &current {
                Some(current) => sent_total(current).await > 0.0,
                None => true,
            }
    })
    .await;
    if let Some(current) = &current {
        wait_until(
            "the fleet's view has both versions claiming",
            Duration::from_secs(10),
            || async {
                let exposition = current.scrape().await;
                ["0.1.5", "0.2.0"].iter().all(|v| {
                    crate::support::metric_value(
                        &exposition,
                        &format!("outbox_relays{{version=\"{v}\",state=\"claiming\"}}"),
                    ) == Some(1.0)
                })
            },
        )
        .await;
    }

    let (status, output) = run_to_end(
        &args(&["migrate", "--database-url", &db.url]),
        &[],
        Duration::from_secs(60),
    )
    .await;
    assert!(status.success(), "migrate under the relays: {output}");
    let (version, admits): (i32, String) = {
        let row = client
            .query_one(
                "SELECT version, relay_versions FROM outbox_relay_schema WHERE table_name = 'outbox'",
                &[],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!(
        (version, admits.as_str()),
        (outbox_relay::version::NEEDS_SCHEMA, ">=0.1.0"),
        "migrate expands only: the previous version stays admitted"
    );
    let current =
        current.get_or_insert_with(|| RelayProcess::spawn_named("current", &current_args, &[]));
    let after_migrate = (sent_total(&previous).await, sent_total(current).await);
    assert!(
        writers.committed() < total,
        "the application was still writing when migrate ended"
    );
    wait_until(
        "both versions claim after the migrate",
        Duration::from_secs(30),
        || async {
            sent_total(&previous).await > after_migrate.0
                && sent_total(current).await > after_migrate.1
        },
    )
    .await;

    let (committed, _) = writers.finish().await;
    wait_count(
        &client,
        "sent_at IS NOT NULL",
        total as i64,
        Duration::from_secs(60),
    )
    .await;
    let received = receive_all(&queue, total, Duration::from_secs(60)).await;
    assert_eq!(
        sorted(copies(&received).into_keys()),
        sorted(committed),
        "every committed event arrives"
    );
    let (violations, by_group) = order_violations(&received, &ids_by_event(&client).await);
    assert_eq!(by_group.len(), 40);
    assert_eq!(violations, 0, "each group in order");
    let (old_sent, new_sent) = (sent_total(&previous).await, sent_total(current).await);
    assert_eq!(
        (old_sent + new_sent) as usize,
        total,
        "each row was settled once: the previous version sent {old_sent}, this one {new_sent}"
    );

    // The previous version is alive: the contract step waits for it.
    let (status, output) = run_to_end(
        &args(&["migrate", "--contract", "--database-url", &db.url]),
        &[],
        Duration::from_secs(60),
    )
    .await;
    assert!(
        !status.success(),
        "contract with the previous version running: {output}"
    );
    let naming = match previous_build {
        Some(_) => "application_name 'outbox-relay'",
        None => "relay relay-previous (0.1.5",
    };
    assert!(output.contains(naming), "{naming:?} in {output}");

    for relay in [&previous, &*current] {
        relay.sigterm();
        let status = relay
            .wait_exit(Duration::from_secs(30))
            .await
            .expect("the relay stops on SIGTERM");
        assert!(status.success(), "{}", relay.output());
        assert!(!relay.output().contains(REFUSAL), "{}", relay.output());
    }
    println!(
        "side by side ({}): {total} events on 40 groups, the previous version sent {old_sent} \
         (after migrate: {}), this one {new_sent} (after migrate: {})",
        match previous_build {
            Some(_) => "a build of the previous release from schema version 3",
            None => "this build as 0.1.5",
        },
        old_sent - after_migrate.0,
        new_sent - after_migrate.1
    );
}

/// Events per second the application commits during the rollout.
const ROLLOUT_RATE: f64 = 1_000.0;
/// Seconds of load: steady before the first replacement, then the three, then steady again.
const ROLLOUT_LOAD_SECS: usize = 30;
const ROLLOUT_WRITERS: usize = 16;

/// Replicas of the rollout: a lease long enough that a busy machine never lets one end under a
/// healthy relay; the rollout itself ends no lease (SIGTERM releases what is not sent).
fn rollout_args(db: &TestDb, queue: &str, endpoint: &str, relay_id: &str) -> Vec<String> {
    let mut a = replica_args(db, queue, endpoint, relay_id);
    for (flag, value) in [
        ("--lease", "10s"),
        ("--send-timeout", "5s"),
        ("--settle-margin", "3s"),
    ] {
        set_arg(&mut a, flag, value);
    }
    a
}

/// Kubernetes' `RollingUpdate` of three replicas, one at a time (SIGTERM, wait until it exits,
/// start the new version, wait until it is ready), while the application commits 1,000 events a
/// second, one per transaction, on durable commits (`fsync` and `synchronous_commit` on, in a
/// cluster of the test's own: the shared one runs with `fsync=off`). No committed event is lost
/// and every FIFO group arrives in order. Copies (sends of an event beyond its first, counted at
/// a proxy in front of SQS) are allowed by at-least-once delivery and reported, as is the oldest
/// unsent row's peak age before and during the rollout, in one `rollout:` line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_replacement_under_load_loses_nothing_and_keeps_order() {
    let cluster = PrivatePg::start_with(&["fsync=on", "synchronous_commit=on"]).await;
    let db = cluster.create_db().await;
    migrate(&db, "outbox").await;
    let client = db.client().await;
    let durable: Vec<String> = client
        .query(
            "SELECT setting FROM pg_settings WHERE name IN ('fsync', 'synchronous_commit') ORDER BY name",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(durable, ["on", "on"], "durable commits");
    let queue = create_queue("rollout.fifo", &[]).await;
    let proxy = FaultProxy::start(sqs().endpoint());
    let endpoint = proxy.endpoint().to_string();
    let mut replicas: Vec<RelayProcess> = (0..3)
        .map(|i| {
            let id = format!("old-{i}");
            RelayProcess::spawn_named(&id, &rollout_args(&db, &queue, &endpoint, &id), &[])
        })
        .collect();
    for relay in &replicas {
        wait_until("the replica is ready", Duration::from_secs(30), || async {
            relay.http_status("/readyz").await == 200
        })
        .await;
    }
    let total = ROLLOUT_RATE as usize * ROLLOUT_LOAD_SECS;
    let ages = AgeSampler::start(&db).await;
    let writers = PacedWriters::start(&db, "roll", ROLLOUT_WRITERS, 25, ROLLOUT_RATE, total);

    // Steady load first, for a baseline of the oldest unsent age; the first seconds, while the
    // relays make their first claims and size their requests, are left out of it.
    tokio::time::sleep(Duration::from_secs(3)).await;
    ages.take_peak();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let peak_before = ages.take_peak();
    let rollout_started = Instant::now();
    for (slot, replica) in replicas.iter_mut().enumerate() {
        replica.sigterm();
        let status = replica
            .wait_exit(Duration::from_secs(60))
            .await
            .unwrap_or_else(|| panic!("{} did not stop after SIGTERM", replica.name()));
        assert!(status.success(), "{}", replica.output());
        let id = format!("new-{slot}");
        *replica = RelayProcess::spawn_named(
            &id,
            &rollout_args(&db, &queue, &endpoint, &id),
            &as_version("0.2.1"),
        );
        let fresh = &*replica;
        wait_until(
            "the new replica is ready",
            Duration::from_secs(60),
            || async { fresh.http_status("/readyz").await == 200 },
        )
        .await;
        // Kubernetes' minReadySeconds: the new pod serves a while before the next one goes.
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let rollout_took = rollout_started.elapsed();
    let peak_during = ages.take_peak();
    let written_during_rollout = writers.committed();

    let (committed, rate) = writers.finish().await;
    let drain_started = Instant::now();
    wait_count(
        &client,
        "sent_at IS NOT NULL",
        total as i64,
        Duration::from_secs(180),
    )
    .await;
    let drained_in = drain_started.elapsed();
    let peak_after = ages.stop().await;
    // Received only now: a consumer on the same two cores during the load (the SDK's parsing in
    // a debug build) took enough CPU to make the relays lag seconds behind, which would hide
    // what the rollout does to the oldest unsent age.
    let received = receive_all(&queue, total, Duration::from_secs(120)).await;

    let committed_set: HashSet<&String> = committed.iter().collect();
    let by_id = copies(&received);
    let lost = committed
        .iter()
        .filter(|id| !by_id.contains_key(*id))
        .count();
    let strangers = by_id
        .keys()
        .filter(|id| !committed_set.contains(id))
        .count();
    let (violations, by_group) = order_violations(&received, &ids_by_event(&client).await);
    let sent = sends(&proxy);
    let sends_total: usize = sent.values().sum();
    let copies_sent = sends_total - sent.len();
    let events_with_copies = sent.values().filter(|&&n| n > 1).count();
    println!(
        "rollout: events={total} writers={ROLLOUT_WRITERS} rate={rate:.0}/s durable=fsync+synchronous_commit \
         replicas=3 replaced=3 lost={lost} copies={copies_sent} (events sent more than once: \
         {events_with_copies}) order_violations={violations} groups={} \
         peak_oldest_unsent_age={peak_during:.2}s (steady before: {peak_before:.2}s, after: \
         {peak_after:.2}s) rollout_took={:.1}s written_by_end_of_rollout={written_during_rollout} \
         drained_after_writers_in={:.1}s",
        by_group.len(),
        rollout_took.as_secs_f64(),
        drained_in.as_secs_f64(),
    );
    assert_eq!(committed.len(), total);
    assert_eq!(lost, 0, "every committed event arrives");
    assert_eq!(strangers, 0, "nothing arrives that was not committed");
    assert_eq!(violations, 0, "each group in order");
    assert_eq!(by_group.len(), ROLLOUT_WRITERS * 25);
    assert!(
        sent.keys().all(|id| committed_set.contains(id)),
        "every send carries a committed event_id"
    );
    assert!(
        written_during_rollout < total,
        "the rollout ran under load ({written_during_rollout} of {total} written by its end)"
    );

    // The replaced relays drop off the registry (after their lease at the latest).
    wait_until(
        "the registry lists the three new replicas only",
        Duration::from_secs(30),
        || async {
            listed_relays(&db).await
                == (0..3)
                    .map(|i| (format!("new-{i}"), "0.2.1".to_string(), true))
                    .collect::<Vec<_>>()
        },
    )
    .await;
    for replica in &replicas {
        replica.sigterm();
        let status = replica
            .wait_exit(Duration::from_secs(30))
            .await
            .expect("the replica stops on SIGTERM");
        assert!(status.success(), "{}", replica.output());
    }
}

/// `migrate --contract` drops what only relays before 0.2.0 read (the lease columns on the
/// outbox rows), so it refuses while one may be alive: a session named as those relays named
/// theirs, a claim whose owner is not registered (such relays do not register), a registered
/// relay of an older version. A relay that stops on SIGTERM withdraws its registration; one that
/// was killed stays registered until its lease runs out. Once none is left, the contract drops
/// the columns, admits only relays from 0.2.0 on (an older one now refuses to start), and a relay
/// of this version still delivers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_refuses_while_an_older_relay_is_alive() {
    let db = migrated_db().await;
    let client = db.client().await;
    let contract = args(&["migrate", "--contract", "--database-url", &db.url]);
    let lease_columns = "SELECT count(*) FROM information_schema.columns
                         WHERE table_schema = 'public' AND table_name = 'outbox'
                           AND column_name IN ('lease_owner', 'lease_until', 'lease_token')";
    let refused = |output: &str, naming: &str| {
        let errors: Vec<&str> = output.lines().filter(|l| l.starts_with("error:")).collect();
        assert_eq!(errors.len(), 1, "one line says why:\n{output}");
        assert!(errors[0].contains(naming), "{naming:?} in {}", errors[0]);
    };
    let run_contract = || async { run_to_end(&contract, &[], Duration::from_secs(60)).await };

    // A session named as relays before 0.2.0 named theirs.
    let (session, connection) = tokio_postgres::connect(
        &format!("{}?application_name=outbox-relay", db.url),
        tokio_postgres::NoTls,
    )
    .await
    .unwrap();
    let session_task = tokio::spawn(connection);
    let pid: i32 = session
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let (status, output) = run_contract().await;
    assert!(
        !status.success(),
        "a relay before 0.2.0 may be connected:\n{output}"
    );
    refused(
        &output,
        &format!("session {pid} (application_name 'outbox-relay'"),
    );
    drop(session);
    let _ = session_task.await;
    wait_until("the session is gone", Duration::from_secs(10), || async {
        client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND application_name = 'outbox-relay'",
                &[],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
            == 0
    })
    .await;

    // A claim held by a relay that never registered.
    client
        .batch_execute(
            "INSERT INTO outbox_claims (owner, until, ids)
             VALUES ('unregistered-0.1.0', now() + interval '1 hour', '{}')",
        )
        .await
        .unwrap();
    let (status, output) = run_contract().await;
    assert!(
        !status.success(),
        "an unregistered relay holds a claim:\n{output}"
    );
    refused(&output, "lease owner 'unregistered-0.1.0'");
    client
        .batch_execute("DELETE FROM outbox_claims WHERE owner = 'unregistered-0.1.0'")
        .await
        .unwrap();

    // Registered relays of an older version: one stops on SIGTERM and withdraws its
    // registration; the other is killed and stays registered until its lease runs out (6 s,
    // renewed every 2 s, so the refusal below has 4 s at least).
    let queue = create_queue("contract", &[]).await;
    let stopping = RelayProcess::spawn_named(
        "stopping",
        &replica_args(&db, &queue, sqs().endpoint(), "relay-0.1.5-stopping"),
        &as_version("0.1.5"),
    );
    let mut killed_args = replica_args(&db, &queue, sqs().endpoint(), "relay-0.1.5-killed");
    set_arg(&mut killed_args, "--lease", "6s");
    let killed = RelayProcess::spawn_named("killed", &killed_args, &as_version("0.1.5"));
    for relay in [&stopping, &killed] {
        wait_until(
            "the older relay is ready",
            Duration::from_secs(30),
            || async { relay.http_status("/readyz").await == 200 },
        )
        .await;
    }
    let (status, output) = run_contract().await;
    assert!(!status.success(), "relays 0.1.5 are alive:\n{output}");
    refused(&output, "relay relay-0.1.5-killed (0.1.5");
    refused(&output, "relay relay-0.1.5-stopping (0.1.5");
    assert_eq!(
        scalar(&client, lease_columns).await,
        3,
        "a refused contract changes nothing"
    );

    stopping.sigterm();
    let status = stopping
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("the older relay stops on SIGTERM");
    assert!(status.success(), "{}", stopping.output());
    killed.kill9();
    killed
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("killed");
    let (status, output) = run_contract().await;
    assert!(
        !status.success(),
        "the killed relay's registration is live:\n{output}"
    );
    refused(&output, "relay relay-0.1.5-killed (0.1.5");
    assert!(
        !output.contains("relay-0.1.5-stopping"),
        "a relay that stopped withdrew its registration: {output}"
    );
    wait_until(
        "the killed relay's registration lapsed",
        Duration::from_secs(20),
        || async {
            scalar(
                &client,
                "SELECT count(*) FROM outbox_relays WHERE seen_until > now()",
            )
            .await
                == 0
        },
    )
    .await;
    for attempt in ["the contract", "the contract again (idempotent)"] {
        let (status, output) = run_contract().await;
        assert!(status.success(), "{attempt}: {output}");
    }
    assert_eq!(
        scalar(&client, lease_columns).await,
        0,
        "the lease columns are gone"
    );
    let admits: String = client
        .query_one(
            "SELECT relay_versions FROM outbox_relay_schema WHERE table_name = 'outbox'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(admits, ">=0.2.0");

    // Relays before 0.2.0 may no longer claim on it; this version delivers.
    let refused_args = replica_args(&db, &queue, sqs().endpoint(), "relay-0.1.5-again");
    let (status, output) =
        run_to_end(&refused_args, &as_version("0.1.5"), Duration::from_secs(30)).await;
    assert!(!status.success(), "0.1.5 refuses to start:\n{output}");
    assert!(output.contains(REFUSAL), "{output}");
    let written = events("after-contract", 50, 5);
    insert(&client, &written, Duration::ZERO).await;
    let current = RelayProcess::spawn_named(
        "current",
        &replica_args(&db, &queue, sqs().endpoint(), "relay-0.2.0"),
        &[],
    );
    wait_count(&client, "sent_at IS NOT NULL", 50, Duration::from_secs(60)).await;
    let received = receive_all(&queue, 50, Duration::from_secs(60)).await;
    assert_eq!(
        sorted(copies(&received).into_keys()),
        sorted(written.into_iter().map(|e| e.event_id)),
    );
    current.sigterm();
    let status = current
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("the relay stops on SIGTERM");
    assert!(status.success(), "{}", current.output());
}
