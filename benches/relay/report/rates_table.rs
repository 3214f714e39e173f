//! The `rates` table: what the relay costs at production rates (rates.rs says what each
//! column is).

use std::fmt::Write as _;

use super::Report;
use crate::rates::{RateSummary, RoundFigures};
use crate::stats::quantile;

impl Report {
    /// One line per rate, medians over rounds and their min–max; then the same cells' CPU
    /// by part.
    pub(super) fn rates_table(&self, t: &mut String) {
        let Some(run) = &self.rates else {
            return;
        };
        let _ = writeln!(
            t,
            "\n### Cost at production rates (durable, wal_level=logical; PostgreSQL on core {}, writer, sink, relay and pg_recvlogical on core {}; one event per transaction, paced; {} s windows after {} s warm-up; relay {}{}; medians over rounds, min–max)\n",
            run.cores.0,
            run.cores.1,
            run.window_seconds,
            crate::rates::WARM_UP.as_secs(),
            run.wakeup.label(),
            if run.relay_args.is_empty() {
                String::new()
            } else {
                format!(" {}", run.relay_args.join(" "))
            },
        );
        let _ = writeln!(
            t,
            "| events/s (reached) | app write µs/event | relay adds µs/event (× app) | its backends µs/event | log-based adds µs/event (walsender) | relay ÷ log-based | relay process % core (µs/event) | pg_recvlogical % core | claims/s | events/claim | its backends µs per claim cycle | statements / transactions per cycle | plan / exec ms per claim | per settlement | probes/s | commit-to-sent p50 / p99 ms |"
        );
        let _ = writeln!(
            t,
            "|---:|---:|---|---:|---|---:|---|---:|---:|---:|---:|---|---|---|---:|---|"
        );
        for s in run.summaries() {
            let f = |figure: &dyn Fn(&RoundFigures) -> f64, digits: usize| fig(&s, figure, digits);
            let m = |figure: &dyn Fn(&RoundFigures) -> f64, digits: usize| {
                format!("{:.*}", digits, s.of(figure).0)
            };
            let _ = writeln!(
                t,
                "| {} ({}) | {} | **{}** (**{}**) | {} | {} ({}) | **{}** | {} ({}) | {} | {} | {} | **{}** | {} / {} | {} / {} | {} / {} | {} | {:.1} / {:.1}{} |",
                s.rate,
                m(&|r| r.reached, 0),
                f(&|r| r.app_us, 0),
                f(&|r| r.relay_added_us, 0),
                m(&|r| r.relay_over_app, 2),
                f(&|r| r.relay_backends_us, 0),
                f(&|r| r.log_added_us, 0),
                m(&|r| r.walsender_us, 0),
                f(&|r| r.relay_over_log, 2),
                f(&|r| r.relay_process_share * 100.0, 1),
                m(&|r| r.relay_process_us, 0),
                f(&|r| r.recvlogical_share * 100.0, 1),
                f(&|r| r.claims_per_second, 0),
                f(&|r| r.events_per_claim, 1),
                f(&|r| r.cycle_backend_us, 0),
                m(&|r| r.statements_per_cycle, 1),
                m(&|r| r.transactions_per_cycle, 1),
                m(&|r| r.claim_ms.0, 3),
                m(&|r| r.claim_ms.1, 3),
                m(&|r| r.settlement_ms.0, 3),
                m(&|r| r.settlement_ms.1, 3),
                m(&|r| r.probes_per_second, 0),
                quantile(&s.latencies_ms, 0.5),
                quantile(&s.latencies_ms, 0.99),
                if s.missing > 0 {
                    format!(" ({} never arrived)", s.missing)
                } else {
                    String::new()
                },
            );
        }
        let _ = writeln!(
            t,
            "\nThe cluster's CPU per event by part, µs (medians of cells): none · relay · log-based\n"
        );
        let _ = writeln!(
            t,
            "| events/s | app's backends | relay's backends | WAL sender | rest (WAL writer, checkpointer, autovacuum, …) | whole cluster |"
        );
        let _ = writeln!(t, "|---:|---|---|---|---|---|");
        use crate::own_core::Reader;
        for s in run.summaries() {
            let by_reader = |part: &dyn Fn(&crate::rates::CpuSplit) -> f64| {
                Reader::ALL
                    .iter()
                    .map(|reader| {
                        let values: Vec<f64> = run
                            .cells
                            .iter()
                            .filter(|c| c.rate == s.rate && c.reader == *reader)
                            .map(|c| part(&c.cpu) / c.events as f64 * 1e6)
                            .collect();
                        format!("{:.0}", crate::stats::median(&values))
                    })
                    .collect::<Vec<_>>()
                    .join(" · ")
            };
            let _ = writeln!(
                t,
                "| {} | {} | {} | {} | {} | {} |",
                s.rate,
                by_reader(&|c| c.app),
                by_reader(&|c| c.relay),
                by_reader(&|c| c.walsender),
                by_reader(&|c| c.rest),
                by_reader(&|c| c.total()),
            );
        }
    }
}

/// `median (min–max)` of one figure over the rounds.
fn fig(s: &RateSummary, figure: &dyn Fn(&RoundFigures) -> f64, digits: usize) -> String {
    let (median, (min, max)) = s.of(figure);
    if s.rounds.len() < 2 {
        return format!("{median:.digits$}");
    }
    format!("{median:.digits$} ({min:.digits$}–{max:.digits$})")
}
