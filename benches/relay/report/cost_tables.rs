//! The tables of what the relay costs the application: harm, idle relays, storage.

use std::fmt::Write as _;

use super::{fmt_ratio, Report};
use crate::stats::{median, quantile, shares, spread};

impl Report {
    /// Harm, idle and storage: the tables of what the relay costs the application.
    pub(super) fn harm_tables(&self, t: &mut String) {
        if !self.harm.is_empty() {
            let _ = writeln!(
                t,
                "\n### Harm: application commits/s with the relay ÷ without (durable cluster; closed-loop single-row INSERTs; medians of alternating cells)\n"
            );
            let _ = writeln!(
                t,
                "| wake-up | cluster | writers | without (each cell) | with (each cell) | with ÷ without | commit-to-sent p50 / p99 / p99.9 ms | writers' backends, with the relay |"
            );
            let _ = writeln!(t, "|---|---|---:|---|---|---:|---|---|");
            for run in &self.harm {
                for s in run.summaries() {
                    let cells = |v: &[f64]| {
                        v.iter()
                            .map(|x| format!("{x:.0}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    };
                    let mut waits = std::collections::BTreeMap::new();
                    for c in run
                        .cells
                        .iter()
                        .filter(|c| c.writers == s.writers && c.with_relay)
                    {
                        for (k, n) in &c.writer_waits {
                            *waits.entry(k.clone()).or_insert(0) += n;
                        }
                    }
                    let _ = writeln!(
                        t,
                        "| {} | {} | {} | {:.0} ({}) | {:.0} ({}) | **{:.2}** | {:.1} / {:.1} / {:.1}{} | {} |",
                        run.wakeup.label(),
                        run.wakeup.cluster_label(),
                        s.writers,
                        median(&s.without),
                        cells(&s.without),
                        median(&s.with),
                        cells(&s.with),
                        s.ratio(),
                        quantile(&s.latencies_ms, 0.5),
                        quantile(&s.latencies_ms, 0.99),
                        quantile(&s.latencies_ms, 0.999),
                        if s.missing > 0 {
                            format!(" ({} never arrived)", s.missing)
                        } else {
                            String::new()
                        },
                        shares(&waits),
                    );
                }
            }
        }
        self.own_core_table(t);
        self.rates_table(t);
        self.horizon_table(t);
        self.wal_table(t);
        if !self.idle.is_empty() {
            let _ = writeln!(
                t,
                "\n### Idle relays: what they cost with nothing to send (durable clusters; every set at once, each in its own database)\n"
            );
            let _ = writeln!(
                t,
                "| wake-up | cluster | relays | seconds | transactions/s | their PostgreSQL backends, % of a core | relay processes, % of a core |"
            );
            let _ = writeln!(t, "|---|---|---:|---:|---:|---:|---:|");
            for r in &self.idle {
                let _ = writeln!(
                    t,
                    "| {} | {} | {} | {:.0} | {:.2} | {:.2} | {:.2} |",
                    r.wakeup.label(),
                    r.wakeup.cluster_label(),
                    r.relays,
                    r.seconds,
                    r.per_second(r.transactions as f64),
                    r.per_second(r.backend_cpu) * 100.0,
                    r.per_second(r.relay_cpu) * 100.0,
                );
            }
            for c in &self.idle_clusters {
                let _ = writeln!(
                    t,
                    "\nWhole {} cluster over the same window (postmaster, background processes and every backend above): {:.2}% of a core.",
                    c.cluster,
                    c.cpu / c.seconds * 100.0
                );
            }
        }
        if !self.storage.is_empty() {
            let _ = writeln!(
                t,
                "\n### Storage: the outbox table under a steady stream (durable cluster; variants at once, each in its own database)\n"
            );
            let _ = writeln!(
                t,
                "| relay | events/s | seconds | size every sample (last: producers stopped), MiB | 2nd half min – max MiB | at the end: heap / indexes / rest MiB | bytes/event (whole run) | growth per day at this rate (2nd half) |"
            );
            let _ = writeln!(t, "|---|---:|---:|---|---|---|---:|---:|");
            for r in &self.storage {
                let mib = |b: i64| b as f64 / 1048576.0;
                let sizes = r
                    .samples
                    .iter()
                    .map(|x| format!("{:.0}", mib(x.total)))
                    .collect::<Vec<_>>()
                    .join(" → ");
                let end = r.last().map_or(String::new(), |l| {
                    format!(
                        "{:.1} / {:.1} / {:.1}",
                        mib(l.heap),
                        mib(l.indexes),
                        mib(l.total - l.heap - l.indexes)
                    )
                });
                let (low, high) = r.second_half_range();
                let _ = writeln!(
                    t,
                    "| {} | {:.0} | {:.0} | {} | {:.0} – {:.0} | {} | {:.0} | {:.2} GiB |",
                    r.name,
                    r.achieved_rate(),
                    r.seconds,
                    sizes,
                    mib(low),
                    mib(high),
                    end,
                    r.bytes_per_event(),
                    r.growth_per_day() / 1073741824.0,
                );
            }
        }
    }

    /// The own-core harm table: the database on a core of its own, with the log-based anchor.
    fn own_core_table(&self, t: &mut String) {
        let Some(run) = &self.own_core else {
            return;
        };
        let _ = writeln!(
            t,
            "\n### Harm, database on its own core: application commits/s by who reads the table (durable, wal_level=logical; PostgreSQL on core {}, writers, sink, relay and pg_recvlogical on core {}; medians and min–max of cells in rotated order)\n",
            run.cores.0, run.cores.1
        );
        let _ = writeln!(
            t,
            "| writers | none | relay ({}) | log-based (pgoutput slot) | relay ÷ none | log-based ÷ none | relay ÷ log-based | commit-to-sent p50 / p99 ms | cores busy, database / other: none · relay · log-based |",
            run.wakeup.label()
        );
        let _ = writeln!(t, "|---:|---|---|---|---:|---:|---:|---|---|");
        use crate::own_core::Reader::{self, LogBased, None as Nothing, Relay};
        for s in run.summaries() {
            let cell = |r: Reader| {
                let (min, max) = spread(&s.values(r));
                format!("{:.0} ({min:.0}–{max:.0})", s.median(r))
            };
            let ratio = |a: Reader, b: Reader| {
                format!(
                    "**{}** (rounds {})",
                    fmt_ratio(Some(s.ratio(a, b))),
                    fmt_ratio(Some(s.round_ratio(a, b)))
                )
            };
            let busy = Reader::ALL
                .iter()
                .map(|r| {
                    let (database, other) = run.cores_busy(s.writers, *r);
                    format!("{:.0}% / {:.0}%", database * 100.0, other * 100.0)
                })
                .collect::<Vec<_>>()
                .join(" · ");
            let _ = writeln!(
                t,
                "| {} | {} | {} | {} | {} | {} | {} | {:.1} / {:.1}{} | {busy} |",
                s.writers,
                cell(Nothing),
                cell(Relay),
                cell(LogBased),
                ratio(Relay, Nothing),
                ratio(LogBased, Nothing),
                ratio(Relay, LogBased),
                quantile(&s.latencies_ms, 0.5),
                quantile(&s.latencies_ms, 0.99),
                if s.missing > 0 {
                    format!(" ({} never arrived)", s.missing)
                } else {
                    String::new()
                },
            );
        }
    }

    /// WAL per event for each settlement mode, and the durable drain.
    fn wal_table(&self, t: &mut String) {
        if !self.wal.is_empty() {
            let _ = writeln!(
                t,
                "\n### WAL per event (durable cluster; {} events of ~{:.0} B payload, single-row INSERTs, then the relay to fauxqs; LSN deltas, no checkpoint between)\n",
                self.wal[0].rows, self.wal[0].payload_bytes
            );
            let _ = writeln!(
                t,
                "| mode | insert B/event | relay B/event | relay ÷ insert | relay DB CPU µs/event | HOT share of outbox updates | relay WAL, top record types |"
            );
            let _ = writeln!(t, "|---|---:|---:|---:|---:|---:|---|");
            for w in &self.wal {
                let top = w.relay_records.as_ref().map_or("—".to_string(), |r| {
                    let total: u64 = r.iter().map(|x| x.bytes()).sum::<u64>().max(1);
                    r.iter()
                        .take(3)
                        .map(|x| {
                            format!("{} {:.0}%", x.kind, x.bytes() as f64 * 100.0 / total as f64)
                        })
                        .collect::<Vec<_>>()
                        .join(", ")
                });
                let _ = writeln!(
                    t,
                    "| {}{} | {:.0} | {:.0} | **{}** | {:.0} | {} | {} |",
                    w.mode,
                    if w.checkpointed {
                        " (a checkpoint began inside the window)"
                    } else {
                        ""
                    },
                    w.insert_per_event(),
                    w.relay_per_event(),
                    fmt_ratio(Some(w.ratio())),
                    w.backend_cpu_us_per_event(),
                    w.hot_share()
                        .map_or("—".to_string(), |h| format!("{:.0}%", h * 100.0)),
                    top,
                );
            }
        }
        if let Some(d) = &self.durable_drain {
            let _ = writeln!(
                t,
                "\nDurable drain (fsync=on, synchronous_commit=on; fauxqs; the relay's defaults): **{:.0} events/s** ({} events in {:.2} s), relay {:.2} CPU s/10k events.",
                d.events_per_second(),
                d.sent,
                d.seconds,
                d.relay_cpu_per_10k(),
            );
        }
    }
}
