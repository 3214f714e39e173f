//! The relay's statements are planned once per connection, generically (`outbox::PLANS`), and
//! the plans must keep their shape whatever the table's statistics: made on an empty,
//! never-analyzed table and used after a million rows arrived (autovacuum off, so no ANALYZE
//! comes), and made again after an ANALYZE.

use std::time::Duration;

use outbox_relay::outbox::{ClaimStrategy, OrderBy, OrderScope, Ordered, Outbox, PLANS};
use outbox_relay::row::KeyColumn;
use serde_json::Value;

use crate::scenario::{migrate_with, migrated_db, run_args};
use crate::support::pg::PrivatePg;
use crate::support::{create_queue, sqs, sqs_client, wait_until, RelayProcess, TestDb};

const BACKLOG: i64 = 1_000_000;

/// Every claim strategy the relay builds, each acknowledgement mode.
fn outboxes(db: &TestDb) -> Vec<(String, Outbox)> {
    let ordered = |by: OrderBy, scope: OrderScope| Ordered {
        key: KeyColumn::AggregateId,
        routing: Default::default(),
        skip_poison: false,
        scope,
        by,
    };
    let fifo_only = OrderScope::FifoDestinations {
        route_by: KeyColumn::AggregateType,
        fifo_routes: vec!["order".into()],
    };
    let strategies = [
        ("plain", ClaimStrategy::Plain),
        (
            "fair",
            ClaimStrategy::Fair {
                key: KeyColumn::AggregateType,
            },
        ),
        (
            "ordered",
            ClaimStrategy::Ordered(ordered(OrderBy::Id, OrderScope::Every)),
        ),
        (
            "ordered_fair",
            ClaimStrategy::OrderedFair {
                ordered: ordered(OrderBy::Id, OrderScope::Every),
                fair: KeyColumn::AggregateType,
            },
        ),
        (
            "ordered_by_transaction",
            ClaimStrategy::Ordered(ordered(OrderBy::Transaction, OrderScope::Every)),
        ),
        (
            "ordered_fifo_destinations",
            ClaimStrategy::Ordered(ordered(OrderBy::Id, fifo_only.clone())),
        ),
        (
            "fair_fifo_destinations",
            ClaimStrategy::OrderedFair {
                ordered: ordered(OrderBy::Id, fifo_only),
                fair: KeyColumn::AggregateType,
            },
        ),
    ];
    let mut all = Vec::new();
    for (name, strategy) in strategies {
        for delete in [true, false] {
            let outbox = Outbox::new(&db.url, "outbox".parse().unwrap(), Duration::from_secs(5))
                .unwrap()
                .claim_strategy(strategy.clone())
                .unwrap()
                .delete_on_ack(delete);
            let ack = if delete { "delete" } else { "mark" };
            all.push((format!("{name}/{ack}"), outbox));
        }
    }
    all
}

/// One statement prepared the way the relay's session prepares it (same settings, same
/// text), in a session of the test's own where its plan can be explained.
struct Prepared {
    what: String,
    name: String,
    params: usize,
}

/// The plan EXPLAIN shows for `p`'s cached plan; arguments are NULL (a generic plan does not
/// look at them).
async fn explain(client: &tokio_postgres::Client, p: &Prepared) -> Value {
    let args = vec!["NULL"; p.params].join(", ");
    let args = if p.params == 0 {
        String::new()
    } else {
        format!("({args})")
    };
    let row = client
        .query_one(
            &format!("EXPLAIN (FORMAT JSON) EXECUTE {}{args}", p.name),
            &[],
        )
        .await
        .unwrap_or_else(|e| panic!("explaining {}: {e}", p.what));
    let plan: Value = row.get(0);
    plan[0]["Plan"].clone()
}

/// Each index of the outbox by name, with its first column (or expression) as EXPLAIN writes it.
type Leading = std::collections::HashMap<String, String>;

async fn leading_columns(client: &tokio_postgres::Client) -> Leading {
    client
        .query(
            "SELECT c.relname::text, pg_get_indexdef(i.indexrelid, 1, true)
             FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
             WHERE i.indrelid = 'outbox'::regclass",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// What is wrong with a plan over a large outbox: a scan that reads the whole table or index
/// (a Seq Scan or Bitmap scan of it, or an index scan whose rows pass a Sort, Hash or
/// Aggregate before any Limit stops it). A lookup (an index condition with `=` on the index's
/// first column) is bounded by what it looks up; anything else must be stopped by a Limit that
/// its rows reach streaming. An `=` on a later column alone is no lookup: the scan reads the
/// whole index (`id = ANY (...)` on a (key, id) index did, on a table analyzed while empty).
fn faults(node: &Value, leading: &Leading, path: &mut Vec<String>, found: &mut Vec<String>) {
    let kind = node["Node Type"].as_str().unwrap_or("?").to_string();
    let relation = node["Relation Name"].as_str().unwrap_or("");
    // A ModifyTable changes the rows its input found: the scans below it are what is judged.
    if relation == "outbox" && kind != "ModifyTable" {
        let here = format!(
            "{kind} on outbox {} {}",
            node["Index Name"].as_str().unwrap_or(""),
            node["Index Cond"].as_str().unwrap_or("")
        );
        let first = node["Index Name"].as_str().and_then(|i| leading.get(i));
        // An `=` on the first column, or the claims' `key >= $k AND key <= $k` (an equality the
        // planner keeps on the key's index): the scan reads what that value has, however the
        // rest is sorted. Its rows are one group's; what a held horizon leaves of the group's
        // deleted rows is the documented cost of the ordered head test (docs/guarantees.md,
        // section 12).
        let lookup = node["Index Cond"].as_str().is_some_and(|c| {
            first.is_some_and(|f| {
                (c.contains(&format!("({f} = ")) && !c.contains(">") && !c.contains("<"))
                    || (c.contains(&format!("({f} >= ")) && c.contains(&format!("({f} <= ")))
            })
        });
        match kind.as_str() {
            "Index Scan" | "Index Only Scan" if lookup => {}
            "Index Scan" | "Index Only Scan" => {
                // Walk up: the nearest Limit must come before anything that reads all its input.
                let mut bounded = false;
                for above in path.iter().rev() {
                    if above == "Limit" {
                        bounded = true;
                        break;
                    }
                    if ["Sort", "Hash", "Aggregate", "Incremental Sort", "SetOp"]
                        .contains(&above.as_str())
                    {
                        break;
                    }
                }
                // The probe's EXISTS stops at the first row its scan returns.
                if path.len() == 1
                    && path[0] == "Result"
                    && node["Parent Relationship"] == "InitPlan"
                {
                    bounded = true;
                }
                if !bounded {
                    found.push(format!("{here}: not bounded by a Limit (under {path:?})"));
                }
            }
            _ => found.push(format!("{here}: reads the whole table (under {path:?})")),
        }
    }
    path.push(kind);
    if let Some(children) = node["Plans"].as_array() {
        for child in children {
            faults(child, leading, path, found);
        }
    }
    path.pop();
}

/// An Aggregate whose strategy is Plain reads its input whole, but a `Hashed`/`Sorted` one
/// too: both stop a walk. A Limit above them does not bound the scan below.
fn plan_faults(plan: &Value, leading: &Leading) -> Vec<String> {
    let mut found = Vec::new();
    faults(plan, leading, &mut Vec::new(), &mut found);
    found
}

async fn prepare_all(
    client: &tokio_postgres::Client,
    outboxes: &[(String, Outbox)],
) -> Vec<Prepared> {
    let mut prepared = Vec::new();
    for (case, outbox) in outboxes {
        for s in outbox.relay_statements() {
            let name = format!("p{}", prepared.len());
            let params = client.prepare(s.sql).await.unwrap().params().len();
            client
                .batch_execute(&format!("PREPARE {name} AS {}", s.sql))
                .await
                .unwrap_or_else(|e| panic!("preparing {case} {}: {e}", s.name));
            prepared.push(Prepared {
                what: format!("{case} {}", s.name),
                name,
                params,
            });
        }
    }
    prepared
}

async fn check_all(client: &tokio_postgres::Client, prepared: &[Prepared], when: &str) {
    let leading = leading_columns(client).await;
    let mut wrong = Vec::new();
    for p in prepared {
        let plan = explain(client, p).await;
        let found = plan_faults(&plan, &leading);
        if !found.is_empty() {
            let full = std::env::var_os("PLANS_FULL").is_some();
            wrong.push(format!(
                "{} ({when}):\n  {}\n{}",
                p.what,
                found.join("\n  "),
                if full {
                    serde_json::to_string(&plan).unwrap()
                } else {
                    String::new()
                }
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
}

/// The relay's claims, settlements and probe, in every claim strategy and acknowledgement
/// mode, planned generically on an empty never-analyzed table (as a relay started on a new
/// table plans them), keep a bounded shape once a million rows arrived without an ANALYZE,
/// again after one, and after every row was deleted and the table analyzed as empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generic_plans_made_on_an_empty_table_stay_bounded_at_a_million_rows() {
    let db = migrated_db().await;
    migrate_with(&db, &["--fair-by", "aggregate_type"]).await;
    migrate_with(&db, &["--order-by", "transaction"]).await;
    let client = db.client().await;
    client
        .batch_execute(
            "ALTER TABLE outbox SET (autovacuum_enabled = off);
             ALTER TABLE outbox_claims SET (autovacuum_enabled = off);",
        )
        .await
        .unwrap();
    let outboxes = outboxes(&db);
    client.batch_execute(PLANS).await.unwrap();
    let prepared = prepare_all(&client, &outboxes).await;
    // The first execution makes the generic plan and caches it; EXPLAIN EXECUTE does the same.
    check_all(&client, &prepared, "empty, never analyzed").await;

    let writer = db.client().await;
    writer
        .execute(
            "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload)
             SELECT 'e-' || g, 'type-' || (g % 7), 'agg-' || (g % 5000), 'order.paid',
                    jsonb_build_object('n', g)
             FROM generate_series(1, $1::bigint) AS g",
            &[&BACKLOG],
        )
        .await
        .unwrap();
    let analyzed: Option<std::time::SystemTime> = client
        .query_one(
            "SELECT last_analyze FROM pg_stat_user_tables WHERE relname = 'outbox'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(analyzed.is_none(), "the table was analyzed");
    check_all(
        &client,
        &prepared,
        "1M rows, never analyzed, plan cached empty",
    )
    .await;

    writer.batch_execute("ANALYZE outbox").await.unwrap();
    check_all(&client, &prepared, "1M rows, analyzed").await;

    // What a relay that keeps up leaves while a vacuum horizon is held: every row settled, the
    // table analyzed as empty (reltuples 0), its indexes still full of the deleted rows'
    // entries. Every index then looks one page long to the planner, and a lookup by id could
    // as well be a walk of a (key, id) index: the one that costs a million entries.
    writer
        .batch_execute("DELETE FROM outbox; ANALYZE outbox")
        .await
        .unwrap();
    check_all(
        &client,
        &prepared,
        "1M rows deleted, not vacuumed, analyzed",
    )
    .await;

    // Every use above was of a generic plan, none planned with the arguments.
    let row = client
        .query_one(
            "SELECT sum(generic_plans)::bigint, sum(custom_plans)::bigint FROM pg_prepared_statements",
            &[],
        )
        .await
        .unwrap();
    let (generic, custom): (i64, i64) = (row.get(0), row.get(1));
    assert_eq!(custom, 0, "custom plans were made");
    assert!(
        generic >= 4 * prepared.len() as i64,
        "{generic} generic plans for {} statements used 4 times each",
        prepared.len()
    );
}

/// The relay's own connection reuses its plans: started on an empty, never-analyzed table
/// (autovacuum off), it drains a backlog that arrives afterwards (its claims, catching up, are
/// planned with their parameters), and over a trickle of rows after it pg_stat_statements
/// (`track_planning`) counts a planning of the claim and the settlement per connection, not
/// per call; where pg_stat_statements counts generic and custom plans (`generic_plan_calls`,
/// not in 15 or 18.4), that every call ran the generic plan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_plans_its_claims_and_settlements_once_and_drains_a_backlog_on_a_never_analyzed_table(
) {
    const ROWS: i64 = 30_000;
    let cluster = PrivatePg::start_with(&[
        "shared_preload_libraries=pg_stat_statements",
        "pg_stat_statements.track_planning=on",
    ])
    .await;
    let db = cluster.create_db().await;
    migrate_with(&db, &[]).await;
    let client = db.client().await;
    client
        .batch_execute(
            "CREATE EXTENSION pg_stat_statements;
             ALTER TABLE outbox SET (autovacuum_enabled = off);
             ALTER TABLE outbox_claims SET (autovacuum_enabled = off);",
        )
        .await
        .unwrap();
    let queue = create_queue("plans", &[]).await;
    let relay = RelayProcess::spawn(
        &run_args(
            &db,
            &queue,
            sqs().endpoint(),
            &["--delete-on-ack", "--batch-size", "100"],
        ),
        &[],
    );
    // The relay is up and has probed the empty table: its plans are made now.
    wait_until(
        "the relay probes the empty table",
        Duration::from_secs(60),
        || async { statement(&client, "%SELECT EXISTS (%").await.0 >= 3 },
    )
    .await;
    client
        .execute(
            "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload)
             SELECT 'e-' || g, 'order', 'agg-' || (g % 100), 'order.paid', jsonb_build_object('n', g)
             FROM generate_series(1, $1::bigint) AS g",
            &[&ROWS],
        )
        .await
        .unwrap();
    drained(&client, "the backlog is drained", Duration::from_secs(180)).await;
    let on_queue = sqs_client()
        .await
        .get_queue_attributes()
        .queue_url(&queue)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages)
        .send()
        .await
        .unwrap();
    let n: i64 = on_queue
        .attributes()
        .and_then(|a| a.get(&aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages))
        .and_then(|v| v.parse().ok())
        .unwrap_or(-1);
    assert_eq!(
        n,
        ROWS,
        "every row reached the queue once\n{}",
        relay.output()
    );
    let analyzed: Option<std::time::SystemTime> = client
        .query_one(
            "SELECT last_analyze FROM pg_stat_user_tables WHERE relname = 'outbox'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(analyzed.is_none(), "the table was analyzed");

    // The backlog's claims came back full and were planned with their parameters (a claim that
    // catches up, `ClaimRequest::catching_up`); a stream's claims, which do not fill, reuse the
    // plan. Counted over a trickle after the drain: 30 inserts of 5 rows, each drained.
    client
        .batch_execute("SELECT pg_stat_statements_reset()")
        .await
        .unwrap();
    for i in 0..30 {
        client
            .execute(
                "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload)
                 SELECT 't-' || $1::int || '-' || g, 'order', 'agg-' || g, 'order.paid', jsonb_build_object('n', g)
                 FROM generate_series(1, 5) AS g",
                &[&i],
            )
            .await
            .unwrap();
        drained(&client, "the trickle is drained", Duration::from_secs(60)).await;
    }

    for (what, pattern) in [
        ("claim", "%INSERT INTO \"outbox_claims\"%"),
        ("settlement", "%WITH fence AS (%"),
    ] {
        let (calls, plans, generic, custom) = statement(&client, pattern).await;
        eprintln!(
            "{what}: {calls} calls, {plans} plannings, generic {generic:?}, custom {custom:?}"
        );
        assert!(
            calls >= 20 && plans * 10 <= calls,
            "the {what} was planned {plans} times in {calls} calls"
        );
        if let (Some(generic), Some(custom)) = (generic, custom) {
            assert_eq!(custom, 0, "the {what} ran a custom plan");
            assert!(
                generic >= calls - plans,
                "{what}: {generic} generic plans, {calls} calls"
            );
        }
    }
}

/// pg_stat_statements' calls and plannings of the statements matching `pattern`, and on
/// PostgreSQL 18 how many calls ran a generic and a custom plan.
async fn statement(
    client: &tokio_postgres::Client,
    pattern: &str,
) -> (i64, i64, Option<i64>, Option<i64>) {
    let row = client
        .query_one(
            "SELECT coalesce(sum(calls), 0)::bigint, coalesce(sum(plans), 0)::bigint,
                    sum((to_jsonb(s) ->> 'generic_plan_calls')::bigint)::bigint,
                    sum((to_jsonb(s) ->> 'custom_plan_calls')::bigint)::bigint
             FROM pg_stat_statements AS s
             WHERE query LIKE $1 AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())",
            &[&pattern],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1), row.get(2), row.get(3))
}

/// Waits until the relay has sent (and deleted) every row of the outbox.
async fn drained(client: &tokio_postgres::Client, what: &str, timeout: Duration) {
    wait_until(what, timeout, || async {
        client
            .query_one("SELECT count(*) FROM outbox", &[])
            .await
            .unwrap()
            .get::<_, i64>(0)
            == 0
    })
    .await;
}
