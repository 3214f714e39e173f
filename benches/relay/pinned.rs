//! A durable cluster pinned to a core of its own, as production has the database beside its
//! sidecars: the own-core harm table and the `rates` group start theirs here.
//!
//! The cluster's postmaster is started pinned to the first core this process may use (as
//! `taskset -c 0 postgres …` does: every backend is forked from the postmaster and inherits
//! its mask, the relay's and the walsender's too), and this process (writers, the SQS sink,
//! the samplers), and so the relay and `pg_recvlogical` it spawns, to the second. This
//! process's own mask is given back when the value is dropped, after the cluster has stopped,
//! so later groups run on every core again.

use crate::affinity::{self, SavedMask};
use crate::procstat;
use crate::progress::say;
use crate::support::pg::PrivatePg;
use crate::support::TestDb;

/// The cluster on the database's core, this process on the other one until dropped.
pub struct PinnedCluster {
    /// The cluster; declared first so that it stops before the mask is given back.
    pub cluster: PrivatePg,
    /// The database's core, and the core of everything else.
    pub cores: (usize, usize),
    /// This process's mask before the group, restored on drop.
    _saved: SavedMask,
}

impl PinnedCluster {
    /// Starts a cluster with `settings` on the first core and moves this process to the
    /// second; `None` (and a line saying why, `group` naming what is skipped) on a machine
    /// where this process may use fewer than two cores.
    pub async fn start(group: &str, settings: &[&str]) -> Option<PinnedCluster> {
        let saved = SavedMask::save();
        let (database_core, other_core) = match saved.cpus() {
            [a, b, ..] => (*a, *b),
            cpus => {
                say(&format!(
                    "{group}: skipped: this process may run on {} core(s) ({}), and the group needs one for the database and one for the rest",
                    cpus.len(),
                    affinity::list(cpus)
                ));
                return None;
            }
        };
        // Started while this process is on the database's core, so the postmaster inherits it;
        // then the whole tree is pinned once more, in case a thread not yet moved spawned it.
        affinity::pin_process(std::process::id(), &[database_core]).expect("pin the benchmark");
        let cluster = PrivatePg::start_with(settings).await;
        affinity::pin_process(std::process::id(), &[other_core]).expect("pin the benchmark");
        let postmaster = cluster.pid().expect("the cluster runs");
        for pid in procstat::tree(postmaster) {
            // A child that exited since the listing (the startup process) needs no pinning.
            match affinity::pin_process(pid, &[database_core]) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                other => other.expect("pin the cluster"),
            }
        }
        Some(PinnedCluster {
            cluster,
            cores: (database_core, other_core),
            _saved: saved,
        })
    }

    /// Says where the postmaster, a new backend of `db` and this process run.
    pub async fn say_cores(&self, group: &str, db: &TestDb) {
        let postmaster = self.cluster.pid().expect("the cluster runs");
        let backend: i32 = db
            .client()
            .await
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .expect("a backend's pid")
            .get(0);
        say(&format!(
            "{group}: PostgreSQL on core {} (postmaster), {} (a new backend); the benchmark, its sink, the relay and pg_recvlogical on core {}",
            affinity::list(&affinity::allowed(postmaster as i32)),
            affinity::list(&affinity::allowed(backend)),
            affinity::list(&affinity::allowed(0)),
        ));
    }
}
