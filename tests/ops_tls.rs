//! TLS to PostgreSQL, against a private cluster switched to `ssl=on` whose test database takes
//! TLS connections only (`hostssl` in pg_hba.conf), with a CA and a server certificate for
//! `localhost` made here by the openssl command line tool. A connection that succeeds therefore
//! went over TLS; `sslmode=disable` proves the rule bites.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::scenario::args;
use crate::support::pg::PrivatePg;
use crate::support::{make_temp_dir, run_to_end, wait_until, TestDb, TEST_SECRET_ACCESS_KEY};

/// A private PostgreSQL cluster switched to `ssl=on`, whose pg_hba.conf lets TCP clients into
/// the test's database over TLS only. Plain TCP stays open for the `postgres` database alone,
/// which the harness's readiness probe uses.
pub struct TlsPg {
    /// Held for the server's lifetime: dropping it stops the server.
    pub cluster: PrivatePg,
    pub db: TestDb,
    /// The CA that signed the server's certificate (for `localhost` only).
    pub ca: PathBuf,
    /// A CA that signed nothing the server presents.
    pub other_ca: PathBuf,
}

impl TlsPg {
    async fn start() -> TlsPg {
        TlsPg::start_with(&[]).await
    }

    /// With extra server settings (see [`PrivatePg::start_with`]).
    pub async fn start_with(settings: &[&str]) -> TlsPg {
        let cluster = PrivatePg::start_with(settings).await;
        let db = cluster.create_db().await;
        let (admin, connection) =
            tokio_postgres::connect(&cluster.url("postgres"), tokio_postgres::NoTls)
                .await
                .expect("connect to the private cluster");
        tokio::spawn(connection);
        let show = |setting: &'static str| {
            let admin = &admin;
            async move {
                admin
                    .query_one(&format!("SHOW {setting}"), &[])
                    .await
                    .unwrap()
                    .get::<_, String>(0)
            }
        };
        let data_dir = show("data_directory").await;
        let hba_file = show("hba_file").await;
        // The certificates must belong to the server's OS user, which owns its data directory.
        let owner = std::fs::metadata(&data_dir).expect("stat the data directory");
        let certs = make_temp_dir("tls-certs");
        make_certificates(&certs);
        for path in [
            certs.clone(),
            certs.join("server.key"),
            certs.join("server.crt"),
        ] {
            std::os::unix::fs::chown(&path, Some(owner.uid()), Some(owner.gid()))
                .expect("hand the certificates to the server's user");
        }
        std::fs::write(
            &hba_file,
            "local all all scram-sha-256\n\
             hostssl all all 127.0.0.1/32 scram-sha-256\n\
             host postgres all 127.0.0.1/32 scram-sha-256\n",
        )
        .expect("rewrite pg_hba.conf");
        let literal =
            |path: PathBuf| format!("'{}'", path.display().to_string().replace('\'', "''"));
        // One statement at a time: ALTER SYSTEM refuses to run inside a transaction block.
        for statement in [
            "ALTER SYSTEM SET ssl = on".to_string(),
            format!(
                "ALTER SYSTEM SET ssl_cert_file = {}",
                literal(certs.join("server.crt"))
            ),
            format!(
                "ALTER SYSTEM SET ssl_key_file = {}",
                literal(certs.join("server.key"))
            ),
            "SELECT pg_reload_conf()".to_string(),
        ] {
            admin
                .batch_execute(&statement)
                .await
                .unwrap_or_else(|e| panic!("{statement}: {e}"));
        }
        // The reload is asynchronous: wait until a new session sees TLS on and the test's
        // database refuses plain TCP.
        let probe = |url: String| async move {
            tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .map(|(client, c)| {
                    tokio::spawn(c);
                    client
                })
        };
        let (postgres_url, db_url) = (cluster.url("postgres"), db.url.clone());
        wait_until(
            "the server reloaded with TLS on",
            Duration::from_secs(20),
            || {
                let (postgres_url, db_url) = (postgres_url.clone(), db_url.clone());
                async move {
                    let ssl_on = match probe(postgres_url).await {
                        Ok(client) => client
                            .query_one("SHOW ssl", &[])
                            .await
                            .is_ok_and(|r| r.get::<_, String>(0) == "on"),
                        Err(_) => false,
                    };
                    ssl_on && probe(db_url).await.is_err()
                }
            },
        )
        .await;
        TlsPg {
            cluster,
            db,
            ca: certs.join("ca.crt"),
            other_ca: certs.join("other-ca.crt"),
        }
    }

    /// The test database's URL with `host` for 127.0.0.1 and `params` appended.
    pub fn url(&self, host: &str, params: &str) -> String {
        format!(
            "{}{params}",
            self.db.url.replacen("@127.0.0.1:", &format!("@{host}:"), 1)
        )
    }

    pub fn password(&self) -> &str {
        let after_user = self.db.url.split_once("://postgres:").unwrap().1;
        after_user.split_once('@').unwrap().0
    }

    fn port(&self) -> &str {
        let after_host = self.db.url.split_once("@127.0.0.1:").unwrap().1;
        after_host.split_once('/').unwrap().0
    }
}

/// A CA, a server certificate for DNS name `localhost` signed by it, and an unrelated CA.
fn make_certificates(dir: &Path) {
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("the openssl command line tool is needed to make test certificates");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    for ca in ["ca", "other-ca"] {
        let (key, crt, subject) = (
            format!("{ca}.key"),
            format!("{ca}.crt"),
            format!("/CN=outbox-relay test {ca}"),
        );
        let mut a = vec!["req", "-x509"];
        a.extend(ec);
        a.extend([
            "-keyout",
            &key,
            "-out",
            &crt,
            "-days",
            "2",
            "-subj",
            &subject,
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
        openssl(&a);
    }
    let mut a = vec!["req"];
    a.extend(ec);
    a.extend([
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ]);
    openssl(&a);
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "server.ext",
        "-out",
        "server.crt",
    ]);
    // PostgreSQL refuses a key file others can read.
    std::fs::set_permissions(
        dir.join("server.key"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
}

/// The process's `error:` lines: exactly one, containing `needle`, and no secret anywhere.
fn assert_one_clear_line(output: &str, needle: &str, password: &str) {
    let errors: Vec<&str> = output.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "one error line expected:\n{output}");
    assert!(
        errors[0].contains(needle),
        "{:?} should mention {needle:?}",
        errors[0]
    );
    assert!(!output.contains(password), "the password leaked:\n{output}");
    assert!(!output.contains(TEST_SECRET_ACCESS_KEY));
}

async fn relay(parts: &[&str], envs: &[(&str, &str)]) -> (Option<i32>, String) {
    let envs: Vec<(String, String)> = envs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let (status, output) = run_to_end(&args(parts), &envs, Duration::from_secs(30)).await;
    (status.code(), output)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmodes_verify_the_server_as_libpq_does() {
    let pg = TlsPg::start().await;
    let ca = pg.ca.display().to_string();
    let other_ca = pg.other_ca.display().to_string();
    let timeout = ["--connect-timeout", "5s"];

    // verify-full, the right CA and the name in the certificate: connects (over TLS, the
    // only way this server lets anyone in).
    let url = pg.url(
        "localhost",
        &format!("?sslmode=verify-full&sslrootcert={ca}"),
    );
    let (code, output) = relay(
        &["migrate", "--database-url", &url, timeout[0], timeout[1]],
        &[],
    )
    .await;
    assert_eq!(code, Some(0), "verify-full with the right CA: {output}");
    assert!(output.contains("migrated"), "{output}");

    // The same CA given by flag, then by environment, instead of in the URL.
    let bare = pg.url("localhost", "?sslmode=verify-full");
    let (code, output) = relay(
        &["status", "--database-url", &bare, "--db-ca-cert", &ca],
        &[],
    )
    .await;
    assert_eq!(code, Some(0), "--db-ca-cert: {output}");
    let (code, output) = relay(
        &["status", "--database-url", &bare],
        &[("OUTBOX_DB_CA_CERT", &ca)],
    )
    .await;
    assert_eq!(code, Some(0), "OUTBOX_DB_CA_CERT: {output}");

    // The flag wins over sslrootcert in the URL: the wrong CA by flag fails.
    let (code, output) = relay(
        &["status", "--database-url", &url, "--db-ca-cert", &other_ca],
        &[],
    )
    .await;
    assert_eq!(code, Some(1), "{output}");
    assert_one_clear_line(
        &output,
        &format!("the server's certificate is not signed by the CA certificate in {other_ca}"),
        pg.password(),
    );

    // A wrong CA in the URL: one line that names the file.
    let wrong_ca = pg.url(
        "localhost",
        &format!("?sslmode=verify-full&sslrootcert={other_ca}"),
    );
    let (code, output) = relay(&["migrate", "--database-url", &wrong_ca], &[]).await;
    assert_eq!(code, Some(1), "{output}");
    assert_one_clear_line(
        &output,
        "cannot connect to PostgreSQL at localhost",
        pg.password(),
    );
    assert!(
        output.contains("not signed by the CA certificate in"),
        "{output}"
    );

    // A host name the certificate does not list: verify-full refuses, verify-ca does not.
    let by_ip = pg.url(
        "127.0.0.1",
        &format!("?sslmode=verify-full&sslrootcert={ca}"),
    );
    let (code, output) = relay(&["migrate", "--database-url", &by_ip], &[]).await;
    assert_eq!(code, Some(1), "{output}");
    assert_one_clear_line(
        &output,
        "the server's certificate is not valid for the host name 127.0.0.1",
        pg.password(),
    );
    let chain_only = pg.url("127.0.0.1", &format!("?sslmode=verify-ca&sslrootcert={ca}"));
    let (code, output) = relay(&["status", "--database-url", &chain_only], &[]).await;
    assert_eq!(code, Some(0), "verify-ca skips the host name: {output}");
    // …but still checks the chain.
    let chain_wrong = pg.url(
        "127.0.0.1",
        &format!("?sslmode=verify-ca&sslrootcert={other_ca}"),
    );
    let (code, output) = relay(&["status", "--database-url", &chain_wrong], &[]).await;
    assert_eq!(code, Some(1), "{output}");
    assert_one_clear_line(
        &output,
        "not signed by the CA certificate in",
        pg.password(),
    );

    // require and prefer encrypt without checking; the key=value form works too.
    for url in [
        pg.url("127.0.0.1", "?sslmode=require"),
        pg.url("127.0.0.1", "?sslmode=prefer"),
        pg.url("127.0.0.1", ""),
        format!(
            "host=127.0.0.1 port={} user=postgres password={} dbname={} sslmode=require",
            pg.port(),
            pg.password(),
            pg.db.name
        ),
    ] {
        let (code, output) = relay(&["status", "--database-url", &url], &[]).await;
        assert_eq!(code, Some(0), "{output}");
    }

    // Plain TCP is refused by this server: the successes above were TLS.
    let plain = pg.url("127.0.0.1", "?sslmode=disable");
    let (code, output) = relay(&["status", "--database-url", &plain], &[]).await;
    assert_eq!(code, Some(1), "{output}");
    assert_one_clear_line(&output, "no encryption", pg.password());

    // Verification with nothing to verify against stops at start-up, before connecting.
    let started = Instant::now();
    let (code, output) = relay(&["migrate", "--database-url", &bare], &[]).await;
    assert_eq!(code, Some(2), "{output}");
    assert_one_clear_line(
        &output,
        "sslmode=verify-full needs the CA certificate that signed the server's: set --db-ca-cert (OUTBOX_DB_CA_CERT) or sslrootcert",
        pg.password(),
    );
    let missing = pg.url(
        "localhost",
        "?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
    );
    let (code, output) = relay(&["migrate", "--database-url", &missing], &[]).await;
    assert_eq!(code, Some(2), "{output}");
    assert_one_clear_line(
        &output,
        "cannot read the database CA certificate /nonexistent/ca.pem",
        pg.password(),
    );
    println!("configuration errors answered in {:?}", started.elapsed());
}
