//! Cluster plumbing: the settings of the benchmark's own PostgreSQL clusters (durable, durable
//! with logical WAL) on the harness's clusters (tests/support/pg.rs), and the admin connections
//! that create and drop their databases.

use crate::relays::Wakeup;
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
