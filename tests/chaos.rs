//! Everything at once: a producer writing 20,000 events while three relays are killed and
//! restarted, every proxy fault comes and goes and PostgreSQL crashes once. Afterwards every
//! row is sent, every event arrived, and every copy is its own row's message.
//!
//! Runs on fauxqs only: scripts/test runs just `sqs_contract` tests on moto.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::scenario::{attr, migrate, relay_args_for, set_arg, wait_count, Producer};
use crate::support::pg::PrivatePg;
use crate::support::{create_queue, receive_all, sqs, FaultProxy, Mode, RelayProcess, TestDb};

const BATCHES: usize = 200;
const BATCH_SIZE: usize = 100;
const EVENTS: usize = BATCHES * BATCH_SIZE;
const RELAYS: usize = 3;
const KILLS: usize = 12;
/// Faults beyond one of each mode, picked at random.
const EXTRA_FAULTS: usize = 3;

/// What the table says about one event at the end.
struct Row {
    payload: serde_json::Value,
    event_type: String,
    aggregate_id: String,
    message_id: String,
    sent: bool,
    quarantined: bool,
}

#[derive(Clone, Copy, Debug)]
enum Action {
    Kill,
    Fault(Mode),
    PgCrash,
}

/// Short leases so a killed relay's rows come back within seconds; a send timeout below the
/// longest injected delay so some delayed sends time out after SQS took them.
fn relay_args(db: &TestDb, queue: &str, endpoint: &str, relay_id: &str) -> Vec<String> {
    let mut args = relay_args_for(db, queue, endpoint, relay_id);
    set_arg(&mut args, "--batch-size", "40");
    args
}

fn random_mode(rng: &mut fastrand::Rng) -> Mode {
    match rng.usize(0..7) {
        0 => Mode::Delay(Duration::from_millis(rng.u64(200..=1500))),
        1 => Mode::Error500,
        2 => Mode::Throttle,
        3 => Mode::Reset,
        4 => Mode::BlackHole,
        5 => Mode::DropResponse,
        _ => Mode::Hold,
    }
}

async fn pause(rng: &mut fastrand::Rng, millis: std::ops::Range<u64>) {
    tokio::time::sleep(Duration::from_millis(rng.u64(millis))).await;
}

struct Fleet<'a> {
    db: &'a TestDb,
    queue: String,
    endpoint: String,
    relays: Vec<RelayProcess>,
    spawned: usize,
    kills: usize,
}

impl Fleet<'_> {
    fn spawn(&mut self, slot: usize) -> RelayProcess {
        self.spawned += 1;
        let id = format!("chaos-{slot}-{}", self.spawned);
        RelayProcess::spawn_named(
            &id,
            &relay_args(self.db, &self.queue, &self.endpoint, &id),
            &[],
        )
    }

    /// Fails the test if a relay ended without being killed: faults must never end a relay.
    async fn assert_all_running(&self) {
        for relay in &self.relays {
            if let Some(status) = relay.wait_exit(Duration::ZERO).await {
                panic!(
                    "{} exited on its own with {status}:\n{}",
                    relay.name(),
                    relay.output()
                );
            }
        }
    }

    async fn kill_one(&mut self, rng: &mut fastrand::Rng) {
        self.assert_all_running().await;
        let slot = rng.usize(0..self.relays.len());
        self.relays[slot].kill9();
        self.relays[slot]
            .wait_exit(Duration::from_secs(10))
            .await
            .expect("a killed relay exits");
        self.relays[slot] = self.spawn(slot);
        self.kills += 1;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_thousand_events_survive_relay_kills_queue_failures_and_a_postgresql_crash() {
    let seed = std::env::var("OUTBOX_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    // Timing still varies from run to run; the seed fixes the schedule of faults.
    eprintln!("chaos: seed={seed} (OUTBOX_CHAOS_SEED={seed} repeats the schedule)");
    let mut rng = fastrand::Rng::with_seed(seed);
    let started = Instant::now();

    let cluster = PrivatePg::start().await;
    let db = cluster.create_db().await;
    migrate(&db, "outbox").await;
    let queue = create_queue("chaos", &[]).await;
    let proxy = FaultProxy::start(sqs().endpoint());
    let mut fleet = Fleet {
        db: &db,
        queue: queue.clone(),
        endpoint: proxy.endpoint().to_string(),
        relays: Vec::new(),
        spawned: 0,
        kills: 0,
    };
    for slot in 0..RELAYS {
        let relay = fleet.spawn(slot);
        fleet.relays.push(relay);
    }
    let producer = Producer::start(
        &db.url,
        "chaos",
        BATCHES,
        BATCH_SIZE,
        Duration::from_millis(200),
    );

    let mut plan: Vec<Action> = vec![Action::Kill; KILLS];
    plan.extend(
        [
            Mode::Delay(Duration::from_millis(rng.u64(200..=1500))),
            Mode::Error500,
            Mode::Throttle,
            Mode::Reset,
            Mode::BlackHole,
            Mode::DropResponse,
            Mode::Hold,
        ]
        .map(Action::Fault),
    );
    for _ in 0..EXTRA_FAULTS {
        plan.push(Action::Fault(random_mode(&mut rng)));
    }
    plan.push(Action::PgCrash);
    rng.shuffle(&mut plan);

    let mut faults = 0;
    let mut pg_restarts = 0;
    for action in plan {
        pause(&mut rng, 300..1500).await;
        match action {
            Action::Kill => fleet.kill_one(&mut rng).await,
            Action::Fault(mode) => {
                proxy.set_mode(mode);
                faults += 1;
                pause(&mut rng, 500..1500).await;
                // Relays also die while the queue is failing them.
                if rng.bool() {
                    fleet.kill_one(&mut rng).await;
                }
                pause(&mut rng, 500..1500).await;
                proxy.set_mode(Mode::Pass);
            }
            Action::PgCrash => {
                cluster.kill_immediate().await;
                pg_restarts += 1;
                pause(&mut rng, 500..2000).await;
                cluster.start_again().await;
            }
        }
    }
    eprintln!(
        "chaos: schedule done after {:?}; producer at {}/{BATCHES} batches",
        started.elapsed(),
        producer.committed_batches()
    );

    let report = producer.finish().await;
    let client = db.client().await;
    wait_count(
        &client,
        "sent_at IS NOT NULL OR quarantined_at IS NOT NULL",
        EVENTS as i64,
        Duration::from_secs(180),
    )
    .await;
    fleet.assert_all_running().await;
    // A relay respawned a moment ago may not have its signal handlers yet, and SIGTERM's
    // default action would end it with the signal rather than a drain and exit 0.
    for relay in &fleet.relays {
        relay
            .wait_for_line("relay started", Duration::from_secs(60))
            .await
            .unwrap_or_else(|| panic!("{} never started:\n{}", relay.name(), relay.output()));
    }
    for relay in &fleet.relays {
        relay.sigterm();
    }
    for relay in &fleet.relays {
        let status = relay
            .wait_exit(Duration::from_secs(30))
            .await
            .expect("a relay stops after SIGTERM");
        assert!(status.success(), "{} exited with {status}", relay.name());
    }
    // No request is still waiting in the proxy to reach SQS after the queue has been drained.
    drop(proxy);
    eprintln!("chaos: all sent after {:?}", started.elapsed());

    let rows = client
        .query(
            "SELECT event_id, payload::text, event_type, aggregate_id, coalesce(message_id, ''), \
                    sent_at IS NOT NULL, quarantined_at IS NOT NULL \
             FROM outbox",
            &[],
        )
        .await
        .expect("read the outbox");
    let table: HashMap<String, Row> = rows
        .iter()
        .map(|r| {
            let payload: String = r.get(1);
            (
                r.get(0),
                Row {
                    payload: serde_json::from_str(&payload).expect("payload is JSON"),
                    event_type: r.get(2),
                    aggregate_id: r.get(3),
                    message_id: r.get(4),
                    sent: r.get(5),
                    quarantined: r.get(6),
                },
            )
        })
        .collect();

    let received = receive_all(&queue, EVENTS, Duration::from_secs(180)).await;
    let mut violations = Vec::new();
    let mut copies: HashMap<&str, usize> = HashMap::new();
    let mut message_ids: HashSet<&str> = HashSet::new();
    for m in &received {
        let Some(id) = attr(m, "event_id") else {
            violations.push(format!("a message without event_id: {m:?}"));
            continue;
        };
        let Some(row) = table.get(id) else {
            violations.push(format!("a message for an event nobody wrote: {id}"));
            continue;
        };
        *copies.entry(id).or_default() += 1;
        message_ids.extend(m.message_id());
        let body: Option<serde_json::Value> = m.body().and_then(|b| serde_json::from_str(b).ok());
        if body.as_ref() != Some(&row.payload)
            || attr(m, "event_type") != Some(row.event_type.as_str())
            || attr(m, "aggregate_id") != Some(row.aggregate_id.as_str())
        {
            violations.push(format!("a copy of {id} is not its row's message: {m:?}"));
        }
    }
    let mut lost = 0;
    for (id, row) in &table {
        if !copies.contains_key(id.as_str()) {
            lost += 1;
            violations.push(format!("{id} never arrived"));
        }
        if !row.sent || row.quarantined {
            violations.push(format!(
                "{id} ended sent={} quarantined={}",
                row.sent, row.quarantined
            ));
        } else if !message_ids.contains(row.message_id.as_str()) {
            violations.push(format!(
                "{id} is marked with MessageId {}, which SQS never delivered",
                row.message_id
            ));
        }
    }
    let written: HashSet<&str> = report.events.iter().map(|e| e.event_id.as_str()).collect();
    if written.len() != EVENTS || table.len() != EVENTS {
        violations.push(format!(
            "{} events written, {} rows in the table; expected {EVENTS}",
            written.len(),
            table.len()
        ));
    }
    lost += written
        .iter()
        .filter(|id| !table.contains_key(**id))
        .count();
    let duplicates: usize = copies.values().map(|c| c - 1).sum();

    for v in violations.iter().take(20) {
        eprintln!("chaos: VIOLATION {v}");
    }
    eprintln!(
        "chaos: {} relays started, producer retries {}, {} messages received, took {:?}",
        fleet.spawned,
        report.retries,
        received.len(),
        started.elapsed()
    );
    println!(
        "chaos: events={} kills={} faults={faults} pg_restarts={pg_restarts} duplicates={duplicates} lost={lost}",
        table.len(),
        fleet.kills
    );
    assert!(
        violations.is_empty(),
        "{} violations, first: {:?}",
        violations.len(),
        violations.first()
    );
    assert_eq!(lost, 0);
    assert!(fleet.kills >= 10 && faults >= 7 && pg_restarts == 1);
}
