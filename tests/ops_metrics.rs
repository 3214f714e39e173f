//! What operators scrape: `/metrics` of a relay that has sent and quarantined rows passes
//! `promtool check metrics`, Prometheus's own lint of the exposition format, names and help.

use std::io::{ErrorKind, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::scenario::{events, insert, migrated_db, run_args, wait_count};
use crate::support::{create_queue, metric_value, sqs, wait_until, RelayProcess};

/// Every metric the relay exports (the product contract's eleven, the claim duration, the
/// concurrency limit and the transaction order's watermark gauges, 0 in insertion order);
/// the scrape must hold each one, so the lint below covers them all.
const EXPORTED_METRICS: &[&str] = &[
    "outbox_oldest_unsent_age_seconds",
    "outbox_unsent_rows",
    "outbox_quarantined_rows",
    "outbox_oldest_quarantined_age_seconds",
    "outbox_blocked_rows",
    "outbox_events_sent_total",
    "outbox_send_failures_total",
    "outbox_events_quarantined_total",
    "outbox_lease_lost_total",
    "outbox_send_duration_seconds",
    "outbox_delivery_lag_seconds",
    "outbox_claim_duration_seconds",
    "outbox_request_concurrency_limit",
    "outbox_order_watermark_age_seconds",
    "outbox_order_watermark_held_rows",
];

/// Runs `promtool check metrics` with the exposition on stdin; returns its exit status and
/// everything it printed.
fn promtool_check_metrics(exposition: &str) -> (std::process::ExitStatus, String) {
    let mut child = match Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(e) if e.kind() == ErrorKind::NotFound => panic!(
            "promtool is not installed (not on PATH): run scripts/test, which installs it \
             (Debian package `prometheus`), or install it yourself"
        ),
        Err(e) => panic!("cannot run promtool: {e}"),
    };
    let mut stdin = child.stdin.take().expect("piped stdin");
    let input = exposition.to_string();
    // Written from another thread so a large scrape cannot deadlock against promtool's output.
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let output = child.wait_with_output().expect("wait for promtool");
    writer
        .join()
        .expect("stdin writer thread")
        .expect("write the scrape to promtool");
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status, printed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_metrics_scrape_passes_promtool_check_metrics() {
    let n = 40;
    let db = migrated_db().await;
    let client = db.client().await;
    let queue = create_queue("opsmetrics", &[]).await;
    let mut written = events("opsmetrics", n, 8);
    // One row that cannot be an SQS message, so the quarantine series carry a sample too.
    written[7].headers = serde_json::json!({"nested": {"not": "a string"}});
    insert(&client, &written, Duration::ZERO).await;

    let relay = RelayProcess::spawn(&run_args(&db, &queue, sqs().endpoint(), &[]), &[]);
    wait_count(
        &client,
        "sent_at IS NOT NULL",
        n as i64 - 1,
        Duration::from_secs(60),
    )
    .await;
    wait_count(
        &client,
        "quarantined_at IS NOT NULL",
        1,
        Duration::from_secs(30),
    )
    .await;
    // The table gauges are refreshed on their own interval; wait until they show the end state.
    wait_until(
        "the gauges show 0 unsent and 1 quarantined",
        Duration::from_secs(20),
        || async {
            let scrape = relay.scrape().await;
            metric_value(&scrape, "outbox_unsent_rows") == Some(0.0)
                && metric_value(&scrape, "outbox_quarantined_rows") == Some(1.0)
        },
    )
    .await;

    let scrape = relay.scrape().await;
    for name in EXPORTED_METRICS {
        assert!(
            scrape
                .lines()
                .any(|l| l.starts_with(&format!("# TYPE {name} "))),
            "/metrics has no TYPE line for {name}:\n{scrape}"
        );
    }
    assert_eq!(
        metric_value(&scrape, "outbox_events_sent_total"),
        Some((n - 1) as f64)
    );
    assert_eq!(
        metric_value(
            &scrape,
            "outbox_events_quarantined_total{reason=\"invalid\"}"
        ),
        Some(1.0)
    );
    // The histograms have samples, so their buckets, sums and counts are all linted.
    for histogram in [
        "outbox_send_duration_seconds",
        "outbox_delivery_lag_seconds",
        "outbox_claim_duration_seconds",
    ] {
        let count = metric_value(&scrape, &format!("{histogram}_count")).unwrap_or(0.0);
        assert!(count > 0.0, "{histogram} has no samples:\n{scrape}");
    }

    let (status, printed) = promtool_check_metrics(&scrape);
    // promtool prints one line per problem; any line at all is a problem with our metrics.
    assert!(
        status.success() && printed.trim().is_empty(),
        "promtool check metrics ({status}) found problems:\n{printed}\nin this scrape:\n{scrape}"
    );

    relay.sigterm();
    let status = relay
        .wait_exit(Duration::from_secs(20))
        .await
        .expect("relay exits");
    assert!(status.success());
}
