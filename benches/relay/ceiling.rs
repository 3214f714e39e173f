//! Group `ceiling`: the database's own ceiling, the relay's claim + mark-sent SQL in a tight
//! loop and the least PostgreSQL allows, no queue.

use crate::procstat::Snapshot;
use crate::progress::say;
use crate::sampler::{self, Activity, Sampler};
use crate::settings::Settings;
use crate::workload::{self, Backlog, Ceiling, Database};

pub struct CeilingRun {
    /// What the claim + mark-sent loop reached.
    pub ceiling: Ceiling,
    /// CPU of every process on the machine meanwhile.
    pub cpu: Snapshot,
    /// What its connections were doing, sampled (empty for the minimal ceiling).
    pub activity: Activity,
}

/// Every ceiling run, and the mean payload size of the backlog they claimed.
pub async fn run(settings: &Settings) -> (f64, Vec<CeilingRun>) {
    let mut payload_bytes = 0.0;
    let mut ceilings = Vec::new();
    for (ordered, workers) in [(false, 1), (false, 2), (false, 4), (true, 1)] {
        let database = Database::create().await;
        payload_bytes = database.fill(&Backlog::orders(settings.rows)).await;
        let outbox = if ordered {
            database.ordered_outbox()
        } else {
            std::sync::Arc::clone(&database.outbox)
        };
        let before = Snapshot::take();
        let sampler = Sampler::start(&database.db).await;
        let c = workload::ceiling(
            outbox,
            ordered,
            settings.batch as i64,
            workers,
            settings.rows,
        )
        .await;
        let activity = sampler.finish().await;
        let cpu = Snapshot::take().since(&before);
        say(&format!(
            "ceiling{} batch {} x {} worker(s): {:.0} rows/s (claim {:.2} ms, mark sent {:.2} ms, {:.2} cores busy); connections: {}",
            if ordered { " (ordered claim)" } else { "" },
            c.batch,
            c.workers,
            c.rows_per_second(),
            c.claim_ms,
            c.settle_ms,
            cpu.busy_cores(c.seconds),
            activity.summary()
        ));
        ceilings.push(CeilingRun {
            cpu,
            activity,
            ceiling: c,
        });
        database.drop_now().await;
    }
    // The least PostgreSQL allows, beside the relay's own SQL: same backlog, batch, one
    // connection.
    let database = Database::create().await;
    database.fill(&Backlog::orders(settings.rows)).await;
    let before = Snapshot::take();
    let c = workload::minimal_ceiling(&database.db, settings.batch as i64, settings.rows).await;
    let cpu = Snapshot::take().since(&before);
    say(&format!(
        "minimal ceiling batch {} x 1 worker: {:.0} rows/s (claim {:.2} ms, mark sent {:.2} ms, {:.2} cores busy)",
        c.batch,
        c.rows_per_second(),
        c.claim_ms,
        c.settle_ms,
        cpu.busy_cores(c.seconds),
    ));
    ceilings.push(CeilingRun {
        cpu,
        activity: sampler::Activity::default(),
        ceiling: c,
    });
    database.drop_now().await;
    (payload_bytes, ceilings)
}
