//! Test harness shared by every integration test in this binary.
//!
//! # Layout
//!
//! - [`pg`]: one PostgreSQL cluster per test process; [`fresh_db`] gives each test its own database.
//! - [`sqs`]: one SQS-compatible server per test process (fauxqs, or moto with
//!   `OUTBOX_TEST_SQS=moto`); [`create_queue`] gives each test its own queue.
//! - [`sns`]: topics on the same server, [`create_topic`] and [`subscribe_queue`] per test.
//! - [`proxy`]: [`FaultProxy`], an HTTP fault injector in front of the SQS server.
//! - [`tcp_proxy`]: [`TcpProxy`], a TCP fault injector in front of PostgreSQL (dark, reset, slow).
//! - [`iam_proxy`]: [`IamProxy`], a PostgreSQL front that checks RDS IAM auth tokens.
//! - [`pgbouncer`]: [`PgBouncer`], Debian's pgbouncer in front of the cluster, per test.
//! - [`prometheus`]: [`Prometheus`], a real Prometheus scraping a test's relays, with its API.
//! - [`relay`]: [`RelayProcess`], the real `outbox-relay` binary as a child process.
//! - [`roles`]: sql/roles.sql applied with psql, as an operator runs it.
//! - [`otlp`]: [`OtlpReceiver`], an OTLP/HTTP trace receiver that decodes the spans it gets.
//!
//! Servers start lazily and once, so tests run in parallel threads, isolated by database and
//! queue rather than by a global lock. Every child process is forked by one long-lived keeper
//! thread with a parent-death signal, so nothing outlives the test process, even on abort.

// Each test module uses a different part of the harness; the rest would warn as unused.
#![allow(dead_code, unused_imports)]

pub mod browser;
pub mod http;
pub mod iam_proxy;
pub mod otlp;
pub mod pg;
pub mod pgbouncer;
pub mod prometheus;
pub mod proxy;
pub mod relay;
pub mod roles;
pub mod scenario;
pub mod sns;
pub mod sqs;
pub mod tcp_proxy;

pub use iam_proxy::IamProxy;
pub use otlp::{OtlpReceiver, ReceivedSpan};
pub use pg::{fresh_db, pg, Pg, TestDb};
pub use pgbouncer::{PgBouncer, PoolMode, Pooling};
pub use prometheus::Prometheus;
pub use proxy::{FaultProxy, Mode};
pub use relay::{metric_value, parse_metrics_addr, run_to_end, RelayProcess};
pub use sns::{
    create_topic, create_topic_named, create_topic_with, sns_client, subscribe_queue, topic_name,
};
pub use sqs::{
    create_queue, receive_all, set_max_message_size, sqs, sqs_client, sqs_client_at,
    test_sdk_config, SqsKind, SqsServer, TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY,
};
pub use tcp_proxy::TcpProxy;

use std::future::Future;
use std::io::{self, Read};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Mutex, Once, OnceLock};
use std::time::{Duration, Instant};

/// Prefix of every temp dir the harness makes; the owner's pid follows, so a later run can tell
/// which ones belong to dead processes.
const TEMP_PREFIX: &str = "outbox-relay-test-";

/// Polls `f` every 50 ms until it returns true; panics naming `what` after `timeout`.
pub async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if f().await {
            return;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting until {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How many of the relay's claims of the default table (rows of `outbox_claims`, one per claim
/// still holding its rows: `owner`, `until`, `ids`) meet `condition`.
pub async fn count_claims(client: &tokio_postgres::Client, condition: &str) -> i64 {
    client
        .query_one(
            &format!("SELECT count(*) FROM outbox_claims WHERE {condition}"),
            &[],
        )
        .await
        .expect("count claims")
        .get(0)
}

/// A number unique within this test process, for database and queue names.
pub fn unique() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// `bytes` random bytes as lowercase hex, from the kernel so no RNG crate is needed.
pub fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .expect("read /dev/urandom");
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// Root of the repository, where `.tools/` and `tests/sqs-servers/` live.
pub fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Makes a private temp dir named after this process, after removing dirs of dead runs.
pub fn make_temp_dir(what: &str) -> PathBuf {
    static SWEEP: Once = Once::new();
    SWEEP.call_once(remove_stale_temp_dirs);
    let dir = std::env::temp_dir().join(format!(
        "{TEMP_PREFIX}{}-{what}-{}",
        std::process::id(),
        random_hex(4)
    ));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    exit_cleanup().lock().unwrap().dirs.push(dir.clone());
    dir
}

/// A killed test run cannot clean up after itself, so the next run does it.
fn remove_stale_temp_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(TEMP_PREFIX)) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        if !process_alive(pid) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

fn process_alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks whether the process exists.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

type Job = Box<dyn FnOnce() + Send>;

/// Runs `f` on the keeper thread and returns its result.
///
/// PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, not the process. Test
/// threads end after each test, so children must be forked by a thread that lives as long as the
/// process does.
fn on_keeper<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    static KEEPER: OnceLock<mpsc::Sender<Job>> = OnceLock::new();
    let keeper = KEEPER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("child-keeper".into())
            .spawn(move || {
                for job in rx {
                    // A panicking job must not end this thread: that would kill every child.
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                }
            })
            .expect("spawn keeper thread");
        tx
    });
    let (tx, rx) = mpsc::sync_channel(1);
    keeper
        .send(Box::new(move || {
            let _ = tx.send(f());
        }))
        .expect("keeper thread is gone");
    rx.recv().expect("job panicked on the keeper thread")
}

/// Spawns `cmd` from the keeper thread so that `death_signal` reaches it when this process ends.
pub fn spawn_kept(mut cmd: Command, death_signal: libc::c_int) -> io::Result<Child> {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: only async-signal-safe calls (prctl, getppid, raise) run between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, death_signal as libc::c_ulong) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died before prctl took effect; then no signal would come.
            if libc::getppid() != parent {
                libc::raise(death_signal);
            }
            Ok(())
        });
    }
    on_keeper(move || cmd.spawn())
}

/// What to stop and delete when the test process exits normally.
#[derive(Default)]
struct ExitCleanup {
    /// Long-lived servers and the signal that stops each one cleanly enough.
    servers: Vec<(libc::pid_t, libc::c_int)>,
    /// Temp dirs; removed only after the servers using them are gone.
    dirs: Vec<PathBuf>,
}

fn exit_cleanup() -> &'static Mutex<ExitCleanup> {
    static CLEANUP: OnceLock<Mutex<ExitCleanup>> = OnceLock::new();
    CLEANUP.get_or_init(|| {
        // SAFETY: registering a plain extern "C" fn; it runs once, at exit().
        unsafe { libc::atexit(cleanup_at_exit) };
        Mutex::new(ExitCleanup::default())
    })
}

/// Registers a server process to be signalled and reaped before temp dirs are removed at exit.
pub fn stop_at_exit(pid: u32, signal: libc::c_int) {
    exit_cleanup()
        .lock()
        .unwrap()
        .servers
        .push((pid as libc::pid_t, signal));
}

extern "C" fn cleanup_at_exit() {
    // A thread may hold the lock while exit() runs; leaving garbage beats deadlocking at exit.
    let Ok(cleanup) = exit_cleanup().try_lock() else {
        return;
    };
    for &(pid, signal) in &cleanup.servers {
        // SAFETY: plain syscalls on our own children.
        unsafe { libc::kill(pid, signal) };
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    for &(pid, _) in &cleanup.servers {
        while Instant::now() < deadline {
            // SAFETY: as above; WNOHANG keeps a stuck child from hanging the exit.
            let rc = unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
            if rc != 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    for dir in &cleanup.dirs {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Reads the last `max` bytes of a server log for a panic message.
pub fn log_tail(path: &Path, max: usize) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    let start = text.len().saturating_sub(max);
    String::from_utf8_lossy(&text[start..]).into_owned()
}

/// Debezium's outbox-router table, as applications create it (`migrate --adopt` tests and the
/// adoption benchmark).
pub const DEBEZIUM_OUTBOX_DDL: &str = "CREATE TABLE outboxevent (
    id uuid NOT NULL PRIMARY KEY,
    aggregatetype varchar(255) NOT NULL,
    aggregateid varchar(255) NOT NULL,
    type varchar(255) NOT NULL,
    payload jsonb
)";

/// The `--column` flags that map [`DEBEZIUM_OUTBOX_DDL`]'s columns to the relay's names.
pub const DEBEZIUM_COLUMNS: [&str; 8] = [
    "--column",
    "event_id=id",
    "--column",
    "aggregate_type=aggregatetype",
    "--column",
    "aggregate_id=aggregateid",
    "--column",
    "event_type=type",
];

/// A claim as the relay's loop makes it: a claim that found claims whose lease ended takes them
/// over after it (`Claimed::freed`), and the loop claims again at once; here the two claims'
/// rows come back together.
pub async fn claim_taking_over(
    session: &outbox_relay::outbox::Session,
    request: &outbox_relay::outbox::ClaimRequest,
) -> outbox_relay::row::Claimed {
    let mut claimed = session.claim(request).await.expect("claim");
    if claimed.freed > 0 {
        let again = session
            .claim(request)
            .await
            .expect("claim after a takeover");
        claimed.rows.extend(again.rows);
        claimed.quarantined.extend(again.quarantined);
        claimed.cursor = again.cursor;
        claimed.freed = again.freed;
    }
    claimed
}
