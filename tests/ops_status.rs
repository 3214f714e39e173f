//! `outbox-relay status` on a million rows: it answers from the partial indexes, and its
//! numbers are the ones a full count finds.

use std::time::{Duration, Instant};

use crate::scenario::{args, migrated_db};
use crate::support::run_to_end;

const ROWS: i64 = 1_000_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_on_a_million_rows_answers_from_the_indexes_and_matches_a_full_count() {
    let db = migrated_db().await;
    let client = db.client().await;
    // Filling a million rows is the heaviest thing in the suite; on a small machine it would
    // starve the tests beside it that measure leases and timeouts. So the backend doing it runs
    // at the lowest CPU priority, and the table skips the WAL (which status does not care about).
    let backend: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    // SAFETY: setpriority(2) on a process of the test's own PostgreSQL; failure only costs speed.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, backend as libc::id_t, 19) };
    client
        .batch_execute("ALTER TABLE outbox SET UNLOGGED")
        .await
        .unwrap();
    let filled = Instant::now();
    // Mostly sent (a day ago), 5% unsent, some of those leased, 0.5% quarantined under five
    // reasons (two of them parked: still unsent); created_at grows with id, as it does when
    // rows are written over time.
    client
        .execute(
            "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload,
                                 created_at, sent_at, quarantined_at, quarantine_reason)
             SELECT 'bulk-' || i, 'order', 'agg-' || (i % 1000), 'order.paid',
                    '{}',
                    now() - interval '2 hours' + i * interval '1 ms',
                    CASE WHEN i % 200 <> 0 AND i % 20 <> 1 THEN now() - interval '1 day' END,
                    CASE WHEN i % 200 = 0 THEN now() END,
                    CASE WHEN i % 200 = 0
                         THEN (ARRAY['invalid', 'max_attempts', 'sender_fault', 'blocked',
                                     'destination'])[1 + (i / 200) % 5] END
             FROM generate_series(1, $1::bigint) AS i",
            &[&ROWS],
        )
        .await
        .expect("fill the table");
    // Leases live in the claims table (sql/claims.sql), a hundred rows to a claim: one unsent
    // row in 400 under claims that last an hour more, as many under claims that ended (their
    // relay stopped; no longer leased, though still listed until the next claim removes them).
    client
        .execute(
            "INSERT INTO outbox_claims (owner, until, ids)
             SELECT 'bulk-relay', until, array_agg(id ORDER BY id)
             FROM (SELECT o.id,
                          CASE WHEN n.i % 400 = 1 THEN now() + interval '1 hour'
                               ELSE now() - interval '1 minute' END AS until,
                          n.i / 40000 AS part
                   FROM outbox AS o,
                        LATERAL (SELECT split_part(o.event_id, '-', 2)::bigint AS i) AS n
                   WHERE n.i % 400 IN (1, 21)) AS c
             GROUP BY until, part",
            &[],
        )
        .await
        .expect("fill the claims");
    // A thousand rows sent just now, so "sent in the last minute" has something to count and
    // stays the same while the test compares (it takes seconds, not a minute).
    client
        .execute(
            "UPDATE outbox SET sent_at = now() WHERE sent_at IS NOT NULL AND id % 1000 = 2",
            &[],
        )
        .await
        .unwrap();
    // What autovacuum would have done by now on a table this size.
    client
        .batch_execute("VACUUM (ANALYZE) outbox, outbox_claims")
        .await
        .unwrap();
    println!("filled {ROWS} rows in {:?}", filled.elapsed());

    let started = Instant::now();
    let (status, output) = run_to_end(
        &args(&["status", "--json", "--database-url", &db.url]),
        &[],
        Duration::from_secs(60),
    )
    .await;
    println!(
        "status --json on {ROWS} rows took {:?} (process start and connect included)",
        started.elapsed()
    );
    assert!(status.success(), "{output}");
    let json: serde_json::Value = output
        .lines()
        .find(|l| l.starts_with('{'))
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no JSON object in:\n{output}"));
    println!("{json}");

    // The same numbers by brute force: sequential scans, no index involved.
    client
        .batch_execute(
            "SET enable_indexscan = off; SET enable_indexonlyscan = off; SET enable_bitmapscan = off",
        )
        .await
        .unwrap();
    let direct = client
        .query_one(
            "SELECT count(*) FILTER (WHERE sent_at IS NULL AND (quarantined_at IS NULL
                                     OR quarantine_reason IN ('blocked', 'destination'))),
                    count(*) FILTER (WHERE sent_at IS NULL AND quarantined_at IS NULL
                                     AND id IN (SELECT unnest(ids) FROM outbox_claims
                                                WHERE until > now())),
                    count(*) FILTER (WHERE quarantined_at IS NOT NULL),
                    count(*) FILTER (WHERE quarantined_at IS NOT NULL AND quarantine_reason = 'invalid'),
                    count(*) FILTER (WHERE quarantined_at IS NOT NULL AND quarantine_reason = 'max_attempts'),
                    count(*) FILTER (WHERE quarantined_at IS NOT NULL AND quarantine_reason = 'sender_fault'),
                    count(*) FILTER (WHERE sent_at > now() - interval '1 minute'),
                    extract(epoch FROM now() - min(created_at)
                            FILTER (WHERE sent_at IS NULL AND (quarantined_at IS NULL
                                    OR quarantine_reason IN ('blocked', 'destination'))))::float8,
                    count(*) FILTER (WHERE quarantined_at IS NOT NULL
                                     AND quarantine_reason IN ('blocked', 'destination'))
             FROM outbox",
            &[],
        )
        .await
        .unwrap();
    let n = |i: usize| direct.get::<_, i64>(i);
    let field = |name: &str| {
        json[name]
            .as_i64()
            .unwrap_or_else(|| panic!("{name} in {json}"))
    };
    assert_eq!(field("unsent"), n(0));
    assert_eq!(field("leased"), n(1));
    assert_eq!(field("parked"), n(8));
    assert_eq!(field("quarantined"), n(2));
    let by_reason = &json["quarantined_by_reason"];
    assert_eq!(by_reason["invalid"].as_i64(), Some(n(3)));
    assert_eq!(by_reason["max_attempts"].as_i64(), Some(n(4)));
    assert_eq!(by_reason["sender_fault"].as_i64(), Some(n(5)));
    let parked_by_reason = ["blocked", "destination"].map(|r| by_reason[r].as_i64().unwrap_or(0));
    assert_eq!(parked_by_reason.iter().sum::<i64>(), n(8), "{json}");
    assert_eq!(field("sent_last_minute"), n(6));
    // The numbers the mix was built to have, so the comparison is not of two zeros.
    assert_eq!(
        (n(0), n(1), n(2), n(6), n(8)),
        (
            ROWS / 20 + ROWS / 200 * 2 / 5,
            ROWS / 400,
            ROWS / 200,
            ROWS / 1000,
            ROWS / 200 * 2 / 5
        )
    );
    let age = json["oldest_unsent_age_seconds"].as_f64().unwrap();
    let direct_age: f64 = direct.get(7);
    assert!(
        age > 7000.0,
        "the oldest unsent row is about two hours old: {age}"
    );
    assert!(
        (direct_age - age).abs() < 60.0,
        "status said {age}s, a full scan {direct_age}s"
    );
    assert_eq!(json["table"], "\"outbox\"");

    // No part of status, nor of the gauges' statement, reads the whole table.
    client
        .batch_execute(
            "RESET enable_indexscan; RESET enable_indexonlyscan; RESET enable_bitmapscan",
        )
        .await
        .unwrap();
    for file in ["sql/status.sql", "sql/stats.sql"] {
        let sql = std::fs::read_to_string(crate::support::repo_root().join(file))
            .unwrap()
            .replace("{table}", "\"outbox\"")
            .replace("{claims}", "\"outbox_claims\"")
            // The insertion order's (--order-by id) parts of the gauges.
            .replace("{carried}", "")
            .replace("{watermark}", "0::bigint, 0::float8")
            // The gauges' bound on how many index entries each side counts.
            .replace("$1", &outbox_relay::outbox::STATS_EXACT_UP_TO.to_string())
            // The gauges' floor (src/outbox/floors.rs): a relay that just started.
            .replace("$2", "0");
        let plan: Vec<String> = client
            .query(&format!("EXPLAIN (COSTS OFF) {sql}"), &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        let plan = plan.join("\n");
        println!("{file}:\n{plan}");
        // The claims table is read whole by design: a few rows, one per claim in flight.
        assert!(
            !plan
                .lines()
                .any(|l| l.contains("Seq Scan") && !l.contains("Seq Scan on outbox_claims")),
            "{file} scans the table:\n{plan}"
        );
    }

    // The text form carries the same numbers, aligned.
    let (status, output) = run_to_end(
        &args(&["status", "--database-url", &db.url]),
        &[],
        Duration::from_secs(60),
    )
    .await;
    assert!(status.success(), "{output}");
    let unsent_line = output
        .lines()
        .find(|l| l.starts_with("unsent "))
        .unwrap_or_else(|| panic!("no unsent line:\n{output}"));
    assert!(unsent_line.ends_with(&format!(" {}", n(0))), "{output}");
    assert!(
        output
            .lines()
            .any(|l| l.trim_start().starts_with("max_attempts ")),
        "{output}"
    );
}
