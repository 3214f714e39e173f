//! The checker checked: a clean history made by hand must pass, and each copy of it broken in
//! one way must be reported under the invariant it breaks. Pure, so it runs before the CI seeds
//! (and with `--self-test`) in a fraction of a second.

use crate::check::check;
use crate::history::Change;
use crate::plan::{Dest, Hazard, Plan, Poison, RowSpec, Txn};
use crate::world::{Evidence, Quiet, Reading, Received, Sample};

const QUEUE: &str = "q.fifo";

fn plan() -> Plan {
    let mut plan = Plan::draw(0, 0);
    plan.faults.clear();
    plan.ops.clear();
    plan.fleet.dest = Dest::Fifo;
    plan.fleet.skip_poison = true;
    plan.fleet.order_by_transaction = false;
    let row = |e: &str| RowSpec {
        event_id: e.to_string(),
        aggregate_type: "a0".to_string(),
        aggregate_id: "g1".to_string(),
        poison: None,
    };
    plan.horizon.clear();
    plan.hazard = None;
    plan.workload.late.clear();
    plan.workload.writers = vec![vec![Txn {
        rows: vec![row("ev-1"), row("ev-2")],
        hold_ms: 0,
    }]];
    plan
}

fn insert(id: i64, txid: i64, at: f64) -> Change {
    Change {
        at,
        txid,
        tbl: "outbox".into(),
        op: "I".into(),
        id: Some(id),
        event_id: Some(format!("ev-{id}")),
        group_key: Some("g1".into()),
        ..Change::default()
    }
}

fn lease(op: &str, token: i64, owner: &str, ids: &[i64], txid: i64, at: f64) -> Change {
    Change {
        at,
        txid,
        app: owner.into(),
        tbl: "claims".into(),
        op: op.into(),
        token: Some(token),
        owner: Some(owner.into()),
        until: Some(100.0),
        ids: ids.to_vec(),
        ..Change::default()
    }
}

fn sent(id: i64, by: &str, txid: i64, at: f64) -> Change {
    Change {
        at,
        txid,
        app: by.into(),
        tbl: "outbox".into(),
        op: "U".into(),
        id: Some(id),
        event_id: Some(format!("ev-{id}")),
        old_sent: Some(false),
        new_sent: Some(true),
        old_attempts: Some(0),
        new_attempts: Some(1),
        ..Change::default()
    }
}

fn message(id: i64) -> Received {
    Received {
        queue: QUEUE.into(),
        event_id: Some(format!("ev-{id}")),
        aggregate_id: Some("g1".into()),
        group_id: Some("g1".into()),
        body: format!(r#"{{"ev":"ev-{id}"}}"#),
    }
}

/// Two rows of one group, each claimed, sent and settled in turn by relay r0.
fn clean() -> Evidence {
    Evidence {
        changes: vec![
            insert(1, 10, 1.0),
            insert(2, 11, 1.1),
            lease("I", 1, "r0", &[1], 20, 2.0),
            lease("D", 1, "r0", &[1], 21, 2.5),
            sent(1, "r0", 21, 2.5),
            lease("I", 2, "r0", &[2], 30, 3.0),
            lease("D", 2, "r0", &[2], 31, 3.5),
            sent(2, "r0", 31, 3.5),
        ],
        received: vec![message(1), message(2)],
        default_queue: QUEUE.into(),
        settled: true,
        quiet: Some(Quiet {
            status_unsent: Some(0),
            status_age: Some(0.0),
            gauge_unsent: Some(0.0),
            gauge_age: Some(0.0),
            ..Quiet::default()
        }),
        signal: vec![sample(10.0, 9.0, &[("r0", 9.0, 9.8, 10.0)])],
        ..Evidence::default()
    }
}

/// A sample at `at` whose oldest unsent row (id 1), created at `created`, every relay's read
/// could know of; each reading `(relay, oldest, last_read, scraped)`.
fn sample(at: f64, created: f64, readings: &[(&str, f64, f64, f64)]) -> Sample {
    Sample {
        at,
        start: 0.0,
        readings: readings
            .iter()
            .map(|&(relay, oldest, last_read, scraped)| Reading {
                relay: relay.into(),
                oldest,
                last_read,
                up: 1.0,
                scraped,
            })
            .collect(),
        truth: Some(created),
        unsent: 1,
        known: Some((created, 1)),
        lower: Some(created),
    }
}

/// Each case: a name, how it breaks the clean history, the invariant that must report it.
type Case = (&'static str, fn(&mut Plan, &mut Evidence), &'static str);

const CASES: &[Case] = &[
    (
        "a copy without faults",
        |_, ev| ev.received.push(message(1)),
        "a seed without faults delivers every row exactly once",
    ),
    (
        "a message of a row whose transaction rolled back",
        |_, ev| {
            let mut void = message(3);
            void.event_id = Some("void-0-1".into());
            void.body = r#"{"ev":"void-0-1"}"#.into();
            ev.received.push(void);
        },
        "only committed rows are delivered",
    ),
    (
        "a row neither received nor quarantined",
        |_, ev| {
            ev.received.pop();
        },
        "no committed row is lost",
    ),
    (
        "a group's second row leased before the first was settled",
        |_, ev| ev.changes[5].at = 2.2,
        "never two rows of one group in flight at once",
    ),
    (
        "a FIFO group received out of order",
        |_, ev| ev.received.reverse(),
        "a FIFO group's first deliveries come in the documented order",
    ),
    (
        "a relay settles a row after its claim was taken over",
        |_, ev| {
            // r1's claim takes r0's expired claim 2 over; then r0 marks the row sent anyway.
            ev.changes.truncate(6);
            ev.changes.push(lease("D", 2, "r0", &[2], 40, 4.0));
            let mut takeover = lease("I", 3, "r1", &[2], 40, 4.0);
            takeover.app = "r1".into();
            ev.changes.push(takeover);
            ev.changes.push(sent(2, "r0", 41, 4.2));
        },
        "a relay whose claim was taken over changes nothing",
    ),
    (
        "an attempt counted by the takeover of an unfaulted relay's claim",
        |_, ev| {
            ev.changes.truncate(6);
            ev.changes.push(lease("D", 2, "r0", &[2], 40, 4.0));
            ev.changes.push(lease("I", 3, "r1", &[2], 40, 4.0));
            let mut attempt = sent(2, "r1", 40, 4.0);
            attempt.new_sent = Some(false);
            ev.changes.push(attempt);
            ev.changes.push(lease("D", 3, "r1", &[2], 41, 4.5));
            ev.changes.push(sent(2, "r1", 41, 4.5));
        },
        "attempts are spent only by a row's own outcomes",
    ),
    (
        "a leased row parked",
        |_, ev| {
            let mut park = sent(2, "r1", 35, 3.2);
            park.old_sent = Some(false);
            park.new_sent = Some(false);
            park.old_attempts = Some(0);
            park.new_attempts = Some(0);
            park.new_reason = Some("blocked".into());
            ev.changes.push(park);
        },
        "parking leaves a row a live claim holds alone",
    ),
    (
        "a row delivered behind its group's poisoned row under --on-poison block",
        |plan, ev| {
            plan.fleet.skip_poison = false;
            ev.poison.insert("ev-1".into(), Poison::Invalid);
        },
        "with --on-poison block, nothing after a poisoned row of its group is delivered",
    ),
    (
        "a gauge that disagrees with the table",
        |_, ev| ev.quiet.as_mut().unwrap().gauge_unsent = Some(3.0),
        "outbox_oldest_unsent_age_seconds and outbox_unsent_rows agree with the table",
    ),
    (
        "an age gauge left at its value from before an outage",
        |_, ev| ev.quiet.as_mut().unwrap().gauge_age = Some(30.0),
        "outbox_oldest_unsent_age_seconds and outbox_unsent_rows agree with the table",
    ),
    (
        // The age gauge's lie of issue 45 as a time: the relay read the row at t=105, then
        // could not read, and exported now - the age it read instead of the row's time.
        "an oldest-unsent time moving on from an age frozen at an old read",
        |_, ev| {
            let mut frozen = sample(185.0, 100.0, &[("r0", 175.0, 105.0, 185.0)]);
            frozen.readings[0].up = 0.0;
            ev.signal.push(frozen);
        },
        "the age a scraper derives from /metrics never hides a waiting row",
    ),
    (
        "an oldest-unsent time older than any row waiting since the freshest read",
        |_, ev| {
            ev.signal
                .push(sample(20.0, 19.0, &[("r0", 5.0, 19.5, 20.0)]))
        },
        "the age a scraper derives from /metrics overstates by at most the time since the freshest read it derives from",
    ),
    (
        "status that disagrees with the table",
        |_, ev| ev.quiet.as_mut().unwrap().status_age = Some(30.0),
        "`status --json` agrees with the table",
    ),
    (
        "a pooled application session reading synchronous_commit = off",
        |_, ev| ev.pool_leaks.push("synchronous_commit=off".into()),
        "an application session through the pool reads the server's defaults",
    ),
    (
        "a relay that exited at start-up",
        |_, ev| {
            ev.startup_exits
                .push("r0.1 exited at start-up: cannot connect".into())
        },
        "a relay waits for its database at start-up, never exits",
    ),
    (
        "an event sent three times by the one relay whose settlements were undone",
        |plan, ev| {
            plan.hazard = Some(Hazard::KeepRows {
                at_ms: 0,
                rule: false,
            });
            ev.relays_run = 1;
            ev.undone_named = Some(format!("{UNDONE} (trigger sim_keep_rows ...)"));
            for _ in 0..2 {
                ev.received.push(message(1));
            }
        },
        "settlements that change nothing cost at most one copy per relay",
    ),
    (
        "undone settlements said without their cause",
        |plan, ev| {
            plan.hazard = Some(Hazard::KeepRows {
                at_ms: 0,
                rule: false,
            });
            ev.relays_run = 1;
            ev.undone_named = Some(UNDONE.into());
        },
        "a relay whose settlements change nothing names the cause",
    ),
    (
        "settlements said undone where nothing undoes them",
        |_, ev| ev.undone_named = Some(UNDONE.into()),
        "settlements are undone only where something undoes them",
    ),
];

/// A relay's line about settlements that change nothing, without its cause.
const UNDONE: &str = "settlements on \"outbox\" change nothing: 1 row(s) ...";

/// What the checker got wrong, if anything.
pub fn run() -> Vec<String> {
    let mut failures = Vec::new();
    let base = check(&plan(), &clean());
    if !base.is_empty() {
        failures.push(format!("the clean history was reported: {base:?}"));
    }
    for (name, breaks, invariant) in CASES {
        let (mut plan, mut ev) = (plan(), clean());
        breaks(&mut plan, &mut ev);
        let found = check(&plan, &ev);
        if !found.iter().any(|v| v.invariant == *invariant) {
            failures.push(format!(
                "{name}: not reported as \"{invariant}\" (reported: {:?})",
                found.iter().map(|v| v.invariant).collect::<Vec<_>>()
            ));
        }
    }
    // The same takeover is legitimate when the relay that lost the claim was faulted.
    let (plan, mut ev) = (plan(), clean());
    let takeover = CASES
        .iter()
        .find(|c| c.0 == "an attempt counted by the takeover of an unfaulted relay's claim")
        .expect("the takeover case");
    (takeover.1)(&mut plan.clone(), &mut ev);
    ev.faulted_hard.insert("r0".into());
    let found = check(&plan, &ev);
    if !found.is_empty() {
        failures.push(format!(
            "a takeover of a killed relay's claim was reported: {found:?}"
        ));
    }
    // A relay stopped since its last scrape keeps its old reading (the rules' last_over_time),
    // beside one that reads: the freshest reading wins, and nothing is reported.
    let mut ev = clean();
    ev.signal.push(sample(
        30.0,
        19.0,
        &[("r0", 5.0, 5.0, 10.0), ("r1", 19.0, 29.8, 30.0)],
    ));
    let found = check(&plan, &ev);
    if !found.is_empty() {
        failures.push(format!(
            "a stopped relay's kept reading beside a fresh one was reported: {found:?}"
        ));
    }
    // A relay woken from a stop shorter than its reads take to be overdue says it can read,
    // with its reading from before the stop; the relays beside it lost the database since
    // their fresher reads. The rule derives from the woken one alone, and the bound is its
    // read's: nothing is reported (seed 505906779503356568).
    let mut ev = clean();
    let mut woken = sample(
        25.0,
        23.0,
        &[("r0", 21.5, 21.5, 25.0), ("r1", 24.0, 24.0, 25.0)],
    );
    woken.readings[1].up = 0.0;
    ev.signal.push(woken);
    let found = check(&plan, &ev);
    if !found.is_empty() {
        failures.push(format!(
            "a relay woken with its old reading beside relays that lost the database was reported: {found:?}"
        ));
    }
    failures
}
