//! The tables of the ceilings, the drains, the relays' connections and the steady runs, and
//! the order of every table printed at the end.

use std::fmt::Write as _;

use super::{fmt_ratio, Report};
use crate::stats::shares;
use crate::timeline;

impl Report {
    pub fn table(&self) -> String {
        let mut t = String::new();
        let b = self.batch;
        let c1 = self.ceiling(1);
        if !self.ceilings.is_empty() {
            let _ = writeln!(
                t,
                "### Database ceiling: the relay's claim + mark-sent SQL, and the minimal one, no queue ({} rows, ~{:.0}-byte payloads; fsync=off cluster)\n",
                self.meta["rows"], self.payload_bytes
            );
            let _ = writeln!(
                t,
                "| claim | batch | workers | rows/s | claim ms | claim ms, first → last tenth | mark sent ms | connections busy | CPU s postgres / bench / others | cores busy |"
            );
            let _ = writeln!(t, "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|");
            for c in &self.ceilings {
                let _ = writeln!(
                    t,
                    "| {} | {} | {} | {:.0} | {:.2} | {:.2} → {:.2} | {:.2} | {:.0}% | {:.1} / {:.1} / {:.1} | {:.2} |",
                    if c.ceiling.minimal {
                        "minimal"
                    } else if c.ceiling.ordered {
                        "ordered"
                    } else {
                        "standard"
                    },
                    c.ceiling.batch,
                    c.ceiling.workers,
                    c.ceiling.rows_per_second(),
                    c.ceiling.claim_ms,
                    c.ceiling.claim_ms_by_tenth.first().copied().unwrap_or(f64::NAN),
                    c.ceiling.claim_ms_by_tenth.last().copied().unwrap_or(f64::NAN),
                    c.ceiling.settle_ms,
                    c.activity.busy() * 100.0,
                    c.cpu.postgres,
                    c.cpu.bench,
                    c.cpu.others(0.0),
                    c.cpu.busy_cores(c.ceiling.seconds)
                );
            }
        }
        if !self.drains.is_empty() {
            let _ = writeln!(
                t,
                "\n### Drains (relay: --batch-size {b}, standard queue unless FIFO; fsync=off cluster)\n"
            );
            let _ = writeln!(
                t,
                "| run | in-flight | events/s | ÷ ceiling (1 worker) | 1st → 2nd half events/s | seconds | relay CPU s / 10k | relay peak RSS MiB | relay DB conn busy | CPU s relay / postgres / bench+sink / fauxqs / others | cores busy |"
            );
            let _ = writeln!(t, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|");
            for d in &self.drains {
                let _ = writeln!(
                    t,
                    "| {}{} | {} | {:.0} | {} | {} | {:.1} | {:.2} | {:.1} | {:.0}% | {:.1} / {:.1} / {:.1} / {:.1} / {:.1} | {:.2} |",
                    d.name,
                    if d.cut {
                        format!(" (cut at {:.0} s: {} sent)", d.seconds, d.sent)
                    } else {
                        String::new()
                    },
                    d.max_in_flight,
                    d.events_per_second(),
                    fmt_ratio(c1.map(|c| d.events_per_second() / c)),
                    d.halves()
                        .map_or("—".to_string(), |(a, b)| format!("{a:.0} → {b:.0}")),
                    d.seconds,
                    d.relay_cpu_per_10k(),
                    d.relay_peak_rss_mib,
                    d.activity.busy() * 100.0,
                    d.relay_cpu,
                    d.cpu.postgres,
                    d.cpu.bench,
                    d.cpu.fauxqs,
                    d.cpu.others(d.relay_cpu),
                    d.busy_cores()
                );
            }
        }
        self.long_group_table(&mut t);
        self.large_events_table(&mut t);
        self.tracing_tables(&mut t);
        if !(self.ceilings.is_empty()
            && self.drains.is_empty()
            && self.long_group.is_empty()
            && self.large_events.is_empty()
            && self.tracing.is_empty()
            && self.steady.is_empty())
        {
            let _ = writeln!(
                t,
                "\n### What the relays' database connections did (pg_stat_activity every 20 ms)\n"
            );
            let _ = writeln!(t, "| run | samples |");
            let _ = writeln!(t, "|---|---|");
            for c in self.ceilings.iter().filter(|c| !c.ceiling.minimal) {
                let _ = writeln!(
                    t,
                    "| ceiling{}, {} worker(s) | {} |",
                    if c.ceiling.ordered { " (ordered)" } else { "" },
                    c.ceiling.workers,
                    c.activity.summary()
                );
            }
            for d in self
                .drains
                .iter()
                .chain(&self.long_group)
                .chain(&self.large_events)
                .chain(self.tracing.iter().map(|t| &t.run))
            {
                let _ = writeln!(t, "| {} | {} |", d.name, d.activity.summary());
            }
            for r in &self.steady {
                let _ = writeln!(t, "| steady {}/s | {} |", r.rate, r.activity.summary());
            }
        }
        if !self.steady.is_empty() {
            let _ = writeln!(
                t,
                "\n### Steady: commit-to-send latency (one relay, sink 0 ms, single-row transactions; durable cluster)\n"
            );
            let _ = writeln!(
                t,
                "| rate/s | achieved/s | events | p50 ms | p99 ms | p99.9 ms | max ms | p50 ms by fifth of the run | entries per request | relay DB conn busy | relay CPU s / 10k | CPU s others | cores busy |"
            );
            let _ = writeln!(
                t,
                "|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|"
            );
            for s in &self.steady {
                let missing = if s.missing > 0 {
                    format!(" ({} missing)", s.missing)
                } else {
                    String::new()
                };
                let by_fifth = s
                    .p50_ms_by_fifth
                    .iter()
                    .map(|v| format!("{v:.1}"))
                    .collect::<Vec<_>>()
                    .join(" → ");
                let _ = writeln!(
                    t,
                    "| {} | {:.0} | {}{} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {:.1} | {:.0}% | {:.2} | {:.1} | {:.2} |",
                    s.rate,
                    s.achieved_rate,
                    s.events,
                    missing,
                    s.p50_ms,
                    s.p99_ms,
                    s.p999_ms,
                    s.max_ms,
                    by_fifth,
                    s.entries_per_request,
                    s.activity.busy() * 100.0,
                    s.relay_cpu_per_10k(),
                    s.cpu.others(s.relay_cpu),
                    s.cpu.busy_cores(s.measured_seconds)
                );
            }
        }
        if !self.steady.is_empty() {
            let _ = writeln!(
                t,
                "\n### Steady: why a rate is or is not kept (durable cluster)\n"
            );
            let _ = writeln!(
                t,
                "| rate/s | producers late p50 / p99 ms | producers' backends | second by second |"
            );
            let _ = writeln!(t, "|---:|---|---|---|");
            for s in &self.steady {
                let _ = writeln!(
                    t,
                    "| {} | {:.1} / {:.1} | {} | {} |",
                    s.rate,
                    s.producer_late_p50_ms,
                    s.producer_late_p99_ms,
                    shares(&s.writer_waits),
                    timeline::summary(&s.timeline)
                );
            }
        }
        self.harm_tables(&mut t);
        if let Some(many) = &self.many_tables {
            t.push_str(&many.table());
        }
        let _ = writeln!(t, "\n### Ratios (same run)\n");
        let _ = writeln!(t, "| ratio | value |");
        let _ = writeln!(t, "|---|---:|");
        for (what, value) in self.ratios() {
            let _ = writeln!(t, "| {what} | {} |", fmt_ratio(value));
        }
        let _ = writeln!(t, "\n### Targets\n");
        let _ = writeln!(t, "| target | goal | measured | met | note |");
        let _ = writeln!(t, "|---|---|---:|---|---|");
        for target in self.targets() {
            let _ = writeln!(
                t,
                "| {} | {} | {} | {} | {} |",
                target.what,
                target.goal,
                target.value.map_or("—".to_string(), |v| format!("{v:.2}")),
                match target.met {
                    Some(true) => "yes",
                    Some(false) => "NO",
                    None => "not run",
                },
                target.note
            );
        }
        t
    }
}
