//! The Grafana dashboard, the alert rules and the autoscaler's query, proven against a real
//! Prometheus: it scrapes relays through quarantines, throttling, a parked destination, lease
//! losses, transaction-order hold-back and a relay the schema refuses; then every panel's
//! query, every template variable's query, every alert's expression and the KEDA
//! ScaledObject's query is evaluated through its HTTP API. Each must return series, and may
//! name only metrics the relay exports. The dashboard's own rules (units, data source, panel
//! ids) are checked in the same test.

mod evaluate;
mod files;
mod lint;
mod promql;

use std::time::{Duration, Instant};

use crate::scenario::{events, insert, migrate_with, migrated_db, run_args, wait_count};
use crate::support::pg::PrivatePg;
use crate::support::prometheus::{now, Prometheus, JOB};
use crate::support::{
    create_queue, repo_root, sqs, unique, wait_until, FaultProxy, Mode, RelayProcess,
};

use evaluate::{declared_metrics, exported_metrics, Checker};
use files::{docs_name_panels_that_exist, read_dashboards, relative};
use lint::lint;

/// Generous for a loaded 2-core machine; a bound on waiting only, never a measured time.
const WAIT: Duration = Duration::from_secs(60);

const ALERTS: &str = "deploy/prometheus/alerts.yml";
const DASHBOARDS: &str = "deploy/grafana";
const METRICS_SOURCE: &str = "src/metrics.rs";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_panel_variable_alert_and_scaling_query_returns_series_from_relays_through_every_condition(
) {
    let root = repo_root();
    let dashboards = read_dashboards(&root.join(DASHBOARDS));
    let mut problems = Vec::new();
    for (path, dashboard) in &dashboards {
        for problem in lint(dashboard) {
            problems.push(format!("{}: {problem}", relative(path)));
        }
    }

    problems.extend(docs_name_panels_that_exist(&root.join("docs"), &dashboards));

    let prometheus = Prometheus::start(&[&root.join(ALERTS)]).await;
    let start = now();
    let (_main, _lease, _order, _refused, _many) = tokio::join!(
        quarantines_throttling_and_a_parked_destination(&prometheus),
        lease_losses(&prometheus),
        transaction_order_hold_back(&prometheus),
        a_relay_the_schema_refuses(&prometheus),
        a_relay_of_several_tables_skips_one(&prometheus),
    );
    for target in prometheus.targets() {
        let up = format!("up{{job=\"{JOB}\", instance=\"{target}\"}}");
        prometheus
            .wait_for_series("every relay scraped", &up, WAIT)
            .await;
    }
    let rules = evaluated_rules(&prometheus).await;
    let end = now();

    let checker = Checker {
        prometheus: &prometheus,
        start,
        end,
        declared: declared_metrics(&root.join(METRICS_SOURCE)),
        exported: exported_metrics(&prometheus).await,
    };
    problems.extend(checker.exports_what_it_declares());
    checker.note_metrics_no_panel_shows(&dashboards);
    for (path, dashboard) in &dashboards {
        for problem in checker.dashboard(dashboard).await {
            problems.push(format!("{}: {problem}", relative(path)));
        }
    }
    problems.extend(checker.alerts(&rules, &root.join(ALERTS)).await);
    problems.extend(checker.scaled_objects(&root.join("deploy")).await);

    assert!(
        problems.is_empty(),
        "{} problem(s) with what operators look at, against Prometheus scraping {:?}:\n{}",
        problems.len(),
        prometheus.targets(),
        problems.join("\n")
    );
}

/// One relay: rows that cannot be messages (quarantined `invalid`), rows for a queue that does
/// not exist (parked, reason `destination`), and SQS throttling every request at first.
async fn quarantines_throttling_and_a_parked_destination(
    prometheus: &Prometheus,
) -> (RelayProcess, FaultProxy) {
    let db = migrated_db().await;
    let client = db.client().await;
    let queue = create_queue("dash", &[]).await;
    let (base, _) = queue.rsplit_once('/').expect("queue URL has a path");
    let missing = format!("{base}/dash-missing-{}-{}", unique(), std::process::id());
    let proxy = FaultProxy::start(sqs().endpoint());
    proxy.set_mode(Mode::Throttle);
    let mut written = events("dash", 40, 8);
    for i in [5, 17] {
        written[i].headers = serde_json::json!({"nested": {"not": "a string"}});
    }
    for i in [9, 23, 31] {
        written[i].queue_url = Some(missing.clone());
    }
    insert(&client, &written, Duration::ZERO).await;

    let args = run_args(&db, &queue, proxy.endpoint(), &["--relay-id", "dash-main"]);
    let relay = RelayProcess::spawn_named("dash-main", &args, &[]);
    let addr = relay.metrics_addr(WAIT).await;
    prometheus.add_target(&addr);
    let on = |series: &str| format!("{series}{{job=\"{JOB}\", instance=\"{addr}\"}} > 0");
    let with = |series: &str, label: &str| {
        format!("{series}{{job=\"{JOB}\", instance=\"{addr}\", {label}}} > 0")
    };
    prometheus
        .wait_for_series(
            "throttled sends",
            &with("outbox_send_failures_total", "kind=\"throttled\""),
            WAIT,
        )
        .await;
    proxy.set_mode(Mode::Pass);
    for (what, expr) in [
        ("sends", on("outbox_events_sent_total")),
        (
            "invalid rows quarantined",
            with("outbox_events_quarantined_total", "reason=\"invalid\""),
        ),
        (
            "a destination refused",
            with("outbox_send_failures_total", "kind=\"destination\""),
        ),
        (
            "rows parked for their destination",
            with("outbox_events_quarantined_total", "reason=\"destination\""),
        ),
        ("the quarantine's gauge", on("outbox_quarantined_rows")),
        ("the delivery lag", on("outbox_delivery_lag_seconds_count")),
    ] {
        prometheus.wait_for_series(what, &expr, WAIT).await;
    }
    // The application goes on writing. A histogram's series appears with its first samples,
    // so rates over it need samples that come after a scrape.
    insert(&client, &events("dash-more", 10, 4), Duration::ZERO).await;
    let more = format!(
        "increase(outbox_delivery_lag_seconds_count{{job=\"{JOB}\", instance=\"{addr}\"}}[1m]) > 0"
    );
    prometheus
        .wait_for_series("the delivery lag of later events", &more, WAIT)
        .await;
    (relay, proxy)
}

/// Two replicas: A sends, freezes holding SQS's answer until its lease ends, B takes the rows
/// over and sends them, and A, resumed, has its settlements refused.
async fn lease_losses(prometheus: &Prometheus) -> (RelayProcess, RelayProcess, FaultProxy) {
    let n = 10;
    let db = migrated_db().await;
    let client = db.client().await;
    let queue = create_queue("dash-lease", &[]).await;
    let proxy = FaultProxy::start(sqs().endpoint());
    proxy.set_mode(Mode::Hold);
    // A's send must still wait for its answer when A freezes: the send timeout leaves a busy
    // machine two seconds to freeze it.
    let timing = [
        "--lease",
        "4s",
        "--send-timeout",
        "2s",
        "--settle-margin",
        "1s",
    ];
    let mut a_args = run_args(&db, &queue, proxy.endpoint(), &timing);
    a_args.extend(["--relay-id".into(), "dash-a".into()]);
    let a = RelayProcess::spawn_named("dash-a", &a_args, &[]);
    let a_addr = a.metrics_addr(WAIT).await;
    prometheus.add_target(&a_addr);
    // Scraped before it freezes, so its lease losses show as an increase.
    let a_scraped = format!("up{{job=\"{JOB}\", instance=\"{a_addr}\"}} == 1");
    prometheus
        .wait_for_series("replica A scraped", &a_scraped, WAIT)
        .await;
    // Written only now: A's send must still be waiting for its answer when A freezes.
    insert(&client, &events("dash-lease", n, 2), Duration::ZERO).await;
    wait_until("A's batch is at SQS, the answer held", WAIT, || async {
        proxy.held() >= 1
    })
    .await;
    a.sigstop();
    // Release SQS's answer only once A is really stopped, or A may settle in time.
    wait_until("A is stopped", WAIT, || async {
        std::fs::read_to_string(format!("/proc/{}/stat", a.pid()))
            .map(|stat| {
                let state = stat.rsplit(')').next().unwrap_or("").trim_start();
                state.starts_with('T')
            })
            .unwrap_or(false)
    })
    .await;
    proxy.set_mode(Mode::Pass);
    let leased = "id IN (SELECT unnest(ids) FROM outbox_claims WHERE until >= now())";
    wait_count(&client, leased, 0, WAIT).await;

    let mut b_args = run_args(&db, &queue, sqs().endpoint(), &timing);
    b_args.extend(["--relay-id".into(), "dash-b".into()]);
    let b = RelayProcess::spawn_named("dash-b", &b_args, &[]);
    prometheus.add_target(&b.metrics_addr(WAIT).await);
    wait_count(&client, "sent_at IS NOT NULL", n as i64, WAIT).await;
    a.sigcont();
    let lost = format!("outbox_lease_lost_total{{job=\"{JOB}\", instance=\"{a_addr}\"}} > 0");
    prometheus
        .wait_for_series("replica A's lease losses", &lost, WAIT)
        .await;
    (a, b, proxy)
}

/// `--order-by transaction`: committed events held back behind a transaction that stays open.
/// On a cluster of its own, because the watermark is the whole cluster's: an open transaction
/// on the shared one would hold back other tests' relays.
async fn transaction_order_hold_back(prometheus: &Prometheus) -> (RelayProcess, PrivatePg) {
    let cluster = PrivatePg::start().await;
    let db = cluster.create_db().await;
    migrate_with(&db, &["--table", "outbox", "--order-by", "transaction"]).await;
    let client = db.client().await;
    let queue = create_queue("dash-xact.fifo", &[]).await;
    let extra = ["--order-by", "transaction", "--relay-id", "dash-order"];
    let relay = RelayProcess::spawn_named(
        "dash-order",
        &run_args(&db, &queue, sqs().endpoint(), &extra),
        &[],
    );
    let addr = relay.metrics_addr(WAIT).await;
    prometheus.add_target(&addr);

    let open = db.client().await;
    open.batch_execute("BEGIN").await.unwrap();
    insert(&open, &events("dash-xact-open", 1, 1), Duration::ZERO).await;
    insert(&client, &events("dash-xact-later", 3, 1), Duration::ZERO).await;
    for series in [
        "outbox_order_watermark_held_rows",
        "outbox_order_watermark_age_seconds",
    ] {
        let expr = format!("{series}{{job=\"{JOB}\", instance=\"{addr}\"}} > 0");
        prometheus
            .wait_for_series("events held back", &expr, WAIT)
            .await;
    }
    open.batch_execute("COMMIT").await.unwrap();
    wait_count(&client, "sent_at IS NOT NULL", 4, WAIT).await;
    (relay, cluster)
}

/// A relay running beside a schema whose contract no longer admits its version, as after a
/// `migrate` of a later release: it stays up, claims nothing, and counts itself refused.
async fn a_relay_the_schema_refuses(prometheus: &Prometheus) -> RelayProcess {
    let db = migrated_db().await;
    let client = db.client().await;
    let queue = create_queue("dash-refused", &[]).await;
    // A short lease, so the contract is read again every second.
    let extra = [
        "--lease",
        "3s",
        "--send-timeout",
        "1s",
        "--settle-margin",
        "1s",
        "--relay-id",
        "dash-refused",
    ];
    let relay = RelayProcess::spawn_named(
        "dash-refused",
        &run_args(&db, &queue, sqs().endpoint(), &extra),
        &[],
    );
    let addr = relay.metrics_addr(WAIT).await;
    prometheus.add_target(&addr);
    let claiming =
        format!("outbox_relays{{job=\"{JOB}\", instance=\"{addr}\", state=\"claiming\"}} > 0");
    prometheus
        .wait_for_series("a relay registered", &claiming, WAIT)
        .await;
    let later = format!(">{}", env!("CARGO_PKG_VERSION"));
    client
        .execute(
            "UPDATE outbox_relay_schema SET relay_versions = $1 WHERE table_name = 'outbox'",
            &[&later],
        )
        .await
        .unwrap();
    // The application goes on writing; the relay finds the rows and may not claim them.
    insert(&client, &events("dash-refused", 3, 1), Duration::ZERO).await;
    let refused =
        format!("outbox_relays{{job=\"{JOB}\", instance=\"{addr}\", state=\"refused\"}} > 0");
    prometheus
        .wait_for_series("a relay refused by the schema", &refused, WAIT)
        .await;
    relay
}

/// A relay serving two tables, one of whose schema no longer admits it: the other flows, the
/// table gauges carry their `table` label, and the refused one is counted skipped.
async fn a_relay_of_several_tables_skips_one(prometheus: &Prometheus) -> RelayProcess {
    let db = crate::support::fresh_db().await;
    let client = db.client().await;
    for schema in ["dash_a", "dash_b"] {
        client
            .batch_execute(&format!("CREATE SCHEMA {schema}"))
            .await
            .unwrap();
        crate::scenario::migrate(&db, &format!("{schema}.outbox")).await;
    }
    let later = format!(">{}", env!("CARGO_PKG_VERSION"));
    client
        .execute(
            "UPDATE dash_b.outbox_relay_schema SET relay_versions = $1",
            &[&later],
        )
        .await
        .unwrap();
    for schema in ["dash_a", "dash_b"] {
        client
            .batch_execute(&format!(
                "INSERT INTO {schema}.outbox (event_id, aggregate_type, aggregate_id, event_type, payload)
                 VALUES ('{schema}-1', 'order', 'a', 'order.placed', '{{}}')"
            ))
            .await
            .unwrap();
    }
    let queue = create_queue("dash-many", &[]).await;
    let relay = RelayProcess::spawn_named(
        "dash-many",
        &run_args(
            &db,
            &queue,
            sqs().endpoint(),
            &["--tables", "dash_*.outbox", "--relay-id", "dash-many"],
        ),
        &[],
    );
    let addr = relay.metrics_addr(WAIT).await;
    prometheus.add_target(&addr);
    let skipped = format!(
        "outbox_table_skipped{{job=\"{JOB}\", instance=\"{addr}\", table=\"dash_b.outbox\"}} > 0"
    );
    prometheus
        .wait_for_series("a table skipped", &skipped, WAIT)
        .await;
    relay
}

/// The alerting rules as Prometheus loaded them, once each has been evaluated.
async fn evaluated_rules(prometheus: &Prometheus) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + WAIT;
    loop {
        let data = prometheus.api("rules", &[("type", "alert")]).await;
        let rules: Vec<serde_json::Value> = data.expect("GET /api/v1/rules")["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect();
        let evaluated = |r: &serde_json::Value| {
            r["lastEvaluation"]
                .as_str()
                .is_some_and(|t| !t.starts_with("0001-"))
        };
        if !rules.is_empty() && rules.iter().all(evaluated) {
            return rules;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus has not evaluated every rule in {WAIT:?}: {rules:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
