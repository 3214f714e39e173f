//! The tables of the long-group, large-event and tracing drains.

use std::fmt::Write as _;

use super::{fmt_ratio, Report};
use crate::stats::median;
use crate::traces::TraceRun;
use crate::tracing_group::TracingDrain;

impl Report {
    pub(super) fn long_group_table(&self, t: &mut String) {
        if self.long_group.is_empty() {
            return;
        }
        let _ = writeln!(
            t,
            "\n### Long group: one group's backlog against the same backlog over many groups (ordered FIFO, --batch-size {}; fsync=off cluster)\n",
            self.batch
        );
        let _ = writeln!(
            t,
            "| run | groups | events | events/s | events/s after the first send | seconds (first send seen at) | requests | entries per request | entries behind their group | relay CPU s / 10k | relay DB conn busy | CPU s others | cores busy |"
        );
        let _ = writeln!(
            t,
            "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"
        );
        for d in &self.long_group {
            let _ = writeln!(
                t,
                "| {} | {} | {} | {:.0} | {} | {:.2} ({}) | {} | {} | {} | {:.2} | {:.0}% | {:.1} | {:.2} |",
                d.name,
                d.groups,
                d.sent,
                d.events_per_second(),
                d.events_per_second_sending()
                    .map_or("—".to_string(), |r| format!("{r:.0}")),
                d.seconds,
                d.first_sent
                    .map_or("—".to_string(), |(at, n)| format!("{at:.2} s, {n} sent")),
                d.requests.map_or("—".to_string(), |r| r.to_string()),
                d.entries_per_request()
                    .map_or("—".to_string(), |e| format!("{e:.1}")),
                if d.requests.is_some() {
                    d.fifo_behind.to_string()
                } else {
                    "—".to_string()
                },
                d.relay_cpu_per_10k(),
                d.activity.busy() * 100.0,
                d.cpu.others(d.relay_cpu),
                d.busy_cores()
            );
        }
        let _ = writeln!(t);
        let _ = writeln!(
            t,
            "| destination | 1 group ÷ many, after the first send | from the relay's start |"
        );
        let _ = writeln!(t, "|---|---:|---:|");
        for (dest, one, many) in self.long_group_pairs() {
            let (sending, from_start) = Self::long_group_ratio(one, many);
            let _ = writeln!(
                t,
                "| {dest} | {} | {} |",
                fmt_ratio(sending),
                fmt_ratio(from_start)
            );
        }
    }

    pub(super) fn tracing_tables(&self, t: &mut String) {
        if self.tracing.is_empty() {
            return;
        }
        let rows = self.tracing[0].run.rows;
        let _ = writeln!(
            t,
            "\n### Tracing: the same drain with spans exported (sink 0 ms, {rows} events each with a sampled traceparent, --batch-size {}, --max-in-flight {}; fsync=off cluster)\n",
            self.batch, self.in_flight
        );
        let mut variants: Vec<String> = Vec::new();
        for d in &self.tracing {
            if !variants.contains(&d.variant()) {
                variants.push(d.variant());
            }
        }
        let off: Vec<&TracingDrain> = self
            .tracing
            .iter()
            .filter(|d| d.run.traces.is_none())
            .collect();
        let off_rates: Vec<f64> = off.iter().map(|d| d.run.events_per_second()).collect();
        let off_median = median(&off_rates);
        let _ = writeln!(
            t,
            "| variant | events/s, median (each round) | ÷ tracing off, medians | ÷ tracing off, each round | relay CPU s / 10k, median | relay peak RSS MiB, max | spans received ÷ events | spans dropped, queue full | export errors |"
        );
        let _ = writeln!(t, "|---|---|---:|---|---:|---:|---:|---:|---:|");
        for variant in &variants {
            let runs: Vec<&TracingDrain> = self
                .tracing
                .iter()
                .filter(|d| &d.variant() == variant)
                .collect();
            let rates: Vec<f64> = runs.iter().map(|d| d.run.events_per_second()).collect();
            let rate = median(&rates);
            let each_round = runs
                .iter()
                .map(|d| {
                    let same_round_off = off.iter().find(|o| o.round == d.round);
                    fmt_ratio(
                        same_round_off
                            .map(|o| d.run.events_per_second() / o.run.events_per_second()),
                    )
                })
                .collect::<Vec<_>>()
                .join(", ");
            let traced: Vec<&TraceRun> =
                runs.iter().filter_map(|d| d.run.traces.as_ref()).collect();
            let received: Option<u64> = traced
                .iter()
                .map(|tr| tr.received.as_ref().map(|r| r.spans))
                .sum();
            let sent: u64 = runs.iter().map(|d| d.run.sent).sum();
            let _ =
                writeln!(
                t,
                "| {variant} | {rate:.0} ({}) | {} | {each_round} | {:.2} | {:.1} | {} | {} | {} |",
                rates
                    .iter()
                    .map(|r| format!("{r:.0}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                fmt_ratio(Some(rate / off_median)),
                median(&runs.iter().map(|d| d.run.relay_cpu_per_10k()).collect::<Vec<_>>()),
                runs.iter()
                    .map(|d| d.run.relay_peak_rss_mib)
                    .fold(0.0, f64::max),
                if traced.is_empty() {
                    "—".to_string()
                } else {
                    received.map_or("— (down)".to_string(), |r| {
                        format!("{:.3} ({r} / {sent})", r as f64 / sent.max(1) as f64)
                    })
                },
                if traced.is_empty() {
                    "—".to_string()
                } else {
                    traced.iter().map(|tr| tr.dropped).sum::<u64>().to_string()
                },
                if traced.is_empty() {
                    "—".to_string()
                } else {
                    traced
                        .iter()
                        .map(|tr| tr.export_errors)
                        .sum::<u64>()
                        .to_string()
                },
            );
        }
        let _ = writeln!(t);
        let _ = writeln!(
            t,
            "| run | events/s | seconds | relay CPU s / 10k | relay peak RSS MiB | spans received | events with a span | spans in their row's trace | dropped, queue full | export requests | spans per request | bytes per span | export errors | exit s | CPU s relay / postgres / bench+sink / others | cores busy |"
        );
        let _ = writeln!(
            t,
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"
        );
        for d in &self.tracing {
            let r = &d.run;
            let received = r.traces.as_ref().and_then(|tr| tr.received.as_ref());
            let dash = || "—".to_string();
            let _ = writeln!(
                t,
                "| {} | {:.0} | {:.1} | {:.2} | {:.1} | {} | {} | {} | {} | {} | {} | {} | {} | {:.2} | {:.1} / {:.1} / {:.1} / {:.1} | {:.2} |",
                r.name,
                r.events_per_second(),
                r.seconds,
                r.relay_cpu_per_10k(),
                r.relay_peak_rss_mib,
                received.map_or_else(dash, |x| x.spans.to_string()),
                received.map_or_else(dash, |x| x.events.to_string()),
                received.map_or_else(dash, |x| x.in_row_trace.to_string()),
                r.traces.as_ref().map_or_else(dash, |tr| tr.dropped.to_string()),
                received.map_or_else(dash, |x| x.requests.to_string()),
                received.map_or_else(dash, |x| format!(
                    "{:.0}",
                    x.spans as f64 / x.requests.max(1) as f64
                )),
                received.map_or_else(dash, |x| format!(
                    "{:.0}",
                    x.bytes as f64 / x.spans.max(1) as f64
                )),
                r.traces
                    .as_ref()
                    .map_or_else(dash, |tr| tr.export_errors.to_string()),
                r.exit_seconds,
                r.relay_cpu,
                r.cpu.postgres,
                r.cpu.bench,
                r.cpu.others(r.relay_cpu),
                r.busy_cores()
            );
        }
    }

    pub(super) fn large_events_table(&self, t: &mut String) {
        if self.large_events.is_empty() {
            return;
        }
        let _ = writeln!(
            t,
            "\n### Large events: a backlog near SQS's message size limit (standard queue, --batch-size {}, --max-in-flight {}; fsync=off cluster; ÷ default: against the default-budget inline run on the same sink)\n",
            self.batch, self.in_flight
        );
        let _ = writeln!(
            t,
            "| run | events | payload bytes (mean) | events/s | ÷ default | seconds | relay peak RSS MiB | relay CPU s | ÷ default | requests | entries per request | objects to S3 | CPU s others | cores busy |"
        );
        let _ = writeln!(
            t,
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        for d in &self.large_events {
            // Each sink's first run (the default budget, bodies inline) is its baseline.
            let base = self
                .large_events
                .iter()
                .find(|b| b.destination == d.destination)
                .unwrap_or(d);
            let _ = writeln!(
                t,
                "| {} | {} | {:.0} | {:.0} | {:.2} | {:.2} | {:.1} | {:.2} | {:.2} | {} | {} | {} | {:.1} | {:.2} |",
                d.name,
                d.sent,
                d.payload_bytes,
                d.events_per_second(),
                d.events_per_second() / base.events_per_second(),
                d.seconds,
                d.relay_peak_rss_mib,
                d.relay_cpu,
                d.relay_cpu / base.relay_cpu,
                d.requests.map_or("—".to_string(), |r| r.to_string()),
                d.entries_per_request()
                    .map_or("—".to_string(), |e| format!("{e:.1}")),
                d.objects.map_or("—".to_string(), |o| o.to_string()),
                d.cpu.others(d.relay_cpu),
                d.busy_cores()
            );
        }
    }
}
