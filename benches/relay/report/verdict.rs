//! The ratios between runs of the same run, and the targets they are held against.

use super::{Report, Target, ENTRIES_PER_REQUEST};
use crate::drain::DrainRun;
use crate::settings::SQS_LATENCY;
use crate::stats::{median, quantile};

impl Report {
    pub(super) fn ratios(&self) -> Vec<(String, Option<f64>)> {
        let c1 = self.ceiling(1);
        let c4 = self.ceiling(4);
        let base_rate = self.base().map(DrainRun::events_per_second);
        let b = self.batch;
        let mut r = vec![
            (
                format!("drain, sink 0 ms ÷ ceiling (batch {b}, 1 worker)"),
                Self::ratio(self.base(), c1),
            ),
            (
                format!("drain, sink 0 ms ÷ minimal ceiling (batch {b}, 1 connection)"),
                Self::ratio(self.base(), self.minimal_ceiling()),
            ),
            (
                "relay's ceiling ÷ minimal ceiling (what our SQL costs)".to_string(),
                c1.zip(self.minimal_ceiling()).map(|(r, m)| r / m),
            ),
            (
                format!("drain, sink 0 ms ÷ ceiling (batch {b}, 4 workers)"),
                Self::ratio(self.base(), c4),
            ),
            (
                format!(
                    "drain, sink 15 ms, in-flight {} ÷ ceiling (batch {b}, 1 worker)",
                    self.in_flight
                ),
                Self::ratio(self.sweep_at(self.in_flight), c1),
            ),
        ];
        if let Some(best) = self.sweep_best() {
            r.push((
                format!(
                    "drain, sink 15 ms, best (in-flight {}) ÷ ceiling (batch {b}, 1 worker)",
                    best.max_in_flight
                ),
                Self::ratio(Some(best), c1),
            ));
        }
        r.extend([
            (
                format!("drain, fauxqs ÷ ceiling (batch {b}, 1 worker)"),
                Self::ratio(self.fauxqs(), c1),
            ),
            (
                "ordered FIFO ÷ unordered (sink 0 ms)".to_string(),
                Self::ratio(self.ordered(), base_rate),
            ),
            (
                "FIFO --ordered off ÷ unordered (sink 0 ms)".to_string(),
                Self::ratio(self.fifo_unordered(), base_rate),
            ),
            (
                format!("ordered FIFO drain ÷ ordered ceiling (batch {b}, 1 worker)"),
                Self::ratio(self.ordered(), self.ceiling_of(true, 1)),
            ),
            (
                format!("ordered ceiling ÷ ceiling (batch {b}, 1 worker)"),
                self.ceiling_of(true, 1).zip(c1).map(|(o, u)| o / u),
            ),
            (
                "2 replicas ÷ 1".to_string(),
                Self::ratio(self.replicas(2), base_rate),
            ),
            (
                "ceiling 2 workers ÷ 1 worker (what the database permits)".to_string(),
                self.ceiling(2).zip(c1).map(|(two, one)| two / one),
            ),
            (
                "4 replicas ÷ 1".to_string(),
                Self::ratio(self.replicas(4), base_rate),
            ),
            (
                "4 replicas ÷ ceiling (4 workers)".to_string(),
                Self::ratio(self.replicas(4), c4),
            ),
        ]);
        for (dest, one, many) in self.long_group_pairs() {
            let (sending, from_start) = Self::long_group_ratio(one, many);
            r.push((
                format!(
                    "long group ({dest}): 1 group ÷ {} groups, after the first send",
                    many.map_or(0, |m| m.groups)
                ),
                sending,
            ));
            r.push((
                format!(
                    "long group ({dest}): 1 group ÷ {} groups, from the relay's start",
                    many.map_or(0, |m| m.groups)
                ),
                from_start,
            ));
        }
        r
    }

    pub(super) fn targets(&self) -> Vec<Target> {
        let at_least = |what: &str, goal: f64, value: Option<f64>, note: String| Target {
            what: what.to_string(),
            goal: format!("≥ {goal}"),
            value,
            met: value.map(|v| v >= goal),
            note,
        };
        let at_most = |what: &str, goal: f64, unit: &str, value: Option<f64>| Target {
            what: what.to_string(),
            goal: format!("≤ {goal} {unit}"),
            value,
            met: value.map(|v| v <= goal),
            note: String::new(),
        };
        let c1 = self.ceiling(1);
        let steady_2k = self.steady.iter().find(|s| s.rate == 2_000);
        let best = self.sweep_best();
        let mut targets = Vec::new();
        // Issue 9: no harm to the application's database, measured on durable commits, for
        // the build's default wake-up (the first harm run).
        if let Some(run) = self.harm.first() {
            let label = run.wakeup.label();
            for s in run.summaries() {
                targets.push(at_least(
                    &format!("commits with ÷ without the relay, {} writer(s)", s.writers),
                    0.95,
                    Some(s.ratio()),
                    format!(
                        "{label}; medians {:.0} / {:.0} commits/s",
                        median(&s.with),
                        median(&s.without)
                    ),
                ));
                if s.writers == 16 {
                    targets.push(at_most(
                        "commit-to-sent p50, 16 writers",
                        5.0,
                        "ms",
                        Some(quantile(&s.latencies_ms, 0.5)),
                    ));
                    targets.push(at_most(
                        "commit-to-sent p99, 16 writers",
                        25.0,
                        "ms",
                        Some(quantile(&s.latencies_ms, 0.99)),
                    ));
                }
            }
        }
        // Issue 20: the harm as production has it (database on its own core), against the
        // log-based anchor of the same run, and what the relay writes per event.
        if let Some(run) = &self.own_core {
            use crate::own_core::Reader::{LogBased, None as Nothing, Relay};
            for s in run.summaries() {
                let anchor = s.ratio(LogBased, Nothing);
                targets.push(at_least(
                    &format!(
                        "database on its own core: commits with ÷ without the relay, {} writers",
                        s.writers
                    ),
                    0.95,
                    Some(s.ratio(Relay, Nothing)),
                    format!(
                        "median of per-round ratios {:.2}; the log-based anchor's {:.2}",
                        s.round_ratio(Relay, Nothing),
                        anchor
                    ),
                ));
                let mut vs_anchor = at_least(
                    &format!(
                        "database on its own core: relay ÷ log-based anchor, {} writers",
                        s.writers
                    ),
                    1.0,
                    Some(s.ratio(Relay, LogBased)),
                    format!(
                        "median of per-round ratios {:.2}",
                        s.round_ratio(Relay, LogBased)
                    ),
                );
                vs_anchor.goal = "≥ 1 (the relay's ratio ≥ the anchor's)".to_string();
                targets.push(vs_anchor);
                if s.writers == 16 {
                    targets.push(at_most(
                        "database on its own core: commit-to-sent p99, 16 writers",
                        25.0,
                        "ms",
                        Some(quantile(&s.latencies_ms, 0.99)),
                    ));
                }
            }
        }
        // Issue 27: cheap at the rates production runs (the `rates` group).
        if let Some(run) = &self.rates {
            for s in run.summaries() {
                let m = |f: &dyn Fn(&crate::rates::RoundFigures) -> f64| Some(s.of(f).0);
                if [200, 500, 2_000].contains(&s.rate) {
                    let mut vs_app = at_most(
                        &format!(
                            "{} events/s: relay's database CPU per event ÷ the application's write",
                            s.rate
                        ),
                        0.25,
                        "×",
                        m(&|r| r.relay_over_app),
                    );
                    vs_app.note = format!(
                        "{:.0} µs added per event, the write {:.0} µs (medians over rounds)",
                        s.of(|r| r.relay_added_us).0,
                        s.of(|r| r.app_us).0
                    );
                    targets.push(vs_app);
                    targets.push(at_most(
                        &format!(
                            "{} events/s: relay's database CPU per event ÷ the log-based reader's",
                            s.rate
                        ),
                        1.0,
                        "×",
                        m(&|r| r.relay_over_log),
                    ));
                }
                if s.rate == 200 {
                    targets.push(at_most(
                        "200 events/s: relay process, % of a core",
                        2.0,
                        "%",
                        m(&|r| r.relay_process_share * 100.0),
                    ));
                }
                if s.rate == 2_000 {
                    targets.push(at_most(
                        "2,000 events/s: relay process, µs per event",
                        25.0,
                        "µs",
                        m(&|r| r.relay_process_us),
                    ));
                }
                let p99 = if s.rate == 5_000 { 25.0 } else { 50.0 };
                targets.push(at_most(
                    &format!("{} events/s: commit-to-sent p99", s.rate),
                    p99,
                    "ms",
                    Some(quantile(&s.latencies_ms, 0.99)),
                ));
            }
        }
        if let Some(w) = self.wal.first() {
            let mut wal = at_most(
                "relay WAL per event ÷ the application's insert WAL per event",
                0.25,
                "×",
                Some(w.ratio()),
            );
            wal.note = format!(
                "{}: {:.0} / {:.0} B per event",
                w.mode,
                w.relay_per_event(),
                w.insert_per_event()
            );
            targets.push(wal);
        }
        let steady_5k = self.steady.iter().find(|s| s.rate == 5_000);
        targets.push(at_most(
            "steady 5,000/s (durable): commit-to-send p50",
            5.0,
            "ms",
            steady_5k.map(|s| s.p50_ms),
        ));
        targets.push(at_most(
            "steady 5,000/s (durable): commit-to-send p99",
            25.0,
            "ms",
            steady_5k.map(|s| s.p99_ms),
        ));
        if let Some(default) = self
            .harm
            .first()
            .map(|h| h.wakeup.clone())
            .or_else(|| self.idle.first().map(|i| i.wakeup.clone()))
        {
            for (relays, goal) in [(1usize, 1.0), (4, 3.0)] {
                let run = self
                    .idle
                    .iter()
                    .find(|i| i.wakeup == default && i.relays == relays);
                targets.push(at_most(
                    &format!("idle, {relays} relay(s): their PostgreSQL backends, % of a core"),
                    goal,
                    "%",
                    run.map(|r| r.per_second(r.backend_cpu) * 100.0),
                ));
            }
        }
        targets.push(at_least(
            "drain ÷ minimal ceiling (sink 0 ms, batch, 1 replica)",
            0.8,
            Self::ratio(self.base(), self.minimal_ceiling()),
            "fsync=off cluster, like the ceilings".to_string(),
        ));
        targets.extend([
            at_least(
                "drain ÷ ceiling, sink 0 ms",
                0.6,
                Self::ratio(self.base(), c1),
                "ceiling: same batch, 1 worker (a relay claims and settles on one connection)"
                    .to_string(),
            ),
            at_least(
                "drain ÷ ceiling, sink 15 ms (default in-flight)",
                0.5,
                Self::ratio(self.sweep_at(self.in_flight), c1),
                format!(
                    "bound by in-flight × 10 / 15 ms = {:.0} events/s",
                    self.in_flight as f64 * ENTRIES_PER_REQUEST / SQS_LATENCY.as_secs_f64()
                ),
            ),
            at_least(
                "drain ÷ ceiling, sink 15 ms (best in-flight)",
                0.5,
                Self::ratio(best, c1),
                best.map_or(String::new(), |b| {
                    format!("--max-in-flight {}", b.max_in_flight)
                }),
            ),
            at_most(
                "steady 2,000/s: commit-to-send p50",
                5.0,
                "ms",
                steady_2k.map(|s| s.p50_ms),
            ),
            at_most(
                "steady 2,000/s: commit-to-send p99",
                25.0,
                "ms",
                steady_2k.map(|s| s.p99_ms),
            ),
            at_least(
                "ordered FIFO (1,000 groups) ÷ unordered",
                0.5,
                Self::ratio(self.ordered(), self.base().map(DrainRun::events_per_second)),
                if self.ordered_flag {
                    "--ordered on vs. the standard-queue drain".to_string()
                } else {
                    "the relay has no --ordered flag yet: plain FIFO fields only".to_string()
                },
            ),
            at_least(
                "2 replicas ÷ 1",
                1.3,
                Self::ratio(
                    self.replicas(2),
                    self.base().map(DrainRun::events_per_second),
                ),
                self.ceiling(2).zip(c1).map_or(String::new(), |(two, one)| {
                    format!("the database itself: 2 connections ÷ 1 = {:.2}", two / one)
                }),
            ),
            at_most(
                "relay peak RSS during a drain",
                40.0,
                "MiB",
                self.drains
                    .iter()
                    .map(|d| d.relay_peak_rss_mib)
                    .reduce(f64::max),
            ),
        ]);
        // Issue 10: a long group drains fast; large events stay inside a 256 MiB container.
        let pairs = self.long_group_pairs();
        if pairs.is_empty() {
            targets.push(at_least(
                "long group: one group's 5,000 events ÷ 5,000 over 1,000 groups",
                0.3,
                None,
                String::new(),
            ));
        }
        for (dest, one, many) in pairs {
            targets.push(at_least(
                &format!("long group ({dest}): one group's 5,000 events ÷ 5,000 over 1,000 groups"),
                0.3,
                Self::long_group_ratio(one, many).0,
                "ordered FIFO; rates after the first send".to_string(),
            ));
        }
        targets.push(at_most(
            "relay peak RSS, ~900 KB events, default --max-bytes-in-flight",
            256.0,
            "MiB",
            self.large_events_default().map(|d| d.relay_peak_rss_mib),
        ));
        targets
    }
}
