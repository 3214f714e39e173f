//! `migrate`, `status` and `check` over a selection of several tables (`--table` repeated,
//! `--tables` patterns): each table in turn, a table that fails reported with its name while
//! the others go on; and the commands that act on one table refuse several in one line.

use outbox_relay::version::NEEDS_SCHEMA;
use std::time::Duration;

use crate::scenario::args;
use crate::startup::assert_one_clear_line;
use crate::support::{create_queue, fresh_db, run_to_end, sqs, TestDb};

const TENANTS: [&str; 3] = ["tenant_1", "tenant_2", "tenant_3"];

/// `outbox-relay PARTS --database-url URL`, to its end: the exit code and the output.
async fn relay(db: &TestDb, parts: &[&str]) -> (Option<i32>, String) {
    let mut a = args(parts);
    a.extend(args(&["--database-url", &db.url]));
    let (status, output) = run_to_end(&a, &[], Duration::from_secs(60)).await;
    (status.code(), output)
}

/// A database with the three tenants' schemas and, beside them, a schema no pattern here
/// selects; each tenant's outbox table migrated when `migrated`.
pub(crate) async fn tenants(migrated: bool) -> TestDb {
    let db = fresh_db().await;
    let client = db.client().await;
    for schema in TENANTS.iter().chain(&["other"]) {
        client
            .batch_execute(&format!("CREATE SCHEMA {schema}"))
            .await
            .unwrap();
    }
    if migrated {
        let (code, output) = relay(
            &db,
            &[
                "migrate",
                "--table",
                "tenant_1.outbox",
                "--table",
                "tenant_2.outbox",
                "--table",
                "tenant_3.outbox",
            ],
        )
        .await;
        assert_eq!(code, Some(0), "{output}");
    }
    db
}

fn error_lines(output: &str) -> Vec<&str> {
    output.lines().filter(|l| l.starts_with("error:")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_runs_for_each_selected_table_and_reports_a_failing_one_with_its_name() {
    let db = tenants(false).await;
    let client = db.client().await;

    // Named tables are created, each with its own lines.
    let (code, output) = relay(
        &db,
        &[
            "migrate",
            "--table",
            "tenant_1.outbox",
            "--table",
            "tenant_2.outbox",
            "--table",
            "tenant_3.outbox",
        ],
    )
    .await;
    assert_eq!(code, Some(0), "{output}");
    for tenant in TENANTS {
        assert!(
            output.contains(&format!(
                "migrated \"{tenant}\".\"outbox\" from schema version 0 to {NEEDS_SCHEMA}"
            )),
            "{output}"
        );
    }

    // tenant_2 back at schema version 1 (no lease table); the pattern finds all three and
    // upgrades that one.
    client
        .batch_execute(
            "DROP TABLE tenant_2.outbox_claims;
             UPDATE tenant_2.outbox_relay_schema SET version = 1;",
        )
        .await
        .unwrap();
    let (code, output) = relay(&db, &["migrate", "--tables", "tenant_*.outbox"]).await;
    assert_eq!(code, Some(0), "{output}");
    assert!(
        output.contains(&format!(
            "migrated \"tenant_2\".\"outbox\" from schema version 1 to {NEEDS_SCHEMA}"
        )),
        "{output}"
    );
    for tenant in ["tenant_1", "tenant_3"] {
        assert!(
            output.contains(&format!(
                "\"{tenant}\".\"outbox\" is up to date (schema version {NEEDS_SCHEMA})"
            )),
            "{output}"
        );
    }
    let claims: bool = client
        .query_one(
            "SELECT to_regclass('tenant_2.outbox_claims') IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(claims, "the upgrade created tenant_2's lease table again");

    // --print-sql: each table's statements under a comment naming it, in the selection's order.
    let (code, output) = relay(
        &db,
        &["migrate", "--print-sql", "--tables", "tenant_*.outbox"],
    )
    .await;
    assert_eq!(code, Some(0), "{output}");
    let headers: Vec<&str> = output.lines().filter(|l| l.starts_with("-- \"")).collect();
    assert_eq!(
        headers,
        [
            "-- \"tenant_1\".\"outbox\"",
            "-- \"tenant_2\".\"outbox\"",
            "-- \"tenant_3\".\"outbox\""
        ],
        "{output}"
    );
    for tenant in TENANTS {
        let lock = format!("'outbox-relay migrate ' || '\"{tenant}\".\"outbox\"'");
        assert_eq!(
            output.matches(&lock).count(),
            1,
            "each table's own statements:\n{output}"
        );
    }

    // A table that cannot be migrated (a table of the application's, no outbox) is named in
    // its error line; the tables after it are still migrated.
    client
        .batch_execute("CREATE TABLE other.outbox (x int)")
        .await
        .unwrap();
    let (code, output) = relay(
        &db,
        &[
            "migrate",
            "--table",
            "tenant_1.outbox",
            "--table",
            "other.outbox",
            "--table",
            "tenant_3.outbox",
        ],
    )
    .await;
    assert_eq!(code, Some(1), "{output}");
    let errors = error_lines(&output);
    assert_eq!(errors.len(), 1, "{output}");
    assert!(
        errors[0].starts_with("error: \"other\".\"outbox\": "),
        "{}",
        errors[0]
    );
    assert!(
        output.contains("\"tenant_3\".\"outbox\" is up to date"),
        "the table after the failed one still ran:\n{output}"
    );

    // A pattern that matches nothing is said in one line, and nothing is migrated.
    let (code, output) = relay(&db, &["migrate", "--tables", "x_*.outbox"]).await;
    assert_eq!(code, Some(1), "{output}");
    assert_one_clear_line(&output, "--tables 'x_*.outbox' matches no table");
    assert!(!output.contains("up to date"), "{output}");
}

/// Rows of `tenant`'s outbox: `unsent` unsent ones created `age` ago, `quarantined` more.
async fn fill(db: &TestDb, tenant: &str, unsent: i32, age: &str, quarantined: i32) {
    let client = db.client().await;
    client
        .execute(
            &format!(
                "INSERT INTO {tenant}.outbox (event_id, aggregate_type, aggregate_id, event_type,
                                            payload, created_at, quarantined_at, quarantine_reason)
                 SELECT '{tenant}-' || i, 'order', 'a', 'order.paid', '{{}}',
                        now() - $1::text::interval,
                        CASE WHEN i > $2::int THEN now() END,
                        CASE WHEN i > $2::int THEN 'invalid' END
                 FROM generate_series(1, $2::int + $3::int) AS i"
            ),
            &[&age, &unsent, &quarantined],
        )
        .await
        .unwrap();
}

fn tables_of(json: &serde_json::Value) -> Vec<&str> {
    json.as_array()
        .unwrap_or_else(|| panic!("an array: {json}"))
        .iter()
        .map(|t| {
            t["table"]
                .as_str()
                .unwrap_or_else(|| panic!("a table in {t}"))
        })
        .collect()
}

fn json_line(output: &str, start: char) -> serde_json::Value {
    output
        .lines()
        .find(|l| l.starts_with(start))
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no JSON starting with {start} in:\n{output}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_lists_each_table_worst_first_and_one_it_cannot_read_with_its_error() {
    let db = tenants(true).await;
    // Oldest unsent row first: tenant_2 (an hour), tenant_3 (ten minutes, but fewer rows than
    // tenant_1 would need to come first), tenant_1 (a minute, most rows).
    fill(&db, "tenant_1", 50, "1 minute", 0).await;
    fill(&db, "tenant_2", 2, "1 hour", 0).await;
    fill(&db, "tenant_3", 5, "10 minutes", 4).await;

    let (code, output) = relay(&db, &["status", "--json", "--tables", "tenant_*.outbox"]).await;
    assert_eq!(code, Some(0), "{output}");
    let json = json_line(&output, '[');
    assert_eq!(
        tables_of(&json),
        [
            "\"tenant_2\".\"outbox\"",
            "\"tenant_3\".\"outbox\"",
            "\"tenant_1\".\"outbox\""
        ],
        "{json}"
    );
    let unsent: Vec<i64> = json
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["unsent"].as_i64().unwrap())
        .collect();
    assert_eq!(unsent, [2, 5, 50], "{json}");
    assert_eq!(json[1]["quarantined"].as_i64(), Some(4), "{json}");

    // The text form: each table's block, in the same order.
    let (code, output) = relay(&db, &["status", "--tables", "tenant_*.outbox"]).await;
    assert_eq!(code, Some(0), "{output}");
    let heads: Vec<&str> = output.lines().filter(|l| l.starts_with("table ")).collect();
    assert_eq!(heads.len(), 3, "{output}");
    for (head, tenant) in heads.iter().zip(["tenant_2", "tenant_3", "tenant_1"]) {
        assert!(
            head.ends_with(&format!("\"{tenant}\".\"outbox\"")),
            "{output}"
        );
    }

    // One table gone meanwhile: listed with its error, first, and the others still read.
    db.client()
        .await
        .batch_execute("DROP TABLE tenant_1.outbox CASCADE")
        .await
        .unwrap();
    let named = [
        "--table",
        "tenant_1.outbox",
        "--table",
        "tenant_2.outbox",
        "--table",
        "tenant_3.outbox",
    ];
    let mut command = vec!["status", "--json"];
    command.extend(named);
    let (code, output) = relay(&db, &command).await;
    assert_eq!(code, Some(1), "{output}");
    let json = json_line(&output, '[');
    assert_eq!(
        tables_of(&json),
        [
            "\"tenant_1\".\"outbox\"",
            "\"tenant_2\".\"outbox\"",
            "\"tenant_3\".\"outbox\""
        ],
        "{json}"
    );
    let error = json[0]["error"]
        .as_str()
        .unwrap_or_else(|| panic!("{json}"));
    assert!(error.contains("tenant_1"), "{error}");
    assert!(json[0].get("unsent").is_none(), "{json}");
    assert_eq!(json[1]["unsent"].as_i64(), Some(2), "{json}");
    assert!(json[2].get("error").is_none(), "{json}");

    let mut command = vec!["status"];
    command.extend(named);
    let (code, output) = relay(&db, &command).await;
    assert_eq!(code, Some(1), "{output}");
    assert!(
        output
            .lines()
            .any(|l| l.starts_with("\"tenant_1\".\"outbox\": ")),
        "{output}"
    );
    assert_eq!(
        output.lines().filter(|l| l.starts_with("table ")).count(),
        2,
        "{output}"
    );

    // One table: the object as it always was.
    let (code, output) = relay(&db, &["status", "--json", "--table", "tenant_3.outbox"]).await;
    assert_eq!(code, Some(0), "{output}");
    let json = json_line(&output, '{');
    assert_eq!(json["table"], "\"tenant_3\".\"outbox\"", "{json}");
    assert_eq!(json["unsent"].as_i64(), Some(5), "{json}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_labels_each_tables_lines_and_runs_the_others_once() {
    let db = tenants(true).await;
    let queue = create_queue("many-check", &[]).await;
    let check = |extra: &'static [&'static str]| {
        let mut a = vec![
            "check",
            "--queue-url",
            queue.as_str(),
            "--sqs-endpoint-url",
            sqs().endpoint(),
            "--connect-timeout",
            "5s",
        ];
        a.extend(extra);
        a
    };
    let two: &[&str] = &["--table", "tenant_1.outbox", "--table", "tenant_2.outbox"];
    let (code, output) = relay(&db, &check(two)).await;
    assert_eq!(code, Some(0), "{output}");
    let verdicts: Vec<&str> = output
        .lines()
        .filter(|l| l.starts_with("ok   ") || l.starts_with("FAIL "))
        .collect();
    for tenant in ["tenant_1", "tenant_2"] {
        let label = format!("ok   [\"{tenant}\".\"outbox\"] ");
        assert!(
            verdicts
                .iter()
                .any(|l| *l == format!("{label}table \"{tenant}\".\"outbox\" exists")),
            "{output}"
        );
        assert!(
            verdicts
                .iter()
                .any(|l| l.starts_with(&label) && l.contains("the relay's statements prepare on")),
            "{output}"
        );
    }
    // What is not about a table is said once, unlabelled.
    assert_eq!(
        verdicts
            .iter()
            .filter(|l| **l == "ok   configuration")
            .count(),
        1,
        "{output}"
    );
    assert_eq!(
        verdicts
            .iter()
            .filter(|l| l.contains(&format!("queue {queue} reachable")))
            .count(),
        1,
        "{output}"
    );
    assert!(
        !verdicts
            .iter()
            .any(|l| l.contains("queue") && l.contains("[\"tenant_")),
        "{output}"
    );
    // The connection's pooler is the same for every table: said with the first only.
    assert_eq!(
        verdicts
            .iter()
            .filter(|l| l.contains("connections: --pooler"))
            .count(),
        1,
        "{output}"
    );

    // A table that is gone fails under its label; the other still passes.
    db.client()
        .await
        .batch_execute("DROP TABLE tenant_2.outbox CASCADE")
        .await
        .unwrap();
    let (code, output) = relay(&db, &check(two)).await;
    assert_eq!(code, Some(1), "{output}");
    let failed: Vec<&str> = output.lines().filter(|l| l.starts_with("FAIL ")).collect();
    assert_eq!(failed.len(), 1, "{output}");
    assert!(
        failed[0]
            .starts_with("FAIL [\"tenant_2\".\"outbox\"] table \"tenant_2\".\"outbox\" exists"),
        "{output}"
    );
    assert!(
        output.contains("ok   [\"tenant_1\".\"outbox\"] table \"tenant_1\".\"outbox\" exists"),
        "{output}"
    );

    // A pattern that matches nothing fails its own line.
    let (code, output) = relay(&db, &check(&["--tables", "x_*.outbox"])).await;
    assert_eq!(code, Some(1), "{output}");
    assert!(
        output.contains("FAIL --tables 'x_*.outbox' selects a table: no outbox table"),
        "{output}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_one_table_commands_refuse_several_tables_in_one_line() {
    let db = tenants(true).await;
    let two = ["--table", "tenant_1.outbox", "--table", "tenant_2.outbox"];
    for (command, flags) in [
        (&["quarantine", "list"][..], &[][..]),
        (&["quarantine", "retry"][..], &["--all"][..]),
        (&["replay"][..], &["--since", "1h"][..]),
    ] {
        let name = command.join(" ");
        let mut a: Vec<&str> = command.to_vec();
        a.extend(flags);
        a.extend(two);
        let (code, output) = relay(&db, &a).await;
        assert_eq!(code, Some(2), "{name}: {output}");
        assert_one_clear_line(
            &output,
            &format!("{name} acts on one table: give one --table (the selection names 2 tables)"),
        );
        let mut a: Vec<&str> = command.to_vec();
        a.extend(flags);
        a.extend(["--tables", "tenant_*.outbox"]);
        let (code, output) = relay(&db, &a).await;
        assert_eq!(code, Some(2), "{name}: {output}");
        assert_one_clear_line(&output, "(--tables 'tenant_*.outbox' is a pattern)");
    }
    // One table still works.
    let (code, output) = relay(&db, &["quarantine", "list", "--table", "tenant_1.outbox"]).await;
    assert_eq!(code, Some(0), "{output}");
    assert!(output.contains("no quarantined rows"), "{output}");
}
