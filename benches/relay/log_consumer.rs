//! The log-based anchor: a `pgoutput` slot on a publication of the outbox table, streamed by
//! `pg_recvlogical` (from the harness's PostgreSQL bindir) to /dev/null, on the benchmark's
//! core. Its cost to the database is the walsender's decoding, on the database's core.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::affinity;
use crate::support::pg::bin_dir;
use crate::support::{self, TestDb};

/// The publication of the log-based cells, created once for the group.
pub const PUBLICATION: &str = "bench_outbox_pub";
/// The slot of a log-based cell, created for it and dropped after it.
const SLOT: &str = "bench_outbox_slot";

/// Where the consumer's walsender stood when the writers stopped.
#[derive(Clone, Copy, Debug)]
pub struct Decoding {
    /// WAL not yet decoded and sent, bytes (`pg_current_wal_lsn() - sent_lsn`).
    pub behind_bytes: f64,
    /// Until `sent_lsn` reached the writers' last position (`None`: not within 60 s).
    pub catch_up_seconds: Option<f64>,
}

/// `pg_recvlogical` streaming [`SLOT`] (created for the cell, dropped after it) to /dev/null.
pub struct LogConsumer {
    /// The `pg_recvlogical` process, on the benchmark's core.
    child: Child,
    /// Its stderr, quoted when it fails.
    log: PathBuf,
}

impl LogConsumer {
    /// Creates the slot (at the current end of the WAL: only the cell's writes are decoded)
    /// and returns once `pg_recvlogical` streams from it.
    pub async fn start(db: &TestDb) -> LogConsumer {
        let admin = db.client().await;
        admin
            .query_one(
                "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
                &[&SLOT],
            )
            .await
            .expect("create the log-based cell's slot");
        let dir = support::make_temp_dir("recvlogical");
        let log = dir.join("pg_recvlogical.log");
        let stderr = std::fs::File::create(&log).expect("pg_recvlogical log");
        let cpus = affinity::allowed(0);
        let mut cmd = Command::new(bin_dir().join("pg_recvlogical"));
        cmd.args(["-d", &db.url, "--slot", SLOT, "--start"])
            .args(["-o", "proto_version=1", "-o"])
            .arg(format!("publication_names={PUBLICATION}"))
            .args(["-f", "/dev/null"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        // SAFETY: sched_setaffinity is a plain syscall, safe between fork and exec. The
        // spawning thread is on this core already; said again so it cannot depend on that.
        unsafe {
            cmd.pre_exec(move || {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                for &c in &cpus {
                    libc::CPU_SET(c, &mut set);
                }
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
                Ok(())
            });
        }
        let mut child = support::spawn_kept(cmd, libc::SIGTERM).expect("start pg_recvlogical");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let active: Option<bool> = admin
                .query_opt(
                    "SELECT active FROM pg_replication_slots WHERE slot_name = $1",
                    &[&SLOT],
                )
                .await
                .expect("read the slot")
                .map(|r| r.get(0));
            if active == Some(true) {
                break;
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "pg_recvlogical exited with {status}:\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            assert!(
                Instant::now() < deadline,
                "pg_recvlogical did not stream in 30 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        LogConsumer { child, log }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// How far its walsender is behind the end of the WAL now, and how long it takes to send
    /// up to there.
    pub async fn catch_up(&self, db: &TestDb) -> Decoding {
        let admin = db.client().await;
        let behind = "SELECT pg_wal_lsn_diff($1::text::pg_lsn, r.sent_lsn)::float8 \
             FROM pg_stat_replication r JOIN pg_replication_slots s ON s.active_pid = r.pid \
             WHERE s.slot_name = $2";
        let end: String = admin
            .query_one("SELECT pg_current_wal_lsn()::text", &[])
            .await
            .expect("read the WAL position")
            .get(0);
        let started = Instant::now();
        let read = || async {
            admin
                .query_opt(behind, &[&end, &SLOT])
                .await
                .expect("read the walsender's position")
                .map_or(f64::NAN, |r| r.get::<_, f64>(0))
        };
        let behind_bytes = read().await;
        let mut catch_up_seconds = None;
        while started.elapsed() < Duration::from_secs(60) {
            if read().await <= 0.0 {
                catch_up_seconds = Some(started.elapsed().as_secs_f64());
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Decoding {
            behind_bytes: behind_bytes.max(0.0),
            catch_up_seconds,
        }
    }

    /// SIGTERM, then drops the slot once its walsender has let go of it.
    pub async fn stop(mut self, db: &TestDb) {
        // SAFETY: kill(2) on our own child, not reaped yet.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(30);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let admin = db.client().await;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match admin
                .execute("SELECT pg_drop_replication_slot($1)", &[&SLOT])
                .await
            {
                Ok(_) => break,
                // Still active for a moment, while its walsender exits.
                Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!(
                    "drop the log-based slot: {e}\n{}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                ),
            }
        }
    }
}
