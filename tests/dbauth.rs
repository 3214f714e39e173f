//! Where the database password comes from: RDS IAM auth tokens (through [`IamProxy`], which
//! checks them as RDS does), a password file rotated while the relay runs, and the flag
//! combinations refused at start-up. Every process's output is searched for the secrets.

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use crate::scenario::{args, events, insert, run_args, wait_count};
use crate::support::pg::PrivatePg;
use crate::support::{
    create_queue, fresh_db, make_temp_dir, pg, random_hex, receive_all, run_to_end, sqs, unique,
    wait_until, IamProxy, RelayProcess, TestDb, TEST_SECRET_ACCESS_KEY,
};

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Panics naming the line of `output` that contains any of `secrets`.
fn assert_no_secret(output: &str, secrets: &[&str]) {
    for secret in secrets {
        if let Some(line) = output.lines().find(|l| l.contains(secret)) {
            panic!("a secret reached the output: {line}");
        }
    }
}

/// Terminates the relay's backends (`application_name` outbox-relay/VERSION) as an operator or a
/// failover would; returns how many there were.
async fn terminate_relay_backends(admin: &tokio_postgres::Client, user: &str) -> i64 {
    admin
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
             WHERE application_name LIKE 'outbox-relay/%' AND usename = $1",
            &[&user],
        )
        .await
        .expect("terminate the relay's backends")
        .get(0)
}

/// The signature part of a token: what makes it a credential.
fn signature(token: &str) -> &str {
    token
        .split('&')
        .find_map(|p| p.strip_prefix("X-Amz-Signature="))
        .expect("a signed token")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn iam_tokens_are_fresh_for_every_connection_and_the_relay_outlives_their_expiry() {
    // wal_level=logical, so the logical wake-up's replication connection logs in with a token too.
    let cluster = PrivatePg::start_with(&["wal_level=logical"]).await;
    let db = cluster.create_db().await;
    let proxy = IamProxy::start(cluster.port(), cluster.password());
    let via = TestDb {
        name: db.name.clone(),
        url: proxy.url(&db.name, "postgres"),
    };
    let queue = create_queue("iam", &[]).await;
    let endpoint = sqs().endpoint();
    let mut output = String::new();

    let (status, said) = run_to_end(
        &args(&[
            "migrate",
            "--database-url",
            &via.url,
            "--database-iam-auth",
            "--wakeup",
            "logical",
        ]),
        &[],
        Duration::from_secs(60),
    )
    .await;
    assert!(status.success(), "migrate with IAM auth: {said}");
    output.push_str(&said);
    let check = args(&[
        "check",
        "--database-url",
        &via.url,
        "--queue-url",
        &queue,
        "--sqs-endpoint-url",
        endpoint,
        "--wakeup",
        "logical",
    ]);
    // The environment variable, as a deployment sets it.
    let (status, said) = run_to_end(
        &check,
        &env(&[("OUTBOX_DATABASE_IAM_AUTH", "true")]),
        Duration::from_secs(60),
    )
    .await;
    assert!(status.success(), "check with IAM auth: {said}");
    assert!(
        said.contains("ok   wake-up mode logical is set up"),
        "{said}"
    );
    output.push_str(&said);

    let relay = RelayProcess::spawn(
        &run_args(
            &via,
            &queue,
            endpoint,
            &["--database-iam-auth", "--wakeup", "logical"],
        ),
        &env(&[("RUST_LOG", "debug,aws_sigv4=trace")]),
    );
    let client = db.client().await;
    insert(&client, &events("iam-a", 5, 2), Duration::ZERO).await;
    assert_eq!(
        receive_all(&queue, 5, Duration::from_secs(30)).await.len(),
        5,
        "{}",
        relay.output()
    );
    // Settled before its connections are cut, so the count below is of the events written after
    // the cut: a settlement the cut interrupts is retried on the next connection (the one under
    // test), and its five are sent again should that outlast their lease.
    wait_count(&client, "sent_at IS NOT NULL", 5, Duration::from_secs(30)).await;

    // Tokens from now on last 2 s; every one the relay holds is made stale before its
    // connections are cut, so only a token signed anew gets it back in.
    proxy.set_max_age(Duration::from_secs(2));
    let before = proxy.accepted().len();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let admin = db.client().await;
    let cut = terminate_relay_backends(&admin, "postgres").await;
    assert!(
        cut >= 2,
        "the session and the logical wake-up: {cut} backends"
    );
    insert(&client, &events("iam-b", 5, 2), Duration::ZERO).await;
    assert_eq!(
        receive_all(&queue, 5, Duration::from_secs(30)).await.len(),
        5,
        "{}",
        relay.output()
    );
    wait_until(
        "the relay's session and logical wake-up are back, each with a token of its own",
        Duration::from_secs(30),
        || async { proxy.accepted().len() >= before + 2 },
    )
    .await;
    relay.sigterm();
    relay
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("relay stops");
    output.push_str(&relay.output());

    // Connections opened within the same second get the same token (the signature covers
    // the time to the second); those opened after the cut must all be new ones.
    let accepted = proxy.accepted();
    let (old, new) = accepted.split_at(before);
    let old: HashSet<&String> = old.iter().collect();
    assert!(
        new.iter().all(|t| !old.contains(t)),
        "a token from before the cut was presented again"
    );
    assert_eq!(proxy.rejected(), Vec::<String>::new());

    // A relay signing with the wrong secret is refused by the proxy, and says so in one line.
    let wrong_secret = format!("wrong-{}", random_hex(8));
    let (status, said) = run_to_end(
        &check,
        &env(&[
            ("OUTBOX_DATABASE_IAM_AUTH", "1"),
            ("AWS_SECRET_ACCESS_KEY", &wrong_secret),
        ]),
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(status.code(), Some(1), "{said}");
    assert!(said.contains("PAM authentication failed"), "{said}");
    let rejected = proxy.rejected();
    assert!(
        rejected.iter().any(|r| r.contains("signature")),
        "{rejected:?}"
    );
    output.push_str(&said);

    let mut secrets = vec![TEST_SECRET_ACCESS_KEY, wrong_secret.as_str()];
    secrets.extend(accepted.iter().map(|t| signature(t)));
    assert_no_secret(&output, &secrets);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_file_rotated_in_place_is_read_at_the_next_connection() {
    let db = fresh_db().await;
    let (status, said) = run_to_end(
        &args(&["migrate", "--database-url", &db.url]),
        &[],
        Duration::from_secs(30),
    )
    .await;
    assert!(status.success(), "{said}");
    let admin = db.client().await;
    let role = format!("relay_pw_{}", unique());
    let first = random_hex(12);
    let second = random_hex(12);
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN PASSWORD '{first}';
             GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role};"
        ))
        .await
        .expect("create the relay's role");
    let url = format!("postgres://{role}@127.0.0.1:{}/{}", pg().port(), db.name);
    let secrets = make_temp_dir("password-file");
    let file = secrets.join("password");
    std::fs::write(&file, format!("{first}\n")).unwrap();
    let file_arg = file.to_str().unwrap();
    let queue = create_queue("pwfile", &[]).await;
    let endpoint = sqs().endpoint();
    let mut output = String::new();

    let check = args(&[
        "check",
        "--database-url",
        &url,
        "--database-password-file",
        file_arg,
        "--queue-url",
        &queue,
        "--sqs-endpoint-url",
        endpoint,
    ]);
    let (status, said) = run_to_end(&check, &[], Duration::from_secs(60)).await;
    assert!(status.success(), "check with a password file: {said}");
    output.push_str(&said);

    let via = TestDb {
        name: db.name.clone(),
        url: url.clone(),
    };
    let relay = RelayProcess::spawn(
        &run_args(&via, &queue, endpoint, &[]),
        &env(&[
            ("OUTBOX_DATABASE_PASSWORD_FILE", file_arg),
            ("RUST_LOG", "debug"),
        ]),
    );
    insert(&admin, &events("pwfile-a", 5, 2), Duration::ZERO).await;
    assert_eq!(
        receive_all(&queue, 5, Duration::from_secs(30)).await.len(),
        5,
        "{}",
        relay.output()
    );
    // Settled before its connections are cut, so the count below is of the events written after
    // the rotation: a settlement the cut interrupts is retried on the next connection (the one
    // under test), and its five are sent again should that outlast their lease.
    wait_count(&admin, "sent_at IS NOT NULL", 5, Duration::from_secs(30)).await;

    // Rotation as Kubernetes does it: the new content appears at once, in place (a rename).
    admin
        .batch_execute(&format!("ALTER ROLE {role} PASSWORD '{second}'"))
        .await
        .unwrap();
    let staged = secrets.join("password.new");
    std::fs::write(&staged, format!("{second}\n")).unwrap();
    std::fs::rename(&staged, &file).unwrap();
    let cut = terminate_relay_backends(&admin, &role).await;
    assert!(cut >= 1, "the relay had no backend to cut");
    insert(&admin, &events("pwfile-b", 5, 2), Duration::ZERO).await;
    assert_eq!(
        receive_all(&queue, 5, Duration::from_secs(30)).await.len(),
        5,
        "{}",
        relay.output()
    );
    assert!(
        relay
            .wait_for_line("database connection established", Duration::from_secs(10))
            .await
            .is_some(),
        "{}",
        relay.output()
    );
    relay.sigterm();
    relay
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("relay stops");
    output.push_str(&relay.output());

    // The old content is refused by the server; the error names the file's source, not it.
    let stale = secrets.join("stale");
    std::fs::write(&stale, &first).unwrap();
    let (status, said) = run_to_end(
        &args(&[
            "status",
            "--database-url",
            &url,
            "--database-password-file",
            stale.to_str().unwrap(),
        ]),
        &[],
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(status.code(), Some(1), "{said}");
    assert!(said.contains("password authentication failed"), "{said}");
    output.push_str(&said);
    assert_no_secret(&output, &[&first, &second]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contradicting_or_missing_password_sources_exit_2_with_one_line() {
    let password = pg().password().to_string();
    let port = pg().port();
    let with_password = format!("postgres://postgres:{password}@127.0.0.1:{port}/app");
    let without = format!("postgres://postgres@127.0.0.1:{port}/app");
    let dir = make_temp_dir("password-flags");
    let file = dir.join("password");
    std::fs::write(&file, format!("{password}\n")).unwrap();
    let empty = dir.join("empty");
    std::fs::write(&empty, "\n").unwrap();
    let missing = dir.join("missing");
    let path = |p: &Path| p.to_str().unwrap().to_string();
    let queue = format!("{}/000000000000/q", sqs().endpoint());
    let cases: Vec<(&str, Vec<String>, &str)> = vec![
        (
            "IAM and a URL password",
            args(&["--database-url", &with_password, "--database-iam-auth"]),
            "remove the password from --database-url",
        ),
        (
            "IAM and a password file",
            args(&[
                "--database-url",
                &without,
                "--database-iam-auth",
                "--database-password-file",
                &path(&file),
            ]),
            "choose one",
        ),
        (
            "a password file and a URL password",
            args(&[
                "--database-url",
                &with_password,
                "--database-password-file",
                &path(&file),
            ]),
            "remove the password from the URL",
        ),
        (
            "IAM without TLS",
            args(&[
                "--database-url",
                &format!("{without}?sslmode=disable"),
                "--database-iam-auth",
            ]),
            "not sslmode=disable",
        ),
        (
            "a missing password file",
            args(&[
                "--database-url",
                &without,
                "--database-password-file",
                &path(&missing),
            ]),
            "no such file",
        ),
        (
            "an empty password file",
            args(&[
                "--database-url",
                &without,
                "--database-password-file",
                &path(&empty),
            ]),
            "is empty",
        ),
    ];
    for (what, flags, needle) in &cases {
        for command in [
            vec![
                "run",
                "--queue-url",
                &queue,
                "--metrics-addr",
                "127.0.0.1:0",
            ],
            vec!["migrate"],
            vec!["status"],
        ] {
            let mut argv = args(&command);
            argv.extend(flags.iter().cloned());
            let (status, said) = run_to_end(&argv, &[], Duration::from_secs(30)).await;
            let said = said.trim();
            assert_eq!(status.code(), Some(2), "{what}, {}: {said}", command[0]);
            assert_eq!(said.lines().count(), 1, "{what}, {}: {said}", command[0]);
            assert!(said.starts_with("error: "), "{what}: {said}");
            assert!(said.contains(needle), "{what}: {said}");
            assert_no_secret(said, &[&password]);
        }
    }
}
