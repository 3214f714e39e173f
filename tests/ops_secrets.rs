//! No secret in any log line or error: a whole relay run (text and JSON logs, debug level
//! included) and a row of commands that fail on purpose, all output captured and searched for
//! the database password and the AWS secret key the processes were given; and relays at trace
//! level with every URL-shaped setting carrying a secret (database, OTLP, SQS, SNS and S3
//! endpoints with userinfo), a password file and RDS IAM tokens.

use std::time::Duration;

use crate::scenario::{args, events, insert, run_args};
use crate::support::{
    create_queue, fresh_db, pg, receive_all, run_to_end, sqs, unique, IamProxy, RelayProcess,
    TestDb, TEST_SECRET_ACCESS_KEY,
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

/// `http://user:secret@host…`: `url` with userinfo put in.
fn with_userinfo(url: &str, user: &str, secret: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    format!("{scheme}://{user}:{secret}@{rest}")
}

/// A relay at `RUST_LOG=trace` (the default text format, then JSON) delivers `n` rows of
/// `prefix`, and stops; returns everything it printed.
async fn relay_at_trace(
    args: &[String],
    env: &[(String, String)],
    queue: &str,
    client: &tokio_postgres::Client,
    prefix: &str,
) -> String {
    insert(client, &events(prefix, 3, 1), Duration::ZERO).await;
    let relay = RelayProcess::spawn(args, env);
    assert_eq!(
        receive_all(queue, 3, Duration::from_secs(60)).await.len(),
        3,
        "{}",
        relay.output()
    );
    relay.sigterm();
    relay
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("relay stops");
    relay.output()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_of_any_url_shaped_setting_reaches_the_logs_even_at_trace_level() {
    let password = pg().password().to_string();
    let db = fresh_db().await;
    let queue = create_queue("secrets-trace", &[]).await;
    let endpoint = sqs().endpoint();
    let closed = crate::support::pg::free_port();
    let token = |what: &str| format!("{what}-{}", crate::support::random_hex(10));
    let (otlp, sqs_secret, sns_secret, s3_secret) =
        (token("otlp"), token("sqs"), token("sns"), token("s3"));
    let mut out = Captured::default();
    assert_eq!(
        out.command("migrate", &["migrate", "--database-url", &db.url], &[])
            .await,
        Some(0),
        "{}",
        out.text
    );
    let client = db.client().await;

    // Every endpoint with userinfo, the OTLP collector down so that the exporter logs its
    // failures (with the URL) at debug level.
    let sqs_with_userinfo = with_userinfo(endpoint, "sqs", &sqs_secret);
    let mut urls = run_args(
        &db,
        &queue,
        &sqs_with_userinfo,
        &[
            "--sns-endpoint-url",
            &with_userinfo("http://127.0.0.1:1", "sns", &sns_secret),
            "--offload-bucket",
            "secrets-bucket",
            "--s3-endpoint-url",
            &with_userinfo(endpoint, "s3", &s3_secret),
        ],
    );
    let env = |format: &[(&str, &str)]| -> Vec<(String, String)> {
        [
            ("RUST_LOG", "trace"),
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                &with_userinfo(&format!("http://127.0.0.1:{closed}"), "user", &otlp),
            ),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ]
        .iter()
        .chain(format)
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    };
    let said = relay_at_trace(&urls, &env(&[]), &queue, &client, "trace-text").await;
    // The exporter did log its endpoint, and the line was redacted: the search below covered it.
    assert!(said.contains("user:***@127.0.0.1"), "{said}");
    out.add("run (trace, text, URLs with userinfo)", &said);
    urls.extend(["--log-format".to_string(), "json".to_string()]);
    let said = relay_at_trace(&urls, &env(&[]), &queue, &client, "trace-json").await;
    out.add("run (trace, json, URLs with userinfo)", &said);

    // The password from a file, the URL without it.
    let dir = crate::support::make_temp_dir("secrets-password-file");
    let file = dir.join("password");
    std::fs::write(&file, format!("{password}\n")).unwrap();
    let bare = TestDb {
        name: db.name.clone(),
        url: db.url.replacen(&format!(":{password}@"), "@", 1),
    };
    assert!(!bare.url.contains(&password));
    let args = run_args(
        &bare,
        &queue,
        endpoint,
        &["--database-password-file", file.to_str().unwrap()],
    );
    let said = relay_at_trace(&args, &env(&[]), &queue, &client, "trace-file").await;
    out.add("run (trace, password file)", &said);

    // An RDS IAM token, minted by the relay for each connection.
    let proxy = IamProxy::start(pg().port(), &password);
    let via = TestDb {
        name: db.name.clone(),
        url: proxy.url(&db.name, "postgres"),
    };
    let args = run_args(&via, &queue, endpoint, &["--database-iam-auth"]);
    let said = relay_at_trace(&args, &env(&[]), &queue, &client, "trace-iam").await;
    out.add("run (trace, IAM auth)", &said);
    let tokens = proxy.accepted();
    assert!(!tokens.is_empty(), "the relay logged in with a token");

    let lines = out.text.lines().count();
    println!("searched {lines} lines from {} runs", out.runs);
    let mut secrets: Vec<(String, String)> = vec![
        (password.clone(), "the database password".into()),
        (TEST_SECRET_ACCESS_KEY.into(), "the AWS secret key".into()),
        (otlp, "the OTLP endpoint's token".into()),
        (sqs_secret, "the SQS endpoint's password".into()),
        (sns_secret, "the SNS endpoint's password".into()),
        (s3_secret, "the S3 endpoint's password".into()),
    ];
    for t in tokens {
        let signature = t
            .split('&')
            .find_map(|p| p.strip_prefix("X-Amz-Signature="))
            .expect("a signed token")
            .to_string();
        secrets.push((signature, "an IAM token's signature".into()));
    }
    for (secret, name) in &secrets {
        let leaks: Vec<&str> = out.text.lines().filter(|l| l.contains(secret)).collect();
        assert!(leaks.is_empty(), "{name} leaked:\n{}", leaks.join("\n"));
    }
}
