//! The `horizon` table: the relay's cost window by window, before, while and after a
//! read-only snapshot holds the vacuum horizon (horizon.rs says what each column is).

use std::fmt::Write as _;

use super::Report;
use crate::horizon::{Window, HOLD_SQL};

impl Report {
    /// One line per window of each rate; then per rate the last held window over the free
    /// phase.
    pub(super) fn horizon_table(&self, t: &mut String) {
        let Some(run) = &self.horizon else {
            return;
        };
        let _ = writeln!(
            t,
            "\n### A held vacuum horizon (durable, wal_level=logical; PostgreSQL on core {}, writer, sink, relay and pg_recvlogical on core {}; one event per transaction, paced; {} s windows; `{HOLD_SQL}` held {:.0} s; relay {}{}; relay and log-based relay reading at once)\n",
            run.cores.0,
            run.cores.1,
            run.window_seconds,
            run.hold.as_secs_f64(),
            run.wakeup.label(),
            if run.relay_args.is_empty() {
                String::new()
            } else {
                format!(" {}", run.relay_args.join(" "))
            },
        );
        let _ = writeln!(
            t,
            "| events/s | phase, minute | relay's backends % of a core | **µs/event** | statements/s | ms each | commit-to-sent p50 / p99 ms | dead outbox rows | dead lease rows | app's write µs/event | log-based (WAL sender) µs/event | relay ÷ app | relay ÷ log-based | others % of a core, load |"
        );
        let _ = writeln!(
            t,
            "|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|"
        );
        for rate in &run.rates {
            for w in &rate.windows {
                let s = w.seconds();
                let _ = writeln!(
                    t,
                    "| {} | {}, {:.1} | {:.1} | **{:.0}** | {:.0} | {:.3} | {} | {} | {} | {:.0} | {:.0} | {:.2} | {:.2} | {:.0}, {:.1} |",
                    rate.rate,
                    w.phase.label(),
                    w.minute,
                    w.cpu.relay / s * 100.0,
                    w.relay_us(),
                    w.statements.calls() / s,
                    w.statements.total_ms() / w.statements.calls(),
                    latency(w),
                    w.tables.dead_outbox,
                    w.tables.dead_claims,
                    w.app_us(),
                    w.log_us(),
                    w.relay_us() / w.app_us(),
                    w.relay_us() / w.log_us(),
                    w.others / s * 100.0,
                    w.load,
                );
            }
        }
        let _ = writeln!(t);
        for rate in &run.rates {
            let (low, high) = rate.free_swing();
            let _ = writeln!(
                t,
                "- {}/s: free phase {:.0} µs/event (windows {:+.0}% / {:+.0}% of it); last held window **{:.2}×** the free phase{}",
                rate.rate,
                rate.free_us(),
                (low - 1.0) * 100.0,
                (high - 1.0) * 100.0,
                rate.last_held_over_free().unwrap_or(f64::NAN),
                if rate.missing > 0 {
                    format!("; {} events never arrived", rate.missing)
                } else {
                    String::new()
                },
            );
        }
    }
}

/// `p50 / p99` of a window's commit-to-sent, or a dash when none committed in it.
fn latency(w: &Window) -> String {
    match (w.p(0.5), w.p(0.99)) {
        (Some(p50), Some(p99)) => format!("{p50:.1} / {p99:.1}"),
        _ => "–".to_string(),
    }
}
