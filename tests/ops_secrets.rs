//! No secret in any log line or error: a whole relay run (text and JSON logs, debug level
//! included) and a row of commands that fail on purpose, all output captured and searched for
//! the database password and the AWS secret key the processes were given.

use std::time::Duration;

use crate::scenario::{args, events, insert, run_args};
use crate::support::{
    create_queue, fresh_db, pg, receive_all, run_to_end, sqs, unique, RelayProcess,
    TEST_SECRET_ACCESS_KEY,
};

/// Everything the processes printed, each run under a header naming it.
#[derive(Default)]
struct Captured {
    text: String,
    runs: usize,
}

impl Captured {
    fn add(&mut self, what: &str, output: &str) {
        self.text.push_str(&format!("==> {what}\n{output}\n"));
        self.runs += 1;
    }

    async fn command(&mut self, what: &str, parts: &[&str], envs: &[(&str, &str)]) -> Option<i32> {
        let envs: Vec<(String, String)> = envs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let (status, output) = run_to_end(&args(parts), &envs, Duration::from_secs(60)).await;
        self.add(what, &output);
        status.code()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_any_log_line_or_error() {
    let password = pg().password().to_string();
    let wrong_password = format!("wrong-{}", crate::support::random_hex(8));
    let db = fresh_db().await;
    let queue = create_queue("secrets", &[]).await;
    let endpoint = sqs().endpoint();
    let mut out = Captured::default();

    // A complete small scenario: migrate, write, relay (text, then JSON at debug level), look.
    assert_eq!(
        out.command("migrate", &["migrate", "--database-url", &db.url], &[])
            .await,
        Some(0),
        "{}",
        out.text
    );
    let client = db.client().await;
    insert(&client, &events("secret-a", 5, 2), Duration::ZERO).await;
    let relay = RelayProcess::spawn(&run_args(&db, &queue, endpoint, &[]), &[]);
    assert_eq!(
        receive_all(&queue, 5, Duration::from_secs(30)).await.len(),
        5
    );
    relay.sigterm();
    relay
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("relay stops");
    out.add("run (text)", &relay.output());

    insert(&client, &events("secret-b", 5, 2), Duration::ZERO).await;
    // The URL from the environment this time, as a deployment would pass it.
    let mut json_args = run_args(&db, &queue, endpoint, &["--log-format", "json"]);
    let at = json_args
        .iter()
        .position(|a| a == "--database-url")
        .unwrap();
    json_args.drain(at..at + 2);
    let relay = RelayProcess::spawn(
        &json_args,
        &[
            ("DATABASE_URL".to_string(), db.url.clone()),
            ("RUST_LOG".to_string(), "debug".to_string()),
        ],
    );
    assert_eq!(
        receive_all(&queue, 5, Duration::from_secs(30)).await.len(),
        5
    );
    relay.sigterm();
    relay
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("relay stops");
    out.add("run (json, debug)", &relay.output());

    out.command("status", &["status", "--database-url", &db.url], &[])
        .await;
    out.command(
        "status --json",
        &["status", "--json", "--database-url", &db.url],
        &[],
    )
    .await;
    out.command(
        "quarantine list",
        &["quarantine", "list", "--database-url", &db.url],
        &[],
    )
    .await;
    out.command(
        "check",
        &[
            "check",
            "--database-url",
            &db.url,
            "--queue-url",
            &queue,
            "--sqs-endpoint-url",
            endpoint,
        ],
        &[("RUST_LOG", "debug")],
    )
    .await;

    // A bad password, for migrate, run and check.
    let bad = db.url.replace(&password, &wrong_password);
    assert_eq!(
        out.command(
            "migrate, bad password",
            &["migrate", "--database-url", &bad],
            &[]
        )
        .await,
        Some(1)
    );
    assert_eq!(
        out.command(
            "run, bad password",
            &[
                "run",
                "--database-url",
                &bad,
                "--queue-url",
                &queue,
                "--sqs-endpoint-url",
                endpoint,
                "--metrics-addr",
                "127.0.0.1:0",
            ],
            &[("RUST_LOG", "debug")],
        )
        .await,
        Some(1)
    );
    out.command(
        "check, bad password",
        &[
            "check",
            "--database-url",
            &bad,
            "--queue-url",
            &queue,
            "--sqs-endpoint-url",
            endpoint,
        ],
        &[],
    )
    .await;

    // A missing queue: the running relay reports it and backs off; check names it.
    let missing = format!("{endpoint}/000000000000/missing-{}", unique());
    let relay = RelayProcess::spawn(&run_args(&db, &missing, endpoint, &[]), &[]);
    insert(&client, &events("secret-c", 3, 1), Duration::ZERO).await;
    crate::support::wait_until(
        "the relay reports the missing queue",
        Duration::from_secs(20),
        || async {
            let said = relay.output();
            said.contains("NonExistentQueue") || said.contains("QueueDoesNotExist")
        },
    )
    .await;
    relay.sigterm();
    relay
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("relay stops");
    out.add("run, missing queue", &relay.output());
    out.command(
        "check, missing queue",
        &[
            "check",
            "--database-url",
            &db.url,
            "--queue-url",
            &missing,
            "--sqs-endpoint-url",
            endpoint,
        ],
        &[],
    )
    .await;

    // Bad flags and bad URLs, every one with the real password in the URL.
    let port = pg().port();
    let closed = crate::support::pg::free_port();
    let bad_flags: [(&str, &[&str]); 5] = [
        (
            "--batch-size nope",
            &["--queue-url", &queue, "--batch-size", "nope"],
        ),
        ("--queue-url not a URL", &["--queue-url", "orders"]),
        (
            "--table a.b.c",
            &["--queue-url", &queue, "--table", "a.b.c"],
        ),
        (
            "--metrics-addr nope",
            &["--queue-url", &queue, "--metrics-addr", "nope"],
        ),
        (
            "--database-url twice",
            &["--queue-url", &queue, "--database-url", &db.url],
        ),
    ];
    for (what, extra) in bad_flags {
        let mut parts = vec![
            "run",
            "--database-url",
            &db.url,
            "--sqs-endpoint-url",
            endpoint,
        ];
        parts.extend(extra);
        let code = out.command(what, &parts, &[]).await;
        assert_eq!(code, Some(2), "{what}: {}", out.text);
    }
    for (what, url) in [
        (
            "a bad port",
            format!("postgres://postgres:{password}@127.0.0.1:notaport/app"),
        ),
        (
            "an unknown parameter",
            format!("postgres://postgres:{password}@127.0.0.1:{port}/app?bogus=1"),
        ),
        (
            "a bad sslmode",
            format!("postgres://postgres:{password}@127.0.0.1:{port}/app?sslmode={password}"),
        ),
        (
            "verify-full without a CA",
            format!("postgres://postgres:{password}@127.0.0.1:{port}/app?sslmode=verify-full"),
        ),
        (
            "a key=value string with an unterminated quote",
            format!("host=127.0.0.1 port={port} password='{password}"),
        ),
        (
            "a key=value string with a stray word",
            format!("host=127.0.0.1 {password} dbname=app"),
        ),
        (
            "nobody listening",
            format!("postgres://postgres:{password}@127.0.0.1:{closed}/app"),
        ),
    ] {
        let code = out
            .command(
                what,
                &["migrate", "--database-url", &url, "--connect-timeout", "2s"],
                &[],
            )
            .await;
        assert_ne!(code, Some(0), "{what}: {}", out.text);
    }

    let lines = out.text.lines().count();
    println!("searched {lines} lines from {} runs", out.runs);
    for (secret, name) in [
        (password.as_str(), "the database password"),
        (wrong_password.as_str(), "the wrong database password"),
        (TEST_SECRET_ACCESS_KEY, "the AWS secret key"),
    ] {
        let leaks: Vec<&str> = out.text.lines().filter(|l| l.contains(secret)).collect();
        assert!(leaks.is_empty(), "{name} leaked:\n{}", leaks.join("\n"));
    }
    // The failures were explained, so the search above covered real error lines.
    assert!(
        out.text.contains("password authentication failed"),
        "{}",
        out.text
    );
    assert!(
        out.text.contains("the queue does not exist"),
        "{}",
        out.text
    );
}
