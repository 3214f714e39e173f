//! `outbox-relay console` (docs/console.md): closed and read-only by default, every value from
//! the table escaped, actions behind a token, a same-origin POST and a confirmation; and an
//! operator's story in a real browser (Debian's headless Chromium) on a real relay: the
//! overview names why rows wait, the operator opens an event, and retries a destination's rows
//! once its queue exists; they arrive, and the bad row stays quarantined with its reason.

use std::path::PathBuf;
use std::time::Duration;

use crate::scenario::{args, count, events, insert_to, migrated_db, run_args, wait_count};
use crate::support::browser::Browser;
use crate::support::http::request;
use crate::support::pg::TestDb;
use crate::support::{
    create_queue, make_temp_dir, random_hex, receive_all, repo_root, run_to_end, sqs, wait_until,
    RelayProcess, TEST_SECRET_ACCESS_KEY,
};

/// Generous for a loaded 2-core machine; a bound on waiting only, never a measured time.
const WAIT: Duration = Duration::from_secs(60);

/// An event id and an error text that would run if the console inserted them as HTML.
const SCRIPT_EVENT_ID: &str = "<script>window.__pwned=1</script>";
const ONERROR_TEXT: &str = "<img src=x onerror=\"window.__pwned=1\">";

struct Console {
    process: RelayProcess,
    addr: String,
}

async fn start_console(db: &TestDb, extra: &[&str]) -> Console {
    let mut a = args(&[
        "console",
        "--database-url",
        &db.url,
        "--listen",
        "127.0.0.1:0",
    ]);
    // Figures a second old at most, unless the test says otherwise.
    if !extra.contains(&"--refresh") {
        a.extend(args(&["--refresh", "1s"]));
    }
    a.extend(args(extra));
    let process = RelayProcess::spawn(&a, &[]);
    let addr = process.logged_addr("console_addr", WAIT).await;
    Console { process, addr }
}

/// A token file naming `alice`; returns its path and the token.
fn token_file() -> (PathBuf, String) {
    let token = format!("tok-{}", random_hex(16));
    let path = make_temp_dir("console-token").join("tokens");
    std::fs::write(&path, format!("# the on-call\nalice:{token}\n")).unwrap();
    (path, token)
}

/// The CSRF token a page's forms carry.
fn csrf_of(page: &str) -> String {
    let (_, rest) = page
        .split_once("name=\"csrf\" value=\"")
        .unwrap_or_else(|| panic!("no CSRF token in the page: {page}"));
    rest.split('"').next().unwrap().to_string()
}

fn form(pairs: &[(&str, &str)]) -> String {
    let mut s = form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        s.append_pair(k, v);
    }
    s.finish()
}

/// The password in a libpq URL (`postgres://user:password@host/...`).
fn password_of(url: &str) -> String {
    let userinfo = url.split("://").nth(1).unwrap().split('@').next().unwrap();
    userinfo
        .split_once(':')
        .map(|(_, p)| p.to_string())
        .unwrap_or_default()
}

/// Rows an operator meets: an unsent one, and a quarantined one whose event id, error text and
/// headers are markup and whose payload carries `payload_mark`.
async fn hostile_rows(client: &tokio_postgres::Client, payload_mark: &str) -> i64 {
    client
        .execute(
            "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload, headers)
             VALUES ('plain-1', 'order', '1', 'order.paid', '{}', '{}')",
            &[],
        )
        .await
        .unwrap();
    let row = client
        .query_one(
            "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload, headers,
                                 quarantined_at, quarantine_reason, last_error)
             VALUES ($1, 'order', '2', 'order.paid', jsonb_build_object('card', $2::text),
                     jsonb_build_object('note', '<svg onload=\"window.__pwned=1\">'),
                     now(), 'invalid', $3)
             RETURNING id",
            &[&SCRIPT_EVENT_ID, &payload_mark, &ONERROR_TEXT],
        )
        .await
        .unwrap();
    row.get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_refuses_an_address_beyond_loopback_without_a_token_in_one_line() {
    let db = migrated_db().await;
    for (extra, says) in [
        (vec!["--listen", "0.0.0.0:0"], "beyond loopback"),
        (vec!["--tls-cert", "/nonexistent.pem"], "go together"),
        (vec!["--refresh", "100ms"], "--refresh"),
    ] {
        let mut a = args(&["console", "--database-url", &db.url]);
        a.extend(args(&extra));
        let (status, output) = run_to_end(&a, &[], WAIT).await;
        assert_eq!(status.code(), Some(2), "{extra:?}: {output}");
        assert_eq!(output.trim().lines().count(), 1, "{extra:?}: {output}");
        assert!(output.contains(says), "{extra:?}: {output}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_is_closed_read_only_and_escaping_by_default() {
    let db = migrated_db().await;
    let client = db.client().await;
    let payload_mark = format!("PAYLOAD-{}", random_hex(8));
    let hostile = hostile_rows(&client, &payload_mark).await;
    let (tokens, token) = token_file();
    let console = start_console(&db, &["--token-file", tokens.to_str().unwrap()]).await;
    let addr = console.addr.as_str();
    let bearer = format!("Bearer {token}");
    let mut seen = Vec::new();

    // No token, a wrong one, a wrong sign-in: nothing but the sign-in page.
    for headers in [vec![], vec![("Authorization", "Bearer not-the-token")]] {
        let (status, head, body) = request(addr, "GET", "/", &headers, "").await;
        assert_eq!(status, 401, "{headers:?}: {head}");
        assert!(!body.contains("unsent"), "{body}");
        seen.push(head + &body);
    }
    let (status, _, body) = request(
        addr,
        "POST",
        "/login",
        &[("Origin", &format!("http://{addr}"))],
        &form(&[("token", "not-the-token")]),
    )
    .await;
    assert_eq!(status, 401, "{body}");

    // The token opens every page; what the table holds is text in them.
    let auth = [("Authorization", bearer.as_str())];
    let (status, head, overview) = request(addr, "GET", "/", &auth, "").await;
    assert_eq!(status, 200, "{overview}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-security-policy: default-src 'none'; style-src 'self'"),
        "{head}"
    );
    let table = "/table?t=%22outbox%22";
    let (status, _, listing) = request(addr, "GET", table, &auth, "").await;
    assert_eq!(status, 200, "{listing}");
    assert!(
        listing.contains("&lt;script&gt;window.__pwned=1&lt;/script&gt;"),
        "{listing}"
    );
    assert!(!listing.contains("<script"), "{listing}");
    assert!(!listing.contains("<img"), "{listing}");
    let event = format!("/event?t=%22outbox%22&id={hostile}");
    let (status, _, detail) = request(addr, "GET", &event, &auth, "").await;
    assert_eq!(status, 200, "{detail}");
    assert!(!detail.contains("<svg"), "{detail}");
    assert!(detail.contains("&lt;svg onload="), "{detail}");
    assert!(
        !detail.contains(&payload_mark),
        "a payload without --payloads: {detail}"
    );
    assert!(detail.contains("hidden (the console runs without --payloads)"));
    assert!(
        !detail.contains("Retry this row"),
        "read-only: no action offered"
    );
    seen.extend([overview.clone(), listing.clone(), detail.clone()]);

    // Actions are off: a well-formed, same-origin POST with its token is still refused.
    let csrf = csrf_of(&overview);
    let origin = format!("http://{addr}");
    let retry = form(&[
        ("csrf", &csrf),
        ("t", "\"outbox\""),
        ("id", &hostile.to_string()),
        ("confirm", "yes"),
    ]);
    let same_origin = [
        ("Authorization", bearer.as_str()),
        ("Origin", origin.as_str()),
    ];
    let (status, _, body) = request(addr, "POST", "/retry", &same_origin, &retry).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("Actions are off"), "{body}");
    assert_eq!(
        count(&client, "quarantined_at IS NOT NULL").await,
        1,
        "nothing moved"
    );

    // A console with actions on still refuses a cross-site POST and one without its token.
    let acting = start_console(
        &db,
        &["--token-file", tokens.to_str().unwrap(), "--actions"],
    )
    .await;
    let (_, _, page) = request(&acting.addr, "GET", "/", &auth, "").await;
    let csrf = csrf_of(&page);
    let origin = format!("http://{}", acting.addr);
    let retry = form(&[
        ("csrf", &csrf),
        ("t", "\"outbox\""),
        ("id", &hostile.to_string()),
        ("confirm", "yes"),
    ]);
    let without = form(&[
        ("t", "\"outbox\""),
        ("id", &hostile.to_string()),
        ("confirm", "yes"),
    ]);
    for (headers, body, what) in [
        (
            vec![
                ("Authorization", bearer.as_str()),
                ("Origin", "http://evil.example"),
            ],
            retry.as_str(),
            "another origin",
        ),
        (
            vec![
                ("Authorization", bearer.as_str()),
                ("Sec-Fetch-Site", "cross-site"),
            ],
            retry.as_str(),
            "a cross-site fetch",
        ),
        (
            vec![
                ("Authorization", bearer.as_str()),
                ("Origin", origin.as_str()),
            ],
            without.as_str(),
            "no CSRF token",
        ),
        (
            vec![("Origin", origin.as_str())],
            retry.as_str(),
            "no bearer token",
        ),
    ] {
        let (status, _, page) = request(&acting.addr, "POST", "/retry", &headers, body).await;
        assert!(status == 403 || status == 401, "{what}: {status} {page}");
        seen.push(page);
    }
    assert_eq!(count(&client, "quarantined_at IS NOT NULL").await, 1);
    // The same request from the console's own page moves the row.
    let (status, _, page) = request(
        &acting.addr,
        "POST",
        "/retry",
        &[
            ("Authorization", bearer.as_str()),
            ("Origin", origin.as_str()),
        ],
        &retry,
    )
    .await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("Moved 1 row(s)"), "{page}");
    assert_eq!(count(&client, "quarantined_at IS NOT NULL").await, 0);
    seen.push(page);

    // A console without a token answers only requests for a loopback host (DNS rebinding).
    let open = start_console(&db, &[]).await;
    let (status, _, _) =
        request(&open.addr, "GET", "/", &[("Host", "evil.example:8089")], "").await;
    assert_eq!(status, 403);
    let (status, _, page) = request(&open.addr, "GET", "/", &[], "").await;
    assert_eq!(status, 200, "{page}");
    seen.push(page);

    // No secret in any answer: the database password, the AWS secret key, the token.
    let password = password_of(&db.url);
    for text in &seen {
        if !password.is_empty() {
            assert!(
                !text.contains(&password),
                "the database password in: {text}"
            );
        }
        assert!(
            !text.contains(TEST_SECRET_ACCESS_KEY),
            "the AWS secret key in: {text}"
        );
        assert!(!text.contains(&token), "the token in: {text}");
    }
    for output in [console.process.output(), acting.process.output()] {
        assert!(!output.contains(&token), "the token logged: {output}");
        if !password.is_empty() {
            assert!(!output.contains(&password), "the password logged: {output}");
        }
    }
}

/// Where the story's screenshots go: OUTBOX_CONSOLE_SHOTS (docs/console refreshes the docs'
/// pictures), else target/console-screenshots.
fn shots_dir() -> PathBuf {
    let dir = std::env::var_os("OUTBOX_CONSOLE_SHOTS")
        .map(PathBuf::from)
        .map(|d| {
            if d.is_absolute() {
                d
            } else {
                repo_root().join(d)
            }
        })
        .unwrap_or_else(|| repo_root().join("target/console-screenshots"));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_names_the_cause_and_retries_the_rows_in_a_browser_without_a_shell() {
    let db = migrated_db().await;
    let client = db.client().await;
    let good = create_queue("console-good", &[]).await;
    let (missing, missing_name) = crate::destination::missing_queue(&good, "console-late");

    // Five rows for a queue that does not exist yet, one with a header SQS refuses, three that
    // flow.
    let late = events("late", 5, 5);
    insert_to(&client, &late, &vec![Some(missing.clone()); late.len()]).await;
    client
        .batch_execute(
            "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload, headers)
             VALUES ('bad-header', 'order', '77', 'order.paid', '{}', '{\"AWS.trace\": \"x\"}')",
        )
        .await
        .unwrap();
    let flowing = events("flows", 3, 3);
    insert_to(&client, &flowing, &vec![None; flowing.len()]).await;
    let relay = RelayProcess::spawn(&run_args(&db, &good, sqs().endpoint(), &[]), &[]);
    wait_count(&client, "quarantine_reason = 'destination'", 5, WAIT).await;
    wait_count(&client, "quarantine_reason = 'invalid'", 1, WAIT).await;
    wait_count(&client, "sent_at IS NOT NULL", 3, WAIT).await;
    // A park's length is drawn with full jitter; the story needs the park still running when
    // the operator acts, as it is for the minutes of a long outage.
    client
        .batch_execute(
            "UPDATE outbox SET available_at = now() + interval '1 hour'
             WHERE quarantine_reason = 'destination'",
        )
        .await
        .unwrap();
    // A row whose id and error are markup, to see the browser run none of it.
    client
        .execute(
            "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload,
                                 quarantined_at, quarantine_reason, last_error)
             VALUES ($1, 'order', '78', 'order.paid', '{}', now(), 'rejected', $2)",
            &[&SCRIPT_EVENT_ID, &ONERROR_TEXT],
        )
        .await
        .unwrap();

    let (tokens, token) = token_file();
    let console = start_console(
        &db,
        &["--token-file", tokens.to_str().unwrap(), "--actions"],
    )
    .await;
    let base = format!("http://{}", console.addr);
    let shots = shots_dir();
    let mut browser = Browser::start();

    // The alert fired: the on-call opens the console and signs in with the token.
    assert_eq!(browser.goto(&format!("{base}/")), 401);
    browser.goto(&format!("{base}/login"));
    browser.fill("input[name=token]", &token);
    browser.click("button[type=submit]");
    browser.goto(&format!("{base}/?hold=1"));
    let overview = browser.text();
    assert!(overview.contains("signed in as alice"), "{overview}");
    // Both causes named, with their runbook sections.
    let causes = browser.texts("ul.causes li").join("\n");
    assert!(
        causes.contains(&format!("5 row(s) parked while {missing} refuses them")),
        "{causes}"
    );
    assert!(
        causes.contains("rows-parked-for-their-queue-destination"),
        "{causes}"
    );
    assert!(causes.contains("1 row(s) quarantined: invalid"), "{causes}");
    browser.screenshot(&shots.join("overview.png"));

    // The queue is created outside the console, as an operator would in AWS.
    crate::destination::create_named(&missing_name, &missing).await;

    // The operator opens one of the parked events and reads its reason.
    browser.click("table.parked a:text('rows')");
    browser.click("table.rows a[href^='/event']");
    let event = browser.text();
    assert!(event.contains("destination"), "{event}");
    assert!(event.contains(&missing), "{event}");
    assert!(
        event.contains("NonExistentQueue") || event.contains("QueueDoesNotExist"),
        "{event}"
    );
    browser.screenshot(&shots.join("event.png"));

    // Back on the overview, held still: retry that destination's rows; the console counts
    // them first.
    browser.goto(&format!("{base}/?hold=1"));
    browser.click("table.parked button:text(\"Retry this destination's rows\")");
    let confirm = browser.text();
    assert!(
        confirm.contains("Retry 5 quarantined row(s)"),
        "the count before anything changes: {confirm}"
    );
    assert_eq!(count(&client, "quarantine_reason = 'destination'").await, 5);
    browser.screenshot(&shots.join("confirm.png"));
    browser.click("button.danger");
    let done = browser.text();
    assert!(done.contains("Moved 5 row(s)"), "{done}");

    // They arrive on the queue, read with the SQS client.
    let received = receive_all(&missing, 5, WAIT).await;
    let mut ids: Vec<String> = received
        .iter()
        .filter_map(|m| crate::scenario::attr(m, "event_id").map(str::to_string))
        .collect();
    ids.sort();
    ids.dedup();
    let mut expected: Vec<String> = late.iter().map(|e| e.event_id.clone()).collect();
    expected.sort();
    assert_eq!(ids, expected, "relay output:\n{}", relay.output());

    // The overview clears of the parked destination; the bad-header row stays with its reason.
    let mut cleared = String::new();
    wait_until(
        "the overview to clear of the parked destination",
        WAIT,
        || {
            let text = browser.goto(&format!("{base}/"));
            assert_eq!(text, 200);
            cleared = browser.texts("ul.causes li").join("\n");
            let done = !cleared.contains("parked while");
            async move { done }
        },
    )
    .await;
    assert!(
        cleared.contains("1 row(s) quarantined: invalid"),
        "{cleared}"
    );
    assert_eq!(
        count(
            &client,
            "event_id = 'bad-header' AND quarantine_reason = 'invalid'"
        )
        .await,
        1
    );
    browser.screenshot(&shots.join("cleared.png"));
    browser.goto(&format!("{base}/table?t=%22outbox%22&reason=invalid"));
    let listing = browser.text();
    assert!(listing.contains("bad-header"), "{listing}");
    assert!(listing.contains("AWS.trace"), "the reason shown: {listing}");

    // Markup from the table is shown as text and runs nowhere.
    browser.goto(&format!("{base}/table?t=%22outbox%22&reason=rejected"));
    let listing = browser.text();
    assert!(listing.contains(SCRIPT_EVENT_ID), "{listing}");
    assert!(listing.contains(ONERROR_TEXT), "{listing}");
    browser.click("table.rows a[href^='/event']");
    assert!(browser.text().contains(SCRIPT_EVENT_ID));
    assert_eq!(browser.ran_anything(), (false, 0, 0));

    // The action is a log line naming who took it, and a counter.
    assert!(
        console
            .process
            .wait_for_line("console: quarantined rows retried", WAIT)
            .await
            .is_some_and(|line| line.contains("who=alice") && line.contains("moved=5")),
        "{}",
        console.process.output()
    );
    let bearer = format!("Bearer {token}");
    let (_, _, metrics) = request(
        &console.addr,
        "GET",
        "/metrics",
        &[("Authorization", bearer.as_str())],
        "",
    )
    .await;
    assert!(
        metrics
            .contains("outbox_console_actions_total{action=\"retry\",table=\"\\\"outbox\\\"\"} 1"),
        "{metrics}"
    );
}

/// One request over TLS to `addr`, trusting `ca` for the name `localhost`: the raw answer.
async fn tls_request(addr: &str, ca: &std::path::Path, text: &str) -> std::io::Result<String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = ServerName::try_from("localhost").unwrap();
    let mut tls = connector.connect(name, tcp).await?;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    tls.write_all(text.as_bytes()).await?;
    let mut raw = Vec::new();
    // A server may close without TLS's close_notify; what arrived before is the answer.
    let _ = tls.read_to_end(&mut raw).await;
    Ok(String::from_utf8_lossy(&raw).to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_serves_https_with_a_secure_cookie_and_hides_the_password_of_a_database_it_cannot_reach(
) {
    let db = migrated_db().await;
    let certs = make_temp_dir("console-tls");
    crate::ops_tls::make_certificates(&certs);
    let (tokens, token) = token_file();
    let console = start_console(
        &db,
        &[
            "--token-file",
            tokens.to_str().unwrap(),
            "--tls-cert",
            certs.join("server.crt").to_str().unwrap(),
            "--tls-key",
            certs.join("server.key").to_str().unwrap(),
        ],
    )
    .await;
    let ca = certs.join("ca.crt");
    let page = tls_request(
        &console.addr,
        &ca,
        &format!(
            "GET / HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
        ),
    )
    .await
    .expect("an HTTPS request");
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(page.contains("unsent"), "{page}");
    let body = form(&[("token", &token)]);
    let login = tls_request(
        &console.addr,
        &ca,
        &format!(
            "POST /login HTTP/1.1\r\nHost: localhost\r\nOrigin: https://localhost\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    )
    .await
    .expect("an HTTPS sign-in");
    assert!(login.starts_with("HTTP/1.1 303"), "{login}");
    let cookie = login
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
        .unwrap_or_else(|| panic!("no cookie: {login}"));
    for part in ["HttpOnly", "SameSite=Strict", "Secure"] {
        assert!(cookie.contains(part), "{cookie}");
    }
    // Plain HTTP to the HTTPS port gets no page.
    let plain = tokio::time::timeout(WAIT, request_or_error(&console.addr))
        .await
        .expect("the server answers or closes");
    assert!(!plain.contains("unsent"), "{plain}");

    // A database that does not answer: the overview says so, without the URL's password.
    let password = format!("pw-{}", random_hex(8));
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let url = format!("postgres://operator:{password}@127.0.0.1:{port}/app?connect_timeout=2");
    let unreachable = RelayProcess::spawn(
        &args(&["console", "--database-url", &url, "--listen", "127.0.0.1:0"]),
        &[],
    );
    let addr = unreachable.logged_addr("console_addr", WAIT).await;
    let (status, head, page) = request(&addr, "GET", "/", &[], "").await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("cannot be"), "the failure named: {page}");
    assert!(!page.contains(&password), "{page}");
    assert!(!head.contains(&password), "{head}");
    assert!(
        !unreachable.output().contains(&password),
        "{}",
        unreachable.output()
    );
}

/// Plain HTTP sent to a TLS listener: whatever comes back (a TLS alert, or nothing).
async fn request_or_error(addr: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await else {
        return String::new();
    };
    let _ = stream
        .write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await;
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw).await;
    String::from_utf8_lossy(&raw).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_shows_many_tables_worst_first_and_reads_each_once_per_refresh() {
    let db = crate::many_admin::tenants(true).await;
    let client = db.client().await;
    // tenant_2: the oldest unsent row; tenant_1: newer ones; tenant_3: nothing waits.
    client
        .batch_execute(
            "INSERT INTO tenant_1.outbox (event_id, aggregate_type, aggregate_id, event_type, payload)
             SELECT 'a-' || g, 'order', g::text, 'order.paid', '{}' FROM generate_series(1, 3) g;
             INSERT INTO tenant_2.outbox (event_id, aggregate_type, aggregate_id, event_type, payload, created_at)
             VALUES ('b-1', 'order', '1', 'order.paid', '{}', now() - interval '1 hour');",
        )
        .await
        .unwrap();
    let console = start_console(&db, &["--tables", "tenant_*.outbox", "--refresh", "10m"]).await;
    let mut pages = Vec::new();
    for _ in 0..20 {
        let (status, _, page) = request(&console.addr, "GET", "/", &[], "").await;
        assert_eq!(status, 200, "{page}");
        pages.push(page);
    }
    let at = |page: &str, table: &str| {
        page.find(&format!("id=\"&quot;{table}&quot;.&quot;outbox&quot;\""))
            .unwrap_or_else(|| panic!("{table} not on the page: {page}"))
    };
    let page = &pages[0];
    assert!(at(page, "tenant_2") < at(page, "tenant_1"), "{page}");
    assert!(at(page, "tenant_1") < at(page, "tenant_3"), "{page}");
    // Twenty pages within one refresh interval: each table's figures read once (at start, for
    // the sent-per-minute line), however many pages asked.
    let (_, _, metrics) = request(&console.addr, "GET", "/metrics", &[], "").await;
    let reads = crate::support::metric_value(&metrics, "outbox_console_table_reads_total");
    assert_eq!(reads, Some(3.0), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_replays_sent_rows_only_after_showing_how_many_and_shows_payloads_when_asked() {
    let db = migrated_db().await;
    let client = db.client().await;
    // Sent ten minutes ago and kept, as `--retention` keeps them: outside a FIFO queue's
    // deduplication window.
    client
        .batch_execute(
            "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload, sent_at)
             SELECT 's-' || g, 'order', g::text, 'order.paid', jsonb_build_object('mark', 'PAYLOAD-' || g),
                    now() - interval '10 minutes'
             FROM generate_series(1, 3) g",
        )
        .await
        .unwrap();
    let console = start_console(&db, &["--actions", "--payloads"]).await;
    let addr = console.addr.as_str();
    let origin = format!("http://{addr}");
    let (status, _, page) = request(addr, "GET", "/replay?t=%22outbox%22", &[], "").await;
    assert_eq!(status, 200, "{page}");
    let csrf = csrf_of(&page);
    let post = |fields: Vec<(&'static str, String)>| {
        let body = form(
            &fields
                .iter()
                .map(|(k, v)| (*k, v.as_str()))
                .collect::<Vec<_>>(),
        );
        let origin = origin.clone();
        async move {
            request(
                addr,
                "POST",
                "/replay",
                &[("Origin", origin.as_str())],
                &body,
            )
            .await
        }
    };
    let base = vec![("csrf", csrf.clone()), ("t", "\"outbox\"".to_string())];

    // A time that is not one is refused with what to write instead.
    let mut bad = base.clone();
    bad.push(("since", "last tuesday".to_string()));
    let (status, _, page) = post(bad).await;
    assert_eq!(status, 400, "{page}");
    assert!(page.contains("RFC 3339"), "{page}");

    // The count first; nothing changes until confirmed.
    let mut two = base.clone();
    two.push(("event_ids", "s-1\ns-2".to_string()));
    let (status, _, page) = post(two.clone()).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("Replay 2 sent row(s)"), "{page}");
    assert_eq!(
        count(&client, "sent_at IS NULL").await,
        0,
        "a count changes nothing"
    );
    two.push(("confirm", "yes".to_string()));
    let (status, _, page) = post(two).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("Replayed 2 sent row(s)"), "{page}");
    assert_eq!(
        count(&client, "sent_at IS NULL AND event_id IN ('s-1', 's-2')").await,
        2
    );
    assert_eq!(count(&client, "sent_at IS NOT NULL").await, 1);
    assert!(
        console
            .process
            .wait_for_line("console: sent rows replayed", WAIT)
            .await
            .is_some_and(|line| line.contains("who=loopback") && line.contains("replayed=2")),
        "{}",
        console.process.output()
    );

    // With --payloads an event's page shows its payload, escaped like everything else.
    let id: i64 = client
        .query_one("SELECT id FROM outbox WHERE event_id = 's-3'", &[])
        .await
        .unwrap()
        .get(0);
    let (status, _, page) = request(
        addr,
        "GET",
        &format!("/event?t=%22outbox%22&id={id}"),
        &[],
        "",
    )
    .await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("PAYLOAD-3"), "{page}");
}
