//! Client certificates (libpq's `sslcert` / `sslkey`, `--db-client-cert` / `--db-client-key`)
//! against the TLS cluster of tests/ops_tls.rs, whose pg_hba.conf admits [`CERT_ROLE`] by
//! certificate alone and [`MTLS_ROLE`] by password plus certificate (`clientcert=verify-full`).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use crate::ops_tls::{
    assert_one_clear_line, make_client_certificates, openssl, relay, TlsPg, CERT_ROLE,
    MTLS_PASSWORD, MTLS_ROLE,
};
use crate::scenario::{events, insert, run_args, wait_count};
use crate::support::{create_queue, make_temp_dir, receive_all, sqs, wait_until, RelayProcess};

/// What fauxqs queues accept by default; `check` compares it with `--max-request-bytes`.
const SIZE: &str = "262144";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_admits_the_relay_by_its_certificate_and_refuses_it_without() {
    let pg = TlsPg::start().await;
    let ca = pg.ca.display().to_string();
    let verify = format!("?sslmode=verify-full&sslrootcert={ca}");
    let (cert, key) = pg.client_files("relay");
    // The chain file holds the leaf and its intermediate; the key is PKCS#8.
    let chain = std::fs::read_to_string(&cert).unwrap();
    assert_eq!(chain.matches("BEGIN CERTIFICATE").count(), 2);
    assert!(std::fs::read_to_string(&key)
        .unwrap()
        .starts_with("-----BEGIN PRIVATE KEY"));

    // In the URL, as libpq takes them.
    let url = pg.url_as(CERT_ROLE, &format!("{verify}&sslcert={cert}&sslkey={key}"));
    let (code, output) = relay(&["migrate", "--database-url", &url], &[]).await;
    assert_eq!(code, Some(0), "sslcert and sslkey in the URL: {output}");

    // Without a certificate the server says it needs one: one line, exit 1 as any refused
    // connection.
    let bare = pg.url_as(CERT_ROLE, &verify);
    let (code, output) = relay(&["status", "--database-url", &bare], &[]).await;
    assert_eq!(code, Some(1), "{output}");
    assert_one_clear_line(
        &output,
        "connection requires a valid client certificate",
        pg.password(),
    );

    // A certificate of the cluster's CA but for another role.
    let (other_cn, other_cn_key) = pg.client_files("mtls");
    let (code, output) = relay(
        &[
            "status",
            "--database-url",
            &bare,
            "--db-client-cert",
            &other_cn,
            "--db-client-key",
            &other_cn_key,
        ],
        &[],
    )
    .await;
    assert_eq!(code, Some(1), "{output}");
    assert_one_clear_line(
        &output,
        &format!("certificate authentication failed for user \"{CERT_ROLE}\""),
        pg.password(),
    );

    // The right name, from a CA the server does not trust: the TLS alert, explained.
    let (stranger, stranger_key) = pg.client_files("stranger");
    let (code, output) = relay(
        &[
            "status",
            "--database-url",
            &bare,
            "--db-client-cert",
            &stranger,
            "--db-client-key",
            &stranger_key,
        ],
        &[],
    )
    .await;
    assert_eq!(code, Some(1), "{output}");
    assert_one_clear_line(
        &output,
        &format!("the server refused the client certificate {stranger}: it is not signed by a CA the server trusts"),
        pg.password(),
    );

    // Password and certificate (`clientcert=verify-full`): both needed. The key is SEC1.
    let (mtls, mtls_key) = pg.client_files("mtls");
    assert!(std::fs::read_to_string(&mtls_key)
        .unwrap()
        .starts_with("-----BEGIN EC PRIVATE KEY"));
    let mtls_url = pg.url_as(MTLS_ROLE, &verify);
    let (code, output) = relay(
        &[
            "status",
            "--database-url",
            &mtls_url,
            "--db-client-cert",
            &mtls,
            "--db-client-key",
            &mtls_key,
        ],
        &[],
    )
    .await;
    assert_eq!(code, Some(0), "password and certificate: {output}");
    let (code, output) = relay(&["status", "--database-url", &mtls_url], &[]).await;
    assert_eq!(code, Some(1), "{output}");
    assert_one_clear_line(
        &output,
        "connection requires a valid client certificate",
        MTLS_PASSWORD,
    );

    // The password from --database-password-file with the certificate: the two new connection
    // settings meet on one handshake (verify-full TLS, the certificate, then the password).
    let files = make_temp_dir("mtls-password-file");
    let password_file = files.join("password");
    std::fs::write(&password_file, format!("{MTLS_PASSWORD}\n")).unwrap();
    let no_password_url = mtls_url.replacen(&format!(":{MTLS_PASSWORD}@"), "@", 1);
    assert_ne!(no_password_url, mtls_url);
    let with_file = |file: &Path| {
        vec![
            "status".to_string(),
            "--database-url".to_string(),
            no_password_url.clone(),
            "--database-password-file".to_string(),
            file.display().to_string(),
            "--db-client-cert".to_string(),
            mtls.clone(),
            "--db-client-key".to_string(),
            mtls_key.clone(),
        ]
    };
    let args = with_file(&password_file);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, output) = relay(&args, &[]).await;
    assert_eq!(code, Some(0), "password file and certificate: {output}");
    let wrong_file = files.join("wrong");
    std::fs::write(&wrong_file, "not-the-password\n").unwrap();
    let args = with_file(&wrong_file);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, output) = relay(&args, &[]).await;
    assert_eq!(code, Some(1), "{output}");
    assert_one_clear_line(
        &output,
        &format!("password authentication failed for user \"{MTLS_ROLE}\""),
        "not-the-password",
    );

    // The flags win over the URL: a stranger's certificate in the URL, the right one by flag.
    let wrong_in_url = pg.url_as(
        CERT_ROLE,
        &format!("{verify}&sslcert={stranger}&sslkey={stranger_key}"),
    );
    let (code, output) = relay(
        &[
            "status",
            "--database-url",
            &wrong_in_url,
            "--db-client-cert",
            &cert,
            "--db-client-key",
            &key,
        ],
        &[],
    )
    .await;
    assert_eq!(code, Some(0), "the flags win: {output}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_delivers_as_the_certificate_role_and_picks_up_a_renewed_certificate() {
    let pg = TlsPg::start().await;
    let ca = pg.ca.display().to_string();
    let url = pg.url_as(CERT_ROLE, &format!("?sslmode=verify-full&sslrootcert={ca}"));
    // A mounted secret: the relay is given these paths once; their content changes below.
    let mounted = make_temp_dir("tls-mounted");
    let (tls_crt, tls_key) = (mounted.join("tls.crt"), mounted.join("tls.key"));
    let put = |name: &str| {
        let (cert, key) = pg.client_files(name);
        replace_file(Path::new(&cert), &tls_crt);
        replace_file(Path::new(&key), &tls_key);
    };
    put("relay");
    let envs = [
        ("OUTBOX_DB_CLIENT_CERT", tls_crt.display().to_string()),
        ("OUTBOX_DB_CLIENT_KEY", tls_key.display().to_string()),
    ];
    let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (code, output) = relay(&["migrate", "--database-url", &url], &envs).await;
    assert_eq!(code, Some(0), "{output}");

    let queue = create_queue("tls-client", &[("MaximumMessageSize", SIZE)]).await;
    let (code, output) = relay(
        &[
            "check",
            "--database-url",
            &url,
            "--queue-url",
            &queue,
            "--sqs-endpoint-url",
            sqs().endpoint(),
            "--max-request-bytes",
            SIZE,
        ],
        &envs,
    )
    .await;
    assert_eq!(code, Some(0), "check as the certificate role: {output}");

    let db = crate::support::TestDb {
        name: pg.db.name.clone(),
        url: url.clone(),
    };
    let envs: Vec<(String, String)> = envs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let relay = RelayProcess::spawn(
        &run_args(
            &db,
            &queue,
            sqs().endpoint(),
            &["--max-request-bytes", SIZE],
        ),
        &envs,
    );
    let admin = pg.admin().await;
    insert(&admin, &events("cert", 3, 2), Duration::ZERO).await;
    let received = receive_all(&queue, 3, Duration::from_secs(30)).await;
    assert_eq!(received.len(), 3, "{}", relay.output());
    // Settled before the server ends the relay's sessions below, so the count after the renewal
    // is of the events written after it: a settlement the cut interrupts is retried on the next
    // connection (the one under test), and its three are sent again should that outlast their
    // lease.
    wait_count(&admin, "sent_at IS NOT NULL", 3, Duration::from_secs(30)).await;

    // The certificate each of the relay's sessions presented, as the server saw it.
    let issuers = || async {
        admin
            .query(
                "SELECT DISTINCT s.issuer_dn FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
                 WHERE a.usename = $1",
                &[&CERT_ROLE],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get::<_, Option<String>>(0).unwrap_or_default())
            .collect::<Vec<String>>()
    };
    assert_eq!(
        issuers().await,
        ["/CN=outbox-relay test intermediate"],
        "{}",
        relay.output()
    );

    // Renewal: new files (another key, another issuer) under the same paths, then the server
    // ends the relay's sessions. The relay reconnects with what the files hold now.
    put("renewed");
    admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1",
            &[&CERT_ROLE],
        )
        .await
        .unwrap();
    insert(&admin, &events("renewed", 3, 2), Duration::ZERO).await;
    let received = receive_all(&queue, 3, Duration::from_secs(30)).await;
    assert_eq!(received.len(), 3, "{}", relay.output());
    wait_until(
        "the relay's sessions present the renewed certificate",
        Duration::from_secs(20),
        || async { issuers().await == ["/CN=outbox-relay test ca"] },
    )
    .await;
    relay.sigterm();
    let status = relay
        .wait_exit(Duration::from_secs(20))
        .await
        .expect("relay stops");
    assert!(status.success(), "{}", relay.output());
    assert!(
        !relay.output().contains("PRIVATE KEY"),
        "{}",
        relay.output()
    );
}

/// Settings that cannot work stop the start-up with exit 2 and one line, before any connection
/// (nothing listens at the URL's port).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificate_settings_that_cannot_work_exit_2_with_one_line() {
    let dir = make_temp_dir("tls-client-config");
    let certs = make_temp_dir("tls-client-cas");
    // The same CAs and client certificates as the cluster's, without a cluster.
    openssl(
        &certs,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=outbox-relay test ca",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    );
    std::fs::copy(certs.join("ca.crt"), certs.join("other-ca.crt")).unwrap();
    std::fs::copy(certs.join("ca.key"), certs.join("other-ca.key")).unwrap();
    make_client_certificates(&certs, &dir);
    let file = |name: &str| dir.join(name).display().to_string();
    let (cert, key) = (file("relay.crt"), file("relay.key"));
    let url = format!(
        "postgres://{CERT_ROLE}@127.0.0.1:{}/app?sslmode=require",
        crate::support::pg::free_port()
    );

    // An encrypted key, a key readable by others, the key of another certificate.
    openssl(
        &dir,
        &[
            "pkey",
            "-in",
            "relay.key",
            "-aes256",
            "-passout",
            "pass:s3cret-phrase",
            "-out",
            "encrypted.key",
        ],
    );
    std::fs::set_permissions(dir.join("encrypted.key"), PermissionsExt::from_mode(0o600)).unwrap();
    std::fs::copy(dir.join("relay.key"), dir.join("open.key")).unwrap();
    std::fs::set_permissions(dir.join("open.key"), PermissionsExt::from_mode(0o644)).unwrap();
    std::fs::copy(dir.join("relay.crt"), dir.join("not-a.key")).unwrap();
    std::fs::set_permissions(dir.join("not-a.key"), PermissionsExt::from_mode(0o600)).unwrap();

    let cases: Vec<Case> = vec![
        (
            vec!["--db-client-cert".into(), cert.clone()],
            vec![],
            "a client certificate needs its key: set --db-client-key".into(),
        ),
        (
            vec![],
            vec![("OUTBOX_DB_CLIENT_KEY", key.clone())],
            "a client key needs its certificate: set --db-client-cert".into(),
        ),
        (
            vec![
                "--database-url".into(),
                url.replace("sslmode=require", "sslmode=disable"),
                "--db-client-cert".into(),
                cert.clone(),
                "--db-client-key".into(),
                key.clone(),
            ],
            vec![],
            "sslmode=disable sends no client certificate".into(),
        ),
        (
            vec![
                "--database-url".into(),
                format!("{url}&sslpassword=s3cret-phrase"),
            ],
            vec![],
            "sslpassword is not supported".into(),
        ),
        (
            vec![
                "--db-client-cert".into(),
                cert.clone(),
                "--db-client-key".into(),
                file("encrypted.key"),
            ],
            vec![],
            format!("the client key {} is encrypted", file("encrypted.key")),
        ),
        (
            vec![
                "--db-client-cert".into(),
                cert.clone(),
                "--db-client-key".into(),
                file("open.key"),
            ],
            vec![],
            format!(
                "the client key {} has group or world access (mode 0644)",
                file("open.key")
            ),
        ),
        (
            vec![
                "--db-client-cert".into(),
                cert.clone(),
                "--db-client-key".into(),
                file("mtls.key"),
            ],
            vec![],
            format!(
                "the client key {} does not belong to the client certificate {cert}",
                file("mtls.key")
            ),
        ),
        (
            vec![
                "--db-client-cert".into(),
                "/nonexistent/tls.crt".into(),
                "--db-client-key".into(),
                key.clone(),
            ],
            vec![],
            "cannot read the client certificate /nonexistent/tls.crt".into(),
        ),
        (
            vec![
                "--db-client-cert".into(),
                cert.clone(),
                "--db-client-key".into(),
                file("not-a.key"),
            ],
            vec![],
            format!(
                "the client key file {} holds no PEM private key",
                file("not-a.key")
            ),
        ),
    ];
    for command in ["status", "migrate", "run"] {
        for (flags, envs, needle) in &cases {
            let mut parts = vec![command.to_string()];
            if !flags.iter().any(|f| f == "--database-url") {
                parts.extend(["--database-url".to_string(), url.clone()]);
            }
            parts.extend(flags.iter().cloned());
            if command == "run" {
                parts.extend(["--queue-url".into(), "https://sqs.example/1/q".into()]);
            }
            let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
            let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let (code, output) = relay(&parts, &envs).await;
            assert_eq!(code, Some(2), "{command} {flags:?}: {output}");
            assert_one_clear_line(&output, needle, "s3cret-phrase");
            assert!(!output.contains("PRIVATE KEY"), "{output}");
        }
    }
}

/// A command line's flags, its environment, and what its one error line says.
type Case = (Vec<String>, Vec<(&'static str, String)>, String);

/// Replaces `to` with a copy of `from` in one step (a rename), as a secret volume swaps its
/// files, keeping the key's 0600.
fn replace_file(from: &Path, to: &Path) {
    let staged = to.with_extension("new");
    std::fs::copy(from, &staged).unwrap();
    std::fs::set_permissions(&staged, PermissionsExt::from_mode(0o600)).unwrap();
    std::fs::rename(&staged, to).unwrap();
}
