//! Cluster plumbing: the benchmark's own PostgreSQL clusters (durable, durable with logical
//! WAL, the `adopt` group's), and the admin connections that create and drop their databases.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::relays::Wakeup;
use crate::support::make_temp_dir;
use crate::support::pg::PrivatePg;
use crate::support::TestDb;

/// Durable commits, as in production.
pub const DURABLE: &[&str] = &["fsync=on", "synchronous_commit=on"];
/// The same, with the WAL a logical-decoding wake-up needs.
pub const DURABLE_LOGICAL: &[&str] = &["fsync=on", "synchronous_commit=on", "wal_level=logical"];
/// The own-core harm table's cluster: durable, logical WAL for every cell (so that the cells
/// differ only in who reads the table), and room for the log-based consumer's slot and sender.
pub const DURABLE_LOGICAL_SLOTS: &[&str] = &[
    "fsync=on",
    "synchronous_commit=on",
    "wal_level=logical",
    "max_replication_slots=10",
    "max_wal_senders=10",
];

/// The `rates` group's cluster: the own-core one's, with `pg_stat_statements` counting every
/// statement (nested ones too) and its planning, so that the relay's statements can be
/// counted and timed per window.
pub const DURABLE_LOGICAL_STATEMENTS: &[&str] = &[
    "fsync=on",
    "synchronous_commit=on",
    "wal_level=logical",
    "max_replication_slots=10",
    "max_wal_senders=10",
    "shared_preload_libraries=pg_stat_statements",
    "pg_stat_statements.track_planning=on",
    "pg_stat_statements.track=all",
];

/// The durable clusters, started when first needed and stopped when a group is done.
#[derive(Default)]
pub struct Clusters {
    /// The durable cluster, once a group needed it.
    durable: Option<PrivatePg>,
    /// The durable cluster with `wal_level=logical`, once a group needed it.
    logical: Option<PrivatePg>,
}

impl Clusters {
    pub async fn for_mode(&mut self, wakeup: &Wakeup) -> &PrivatePg {
        if wakeup.needs_logical_wal() {
            self.logical().await
        } else {
            self.durable().await
        }
    }

    pub async fn durable(&mut self) -> &PrivatePg {
        if self.durable.is_none() {
            self.durable = Some(PrivatePg::start_with(DURABLE).await);
        }
        self.durable.as_ref().expect("started")
    }

    pub async fn logical(&mut self) -> &PrivatePg {
        if self.logical.is_none() {
            self.logical = Some(PrivatePg::start_with(DURABLE_LOGICAL).await);
        }
        self.logical.as_ref().expect("started")
    }

    /// The durable cluster (`logical`: the one with logical WAL) if a group has started it.
    pub fn running(&self, logical: bool) -> Option<&PrivatePg> {
        if logical {
            self.logical.as_ref()
        } else {
            self.durable.as_ref()
        }
    }

    /// Stops both, so that their background processes do not run beside the next group.
    pub fn stop(&mut self) {
        self.durable = None;
        self.logical = None;
    }
}

/// Drops `db` of `cluster`, so that the next run's disk and cache are not shared with it.
pub async fn drop_db(cluster: &PrivatePg, db: &TestDb) {
    drop_database(&cluster.admin_url(), &db.name).await;
}

/// Drops database `name` of the cluster whose admin URL is `admin_url`, its sessions with it.
pub async fn drop_database(admin_url: &str, name: &str) {
    let (client, connection) = tokio_postgres::connect(admin_url, tokio_postgres::NoTls)
        .await
        .expect("connect as admin");
    let driver = tokio::spawn(connection);
    client
        .batch_execute(&format!("DROP DATABASE \"{name}\" WITH (FORCE)"))
        .await
        .expect("drop a benchmark database");
    drop(client);
    let _ = driver.await;
}

/// A port nothing listens on now, for the `adopt` group's cluster.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

/// A client of `url` whose connection runs on its own task until the client is dropped.
pub async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect to the benchmark's PostgreSQL: {e}"));
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// A throwaway cluster that commits durably, as production does: the test harness's clusters
/// run with `fsync=off`, which hides what a lock or a flush costs a commit.
pub struct DurablePg {
    /// The cluster's directory (data, socket, log), removed on drop.
    root: PathBuf,
    /// Where it listens on 127.0.0.1.
    port: u16,
    /// The postmaster, stopped on drop.
    child: std::process::Child,
}

impl DurablePg {
    pub fn start() -> DurablePg {
        let bin = bin_dir();
        let run_as = run_as();
        let root = make_temp_dir("adopt-pg");
        let data = root.join("data");
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(&root, Some(uid), Some(gid)).expect("chown");
        }
        let as_user = |cmd: &mut Command| {
            cmd.current_dir(&root);
            if let Some((uid, gid)) = run_as {
                cmd.uid(uid).gid(gid).env("HOME", &root);
            }
        };
        let mut initdb = Command::new(bin.join("initdb"));
        initdb.arg("-D").arg(&data).args([
            "-U",
            "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
        ]);
        as_user(&mut initdb);
        let out = initdb.output().expect("run initdb");
        assert!(out.status.success(), "initdb: {out:?}");
        let port = free_port();
        let log = std::fs::File::create(root.join("postgres.log")).expect("log file");
        let mut postgres = Command::new(bin.join("postgres"));
        postgres
            .arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string(), "-k"])
            .arg(&root)
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", "fsync=on", "-c", "synchronous_commit=on"])
            .args(["-c", "shared_buffers=128MB", "-c", "max_connections=50"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup"))
            .stderr(log);
        as_user(&mut postgres);
        let child = postgres.spawn().expect("start postgres");
        let pg = DurablePg { root, port, child };
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "postgres did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        pg
    }

    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    pub async fn create_db(&self, name: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        let admin = loop {
            match tokio_postgres::connect(&self.url("postgres"), tokio_postgres::NoTls).await {
                Ok((client, connection)) => {
                    tokio::spawn(connection);
                    break client;
                }
                Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("postgres does not accept logins: {e}"),
            }
        };
        admin
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .await
            .unwrap();
        self.url(name)
    }
}

impl Drop for DurablePg {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own live child: fast shutdown.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGINT) };
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// The harness's rule: `OUTBOX_TEST_PG_BINDIR`, else `pg_config --bindir`, else Debian's
/// newest `/usr/lib/postgresql/N/bin`.
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("OUTBOX_TEST_PG_BINDIR") {
        return PathBuf::from(dir);
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && dir.join("postgres").is_file() {
            return dir;
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, dir)| dir.join("postgres").is_file())
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, dir)| dir)
        .expect("no PostgreSQL server binaries found")
}

/// PostgreSQL refuses to run as root: run it as the `postgres` user then.
fn run_as() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions; getpwnam's result is read at once.
    unsafe {
        if libc::geteuid() != 0 {
            return None;
        }
        let pw = libc::getpwnam(c"postgres".as_ptr());
        assert!(!pw.is_null(), "running as root without a `postgres` user");
        Some(((*pw).pw_uid, (*pw).pw_gid))
    }
}
