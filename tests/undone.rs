//! Settlements that change nothing (docs/operations.md, "Triggers and rules"): a trigger that
//! keeps the row, a rule that does something else instead. The relay sent the rows and settled
//! them under its claim; if the settlement left them unsent they would be claimed and sent
//! again, for ever (84 copies of one event in 20 s before this was caught). The relay stops
//! claiming instead, names the cause, and loses nothing: each event reaches SQS once.

use std::time::Duration;

use crate::scenario::{
    copies, count, events, insert, migrated_db, relay_command, run_args, wait_count,
};
use crate::support::{create_queue, pg, receive_all, sqs, RelayProcess, TcpProxy, TestDb};

/// With `setup` applied to a migrated table and the relay run with `retention` (`None`: its
/// default, delete on acknowledgement), 30 rows are written: the relay sends some, finds its
/// settlement undone, and stops with a line naming `cause`.
async fn undone_settlements_stop_claims(setup: &str, retention: Option<&str>, cause: &str) {
    let db = migrated_db().await;
    let app = db.client().await;
    app.batch_execute(setup).await.unwrap();
    let queue = create_queue("undone", &[]).await;
    let mut args = run_args(&db, &queue, sqs().endpoint(), &[]);
    let at = args.iter().position(|a| a == "--retention").unwrap();
    match retention {
        Some(r) => args[at + 1] = r.to_string(),
        None => {
            args.drain(at..at + 2);
        }
    }
    let relay = RelayProcess::spawn(&args, &[]);
    relay.metrics_addr(Duration::from_secs(30)).await;
    insert(&app, &events("undone", 30, 3), Duration::ZERO).await;
    let line = relay
        .wait_for_line("claims stopped so that", Duration::from_secs(30))
        .await
        .unwrap_or_else(|| panic!("no line about the undone settlement:\n{}", relay.output()));
    assert!(line.contains(cause), "{line}");
    assert!(line.contains("outbox"), "{line}");
    assert_eq!(relay.http_status("/readyz").await, 503);
    // The gauge the alert OutboxSettlementsUndone reads names the table.
    assert_eq!(
        relay.metric("outbox_table_blocked{table=\"outbox\"}").await,
        Some(1.0)
    );
    // Whatever was sent, at most once more than it should have been (a claim may have taken
    // the rows in the moment between the settlement and the stop); the relay keeps running
    // and claims nothing more.
    let received = receive_all(&queue, 1, Duration::from_secs(10)).await;
    assert!(!received.is_empty());
    let over = copies(&received)
        .into_iter()
        .filter(|(_, n)| *n > 2)
        .collect::<Vec<_>>();
    assert!(over.is_empty(), "events sent more than twice: {over:?}");
    assert!(relay.wait_exit(Duration::from_millis(100)).await.is_none());
    // Nothing lost: every row is still there, unsent.
    assert_eq!(count(&app, "sent_at IS NULL").await, 30);
    // `status` shows why: the relay registered as not claiming (at its next renewal), and the
    // table's trigger marked as one that can undo settlements.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        let output = relay_command(&["status", "--json", "--database-url", &db.url]).await;
        let json = output.lines().find(|l| l.starts_with('{')).unwrap_or("");
        let status: serde_json::Value = serde_json::from_str(json)
            .unwrap_or_else(|e| panic!("status --json is not JSON ({e}): {output}"));
        let claiming = status["relays"]
            .as_array()
            .is_some_and(|r| r.iter().any(|r| r["claiming"] == true));
        if !claiming || std::time::Instant::now() > deadline {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let relays = status["relays"].as_array().expect("relays");
    assert_eq!(relays.len(), 1, "{status}");
    assert_eq!(relays[0]["claiming"], false, "{status}");
    let undoing: Vec<&str> = status["triggers"]
        .as_array()
        .expect("triggers")
        .iter()
        .filter(|t| t["undoes"] == true)
        .filter_map(|t| t["what"].as_str())
        .collect();
    assert!(undoing.iter().any(|w| w.contains(cause)), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_before_delete_trigger_that_keeps_the_rows_stops_claims_with_each_event_sent_at_most_twice(
) {
    undone_settlements_stop_claims(&keeping("DELETE"), None, "trigger keep_rows (BEFORE DELETE")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_before_update_trigger_that_keeps_the_rows_stops_claims_under_retention() {
    undone_settlements_stop_claims(
        &keeping("UPDATE"),
        Some("1h"),
        "trigger keep_rows (BEFORE UPDATE",
    )
    .await;
}

/// A row trigger that keeps every row an `event` (`UPDATE`, `DELETE`) would change, as
/// soft-delete tooling does.
fn keeping(event: &str) -> String {
    format!(
        "CREATE FUNCTION keep_rows() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$; \
         CREATE TRIGGER keep_rows BEFORE {event} ON outbox FOR EACH ROW EXECUTE FUNCTION keep_rows()"
    )
}

/// As [`stopped_naming`], and the line says `said`.
async fn stopped_saying(relay: &RelayProcess, cause: &str, said: &str) {
    stopped_naming(relay, cause).await;
    let line = relay
        .wait_for_line("claims stopped so that", Duration::ZERO)
        .await
        .unwrap_or_default();
    assert!(line.contains(said), "{line}");
}

/// The relay logged its one line about undone settlements, naming `cause`, is not ready, and
/// the alert's gauge is up.
async fn stopped_naming(relay: &RelayProcess, cause: &str) {
    let line = relay
        .wait_for_line("claims stopped so that", Duration::from_secs(30))
        .await
        .unwrap_or_else(|| panic!("no line naming {cause}:\n{}", relay.output()));
    assert!(line.contains(cause), "{line}");
    assert_eq!(relay.http_status("/readyz").await, 503);
    assert_eq!(
        relay.metric("outbox_table_blocked{table=\"outbox\"}").await,
        Some(1.0)
    );
}

/// A `DO INSTEAD NOTHING` rule created while the relay runs: PostgreSQL then refuses the
/// relay's own `UPDATE ... RETURNING` (SQLSTATE 0A000) on every settlement. The relay stopped
/// for nothing before this was caught: it retried each settlement until its lease ended and
/// logged a warning per retry (found by the simulation, seed 47). It names the rule once,
/// stops claiming, and every row it could not settle stays unsent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_created_while_the_relay_runs_stops_claims_with_one_line_naming_it() {
    let db = migrated_db().await;
    let app = db.client().await;
    let queue = create_queue("undone-rule-later", &[]).await;
    let relay = RelayProcess::spawn(&run_args(&db, &queue, sqs().endpoint(), &[]), &[]);
    relay.metrics_addr(Duration::from_secs(30)).await;
    insert(&app, &events("before", 10, 2), Duration::ZERO).await;
    wait_count(&app, "sent_at IS NOT NULL", 10, Duration::from_secs(30)).await;
    app.batch_execute("CREATE RULE keep_rows AS ON UPDATE TO outbox DO INSTEAD NOTHING")
        .await
        .unwrap();
    insert(&app, &events("after", 20, 2), Duration::ZERO).await;
    stopped_naming(&relay, "rule keep_rows (ON UPDATE DO INSTEAD)").await;
    // Claims stay stopped: a second later nothing more was said or sent.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let output = relay.output();
    assert_eq!(output.matches("change nothing").count(), 1, "{output}");
    assert_eq!(count(&app, "sent_at IS NULL").await, 20);
    let received = receive_all(&queue, 10, Duration::from_secs(10)).await;
    let over = copies(&received)
        .into_iter()
        .filter(|(_, n)| *n > 2)
        .collect::<Vec<_>>();
    assert!(over.is_empty(), "events sent more than twice: {over:?}");
}

/// The same rule, created while the relay's connections are being replaced: the CREATE RULE
/// waits for its lock behind a transaction, every statement of the relay's queues behind it
/// and times out, the relay replaces its connections and stops claiming until a renewal
/// succeeds. The new connection cannot prepare the settlements, so no settlement ever meets
/// the rule: the relay used to wait for a renewal that never came, silently, its rows unsent
/// (simulation seed 4885364916658979262, 1 run in 4: "no committed row is lost", 50 rows).
/// The renewal's refusal names the rule and stops claims as a settlement's would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_created_while_the_relay_reconnects_is_named_by_its_next_renewal() {
    let db = migrated_db().await;
    let app = db.client().await;
    let queue = create_queue("undone-rule-reconnect", &[]).await;
    // Delete on acknowledgement, and a rule on DELETE: no statement of the relay's maintenance
    // (its updates: parking, unparking) meets the rule before a settlement would.
    let mut args = run_args(
        &db,
        &queue,
        sqs().endpoint(),
        &[
            "--delete-on-ack",
            "--lease",
            "2s",
            "--send-timeout",
            "1s",
            "--settle-margin",
            "500ms",
        ],
    );
    // The relay reaches the database through a proxy that can reset its connections.
    let proxy = TcpProxy::start(pg().port());
    let at = args.iter().position(|a| a == "--database-url").unwrap();
    args[at + 1] = proxy.url_through(&db.url);
    let relay = RelayProcess::spawn(&args, &[]);
    relay.metrics_addr(Duration::from_secs(30)).await;
    insert(&app, &events("before", 10, 2), Duration::ZERO).await;
    wait_count(&app, "true", 0, Duration::from_secs(30)).await;
    // The table locked as a CREATE RULE waiting for its lock would leave it, and the relay's
    // connections replaced: the new ones cannot prepare the relay's statements, renewals fail
    // for half the lease, and claims stop.
    let ddl = db.client().await;
    ddl.batch_execute("BEGIN; LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    proxy.reset_existing();
    relay
        .wait_for_line(
            "the relay's registration was not renewed for half its lease",
            Duration::from_secs(30),
        )
        .await
        .unwrap_or_else(|| panic!("claims never stopped:\n{}", relay.output()));
    ddl.batch_execute("CREATE RULE keep_rows AS ON DELETE TO outbox DO INSTEAD NOTHING; COMMIT")
        .await
        .unwrap();
    insert(&app, &events("after", 20, 2), Duration::ZERO).await;
    stopped_naming(&relay, "rule keep_rows").await;
    assert_eq!(count(&app, "sent_at IS NULL").await, 20);
}

/// A rule that rewrites the DELETE cannot serve a settlement at all (PostgreSQL refuses it in
/// the settlement's WITH): the relay refuses to start, naming the rule, rather than asking for a
/// migration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_that_does_something_else_instead_of_the_delete_is_named_at_start() {
    let db = migrated_db().await;
    db.client()
        .await
        .batch_execute(
            "CREATE TABLE outbox_deleted (id bigint); \
             CREATE RULE keep_rows AS ON DELETE TO outbox DO INSTEAD INSERT INTO outbox_deleted VALUES (old.id)",
        )
        .await
        .unwrap();
    let queue = create_queue("undone-rule", &[]).await;
    let mut args = run_args(&db, &queue, sqs().endpoint(), &[]);
    let at = args.iter().position(|a| a == "--retention").unwrap();
    args.drain(at..at + 2);
    let relay = RelayProcess::spawn(&args, &[]);
    let status = relay
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("the relay refuses to start");
    assert!(!status.success());
    let output = relay.output();
    assert!(
        output.contains("rule keep_rows (ON DELETE DO INSTEAD)")
            && !output.contains("run `outbox-relay migrate`"),
        "{output}"
    );
    // `check` names it too, and passes a trigger that only adds work, saying so.
    db.client()
        .await
        .batch_execute(
            "CREATE FUNCTION audit_copy() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN OLD; END $$; \
             CREATE TRIGGER audit AFTER DELETE ON outbox FOR EACH ROW EXECUTE FUNCTION audit_copy()",
        )
        .await
        .unwrap();
    let mut check = args.clone();
    check[0] = "check".into();
    let (status, output) = crate::support::run_to_end(&check, &[], Duration::from_secs(30)).await;
    assert!(!status.success(), "{output}");
    let failed: Vec<&str> = output
        .lines()
        .filter(|l| l.starts_with("FAIL triggers and rules"))
        .collect();
    assert!(
        failed.len() == 1 && failed[0].contains("rule keep_rows") && !failed[0].contains("audit"),
        "{output}"
    );
    db.client()
        .await
        .batch_execute("DROP RULE keep_rows ON outbox")
        .await
        .unwrap();
    let (_, output) = crate::support::run_to_end(&check, &[], Duration::from_secs(30)).await;
    let line = output
        .lines()
        .find(|l| l.starts_with("ok   triggers and rules"))
        .unwrap_or_else(|| panic!("{output}"));
    assert!(
        line.contains("trigger audit (AFTER DELETE FOR EACH ROW")
            && line.contains("its work is added to each event"),
        "{line}"
    );
}

/// A partitioned outbox (range on `created_at`, the usual way to drop old events) is refused by
/// `migrate`, `check` and `run` alike, in one line that names partitioning and what to do,
/// rather than with PostgreSQL's own words about concurrent indexes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_outbox_is_refused_in_one_line_by_migrate_check_and_run() {
    let db = crate::support::fresh_db().await;
    db.client()
        .await
        .batch_execute(
            "CREATE TABLE outbox (
                 id bigint GENERATED ALWAYS AS IDENTITY,
                 event_id text NOT NULL,
                 aggregate_type text NOT NULL,
                 aggregate_id text NOT NULL,
                 event_type text NOT NULL,
                 payload jsonb NOT NULL,
                 headers jsonb NOT NULL DEFAULT '{}',
                 created_at timestamptz NOT NULL DEFAULT now(),
                 PRIMARY KEY (id, created_at)
             ) PARTITION BY RANGE (created_at);
             CREATE TABLE outbox_2026 PARTITION OF outbox
                 FOR VALUES FROM ('2026-01-01') TO ('2027-01-01')",
        )
        .await
        .unwrap();
    let queue = create_queue("partitioned", &[]).await;
    let run = run_args(&db, &queue, sqs().endpoint(), &[]);
    let mut check = run.clone();
    check[0] = "check".into();
    for command in [
        crate::scenario::args(&["migrate", "--database-url", &db.url]),
        check,
        run,
    ] {
        let (status, output) =
            crate::support::run_to_end(&command, &[], Duration::from_secs(30)).await;
        assert!(!status.success(), "{} succeeded: {output}", command[0]);
        assert!(
            output.contains("is partitioned, which the relay does not serve")
                && !output.contains("concurrently"),
            "{}: {output}",
            command[0]
        );
    }
}

/// Several relays: each meets the undone settlement on its own claims and stops, so each event
/// is sent at most once more per relay, and nothing is lost. Every relay meets it: a settlement
/// that changes nothing still ends its claim, so the rows are free and unsent again, and a relay
/// that still claims takes them until its own settlement has been undone too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_relays_each_stop_and_no_event_is_sent_more_than_once_more_per_relay() {
    let db = migrated_db().await;
    let app = db.client().await;
    app.batch_execute(&keeping("UPDATE")).await.unwrap();
    let queue = create_queue("undone-three", &[]).await;
    let relays: Vec<RelayProcess> = (0..3)
        .map(|i| {
            let id = format!("undone-{i}");
            RelayProcess::spawn_named(
                &id,
                &run_args(&db, &queue, sqs().endpoint(), &["--relay-id", &id]),
                &[],
            )
        })
        .collect();
    for relay in &relays {
        relay.metrics_addr(Duration::from_secs(30)).await;
    }
    insert(&app, &events("undone-three", 60, 6), Duration::ZERO).await;
    // Each relay's own line, gauge and readiness, and its own count of SendMessageBatch calls:
    // it stopped on a settlement of its own, not because another relay did.
    for relay in &relays {
        let line = relay
            .wait_for_line("claims stopped so that", Duration::from_secs(60))
            .await
            .unwrap_or_else(|| {
                panic!(
                    "{} did not stop claiming:\n{}",
                    relay.name(),
                    relay.output()
                )
            });
        assert!(line.contains("trigger keep_rows (BEFORE UPDATE"), "{line}");
        assert_eq!(
            relay.metric("outbox_table_blocked{table=\"outbox\"}").await,
            Some(1.0),
            "{}",
            relay.name()
        );
        assert_eq!(relay.http_status("/readyz").await, 503, "{}", relay.name());
        let sends = relay
            .metric("outbox_send_duration_seconds_count")
            .await
            .unwrap_or(0.0);
        assert!(sends > 0.0, "{} stopped without sending", relay.name());
    }
    // All three stopped, so the queue goes quiet: what it holds is every copy there will be.
    let received = receive_all(&queue, 1, Duration::from_secs(10)).await;
    let most = copies(&received).into_values().max().unwrap_or(0);
    assert!(most >= 1);
    assert!(most <= 1 + relays.len(), "an event was sent {most} times");
    assert_eq!(count(&app, "sent_at IS NULL").await, 60);
}

/// Parking that changes nothing (simulation seed 505906779503356543): under `--on-poison block`
/// the rows behind a quarantined event are parked by an UPDATE, and a row trigger that keeps
/// every UPDATE left the rows committed after it unsent and unparked, out of `quarantine list`,
/// with nothing said, while settlements (deletes here) still worked. The pass that meant to
/// park them now names the trigger and stops claims as an undone settlement does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trigger_that_keeps_the_parking_update_is_named_and_stops_claims() {
    let (_db, app, queue, relay) = deleting_relay("undone-parking.fifo").await;
    let row = |event_id: &str, pad: usize| sized_row(event_id, "g", pad);
    // The group's head is too large to send: quarantined at claim, the row behind it parked.
    app.batch_execute(&format!("{}; {}", row("head", 4000), row("behind", 10)))
        .await
        .unwrap();
    wait_count(
        &app,
        "quarantine_reason = 'blocked'",
        1,
        Duration::from_secs(30),
    )
    .await;
    app.batch_execute(&keeping("UPDATE")).await.unwrap();
    app.batch_execute(&row("later", 10)).await.unwrap();
    stopped_saying(
        &relay,
        "trigger keep_rows (BEFORE UPDATE",
        "1 row(s) behind a quarantined event of their group are still unparked",
    )
    .await;
    // Nothing was sent, and the later row waits where it was: unsent, not parked.
    assert_eq!(
        count(
            &app,
            "event_id = 'later' AND sent_at IS NULL AND quarantined_at IS NULL"
        )
        .await,
        1
    );
    assert!(receive_all(&queue, 0, Duration::from_secs(2))
        .await
        .is_empty());
}

/// The quarantine of a row refused at claim (too large here) that changes nothing: a row
/// trigger keeps every UPDATE while settlements (deletes) still work. The row was refused again
/// at every claim, never sent and never in `quarantine list`, with only its age to say so. The
/// quarantine now answers the rows it left out, and the relay names the trigger and stops
/// claims as an undone settlement does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trigger_that_keeps_the_quarantine_at_claim_is_named_and_stops_claims() {
    let (_db, app, queue, relay) = deleting_relay("undone-refused").await;
    app.batch_execute(&keeping("UPDATE")).await.unwrap();
    app.batch_execute(&sized_row("small", "small", 10))
        .await
        .unwrap();
    wait_count(&app, "true", 0, Duration::from_secs(30)).await;
    app.batch_execute(&sized_row("large", "large", 4000))
        .await
        .unwrap();
    stopped_saying(
        &relay,
        "trigger keep_rows (BEFORE UPDATE",
        "1 row(s) a claim refused (too large, or out of attempts) are still unquarantined",
    )
    .await;
    assert_eq!(
        count(
            &app,
            "event_id = 'large' AND sent_at IS NULL AND quarantined_at IS NULL"
        )
        .await,
        1
    );
    // The small row was sent and settled: only the quarantine met the trigger.
    let received = receive_all(&queue, 1, Duration::from_secs(2)).await;
    assert_eq!(copies(&received).into_keys().collect::<Vec<_>>(), ["small"]);
}

/// A rule that does nothing instead of an UPDATE refuses the quarantine of a row refused at
/// claim (PostgreSQL refuses the data-modifying WITH). The relay logged a warning at each
/// claim's quarantine until another of its statements met the rule; the quarantine now names
/// it and stops claims, without a warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_that_refuses_the_quarantine_at_claim_is_named_and_stops_claims() {
    let (_db, app, _queue, relay) = deleting_relay("undone-refused-rule").await;
    // Once the relay runs: at its start it would refuse the rule in the same words, and exit.
    app.batch_execute(&sized_row("small", "small", 10))
        .await
        .unwrap();
    wait_count(&app, "true", 0, Duration::from_secs(30)).await;
    app.batch_execute("CREATE RULE keep_rows AS ON UPDATE TO outbox DO INSTEAD NOTHING")
        .await
        .unwrap();
    app.batch_execute(&sized_row("large", "large", 4000))
        .await
        .unwrap();
    stopped_naming(&relay, "rule keep_rows (ON UPDATE DO INSTEAD)").await;
    assert_eq!(
        count(
            &app,
            "event_id = 'large' AND sent_at IS NULL AND quarantined_at IS NULL"
        )
        .await,
        1
    );
    assert_eq!(
        relay
            .output()
            .matches("could not quarantine the rows the claim refused")
            .count(),
        0,
        "{}",
        relay.output()
    );
}

/// A relay whose settlements delete (a trigger or rule on UPDATE leaves them alone) and whose
/// `--max-payload-bytes` is 2048, ready.
async fn deleting_relay(name: &str) -> (TestDb, tokio_postgres::Client, String, RelayProcess) {
    let db = migrated_db().await;
    let app = db.client().await;
    let queue = create_queue(name, &[]).await;
    let mut args = run_args(
        &db,
        &queue,
        sqs().endpoint(),
        &["--max-payload-bytes", "2048"],
    );
    let at = args.iter().position(|a| a == "--retention").unwrap();
    args.drain(at..at + 2);
    let relay = RelayProcess::spawn(&args, &[]);
    relay.metrics_addr(Duration::from_secs(30)).await;
    (db, app, queue, relay)
}

/// An event of `group` whose payload pads to `pad` bytes.
fn sized_row(event_id: &str, group: &str, pad: usize) -> String {
    format!(
        "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload)
         VALUES ('{event_id}', 'order', '{group}', 'order.placed',
                 jsonb_build_object('pad', repeat('x', {pad})))"
    )
}
