//! [`PgBouncer`]: Debian's `pgbouncer` in front of the test cluster, one per test, on a port
//! and with an ini of its own.
//!
//! It logs in to PostgreSQL as the client's user with the password from its users file
//! (`auth_type = plain`, enough on loopback). PgBouncer refuses to run as root, so under root
//! it runs as the `postgres` OS user, like the cluster.

use super::{log_tail, make_temp_dir, spawn_kept};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// PgBouncer's `pool_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMode {
    Session,
    Transaction,
}

/// How a test's PgBouncer pools.
#[derive(Debug, Clone, Copy)]
pub struct Pooling {
    pub mode: PoolMode,
    /// `default_pool_size`: server connections per (database, user).
    pub size: u32,
    /// Whether a server connection is reset (`DISCARD ALL`) when a session client leaves;
    /// PgBouncer's default, which hides what a client left behind.
    pub reset: bool,
}

pub struct PgBouncer {
    port: u16,
    password: String,
    log_path: PathBuf,
    child: Mutex<Option<Child>>,
}

/// `PGBOUNCER`, else Debian's path, else PATH.
fn binary() -> PathBuf {
    if let Some(path) = std::env::var_os("PGBOUNCER") {
        return PathBuf::from(path);
    }
    let debian = PathBuf::from("/usr/sbin/pgbouncer");
    if debian.is_file() {
        return debian;
    }
    PathBuf::from("pgbouncer")
}

impl PgBouncer {
    /// Starts PgBouncer in front of PostgreSQL on 127.0.0.1:`upstream_port`, whose `postgres`
    /// role logs in with `password`; returns once a login through it works.
    pub async fn start(upstream_port: u16, password: &str, pooling: Pooling) -> PgBouncer {
        let dir = make_temp_dir("pgbouncer");
        let run_as = if unsafe { libc::geteuid() } == 0 {
            Some(super::pg::postgres_user())
        } else {
            None
        };
        let port = super::pg::free_port();
        let log_path = dir.join("pgbouncer.log");
        let users = dir.join("users.txt");
        std::fs::write(&users, format!("\"postgres\" \"{password}\"\n")).expect("users file");
        let mode = match pooling.mode {
            PoolMode::Session => "session",
            PoolMode::Transaction => "transaction",
        };
        let reset = if pooling.reset { "DISCARD ALL" } else { "" };
        let ini = dir.join("pgbouncer.ini");
        std::fs::write(
            &ini,
            format!(
                "[databases]\n\
                 * = host=127.0.0.1 port={upstream_port}\n\
                 [pgbouncer]\n\
                 listen_addr = 127.0.0.1\n\
                 listen_port = {port}\n\
                 unix_socket_dir =\n\
                 auth_type = plain\n\
                 auth_file = {users}\n\
                 pool_mode = {mode}\n\
                 default_pool_size = {size}\n\
                 min_pool_size = 0\n\
                 reserve_pool_size = 0\n\
                 max_client_conn = 200\n\
                 server_reset_query = {reset}\n\
                 ignore_startup_parameters = extra_float_digits\n\
                 logfile = {log}\n\
                 log_connections = 0\n\
                 log_disconnections = 0\n\
                 admin_users = postgres\n",
                users = users.display(),
                size = pooling.size,
                log = log_path.display(),
            ),
        )
        .expect("pgbouncer.ini");
        if let Some((uid, gid)) = run_as {
            for path in [&dir, &users, &ini] {
                std::os::unix::fs::chown(path, Some(uid), Some(gid))
                    .expect("chown pgbouncer files");
            }
        }
        let mut cmd = Command::new(binary());
        cmd.arg(&ini)
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some((uid, gid)) = run_as {
            cmd.uid(uid)
                .gid(gid)
                .env("HOME", &dir)
                .env("USER", "postgres");
        }
        let child = spawn_kept(cmd, libc::SIGKILL).unwrap_or_else(|e| {
            panic!(
                "start {}: {e} (install Debian's pgbouncer package)",
                binary().display()
            )
        });
        let bouncer = PgBouncer {
            port,
            password: password.to_string(),
            log_path,
            child: Mutex::new(Some(child)),
        };
        bouncer.until_ready().await;
        bouncer
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// libpq URL for database `name` as the superuser, through the pool.
    pub fn url_for(&self, name: &str) -> String {
        format!(
            "postgres://postgres:{}@127.0.0.1:{}/{name}",
            self.password, self.port
        )
    }

    /// A client of the pool, as an application connects.
    pub async fn client(&self, name: &str) -> tokio_postgres::Client {
        let (client, connection) =
            tokio_postgres::connect(&self.url_for(name), tokio_postgres::NoTls)
                .await
                .unwrap_or_else(|e| panic!("connect through pgbouncer: {e}\n{}", self.log()));
        tokio::spawn(async move {
            let _ = connection.await;
        });
        client
    }

    pub fn log(&self) -> String {
        log_tail(&self.log_path, 8000)
    }

    async fn until_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let attempt = tokio::time::timeout(
                Duration::from_secs(5),
                tokio_postgres::connect(&self.url_for("postgres"), tokio_postgres::NoTls),
            )
            .await;
            if let Ok(Ok((client, connection))) = attempt {
                let driver = tokio::spawn(connection);
                let works = client.simple_query("SELECT 1").await.is_ok();
                drop(client);
                let _ = driver.await;
                if works {
                    return;
                }
            }
            if let Some(status) = self
                .child
                .lock()
                .unwrap()
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("pgbouncer exited with {status}:\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "pgbouncer did not accept a login in 30 s:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.lock().unwrap().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
