//! The console at size (`console`): how long its pages take to render on a table holding
//! 1,000,000 unsent rows and 100,000 quarantined ones (issue 48's target: under 200 ms), beside
//! `outbox-relay status` on the same table in the same run, the baseline whose statement the
//! overview reads.
//!
//! On the shared cluster (`fsync=off`: the console only reads). The table is filled in one
//! statement and vacuumed, as autovacuum leaves a production table; 1,000 of the quarantined
//! rows are parked for three destinations. Each page is timed from the request to the last
//! byte, `ROUNDS` times: the overview cold (its figures older than `--refresh`, so read again)
//! and warm (from the cache), the quarantine list's first page, one reason's, a page deep in
//! the list (a seek from an id) and an event.

use std::time::{Duration, Instant};

use crate::progress::say;
use crate::stats::quantile;
use crate::support::http::request;
use crate::support::{run_to_end, RelayProcess};
use crate::workload::Database;

const UNSENT: i64 = 1_000_000;
const QUARANTINED: i64 = 100_000;
const ROUNDS: usize = 15;
/// The console's `--refresh`, the least it takes: a cold overview after each wait.
const REFRESH: Duration = Duration::from_secs(1);

pub async fn run() {
    let database = Database::create().await;
    let client = database.db.client().await;
    let started = Instant::now();
    client
        .batch_execute(&format!(
            "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload, headers)
             SELECT 'u-' || g, 'order', (g % 1000)::text, 'order.paid',
                    jsonb_build_object('order', g, 'total', g % 977), '{{}}'
             FROM generate_series(1, {UNSENT}) AS g;
             INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload, headers,
                                 queue_url, quarantined_at, quarantine_reason, last_error, attempts)
             SELECT 'q-' || g, 'order', (g % 1000)::text, 'order.paid', '{{}}', '{{}}',
                    CASE WHEN g <= 1000 THEN 'https://sqs.example/123/q' || (g % 3) END,
                    now() - (g || ' seconds')::interval,
                    CASE WHEN g <= 1000 THEN 'destination'
                         ELSE (ARRAY['invalid', 'sender_fault', 'max_attempts', 'too_large'])[g % 4 + 1] END,
                    'SenderFault: InvalidParameterValue for row ' || g, g % 7
             FROM generate_series(1, {QUARANTINED}) AS g;"
        ))
        .await
        .expect("fill the table");
    client
        .batch_execute("VACUUM ANALYZE outbox")
        .await
        .expect("vacuum the table");
    say(&format!(
        "console: {UNSENT} unsent and {QUARANTINED} quarantined rows written and vacuumed in {:.0} s",
        started.elapsed().as_secs_f64()
    ));
    let middle: i64 = client
        .query_one(
            "SELECT id FROM outbox WHERE quarantined_at IS NOT NULL ORDER BY id OFFSET $1 LIMIT 1",
            &[&(QUARANTINED / 2)],
        )
        .await
        .expect("a quarantined id")
        .get(0);

    let mut status_ms = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let (exit, output) = run_to_end(
            &crate::support::scenario::args(&["status", "--database-url", &database.db.url]),
            &[],
            Duration::from_secs(60),
        )
        .await;
        assert!(exit.success(), "status: {output}");
        status_ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }

    let console = RelayProcess::spawn(
        &crate::support::scenario::args(&[
            "console",
            "--database-url",
            &database.db.url,
            "--listen",
            "127.0.0.1:0",
            "--refresh",
            "1s",
        ]),
        &[],
    );
    let addr = console
        .logged_addr("console_addr", Duration::from_secs(30))
        .await;
    let pages = [
        ("overview, cold", "/".to_string(), true),
        ("overview, warm", "/".to_string(), false),
        (
            "quarantine, first page",
            "/table?t=%22outbox%22".to_string(),
            false,
        ),
        (
            "quarantine, one reason",
            "/table?t=%22outbox%22&reason=max_attempts".to_string(),
            false,
        ),
        (
            "quarantine, a deep page",
            format!("/table?t=%22outbox%22&after={middle}"),
            false,
        ),
        ("event", format!("/event?t=%22outbox%22&id={middle}"), false),
    ];
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); pages.len()];
    // The first overview opens the console's connection to the table; not a page an operator
    // waits for twice.
    let _ = request(&addr, "GET", "/", &[], "").await;
    for _ in 0..ROUNDS {
        for (i, (name, path, cold)) in pages.iter().enumerate() {
            if *cold {
                tokio::time::sleep(REFRESH + Duration::from_millis(100)).await;
            }
            let t = Instant::now();
            let (status, _, body) = request(&addr, "GET", path, &[], "").await;
            let ms = t.elapsed().as_secs_f64() * 1000.0;
            assert_eq!(status, 200, "{name}: {body}");
            times[i].push(ms);
        }
    }
    for t in &mut times {
        t.sort_by(f64::total_cmp);
    }
    status_ms.sort_by(f64::total_cmp);
    let status_p50 = quantile(&status_ms, 0.5);
    let line: Vec<String> = pages
        .iter()
        .zip(&times)
        .map(|((name, _, _), t)| {
            format!(
                "{name} p50 {:.1} ms, max {:.1}",
                quantile(t, 0.5),
                t.last().copied().unwrap_or(0.0)
            )
        })
        .collect();
    say(&format!(
        "console at {UNSENT} unsent / {QUARANTINED} quarantined, {ROUNDS} rounds: {}; baseline `outbox-relay status` (a process, its connection and the same statement) p50 {status_p50:.1} ms; cold overview ÷ status {:.2}x",
        line.join("; "),
        quantile(&times[0], 0.5) / status_p50
    ));
    console.sigterm();
    let _ = console.wait_exit(Duration::from_secs(10)).await;
    database.drop_now().await;
}
