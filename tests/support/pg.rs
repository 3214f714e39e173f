//! One throwaway PostgreSQL cluster per test process, one database per test; and
//! [`PrivatePg`], a cluster of one test's own for tests that stop or crash PostgreSQL.

use super::{log_tail, make_temp_dir, random_hex, spawn_kept, stop_at_exit, unique};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The test cluster: a `postgres` child of this process on a loopback port.
pub struct Pg {
    /// Directory holding server binaries; kept so the server can be started again.
    bin_dir: PathBuf,
    /// Cluster data; kept across a restart so databases survive it like in production.
    data_dir: PathBuf,
    /// Unix socket directory, private to this run so it never collides with a system server.
    socket_dir: PathBuf,
    /// Server log (stdout and stderr), quoted when the server fails.
    log_path: PathBuf,
    /// Fixed for the life of the process so URLs handed to relays stay valid across restarts.
    port: u16,
    /// Password of the `postgres` superuser; random so tests can check it never leaks into logs.
    password: String,
    /// `(uid, gid)` of the `postgres` OS user when we are root: initdb and postgres refuse root.
    run_as: Option<(u32, u32)>,
    /// Extra `-c name=value` server settings, after (so overriding) the defaults; kept for
    /// restarts.
    settings: Vec<String>,
    /// The running postmaster; `None` while stopped.
    child: Mutex<Option<Child>>,
}

/// A database of its own for one test.
pub struct TestDb {
    pub name: String,
    /// libpq URL with the password, for the relay's `--database-url`.
    pub url: String,
}

/// The cluster, started on first use.
pub fn pg() -> &'static Pg {
    static PG: OnceLock<Pg> = OnceLock::new();
    // Started on a plain thread: readiness is checked with a runtime of its own, which cannot
    // be created on a thread that is already inside the test's runtime.
    PG.get_or_init(|| {
        std::thread::spawn(Pg::start)
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e))
    })
}

/// Creates an empty database with a unique name.
pub async fn fresh_db() -> TestDb {
    create_db_on(pg()).await
}

async fn create_db_on(pg: &Pg) -> TestDb {
    let name = format!("t_{}_{}", unique(), std::process::id());
    let admin = connect(&pg.admin_url()).await;
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap_or_else(|e| panic!("CREATE DATABASE {name}: {e}"));
    let url = pg.url_for(&name);
    TestDb { name, url }
}

impl TestDb {
    /// A new connection to this database as the superuser.
    pub async fn client(&self) -> tokio_postgres::Client {
        connect(&self.url).await
    }
}

/// A connection as the superuser to `url`; the connection task ends quietly when the server goes.
pub async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect to test PostgreSQL: {e}"));
    tokio::spawn(async move {
        // The connection ends with an error when the test kills the server on purpose.
        let _ = connection.await;
    });
    client
}

impl Pg {
    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn password(&self) -> &str {
        &self.password
    }

    /// The directory whose `initdb` and `postgres` made and run this cluster.
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    pub fn admin_url(&self) -> String {
        self.url_for("postgres")
    }

    /// libpq URL for database `name` as the superuser.
    pub fn url_for(&self, name: &str) -> String {
        format!(
            "postgres://postgres:{}@127.0.0.1:{}/{name}",
            self.password, self.port
        )
    }

    /// Everything the server has logged so far.
    pub fn log(&self) -> String {
        log_tail(&self.log_path, usize::MAX)
    }

    fn start() -> Pg {
        let pg = Pg::init();
        pg.spawn_server(true);
        pg.wait_ready();
        pg
    }

    /// Creates a cluster in a fresh temp dir and picks its port; does not start it.
    fn init() -> Pg {
        let bin_dir = bin_dir();
        let run_as = if unsafe { libc::geteuid() } == 0 {
            Some(postgres_user())
        } else {
            None
        };
        let root = make_temp_dir("pg");
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(&root, Some(uid), Some(gid)).expect("chown pg temp dir");
        }
        let data_dir = root.join("data");
        let log_path = root.join("postgres.log");
        let password = random_hex(16);

        let pwfile = root.join("pwfile");
        std::fs::write(&pwfile, &password).expect("write pwfile");
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(&pwfile, Some(uid), Some(gid)).expect("chown pwfile");
        }
        let mut initdb = Command::new(bin_dir.join("initdb"));
        initdb
            .arg("-D")
            .arg(&data_dir)
            .args(["-U", "postgres", "--auth=scram-sha-256", "--no-sync"])
            .args(["--encoding=UTF8", "--locale=C"])
            .arg(format!("--pwfile={}", pwfile.display()));
        as_user(&mut initdb, run_as, &root);
        let out = initdb.output().expect("run initdb");
        let _ = std::fs::remove_file(&pwfile);
        assert!(
            out.status.success(),
            "initdb failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );

        Pg {
            bin_dir,
            data_dir,
            socket_dir: root,
            log_path,
            port: free_port(),
            password,
            run_as,
            settings: Vec::new(),
            child: Mutex::new(None),
        }
    }

    /// Starts the postmaster. The shared cluster is also stopped at exit; a private one is
    /// stopped by its owner, and its pid must not be signalled at exit once it has been reaped.
    fn spawn_server(&self, stop_at_process_exit: bool) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .expect("open postgres log");
        let mut cmd = Command::new(self.bin_dir.join("postgres"));
        cmd.arg("-D")
            .arg(&self.data_dir)
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-k")
            .arg(&self.socket_dir)
            .args(["-c", "listen_addresses=127.0.0.1"])
            // fsync=off is safe against a killed server (writes reach the page cache); commits
            // stay synchronous so a restart test never loses an acknowledged row.
            .args(["-c", "fsync=off"])
            .args(["-c", "max_connections=300", "-c", "shared_buffers=128MB"])
            // Two-phase commits for the rows of prepared transactions (tests/horizon.rs).
            .args(["-c", "max_prepared_transactions=20"]);
        for setting in &self.settings {
            cmd.arg("-c").arg(setting);
        }
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup log fd"))
            .stderr(log);
        as_user(&mut cmd, self.run_as, &self.socket_dir);
        // SIGQUIT is PostgreSQL's immediate shutdown: no checkpoint, children told to exit.
        let child = spawn_kept(cmd, libc::SIGQUIT).expect("spawn postgres");
        if stop_at_process_exit {
            stop_at_exit(child.id(), libc::SIGQUIT);
        }
        let mut slot = self.child.lock().unwrap();
        assert!(slot.is_none(), "postgres is already running");
        *slot = Some(child);
    }

    /// Blocks until a real login succeeds, so the first test does not race the startup.
    fn wait_ready(&self) {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime for the readiness check")
            .block_on(self.until_ready());
    }

    /// Returns once a real login succeeds; panics with the server log if it exits or takes
    /// over 60 s.
    async fn until_ready(&self) {
        let url = self.admin_url();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let attempt = tokio::time::timeout(
                Duration::from_secs(5),
                tokio_postgres::connect(&url, tokio_postgres::NoTls),
            )
            .await;
            if matches!(attempt, Ok(Ok(_))) {
                return;
            }
            if let Some(status) = self.exited() {
                panic!("postgres exited with {status}:\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "postgres did not accept connections in 60 s:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The postmaster's exit status if it has ended; it is reaped then, and the slot emptied.
    fn exited(&self) -> Option<ExitStatus> {
        let mut slot = self.child.lock().unwrap();
        let status = slot.as_mut()?.try_wait().expect("try_wait postgres")?;
        *slot = None;
        Some(status)
    }

    /// Sends `signal` to the postmaster and waits until it has exited, which it does only
    /// after every backend has gone, so the port is free again.
    ///
    /// The signal is sent again every 5 s: once in a long random simulation, a fast shutdown
    /// sent just after a crash restart was never logged as received. A server that still has
    /// not exited after 60 s is shut down immediately (as a crash would), said on stderr,
    /// rather than failing the test for the harness's own server.
    async fn stop(&self, signal: libc::c_int) {
        if self.signal_until_exit(signal).await {
            return;
        }
        if signal != libc::SIGQUIT {
            eprintln!(
                "postgres did not exit in 60 s after signal {signal}; shutting it down immediately"
            );
            if self.signal_until_exit(libc::SIGQUIT).await {
                return;
            }
        }
        panic!(
            "postgres did not exit in 60 s after signal {signal}:\n{}",
            self.log()
        );
    }

    /// Sends `signal` every 5 s until the postmaster exits (true) or 60 s have passed.
    async fn signal_until_exit(&self, signal: libc::c_int) -> bool {
        let pid = match self.child.lock().unwrap().as_ref() {
            Some(child) => child.id(),
            None => panic!("postgres is not running"),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut next_signal = Instant::now();
        loop {
            if Instant::now() >= next_signal {
                // SAFETY: kill(2) on our own child, not reaped yet (only `exited` reaps it).
                unsafe { libc::kill(pid as libc::pid_t, signal) };
                next_signal += Duration::from_secs(5);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            if self.exited().is_some() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
        }
    }
}

/// A PostgreSQL cluster of one test's own: for tests that stop, crash or restart the server,
/// which the shared cluster must never do since every test running in parallel uses it.
///
/// Restarts keep the port and the data directory, so URLs handed to relays stay valid and
/// committed rows survive, as with a production server. Dropping it ends the server and
/// deletes its files.
pub struct PrivatePg {
    pg: Pg,
}

impl PrivatePg {
    pub async fn start() -> PrivatePg {
        PrivatePg::start_with(&[]).await
    }

    /// A cluster with extra server settings (`"wal_level=logical"`, `"fsync=on"`), which
    /// override the harness's defaults and stay in force across restarts.
    pub async fn start_with(settings: &[&str]) -> PrivatePg {
        let mut pg = tokio::task::spawn_blocking(Pg::init)
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        pg.settings = settings.iter().map(|s| s.to_string()).collect();
        pg.spawn_server(false);
        pg.until_ready().await;
        PrivatePg { pg }
    }

    /// libpq URL for database `db` as the superuser.
    pub fn url(&self, db: &str) -> String {
        self.pg.url_for(db)
    }

    pub fn admin_url(&self) -> String {
        self.pg.admin_url()
    }

    /// The postmaster's pid while it runs, e.g. to sum the CPU of its process tree.
    pub fn pid(&self) -> Option<u32> {
        self.pg.child.lock().unwrap().as_ref().map(Child::id)
    }

    /// The directory of the server's Unix socket.
    pub fn socket_dir(&self) -> &Path {
        &self.pg.socket_dir
    }

    pub fn port(&self) -> u16 {
        self.pg.port
    }

    /// The superuser's password.
    pub fn password(&self) -> &str {
        &self.pg.password
    }

    /// An empty database with a unique name on this cluster.
    pub async fn create_db(&self) -> TestDb {
        create_db_on(&self.pg).await
    }

    /// Fast shutdown (SIGINT): sessions are ended, a checkpoint is written, the server exits.
    pub async fn stop_fast(&self) {
        self.pg.stop(libc::SIGINT).await;
    }

    /// Immediate shutdown (SIGQUIT), like a crash: no checkpoint, so the next start replays
    /// the WAL.
    pub async fn kill_immediate(&self) {
        self.pg.stop(libc::SIGQUIT).await;
    }

    /// Starts the stopped server again on the same port and data, and waits until it accepts
    /// logins.
    pub async fn start_again(&self) {
        self.pg.spawn_server(false);
        self.pg.until_ready().await;
    }

    pub async fn restart(&self) {
        self.stop_fast().await;
        self.start_again().await;
    }

    /// Everything the server has logged so far, restarts included.
    pub fn log(&self) -> String {
        self.pg.log()
    }
}

/// A streaming standby and its promotion, for failover tests.
impl PrivatePg {
    /// A hot standby of this cluster, streaming from it, on a port of its own. Made with
    /// `pg_basebackup -R -X stream` where the cluster's binaries have it; PostgreSQL builds
    /// without client tools get a copy of the cleanly stopped cluster instead, which is a base
    /// backup too (this cluster is restarted for it).
    pub async fn standby(&self) -> PrivatePg {
        let primary = &self.pg;
        let root = make_temp_dir("pg-standby");
        if let Some((uid, gid)) = primary.run_as {
            std::os::unix::fs::chown(&root, Some(uid), Some(gid)).expect("chown standby dir");
        }
        let data_dir = root.join("data");
        let basebackup = primary.bin_dir.join("pg_basebackup");
        if basebackup.is_file() {
            let mut cmd = Command::new(basebackup);
            cmd.arg("-D")
                .arg(&data_dir)
                .args(["-R", "-X", "stream", "--no-sync", "-U", "postgres"])
                // A spread checkpoint would make the backup wait minutes.
                .arg("--checkpoint=fast")
                .args(["-h", "127.0.0.1", "-p", &primary.port.to_string()])
                .env("PGPASSWORD", &primary.password);
            as_user(&mut cmd, primary.run_as, &root);
            let out = tokio::task::spawn_blocking(move || cmd.output())
                .await
                .unwrap()
                .expect("run pg_basebackup");
            assert!(
                out.status.success(),
                "pg_basebackup failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        } else {
            self.stop_fast().await;
            let out = Command::new("cp")
                .arg("-a")
                .arg(&primary.data_dir)
                .arg(&data_dir)
                .output()
                .expect("run cp");
            assert!(out.status.success(), "copy the data directory: {out:?}");
            self.start_again().await;
        }
        // Written here whichever way the copy was made, so the standby surely logs in.
        let auto_conf = data_dir.join("postgresql.auto.conf");
        let mut conf = std::fs::read_to_string(&auto_conf).unwrap_or_default();
        conf.push_str(&format!(
            "\nprimary_conninfo = 'host=127.0.0.1 port={} user=postgres password={}'\n",
            primary.port, primary.password
        ));
        std::fs::write(&auto_conf, conf).expect("write postgresql.auto.conf");
        std::fs::write(data_dir.join("standby.signal"), "").expect("write standby.signal");
        if let Some((uid, gid)) = primary.run_as {
            for file in ["postgresql.auto.conf", "standby.signal"] {
                std::os::unix::fs::chown(data_dir.join(file), Some(uid), Some(gid))
                    .expect("chown standby files");
            }
        }
        let pg = Pg {
            bin_dir: primary.bin_dir.clone(),
            data_dir,
            log_path: root.join("postgres.log"),
            socket_dir: root,
            port: free_port(),
            password: primary.password.clone(),
            run_as: primary.run_as,
            // The same max_connections: a standby with fewer refuses to start.
            settings: primary.settings.clone(),
            child: Mutex::new(None),
        };
        pg.spawn_server(false);
        pg.until_ready().await;
        PrivatePg { pg }
    }

    /// Promotes this standby; returns once it takes writes.
    pub async fn promote(&self) {
        let admin = connect(&self.admin_url()).await;
        let promoted: bool = admin
            .query_one("SELECT pg_promote(true, 60)", &[])
            .await
            .expect("pg_promote")
            .get(0);
        assert!(promoted, "the standby was not promoted:\n{}", self.log());
    }
}

impl Drop for PrivatePg {
    fn drop(&mut self) {
        let slot = self.pg.child.get_mut().unwrap_or_else(|e| e.into_inner());
        if let Some(mut child) = slot.take() {
            if matches!(child.try_wait(), Ok(None)) {
                // SAFETY: kill(2) on our own live child; immediate shutdown, as at exit.
                unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGQUIT) };
                let deadline = Instant::now() + Duration::from_secs(10);
                while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(10));
                }
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        // The data dir's parent; the exit-time sweep would remove it too, only much later.
        let _ = std::fs::remove_dir_all(&self.pg.socket_dir);
    }
}

/// Drops root for initdb and postgres, and starts them in a directory they may enter.
fn as_user(cmd: &mut Command, run_as: Option<(u32, u32)>, cwd: &Path) {
    cmd.current_dir(cwd);
    if let Some((uid, gid)) = run_as {
        cmd.uid(uid)
            .gid(gid)
            .env("HOME", cwd)
            .env("USER", "postgres");
    }
}

pub(crate) fn postgres_user() -> (u32, u32) {
    // SAFETY: getpwnam returns a pointer into static storage; read it at once. Only this
    // one-time start-up calls it.
    unsafe {
        let pw = libc::getpwnam(c"postgres".as_ptr());
        assert!(
            !pw.is_null(),
            "running as root, but there is no `postgres` OS user to run PostgreSQL as \
             (install the postgresql package, or run the tests as a normal user)"
        );
        ((*pw).pw_uid, (*pw).pw_gid)
    }
}

/// Where the PostgreSQL binaries are (`initdb`, `postgres`, `pg_recvlogical`, `pg_waldump`),
/// found once: the clusters of the tests, the simulation and the benchmarks start from it.
pub fn bin_dir() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(find_bin_dir).clone()
}

/// `OUTBOX_TEST_PG_BINDIR`, else `pg_config --bindir`, else Debian's newest
/// `/usr/lib/postgresql/N/bin` (Debian keeps the server out of PATH), else PATH.
fn find_bin_dir() -> PathBuf {
    let has_server = |dir: &Path| dir.join("initdb").is_file() && dir.join("postgres").is_file();
    if let Some(dir) = std::env::var_os("OUTBOX_TEST_PG_BINDIR") {
        return PathBuf::from(dir);
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && has_server(&dir) {
            return dir;
        }
    }
    let mut debian: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, dir)| has_server(dir))
        .collect();
    debian.sort();
    if let Some((_, dir)) = debian.pop() {
        return dir;
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .find(|dir| has_server(dir))
        .expect("no PostgreSQL server binaries (initdb, postgres) found; run scripts/test")
}

/// A loopback port nobody listens on right now; the tiny window before use is acceptable here.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}
