//! CPU time of the relay's PostgreSQL backends: `pg_stat_activity` says which they are (by
//! `application_name`), /proc how much CPU each has used. Backends exit with the relay, so
//! each is read every 200 ms while it lives and its last reading kept.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::procstat;
use crate::support::TestDb;

/// The relay's own `application_name` when the database URL sets none.
const RELAY_APP: &str = "outbox-relay";

/// The relay's backends' CPU: `pg_stat_activity` lists them, /proc has their times.
pub struct BackendCpu {
    /// Set by [`BackendCpu::finish`]; the task reads once more and ends.
    stop: Arc<AtomicBool>,
    /// The sampling task: pid -> last utime + stime read.
    task: JoinHandle<BTreeMap<i32, f64>>,
}

impl BackendCpu {
    pub async fn start(db: &TestDb) -> BackendCpu {
        let client = db.client().await;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let task = tokio::spawn(async move {
            let mut last: BTreeMap<i32, f64> = BTreeMap::new();
            let mut tick = tokio::time::interval(Duration::from_millis(200));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                let stopping = stopped.load(Ordering::Relaxed);
                if let Ok(rows) = client
                    .query(
                        "SELECT pid FROM pg_stat_activity \
                         WHERE datname = current_database() AND application_name LIKE $1 || '%'",
                        &[&RELAY_APP],
                    )
                    .await
                {
                    for row in rows {
                        last.entry(row.get(0)).or_insert(0.0);
                    }
                }
                for (pid, cpu) in last.iter_mut() {
                    if let Some(now) = procstat::cpu_seconds(*pid as u32) {
                        *cpu = now;
                    }
                }
                if stopping {
                    return last;
                }
                tick.tick().await;
            }
        });
        BackendCpu { stop, task }
    }

    /// (CPU seconds, backends seen). Called after the relay exited: the last readings of its
    /// backends are the ones taken before they went.
    pub async fn finish(self) -> (f64, usize) {
        self.stop.store(true, Ordering::Relaxed);
        let last = self.task.await.unwrap_or_default();
        (last.values().sum(), last.len())
    }
}
