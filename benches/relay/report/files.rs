//! What a run writes to disk: results.json, table.md, and the plot data.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use serde_json::json;

use super::{Report, ENTRIES_PER_REQUEST};
use crate::backlog::BacklogRun;
use crate::drain::DrainRun;
use crate::harm::HarmRun;
use crate::horizon::HorizonRun;
use crate::idle::IdleRun;
use crate::many_tables::ManyTablesRun;
use crate::own_core::OwnCoreRun;
use crate::rates::RatesRun;
use crate::settings::SQS_LATENCY;
use crate::steady::SteadyRun;
use crate::storage::StorageRun;
use crate::wal::WalRun;

impl Report {
    /// results.json, table.md, and the plot data: inflight.tsv, inflight0.tsv, latency_cdf.tsv,
    /// plot_vars.gp.
    pub fn write(&self, dir: &Path) {
        let results = json!({
            "meta": self.meta,
            "payload_bytes_mean": self.payload_bytes,
            "seconds": self.seconds,
            "ceiling": self.ceilings.iter().map(|c| json!({
                "ordered": c.ceiling.ordered,
                "minimal": c.ceiling.minimal,
                "batch": c.ceiling.batch,
                "workers": c.ceiling.workers,
                "rows": c.ceiling.rows,
                "seconds": c.ceiling.seconds,
                "rows_per_second": c.ceiling.rows_per_second(),
                "claim_ms": c.ceiling.claim_ms,
                "mark_sent_ms": c.ceiling.settle_ms,
                "claim_ms_by_tenth_of_drain": c.ceiling.claim_ms_by_tenth,
                "postgres_cpu_seconds": c.cpu.postgres,
                "bench_process_cpu_seconds": c.cpu.bench,
                "other_processes_cpu_seconds": c.cpu.others(0.0),
                "machine_busy_cores": c.cpu.busy_cores(c.ceiling.seconds),
                "connections_busy": c.activity.busy(),
                "connection_samples": c.activity.samples,
                "connection_waits": c.activity.waits,
            })).collect::<Vec<_>>(),
            "drains": self.drains.iter().map(DrainRun::to_json).collect::<Vec<_>>(),
            "long_group": self.long_group.iter().map(DrainRun::to_json).collect::<Vec<_>>(),
            "large_events": self.large_events.iter().map(DrainRun::to_json).collect::<Vec<_>>(),
            "tracing": self.tracing.iter().map(|t| {
                let mut run = t.run.to_json();
                run["round"] = json!(t.round);
                run["variant"] = json!(t.variant());
                run
            }).collect::<Vec<_>>(),
            "steady": self.steady.iter().map(SteadyRun::to_json).collect::<Vec<_>>(),
            "harm": self.harm.iter().map(HarmRun::to_json).collect::<Vec<_>>(),
            "harm_own_core": self.own_core.as_ref().map(OwnCoreRun::to_json),
            "rates": self.rates.as_ref().map(RatesRun::to_json),
            "horizon": self.horizon.as_ref().map(HorizonRun::to_json),
            "wal_per_event": self.wal.iter().map(WalRun::to_json).collect::<Vec<_>>(),
            "durable_drain": self.durable_drain.as_ref().map(DrainRun::to_json),
            "idle": self.idle.iter().map(IdleRun::to_json).collect::<Vec<_>>(),
            "idle_whole_clusters": self.idle_clusters.iter().map(|c| json!({
                "cluster": c.cluster,
                "seconds": c.seconds,
                "cpu_seconds": c.cpu,
                "percent_of_a_core": c.cpu / c.seconds * 100.0,
            })).collect::<Vec<_>>(),
            "storage": self.storage.iter().map(StorageRun::to_json).collect::<Vec<_>>(),
            "big_backlog": self.big_backlog.iter().map(BacklogRun::to_json).collect::<Vec<_>>(),
            "many_tables": self.many_tables.as_ref().map(ManyTablesRun::to_json),
            "ratios": self.ratios().into_iter().map(|(what, v)| json!({"ratio": what, "value": v})).collect::<Vec<_>>(),
            "targets": self.targets().into_iter().map(|t| json!({
                "target": t.what, "goal": t.goal, "value": t.value, "met": t.met, "note": t.note,
            })).collect::<Vec<_>>(),
        });
        write(
            &dir.join("results.json"),
            &serde_json::to_string_pretty(&results).expect("results as JSON"),
        );
        write(&dir.join("table.md"), &self.table());

        let mut inflight = String::from("# in_flight\tevents_per_s\tlatency_bound_per_s\n");
        for d in self.sweep() {
            let bound = d.max_in_flight as f64 * ENTRIES_PER_REQUEST / SQS_LATENCY.as_secs_f64();
            let _ = writeln!(
                inflight,
                "{}\t{:.1}\t{:.1}",
                d.max_in_flight,
                d.events_per_second(),
                bound
            );
        }
        write(&dir.join("inflight.tsv"), &inflight);
        let mut inflight0 = String::from("# in_flight\tevents_per_s (sink 0 ms, 1 replica)\n");
        for d in self
            .drains
            .iter()
            .filter(|d| d.sink_latency() == Some(Duration::ZERO) && d.replicas == 1 && !d.fifo)
        {
            let _ = writeln!(
                inflight0,
                "{}\t{:.1}",
                d.max_in_flight,
                d.events_per_second()
            );
        }
        write(&dir.join("inflight0.tsv"), &inflight0);

        // One block per rate (gnuplot `index`), at most ~2,000 points each.
        let mut cdf = String::new();
        for s in &self.steady {
            let _ = writeln!(cdf, "# rate {}\n# latency_ms\tfraction", s.rate);
            let n = s.latencies_ms.len();
            let step = (n / 2000).max(1);
            for i in (0..n)
                .step_by(step)
                .chain(std::iter::once(n.saturating_sub(1)))
            {
                if n == 0 {
                    break;
                }
                let _ = writeln!(
                    cdf,
                    "{:.4}\t{:.6}",
                    s.latencies_ms[i].max(0.01),
                    (i + 1) as f64 / n as f64
                );
            }
            cdf.push_str("\n\n");
        }
        write(&dir.join("latency_cdf.tsv"), &cdf);

        let mut vars = String::new();
        let num = |v: Option<f64>| v.filter(|v| v.is_finite()).unwrap_or(0.0);
        let _ = writeln!(vars, "ceiling1 = {:.1}", num(self.ceiling(1)));
        let _ = writeln!(vars, "ceiling4 = {:.1}", num(self.ceiling(4)));
        let _ = writeln!(
            vars,
            "drain0 = {:.1}",
            num(self.base().map(DrainRun::events_per_second))
        );
        let _ = writeln!(vars, "batch = {}", self.batch);
        let _ = writeln!(vars, "steady_blocks = {}", self.steady.len());
        for (i, s) in self.steady.iter().enumerate() {
            let _ = writeln!(
                vars,
                "steady_title{i} = \"{}/s: p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms\"",
                s.rate, s.p50_ms, s.p99_ms, s.p999_ms
            );
        }
        write(&dir.join("plot_vars.gp"), &vars);
    }
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}
