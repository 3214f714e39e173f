//! Group `wal`: what the relay writes to the database per event, for each settlement mode,
//! beside what the application's own INSERT writes; and a drain on a durable cluster.
//!
//! For each mode, on the durable cluster (`fsync=on`, `synchronous_commit=on`): a CHECKPOINT,
//! then N single-row INSERT transactions with no relay running (the application's WAL), then
//! the relay against fauxqs until every row is settled (the relay's WAL), the two measured by
//! `pg_current_wal_lsn()` deltas. No checkpoint runs in between, so the relay's first change
//! of each page after the insert's checkpoint writes a full-page image: that is part of what
//! it costs. Autovacuum is off on the new database's tables during the measurement, so the
//! window holds what the application and the relay wrote, not a vacuum that happened to start
//! (what vacuum later writes for the dead versions is not counted).
//!
//! The relay's PostgreSQL CPU is that of its backends (`application_name` `outbox-relay`, the
//! relay's own default), read from /proc every 200 ms while they live, the last reading of
//! each kept: backends exit with the relay.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::backend_cpu::BackendCpu;
use crate::cluster::{drop_db, Clusters};
use crate::drain::{drain, say_drain, spec, Destination, DrainRun};
use crate::help::help_value;
use crate::procstat;
use crate::progress::say;
use crate::relays::{check_alive, migrate, sent_total, start_relay_at, stop, Wakeup};
use crate::settings::Settings;
use crate::support;
use crate::support::pg::PrivatePg;
use crate::waldump::{self, WalRecord};
use crate::workload::{self, Backlog};

/// Writer connections of the insert phase: enough for commits to group, as an application's do.
const INSERT_CONNECTIONS: usize = 16;
/// A relay that has not settled the rows by then is stuck, not slow.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(300);

/// A settlement mode: the relay's flags for it.
pub struct Mode {
    /// How the tables name it.
    pub label: String,
    /// The relay's extra flags (none for the build's default).
    pub flags: Vec<String>,
}

/// The build's default `--retention` first, then `0` (delete on acknowledgement), `1h` and
/// `off`, each once.
pub fn modes(relay_help: &str) -> Vec<Mode> {
    let default = help_value(relay_help, "--retention");
    let mut modes = vec![Mode {
        label: match &default {
            Some(d) => format!("--retention {d} (default)"),
            None => "defaults".to_string(),
        },
        flags: Vec::new(),
    }];
    for value in ["0", "1h", "off"] {
        if default.as_deref() != Some(value) {
            modes.push(Mode {
                label: format!("--retention {value}"),
                flags: vec!["--retention".to_string(), value.to_string()],
            });
        }
    }
    modes
}

/// Row changes of one table during the relay's phase (`pg_stat_user_tables` deltas).
pub struct TableWrites {
    /// The table, schema-qualified.
    pub table: String,
    /// `n_tup_ins`, `n_tup_upd`, `n_tup_hot_upd`, `n_tup_del` deltas.
    pub inserted: i64,
    /// See `inserted`.
    pub updated: i64,
    /// See `inserted`.
    pub hot_updated: i64,
    /// See `inserted`.
    pub deleted: i64,
}

/// What one settlement mode wrote.
pub struct WalRun {
    /// [`Mode::label`].
    pub mode: String,
    /// [`Mode::flags`].
    pub flags: Vec<String>,
    /// Events written and relayed.
    pub rows: u64,
    /// Mean payload size of an event, bytes of JSON text.
    pub payload_bytes: f64,
    /// WAL of the insert phase and of the relay phase, bytes.
    pub insert_wal: u64,
    /// See `insert_wal`.
    pub relay_wal: u64,
    /// From the relay's start until every row was settled (at least the second
    /// [`start_relay_at`] waits after the relay serves its metrics).
    pub relay_seconds: f64,
    /// utime + stime of the relay's backends (last reading of each), and how many there were.
    pub backend_cpu: f64,
    /// See `backend_cpu`.
    pub backends: usize,
    /// The whole cluster's CPU over the relay phase (backends, WAL writer, checkpointer…).
    pub postgres_cpu: f64,
    /// The relay process's own CPU.
    pub relay_cpu: f64,
    /// Row changes of every table during the relay phase.
    pub tables: Vec<TableWrites>,
    /// `pg_waldump --stats=record` of each phase, when the cluster's bindir has it.
    pub insert_records: Option<Vec<WalRecord>>,
    /// See `insert_records`.
    pub relay_records: Option<Vec<WalRecord>>,
    /// A checkpoint (timed, or forced by WAL volume) began inside the measured window: its
    /// full-page images raise the figures, so the run says so.
    pub checkpointed: bool,
}

impl WalRun {
    pub fn insert_per_event(&self) -> f64 {
        self.insert_wal as f64 / self.rows as f64
    }

    pub fn relay_per_event(&self) -> f64 {
        self.relay_wal as f64 / self.rows as f64
    }

    /// The relay's WAL ÷ the application's, per event.
    pub fn ratio(&self) -> f64 {
        self.relay_per_event() / self.insert_per_event()
    }

    pub fn backend_cpu_us_per_event(&self) -> f64 {
        self.backend_cpu * 1e6 / self.rows as f64
    }

    /// HOT updates ÷ updates of the outbox table in the relay phase (`None`: no updates).
    pub fn hot_share(&self) -> Option<f64> {
        let outbox = self.tables.iter().find(|t| t.table == "public.outbox")?;
        (outbox.updated > 0).then(|| outbox.hot_updated as f64 / outbox.updated as f64)
    }

    pub fn to_json(&self) -> Value {
        let records = |r: &Option<Vec<WalRecord>>| {
            r.as_ref().map(|r| {
                r.iter()
                    .map(|r| {
                        json!({
                            "type": r.kind, "count": r.count,
                            "record_bytes": r.record_bytes, "fpi_bytes": r.fpi_bytes,
                        })
                    })
                    .collect::<Vec<_>>()
            })
        };
        json!({
            "mode": self.mode,
            "flags": self.flags,
            "destination": "fauxqs",
            "rows": self.rows,
            "payload_bytes_mean": self.payload_bytes,
            "insert_wal_bytes": self.insert_wal,
            "relay_wal_bytes": self.relay_wal,
            "insert_wal_bytes_per_event": self.insert_per_event(),
            "relay_wal_bytes_per_event": self.relay_per_event(),
            "relay_over_insert": self.ratio(),
            "relay_seconds": self.relay_seconds,
            "relay_backend_cpu_seconds": self.backend_cpu,
            "relay_backends": self.backends,
            "relay_backend_cpu_us_per_event": self.backend_cpu_us_per_event(),
            "postgres_cpu_seconds_relay_phase": self.postgres_cpu,
            "relay_process_cpu_seconds": self.relay_cpu,
            "outbox_hot_update_share": self.hot_share(),
            "tables": self.tables.iter().map(|t| json!({
                "table": t.table, "inserted": t.inserted, "updated": t.updated,
                "hot_updated": t.hot_updated, "deleted": t.deleted,
            })).collect::<Vec<_>>(),
            "insert_wal_records": records(&self.insert_records),
            "relay_wal_records": records(&self.relay_records),
            "checkpoint_inside_the_window": self.checkpointed,
        })
    }
}

/// The group: every settlement mode, then the durable drain.
pub async fn run(
    settings: &Settings,
    clusters: &mut Clusters,
    wakeup: &Wakeup,
    relay_help: &str,
) -> (Vec<WalRun>, Option<DrainRun>) {
    let cluster = clusters.durable().await;
    let mut runs = Vec::new();
    for mode in modes(relay_help) {
        let run = measure(settings, cluster, wakeup, &mode).await;
        say(&format!(
            "wal, {}: insert {:.0} B/event, relay {:.0} B/event ({:.2} × the insert); relay's backends {:.0} µs CPU/event ({} backends), whole cluster {:.0} µs/event; outbox updates {} HOT; {} events, the relay ran {:.1} s",
            run.mode,
            run.insert_per_event(),
            run.relay_per_event(),
            run.ratio(),
            run.backend_cpu_us_per_event(),
            run.backends,
            run.postgres_cpu * 1e6 / run.rows as f64,
            run.hot_share()
                .map_or("—".to_string(), |s| format!("{:.0}%", s * 100.0)),
            run.rows,
            run.relay_seconds,
        ));
        if run.checkpointed {
            say("  a checkpoint began inside the measured window: its full-page images are in the figures above");
        }
        for t in &run.tables {
            say(&format!(
                "  {} in the relay phase: {} inserted, {} updated ({} HOT), {} deleted",
                t.table, t.inserted, t.updated, t.hot_updated, t.deleted
            ));
        }
        for (phase, records) in [
            ("insert", &run.insert_records),
            ("relay", &run.relay_records),
        ] {
            if let Some(records) = records {
                say(&format!(
                    "  {phase} WAL by record type: {}",
                    waldump::top(records)
                ));
            }
        }
        runs.push(run);
    }
    clusters.stop();
    let mut durable = spec(
        settings,
        "durable drain, fauxqs, defaults",
        Destination::Fauxqs,
        1,
        settings.in_flight,
    );
    durable.backlog = Backlog::orders(settings.durable_drain_rows);
    durable.durable = true;
    let drained = drain(settings, durable).await;
    say_drain(&drained);
    (runs, Some(drained))
}

async fn measure(settings: &Settings, cluster: &PrivatePg, wakeup: &Wakeup, mode: &Mode) -> WalRun {
    let db = cluster.create_db().await;
    migrate(&db, wakeup).await;
    let admin = db.client().await;
    admin
        .batch_execute(
            "DO $$ DECLARE t record; BEGIN \
               FOR t IN SELECT schemaname, relname FROM pg_stat_user_tables LOOP \
                 EXECUTE format('ALTER TABLE %I.%I SET (autovacuum_enabled = off)', t.schemaname, t.relname); \
               END LOOP; END $$; CHECKPOINT",
        )
        .await
        .expect("autovacuum off, checkpoint");
    let rows = settings.wal_rows;
    let payload_bytes: f64 = admin
        .query_one(
            &format!(
                "SELECT avg(length(({})::text))::float8 FROM generate_series(1, $1::bigint) AS g",
                workload::order_payload_sql("g")
            ),
            &[&(rows as i64)],
        )
        .await
        .expect("payload size")
        .get(0);
    let redo = checkpoint_redo(&admin).await;
    let lsn0 = lsn(&admin).await;
    let tag = mode
        .label
        .split(' ')
        .nth(1)
        .unwrap_or("default")
        .to_string();
    workload::insert_events(&db, &format!("wal-{tag}"), rows, INSERT_CONNECTIONS).await;
    let lsn1 = lsn(&admin).await;
    // The writers' statistics reach the shared counters when their backends exit.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let tables_before = table_writes(&admin).await;

    let queue_url = support::create_queue(&format!("wal-{tag}"), &[]).await;
    let endpoint = support::sqs().endpoint().to_string();
    let postmaster = cluster.pid().expect("the cluster runs");
    let postgres_before = procstat::tree_cpu_seconds(postmaster);
    let backends = BackendCpu::start(&db).await;
    let started = Instant::now();
    let relay = start_relay_at(
        settings,
        &db,
        wakeup,
        (&queue_url, &endpoint),
        &format!("bench-wal-{tag}"),
        &mode.flags,
    )
    .await;
    let relays = std::slice::from_ref(&relay);
    loop {
        if sent_total(relays).await >= rows && unsettled(&admin).await == 0 {
            break;
        }
        check_alive(relays);
        assert!(
            started.elapsed() < SETTLE_TIMEOUT,
            "wal, {}: rows not settled after {SETTLE_TIMEOUT:?}\n{}",
            mode.label,
            relay.output()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let relay_seconds = started.elapsed().as_secs_f64();
    let relay_cpu = procstat::cpu_seconds(relay.pid()).unwrap_or(0.0);
    stop(relays).await;
    let lsn2 = lsn(&admin).await;
    let checkpointed = checkpoint_redo(&admin).await != redo;
    let (backend_cpu, backend_count) = backends.finish().await;
    let postgres_cpu = procstat::tree_cpu_seconds(postmaster) - postgres_before;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let tables = table_writes(&admin)
        .await
        .into_iter()
        .map(|(table, after)| {
            let before = tables_before.get(&table).copied().unwrap_or_default();
            TableWrites {
                table,
                inserted: after[0] - before[0],
                updated: after[1] - before[1],
                hot_updated: after[2] - before[2],
                deleted: after[3] - before[3],
            }
        })
        .filter(|t| t.inserted + t.updated + t.deleted > 0)
        .collect();
    let wal_dir = cluster.socket_dir().join("data/pg_wal");
    let insert_records = waldump::stats(&wal_dir, &lsn0, &lsn1);
    let relay_records = waldump::stats(&wal_dir, &lsn1, &lsn2);
    let (insert_wal, relay_wal) = (
        lsn_diff(&admin, &lsn1, &lsn0).await,
        lsn_diff(&admin, &lsn2, &lsn1).await,
    );
    drop(admin);
    drop_db(cluster, &db).await;
    WalRun {
        mode: mode.label.clone(),
        flags: mode.flags.clone(),
        rows,
        payload_bytes,
        insert_wal,
        relay_wal,
        relay_seconds,
        backend_cpu,
        backends: backend_count,
        postgres_cpu,
        relay_cpu,
        tables,
        insert_records,
        relay_records,
        checkpointed,
    }
}

async fn lsn(client: &tokio_postgres::Client) -> String {
    client
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .expect("read the WAL position")
        .get(0)
}

/// Where the last checkpoint's redo starts: it moves when a checkpoint begins.
async fn checkpoint_redo(client: &tokio_postgres::Client) -> String {
    client
        .query_one("SELECT redo_lsn::text FROM pg_control_checkpoint()", &[])
        .await
        .expect("read the last checkpoint")
        .get(0)
}

async fn lsn_diff(client: &tokio_postgres::Client, later: &str, earlier: &str) -> u64 {
    let bytes: f64 = client
        .query_one(
            "SELECT pg_wal_lsn_diff($1::text::pg_lsn, $2::text::pg_lsn)::float8",
            &[&later, &earlier],
        )
        .await
        .expect("WAL bytes between two positions")
        .get(0);
    bytes as u64
}

/// Rows not settled yet; 0 when the table has no `sent_at` to tell (a relay build that keeps
/// it elsewhere: the sent counter decides alone then).
async fn unsettled(client: &tokio_postgres::Client) -> i64 {
    client
        .query_one(
            "SELECT count(*) FROM outbox WHERE sent_at IS NULL AND quarantined_at IS NULL",
            &[],
        )
        .await
        .map_or(0, |row| row.get(0))
}

/// `schema.table` -> [ins, upd, hot_upd, del] of every user table, fresh (no cached snapshot).
async fn table_writes(client: &tokio_postgres::Client) -> BTreeMap<String, [i64; 4]> {
    client
        .batch_execute("SELECT pg_stat_clear_snapshot()")
        .await
        .expect("clear the statistics snapshot");
    client
        .query(
            "SELECT schemaname || '.' || relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del \
             FROM pg_stat_user_tables",
            &[],
        )
        .await
        .expect("read table statistics")
        .iter()
        .map(|r| (r.get(0), [r.get(1), r.get(2), r.get(3), r.get(4)]))
        .collect()
}

// Run by selftest.rs (`cargo test --bench relay`): the bench has no libtest harness.
pub mod tests {
    use super::modes;

    pub fn settlement_modes_start_with_the_default_and_repeat_none() {
        let help = "      --retention <RETENTION>\n          How long\n\n          [default: 0]\n";
        let labels: Vec<String> = modes(help).into_iter().map(|m| m.label).collect();
        assert_eq!(
            labels,
            [
                "--retention 0 (default)",
                "--retention 1h",
                "--retention off"
            ]
        );
        let old = modes("      --retention <AGE>\n          [default: 7d]\n");
        assert_eq!(old.len(), 4);
        assert!(old[0].flags.is_empty());
        assert_eq!(old[1].flags, ["--retention", "0"]);
    }
}
