//! TLS to PostgreSQL, against a private cluster switched to `ssl=on` whose test database takes
//! TLS connections only (`hostssl` in pg_hba.conf), with a CA and a server certificate for
//! `localhost` made here by the openssl command line tool. A connection that succeeds therefore
//! went over TLS; `sslmode=disable` proves the rule bites. The same cluster trusts its CA for
//! client certificates and admits two roles by certificate only (see [`CERT_ROLE`]), which
//! tests/ops_tls_client.rs uses.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::scenario::args;
use crate::support::pg::PrivatePg;
use crate::support::{make_temp_dir, run_to_end, wait_until, TestDb, TEST_SECRET_ACCESS_KEY};

/// A role pg_hba.conf admits over TCP with a client certificate and nothing else (`cert`: the
/// certificate's CN must be the role's name, and it must chain to the cluster's CA). A
/// superuser, so that the relay's commands and the logical wake-up's replication connection all work
/// as it: what is tested here is how it gets in.
pub const CERT_ROLE: &str = "relay_cert";

/// A role that needs both its password and a client certificate whose CN is its name
/// (`scram-sha-256 clientcert=verify-full`); a superuser too.
pub const MTLS_ROLE: &str = "relay_mtls";

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
    /// Client certificates and keys (see [`make_client_certificates`]), owned by the test's user.
    pub clients: PathBuf,
}

impl TlsPg {
    pub async fn start() -> TlsPg {
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
        let clients = make_temp_dir("tls-clients");
        make_client_certificates(&certs, &clients);
        std::fs::write(
            &hba_file,
            format!(
                "local all all scram-sha-256\n\
                 hostssl all {CERT_ROLE} 127.0.0.1/32 cert\n\
                 hostssl all {MTLS_ROLE} 127.0.0.1/32 scram-sha-256 clientcert=verify-full\n\
                 hostssl all all 127.0.0.1/32 scram-sha-256\n\
                 host postgres all 127.0.0.1/32 scram-sha-256\n"
            ),
        )
        .expect("rewrite pg_hba.conf");
        admin
            .batch_execute(&format!(
                "CREATE ROLE {CERT_ROLE} LOGIN SUPERUSER; \
                 CREATE ROLE {MTLS_ROLE} LOGIN SUPERUSER PASSWORD '{}'",
                MTLS_PASSWORD
            ))
            .await
            .expect("create the certificate roles");
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
            // The CAs client certificates must chain to; the server asks clients for one.
            format!(
                "ALTER SYSTEM SET ssl_ca_file = {}",
                literal(certs.join("ca.crt"))
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
            clients,
        }
    }

    /// The test database's URL as `role` (with [`MTLS_PASSWORD`] for [`MTLS_ROLE`]).
    pub fn url_as(&self, role: &str, params: &str) -> String {
        let password = if role == MTLS_ROLE {
            format!(":{MTLS_PASSWORD}")
        } else {
            String::new()
        };
        format!(
            "postgres://{role}{password}@localhost:{}/{}{params}",
            self.port(),
            self.db.name
        )
    }

    /// A superuser session on the test database over the Unix socket (TCP needs TLS).
    pub async fn admin(&self) -> tokio_postgres::Client {
        let url = format!(
            "host={} port={} user=postgres password={} dbname={}",
            self.cluster.socket_dir().display(),
            self.cluster.port(),
            self.password(),
            self.db.name
        );
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .expect("connect over the Unix socket");
        tokio::spawn(connection);
        client
    }

    /// `NAME.crt` and `NAME.key` of a client certificate [`make_client_certificates`] made.
    pub fn client_files(&self, name: &str) -> (String, String) {
        let path = |ext: &str| {
            self.clients
                .join(format!("{name}.{ext}"))
                .display()
                .to_string()
        };
        (path("crt"), path("key"))
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

    pub fn port(&self) -> &str {
        let after_host = self.db.url.split_once("@127.0.0.1:").unwrap().1;
        after_host.split_once('/').unwrap().0
    }
}

/// [`MTLS_ROLE`]'s password.
pub const MTLS_PASSWORD: &str = "mtls-pa55word";

/// Runs the openssl command line tool in `dir`.
pub fn openssl(dir: &Path, args: &[&str]) {
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
}

/// A CA, a server certificate for DNS name `localhost` signed by it, and an unrelated CA.
pub(crate) fn make_certificates(dir: &Path) {
    let openssl = |args: &[&str]| openssl(dir, args);
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

/// Client certificates, in `dir`, from the CAs in `certs` (each `NAME.crt` with `NAME.key`, the
/// key 0600 as libpq wants it):
/// - `relay`: CN [`CERT_ROLE`], issued by an intermediate CA the cluster's CA signed; the file
///   holds the chain (leaf, then the intermediate), which the server needs to verify it; an EC
///   key in PKCS#8 (`BEGIN PRIVATE KEY`);
/// - `renewed`: CN [`CERT_ROLE`] again, signed by the cluster's CA directly; an RSA key in
///   PKCS#1 (`BEGIN RSA PRIVATE KEY`);
/// - `mtls`: CN [`MTLS_ROLE`], signed by the cluster's CA; an EC key in SEC1
///   (`BEGIN EC PRIVATE KEY`);
/// - `stranger`: CN [`CERT_ROLE`], signed by the CA the cluster does not trust.
pub fn make_client_certificates(certs: &Path, dir: &Path) {
    let ca = |name: &str| certs.join(name).display().to_string();
    let openssl = |args: &[&str]| openssl(dir, args);
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    std::fs::write(
        dir.join("intermediate.ext"),
        "basicConstraints=critical,CA:TRUE,pathlen:0\nkeyUsage=critical,keyCertSign,cRLSign\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("client.ext"),
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n",
    )
    .unwrap();
    let issue_with = |name: &str, cn: &str, ca_crt: &str, ca_key: &str, ext: &str, alg: &[&str]| {
        let (key, csr, crt) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
        );
        let subject = format!("/CN={cn}");
        let mut a = vec!["req"];
        a.extend(alg);
        a.extend(["-keyout", &key, "-out", &csr, "-subj", &subject]);
        openssl(&a);
        openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            ca_crt,
            "-CAkey",
            ca_key,
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            ext,
            "-out",
            &crt,
        ]);
        std::fs::set_permissions(
            dir.join(&key),
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
    };
    let issue = |name: &str, cn: &str, ca_crt: &str, ca_key: &str, ext: &str| {
        issue_with(name, cn, ca_crt, ca_key, ext, &ec)
    };
    let (root_crt, root_key) = (ca("ca.crt"), ca("ca.key"));
    issue(
        "intermediate",
        "outbox-relay test intermediate",
        &root_crt,
        &root_key,
        "intermediate.ext",
    );
    issue(
        "relay",
        CERT_ROLE,
        "intermediate.crt",
        "intermediate.key",
        "client.ext",
    );
    let mut chain = std::fs::read(dir.join("relay.crt")).unwrap();
    chain.extend(std::fs::read(dir.join("intermediate.crt")).unwrap());
    std::fs::write(dir.join("relay.crt"), chain).unwrap();
    issue_with(
        "renewed",
        CERT_ROLE,
        &root_crt,
        &root_key,
        "client.ext",
        &["-newkey", "rsa:2048", "-nodes"],
    );
    issue("mtls", MTLS_ROLE, &root_crt, &root_key, "client.ext");
    // The same keys in the other encodings libpq reads.
    openssl(&[
        "rsa",
        "-in",
        "renewed.key",
        "-traditional",
        "-out",
        "renewed.pkcs1",
    ]);
    openssl(&["ec", "-in", "mtls.key", "-out", "mtls.sec1"]);
    for (from, to) in [("renewed.pkcs1", "renewed.key"), ("mtls.sec1", "mtls.key")] {
        std::fs::set_permissions(
            dir.join(from),
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
        std::fs::rename(dir.join(from), dir.join(to)).unwrap();
    }
    issue(
        "stranger",
        CERT_ROLE,
        &ca("other-ca.crt"),
        &ca("other-ca.key"),
        "client.ext",
    );
}

/// The process's `error:` lines: exactly one, containing `needle`, and no secret anywhere.
pub fn assert_one_clear_line(output: &str, needle: &str, password: &str) {
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

pub async fn relay(parts: &[&str], envs: &[(&str, &str)]) -> (Option<i32>, String) {
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
